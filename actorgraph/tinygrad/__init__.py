"""Run tinygrad's captured work on actorgraph (`pip install 'actorgraph[tinygrad]'`).

- `install()` / `uninstall()`: actorgraph becomes the graph runner of every tinygrad CPU
  device, so `TinyJit` replays through actorgraph's planner and actors unchanged.
- `await graph_from_jit(rt, jit)`: a captured TinyJit as a `JitGraph` on a runtime you
  opened, for trio programs (profiles, traces, `plan.verify()` as for any graph).

tinygrad's `CPU` is actorgraph's `CPU:0`, `CPU:N` is `CPU:N`. Only this module imports
tinygrad; `import actorgraph` never does.
"""

from __future__ import annotations

try:
    import tinygrad as _tinygrad  # noqa: F401
except ImportError as _error:  # pragma: no cover - depends on the install
    from .._errors import MissingExtraError

    raise MissingExtraError(
        "actorgraph.tinygrad needs tinygrad 0.11.0: pip install 'actorgraph[tinygrad]' "
        "(and clang, which tinygrad's CPU devices compile with)"
    ) from _error

from ._runner import ActorGraph as ActorGraph
from ._runner import TinygradStatistics as TinygradStatistics
from ._runner import install as install
from ._runner import installed as installed
from ._runner import statistics as statistics
from ._runner import uninstall as uninstall
from ._trio import JitGraph as JitGraph
from ._trio import graph_from_jit as graph_from_jit

__all__ = [
    "ActorGraph",
    "JitGraph",
    "TinygradStatistics",
    "graph_from_jit",
    "install",
    "installed",
    "statistics",
    "uninstall",
]
