"""Run tinygrad's captured work on actorgraph (`pip install 'actorgraph[tinygrad]'`).

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

TINYGRAD_VERSION = installed_version()
_adapter: Any = importlib.import_module(f"{__name__}.{adapter_for(TINYGRAD_VERSION)}")

from . import _install  # noqa: E402 - after the version check: it imports tinygrad
from ._install import TinygradStatistics as TinygradStatistics  # noqa: E402
from ._trio import JitGraph as JitGraph  # noqa: E402
from ._trio import graph_from_jit as graph_from_jit  # noqa: E402

SUPPORTED_VERSIONS = tuple(SUPPORTED)
ActorGraph: Any = _adapter.ActorGraph


def install(*, devices: int = 16, check_replays: int = 0, **options: Any) -> None:
    """Make actorgraph the graph runner of every tinygrad CPU device, open or opened later.

    Starts a background runtime (`ag.start_runtime`) on CPU:0 ... CPU:devices-1 (options
    go to it); TinyJit then replays through actorgraph's planner and actors with no change
    to the caller's code. A runner call returns once its replay is done. Calling install()
    again while installed does nothing.

    `check_replays=N`: the first N replays of every graphed batch also run the batch the
    way tinygrad runs it itself, on shadow copies of the memory they touch, and a
    difference raises `ag.ReplayMismatchError` naming the call and the first differing
    element (see `statistics().checked`). Raises UsageError for a `devices` or
    `check_replays` that is not an int in range.
    """
    runners = (_adapter.ActorGraph, _adapter.CheckedActorGraph)
    options = {"check_replays": check_replays, **options}
    _install.install(runners, _adapter.ORDERING, _adapter.VERSION, devices, options)


def uninstall() -> None:
    """Give every tinygrad CPU device its own graph runner back and close the runtime.
    Jits captured while installed must capture again (`jit.reset()`)."""
    _install.uninstall(_adapter.synchronize)


def installed() -> bool:
    return _install.current() is not None


def statistics() -> TinygradStatistics:
    """A snapshot of what install() has done."""
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
