"""Every benchmark script runs in its quick mode, as a user runs it: `python NAME.py --quick`
from the benchmarks folder, in a process of its own. Its figures mean nothing here; what
is checked is that the script runs to the end, and that a quick run leaves the results of
full runs alone (it writes under results/quick/, or nowhere).

The scripts are found, not listed: every benchmarks/*.py with a main guard, but the
`_`-prefixed helper modules. And no benchmark file may be named like a package the
benchmarks (or actorgraph) use: run from that folder, a script's own folder comes first
on sys.path, so such a file would be imported in the package's place.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import _extras
import pytest
from _paths import ROOT, TESTS

BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
GUARD = 600  # seconds: a hang guard only; a quick run takes a few seconds
# Packages a benchmark may need that the test install does not bring: a script that
# stops for want of one of them is skipped, saying so.
OPTIONAL = {"tinygrad", "ray", "dask", "tqdm"}


def scripts() -> list[Path]:
    return sorted(
        path
        for path in BENCHMARKS.glob("*.py")
        if not path.name.startswith("_")
        and re.search(r"^if __name__ == .__main__.:", path.read_text(), re.MULTILINE)
    )


def _case(path: Path) -> object:
    return pytest.param(path, id=path.stem)


def _results_of_full_runs() -> dict[Path, tuple[int, int]]:
    if not RESULTS.is_dir():
        return {}
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in RESULTS.iterdir() if p.is_file()}


@pytest.mark.parametrize("script", [_case(p) for p in scripts()])
def test_every_benchmark_runs_in_its_quick_mode(script: Path) -> None:
    assert "--quick" in script.read_text(), f"{script.name} has no --quick mode"
    before = _results_of_full_runs()
    # CUDA benchmarks run on the fake driver here (no GPU needed): the same code paths.
    env = dict(os.environ, ACTORGRAPH_CUDA_DRIVER="fake")
    done = subprocess.run(
        [sys.executable, script.name, "--quick"],
        cwd=BENCHMARKS,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    missing = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", done.stderr)
    if done.returncode != 0 and missing and missing.group(1).split(".")[0] in OPTIONAL:
        pytest.skip(f"{script.name} cannot run here: {_extras.missing(missing.group(1), 'it')}")
    assert done.returncode == 0, f"{script.name} --quick failed:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{script.name} --quick printed nothing"
    assert _results_of_full_runs() == before, (
        f"{script.name} --quick wrote over a full run's results"
    )


def _forbidden_names() -> set[str]:
    """Top-level module names a benchmark file must not take: the standard library's,
    every installed distribution's, actorgraph's dependencies and extras (installed or
    not), and every name a benchmark imports a submodule of (a package, then)."""
    names = set(sys.stdlib_module_names) | set(importlib.metadata.packages_distributions())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    wanted += [req for extra in project["optional-dependencies"].values() for req in extra]
    for requirement in wanted:
        dist = re.match(r"[A-Za-z0-9_.-]+", requirement)
        assert dist is not None
        names |= {dist.group(0).replace("-", "_").lower(), dist.group(0).split("-")[0].lower()}
    for path in BENCHMARKS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                dotted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                dotted = [node.module]
            else:
                continue
            names |= {name.split(".")[0] for name in dotted if "." in name}
    return names


def _found_outside(name: str) -> str | None:
    """Where `name` imports from when this checkout's folders are not on the path."""
    ours = {ROOT, TESTS, BENCHMARKS, Path.cwd()}
    path = [p for p in sys.path if p and Path(p).resolve() not in ours]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    return None if spec is None else str(spec.origin or spec.submodule_search_locations)


@pytest.mark.parametrize("module", [_case(p) for p in sorted(BENCHMARKS.glob("*.py"))])
def test_no_benchmark_file_hides_a_package(module: Path) -> None:
    name = module.stem
    where = _found_outside(name)
    assert name.lower() not in _forbidden_names() and where is None, (
        f"benchmarks/{module.name} takes the name of a package ({where or name}): a script "
        f"run from benchmarks/ that imports {name} would get this file; rename it"
    )
