"""Which tinygrad is installed, and whether actorgraph.tinygrad speaks its language.

tinygrad changed shape between releases (0.11 hands a graph runner a list of ExecItems;
0.13 onwards captures a UOp LINEAR of CALLs and builds runners lazily), so each supported
release has an adapter of its own, chosen here by the version pip installed. This module
imports no tinygrad: it reads the installed distribution's metadata only.
"""

from __future__ import annotations

import importlib.metadata

from actorgraph.devices import install_hint

from .._errors import MissingExtraError

# Supported releases -> the adapter module that speaks their API. The newest comes last:
# it is what the tinygrad extra installs.
SUPPORTED: dict[str, str] = {"0.11.0": "_v011", "0.14.0": "_v014"}
NEWEST = list(SUPPORTED)[-1]
PIP_COMMAND = install_hint("tinygrad")


class TinygradVersionError(MissingExtraError):
    """The installed tinygrad is a release actorgraph.tinygrad has no adapter for (an
    ImportError: `import actorgraph.tinygrad` raises it)."""


def installed_version() -> str | None:
    """The installed tinygrad's version, or None when tinygrad is not installed."""
    try:
        return importlib.metadata.version("tinygrad")
    except importlib.metadata.PackageNotFoundError:
        return None


def adapter_for(version: str | None) -> str:
    """The adapter module's name for this tinygrad version; raises a MissingExtraError
    (tinygrad missing) or TinygradVersionError (a release without an adapter)."""
    supported = ", ".join(SUPPORTED)
    if version is None:
        raise MissingExtraError(
            f"actorgraph.tinygrad needs tinygrad (supported: {supported}), which is not "
            f"installed: {PIP_COMMAND} (tinygrad {NEWEST}; its CPU devices compile with clang)"
        )
    adapter = SUPPORTED.get(version)
    if adapter is None:
        raise TinygradVersionError(
            f"actorgraph.tinygrad supports tinygrad {supported}, but tinygrad {version} is "
            f"installed; install a supported release: {PIP_COMMAND} (tinygrad {NEWEST}), "
            f"or pip install tinygrad=={NEWEST}"
        )
    return adapter
