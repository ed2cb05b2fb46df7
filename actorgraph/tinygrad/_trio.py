"""The trio-native path: a captured TinyJit as a Graph on a runtime the caller opened."""

from __future__ import annotations

import importlib
import weakref
from typing import Any

import trio

from .._background import BackgroundRuntime
from .._errors import UsageError
from .._graph import Graph
from .._runtime import Runtime
from .._vars import Var
from ._batch import Batch, on_runtime_thread
from ._convert import Wrapper
from ._version import adapter_for, installed_version
from ._watch import watched

_adapter: Any = importlib.import_module(f"{__package__}.{adapter_for(installed_version())}")


class JitGraph:
    """A captured TinyJit replayed by actorgraph: `await jit_graph(*args, **kwargs)` takes
    the jit's own arguments (tensors, bound Variables), checks them as TinyJit does,
    replays the captured work on the runtime's CPU devices and returns what the jit
    returns (its output tensors, which the replay wrote). `jit_graph.graph` is the
    ag.Graph (plan, statistics, profiles).

    Symbolic shapes replay with one plan, made for the largest sizes the jit allows
    (`graphs` counts the plans made).
    """

    def __init__(
        self, runtime: Runtime | BackgroundRuntime, jit: Any, *, verify: bool | None = None
    ) -> None:
        self.runtime = runtime
        self.jit = jit
        self._wrapper = _wrapper_of(runtime)
        # Every call kind and captured buffer is checked now, not on the first call.
        self._source = _adapter.JitSource(jit, self._wrapper)
        self._verify = verify

    def __repr__(self) -> str:
        return f"<JitGraph of {self._source.name}: {self._source.size} calls, {self.graphs} plans>"

    @property
    def graph(self) -> Graph:
        """The Graph of the latest call."""
        batch = self._source.batch
        if batch is None or batch.graph is None:
            raise UsageError("this JitGraph has not been called yet; await it once first")
        graph: Graph = batch.graph
        return graph

    @property
    def graphs(self) -> int:
        batch = self._source.batch
        return 0 if batch is None else int(batch.plans)

    async def inputs(self, *args: Any, **kwargs: Any) -> tuple[Graph, list[Any], dict[Var, int]]:
        """(graph, input buffers, var values) for a call with these arguments, so that
        `await graph(buffers, values)` is the replay (with profile=, submit(), ...).
        Order it after tinygrad's own work yourself (or call the JitGraph instead)."""
        batch, roots, values = await self._prepare(args, kwargs)
        return batch.graph, roots, values

    async def _prepare(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Batch, list[Any], dict[Var, int]]:
        self._wrapper.forget_freed()
        batch, roots, given = await self._source.prepare(self.runtime, args, kwargs)
        if batch.graph_for(roots) is None:
            if batch.remote:  # planned where the workers' memory is resolved (_batch.py)
                held = batch.hold()
                runtime = self.runtime
                assert isinstance(runtime, BackgroundRuntime)  # JitSource checked it
                items, inputs, limits = await on_runtime_thread(runtime, batch.plan, roots, held)
            else:
                items, inputs, limits = batch.plan(roots)
            graph = await self.runtime.compile(
                items, inputs=inputs, max_sizes=limits, verify=self._verify, aliasing="replan"
            )
            batch.keep_plan(graph, limits, self.runtime)
        return batch, roots, batch.values(given, f"{self._source.name}")

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Replay with the jit's own arguments; return what the jit returns, written.

        Cancelled before the replay starts, it starts nothing; cancelled once it has
        started, it still returns only when the replay is done (tinygrad's own work
        after the call, inline on this thread, must not pass it)."""
        batch, roots, values = await self._prepare(args, kwargs)
        await trio.lowlevel.checkpoint_if_cancelled()
        after, then = self._source.points(batch)  # values taken: from here, they are written
        graph = batch.graph
        try:
            if after or then:
                await graph(roots, values, after=after, then=then)
            else:
                await graph(roots, values)
        except BaseException:
            with trio.CancelScope(shield=True):
                await _replays_done(graph)
            for timeline, value in then:  # (written already, unless it never started)
                timeline.advance(value)
            raise
        return self._source.ret


# One Wrapper per runtime, shared by its JitGraphs: memory tinygrad frees and hands out
# again, on another device say, must be let go of by whichever JitGraph wrapped it.
_wrappers: weakref.WeakKeyDictionary[Runtime | BackgroundRuntime, Wrapper] = (
    weakref.WeakKeyDictionary()
)


def _wrapper_of(runtime: Runtime | BackgroundRuntime) -> Wrapper:
    found = _wrappers.get(runtime)
    if found is None:
        found = _wrappers[runtime] = watched(Wrapper(runtime))
    return found


async def _replays_done(graph: Graph) -> None:
    """Return once none of the graph's replays is in flight (a cancelled caller's
    replay goes on on the actors; only this rare path polls)."""
    while graph.statistics().in_flight:
        await trio.sleep(0.0005)


async def graph_from_jit(
    runtime: Runtime | BackgroundRuntime, jit: Any, *, verify: bool | None = None
) -> JitGraph:
    """A captured TinyJit as a JitGraph on `runtime` (which opens the CPU devices the jit
    uses: tinygrad's CPU is CPU:0, CPU:1 is CPU:1, ...). The jit must have captured
    (tinygrad captures on a jit's second call). `verify=True` proves each plan
    deadlock- and race-free.

    A jit on AG devices (tinygrad 0.14, `install(remote=...)`) runs on the runtime
    install() started, where their memory lives: pass `agt.runtime()`; its replays come
    after the AG work tinygrad recorded before them.

    Raises:
        UsageError: the jit has not captured, has a call actorgraph cannot run, or runs
            on AG devices and `runtime` is not install()'s."""
    return JitGraph(runtime, jit, verify=verify)
