"""Run tinygrad's captured work on actorgraph (the tinygrad extra: `pip install -e ".[tinygrad]"`).

- `install()` / `uninstall()`: actorgraph becomes the graph runner of every tinygrad CPU
  device, so `TinyJit` replays through actorgraph's planner and actors unchanged.
- `await graph_from_jit(rt, jit)`: a captured TinyJit as a `JitGraph` on a runtime you
  opened, for trio programs (profiles, traces, `plan.verify()` as for any graph).

Supported tinygrad releases: 0.11.0 and 0.14.0, each through an adapter of its own
(`_v011`, `_v014`) chosen here by the installed version; any other release raises
`TinygradVersionError` (an ImportError) on import, naming it and the supported ones.
tinygrad's `CPU` is actorgraph's `CPU:0`, `CPU:N` is `CPU:N`. Only this package imports
tinygrad; `import actorgraph` never does.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import SUPPORTED, TinygradVersionError, adapter_for, installed_version

#: The installed tinygrad's version, read from its distribution's metadata at import.
TINYGRAD_VERSION = installed_version()
_adapter: Any = importlib.import_module(f"{__name__}.{adapter_for(TINYGRAD_VERSION)}")

from . import _install  # noqa: E402 - after the version check: it imports tinygrad
from ._install import TinygradStatistics as TinygradStatistics  # noqa: E402
from ._trio import JitGraph as JitGraph  # noqa: E402
from ._trio import graph_from_jit as graph_from_jit  # noqa: E402

#: The tinygrad releases actorgraph.tinygrad has an adapter for, oldest first; importing
#: it with any other release raises TinygradVersionError.
SUPPORTED_VERSIONS = tuple(SUPPORTED)
ActorGraph: Any = _adapter.ActorGraph


def install(*, devices: int = 16, **options: Any) -> None:
    """Make actorgraph the graph runner of every tinygrad CPU device, open or opened later.

    It starts a background runtime (`ag.start_runtime`) on `CPU:0` ... `CPU:devices-1`;
    TinyJit then replays through actorgraph's planner and actors with no change to the
    caller's code, each replay returning once its work is done. What actorgraph cannot run
    (other devices, other call kinds, CPU devices past `devices`) tinygrad runs itself.
    Calling install() again while installed does nothing.

    Args:
        devices: how many CPU devices the runtime opens (tinygrad's `CPU` is `CPU:0`,
            `CPU:1` is `CPU:1`, ...).
        **options: open_runtime's options; `cpu_thread_bytes=1 << 20` runs large kernels
            on the devices' worker threads, so devices compute in parallel.

    Raises:
        UsageError: `devices` is not an int >= 1, or an option that neither install nor
            open_runtime takes (the message names the closest one).
    """
    _install.install(_adapter.ActorGraph, _adapter.ORDERING, _adapter.VERSION, devices, options)


def uninstall() -> None:
    """Give every tinygrad CPU device its own graph runner back and close the runtime.

    A jit captured while installed must capture again (`jit.reset()`); else its next call
    raises ClosedError saying so.
    """
    _install.uninstall(_adapter.synchronize)


def installed() -> bool:
    """Whether install() is in effect.

    Returns:
        True between install() and uninstall().
    """
    return _install.current() is not None


def statistics() -> TinygradStatistics:
    """A snapshot of what install() has done.

    Returns:
        The TinygradStatistics (all zeros when not installed).
    """
    return _install.statistics()


__all__ = [
    "SUPPORTED_VERSIONS",
    "TINYGRAD_VERSION",
    "ActorGraph",
    "JitGraph",
    "TinygradStatistics",
    "TinygradVersionError",
    "graph_from_jit",
    "install",
    "installed",
    "statistics",
    "uninstall",
]
