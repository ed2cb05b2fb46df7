"""What a test needs beyond the test extra, and the skip reason that says how to get it.

The README's test command installs the test extra only, so the tests of the other extras
skip there: each skip names the command that installs what is missing and runs them.
"""

from __future__ import annotations

from types import ModuleType

import pytest

# Modules tests import that come with an extra of actorgraph's, by the extra.
EXTRA_OF = {
    "tinygrad": "tinygrad",
    "ray": "ray",
    "dask": "bench",
    "tqdm": "progress",
    "matplotlib": "plot",
}


def install_command(extra: str) -> str:
    """The command, run in the checkout, that installs the test extra and `extra`."""
    return f'pip install -e ".[test,{extra}]"'


# Modules the test extra itself brings (a venv without it runs few tests at all).
TEST_EXTRA = frozenset(["nbformat", "nbclient", "ipykernel", "trustme", "cuda", "matplotlib"])


def missing(module: str, what: str = "these tests") -> str:
    """The reason to skip `what` when `module` (maybe at a release: `tinygrad==0.14.0`) is
    not installed: the command to get it."""
    top = module.partition("==")[0].split(".")[0]
    if top in EXTRA_OF and top not in TEST_EXTRA:
        how = f"{install_command(EXTRA_OF[top])} in the checkout"
    elif top in TEST_EXTRA:
        how = 'pip install -e ".[test]" in the checkout'
    else:  # not one of actorgraph's extras: the package itself
        how = f"pip install {top}"
    return f"{module} is not installed: {how} installs it and runs {what}"


def importorskip(module: str) -> ModuleType:
    """`pytest.importorskip(module)`, skipping with `missing(module)` as the reason."""
    return pytest.importorskip(module, reason=missing(module))


NO_CLANG = (
    "clang is not installed: tinygrad's CPU devices compile with it; apt-get install clang "
    "runs these tests"
)
