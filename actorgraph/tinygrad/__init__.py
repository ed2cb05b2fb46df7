"""Run tinygrad's captured work on actorgraph (the tinygrad extra: `pip install -e ".[tinygrad]"`).

- `install()` / `uninstall()`: actorgraph becomes the graph runner of every tinygrad CPU
  device, so `TinyJit` replays through actorgraph's planner and actors unchanged.
- `await graph_from_jit(rt, jit)`: a captured TinyJit as a `JitGraph` on a runtime you
  opened, for trio programs (profiles, traces, `plan.verify()` as for any graph).
- `install(remote=[...])` (tinygrad 0.14): the CPU devices of actorgraph workers become
  tinygrad's `AG`, `AG:1`, ... (_ag.py), their work recorded and sent when a result is
  needed (_pending.py); `python -m actorgraph.tinygrad SCRIPT` installs from the
  environment and runs an unmodified script.

Supported tinygrad releases: 0.11.0 and 0.14.0, each through an adapter of its own
(`_v011`, `_v014`) chosen here by the installed version; any other release raises
`TinygradVersionError` (an ImportError) on import, naming it and the supported ones.
tinygrad's `CPU` is actorgraph's `CPU:0`, `CPU:N` is `CPU:N`. Only this package imports
tinygrad; `import actorgraph` never does.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from .._background import BackgroundRuntime
from .._errors import ClosedError, UsageError
from ._version import SUPPORTED, TinygradVersionError, adapter_for, installed_version

#: The installed tinygrad's version, read from its distribution's metadata at import.
TINYGRAD_VERSION = installed_version()
_adapter: Any = importlib.import_module(f"{__name__}.{adapter_for(TINYGRAD_VERSION)}")

from . import _install  # noqa: E402 - after the version check: it imports tinygrad
from ._install import TinygradStatistics as TinygradStatistics  # noqa: E402
from ._pending import check_remote_names  # noqa: E402
from ._trio import JitGraph as JitGraph  # noqa: E402
from ._trio import graph_from_jit as graph_from_jit  # noqa: E402

#: The tinygrad releases actorgraph.tinygrad has an adapter for, oldest first; importing
#: it with any other release raises TinygradVersionError.
SUPPORTED_VERSIONS = tuple(SUPPORTED)
ActorGraph: Any = _adapter.ActorGraph


def install(
    *,
    devices: int = 16,
    remote: Sequence[str] | None = None,
    check_replays: int = 0,
    **options: Any,
) -> None:
    """Make actorgraph the graph runner of every tinygrad CPU device, open or opened later,
    and (tinygrad 0.14) the workers' devices tinygrad devices.

    It starts a background runtime (`ag.start_runtime`) on `CPU:0` ... `CPU:devices-1` and
    the worker devices `remote` names; TinyJit then replays through actorgraph's planner
    and actors with no change to the caller's code, each replay returning once its work is
    done. What actorgraph cannot run (other devices, other call kinds, CPU devices past
    `devices`) tinygrad runs itself. Calling install() again while installed does nothing.

    Args:
        devices: how many CPU devices the runtime opens (tinygrad's `CPU` is `CPU:0`,
            `CPU:1` is `CPU:1`, ...).
        remote: worker devices (`KIND:N@HOST:PORT`, of workers started with
            `actorgraph worker --allow-programs`) that become tinygrad's `AG`, `AG:1`, ...
            in this order; None reads them from the environment variable
            `ACTORGRAPH_REMOTE` (comma-separated), and the token from
            `ACTORGRAPH_TOKEN_FILE` unless `remote_token_file=` is given.
        check_replays: the first N replays of every graphed batch also run the batch the
            way tinygrad runs it itself, on shadow copies of the memory they touch, and a
            difference raises `ag.ReplayMismatchError` naming the call and the first
            differing element (see `statistics().checked`). CPU devices only: refused
            with remote devices.
        **options: open_runtime's options (`remote_token_file=`, `remote_tls_ca=`, ...);
            `cpu_thread_bytes=1 << 20` runs large kernels on the devices' worker threads,
            so devices compute in parallel.

    Raises:
        UsageError: `devices` is not an int >= 1, a bad check_replays or remote name,
            remote devices on tinygrad 0.11 (which keeps its own REMOTE device),
            check_replays with remote devices, or an option that neither install nor
            open_runtime takes (the message names the closest one).
        ClosedError: a worker could not be reached (the message says why).
    """
    names = _remote_from(remote)
    register = None
    if names:
        if not hasattr(_adapter, "register_remote"):
            raise UsageError(
                f"actorgraph's AG devices (install(remote=...) or ACTORGRAPH_REMOTE) need "
                f"tinygrad 0.14.0, and tinygrad {TINYGRAD_VERSION} is installed, which has its "
                f"own REMOTE device for remote work; use that, or pip install "
                f"'actorgraph[tinygrad]' (tinygrad 0.14.0)"
            )
        register = _adapter.register_remote
    runners = (_adapter.ActorGraph, _adapter.CheckedActorGraph)
    options = {"check_replays": check_replays, **options}
    _install.install(
        runners, _adapter.ORDERING, _adapter.VERSION, devices, options, names, register
    )


def _remote_from(remote: Sequence[str] | None) -> list[str]:
    if remote is None:
        found = os.environ.get("ACTORGRAPH_REMOTE", "")
        return check_remote_names([name.strip() for name in found.split(",") if name.strip()])
    if isinstance(remote, str):
        raise UsageError(
            f"install(remote=...) takes a list of worker device names, got the string "
            f"{remote!r}; write remote=[{remote!r}]"
        )
    return check_remote_names(list(remote))


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


def runtime() -> BackgroundRuntime:
    """The background runtime install() started: what `graph_from_jit` takes for a jit
    on AG devices (their memory lives in it).

    Returns:
        The BackgroundRuntime of install().

    Raises:
        ClosedError: actorgraph.tinygrad is not installed.
    """
    state = _install.current()
    if state is None:
        raise ClosedError("actorgraph.tinygrad is not installed; call install() first")
    found: BackgroundRuntime = state.runtime
    return found


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
    "runtime",
    "statistics",
    "uninstall",
]
