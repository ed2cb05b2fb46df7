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
    """A captured TinyJit replayed by actorgraph on a runtime you opened (`graph_from_jit`).

    `await jit_graph(*args)` takes the jit's own arguments, checks them as TinyJit does,
    replays the captured work on the runtime's CPU devices and returns what the jit
    returns. Symbolic shapes replay with one plan, made for the largest sizes the jit
    allows.
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
        """The ag.Graph of the latest call (its plan, statistics, profiles).

        Raises:
            UsageError: the JitGraph has not been called yet.
        """
        batch = self._source.batch
        if batch is None or batch.graph is None:
            raise UsageError("this JitGraph has not been called yet; await it once first")
        graph: Graph = batch.graph
        return graph

    @property
    def graphs(self) -> int:
        """How many plans were made (one, unless a call needed a larger one)."""
        batch = self._source.batch
        return 0 if batch is None else int(batch.plans)

    async def inputs(self, *args: Any, **kwargs: Any) -> tuple[Graph, list[Any], dict[Var, int]]:
        """The graph, its input buffers and Var values for a call with these arguments.

        So that `await graph(buffers, values)` is the replay, with `profile=`, `submit()` and
        the rest. Order it after tinygrad's own work yourself (or call the JitGraph instead).

        Args:
            *args: the jit's own arguments.
            **kwargs: the jit's own keyword arguments.

        Returns:
            (the ag.Graph, its input buffers, its Var values).

        Raises:
            InputError: an argument does not match the jit's capture (a wrong shape, a freed
                tinygrad buffer), naming the argument and the jitted function.
        """
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

        Cancelled before its replay starts, it starts nothing; cancelled once it has started,
        it still returns only when the replay is done (tinygrad's own work after the call,
        inline on this thread, must not pass it). A jit input that the jit itself writes is
        copied first, as tinygrad 0.14 does.

        Args:
            *args: the jit's own arguments (tensors, bound Variables).
            **kwargs: the jit's own keyword arguments.

        Returns:
            What the jit returns (its output tensors, which the replay wrote).

        Raises:
            InputError: an argument does not match the jit's capture.
            ItemError: a kernel raised.
        """
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
    """A captured TinyJit as a JitGraph on `runtime`, for trio programs.

    The runtime opens the CPU devices the jit uses: tinygrad's `CPU` is `CPU:0`, `CPU:1`
    is `CPU:1`, and so on. Every call kind and captured buffer is checked now, not on the
    first call. A jit on AG devices (tinygrad 0.14, `install(remote=...)`) runs on the
    runtime install() started, where their memory lives: pass `agt.runtime()`; its
    replays come after the AG work tinygrad recorded before them.

    Args:
        runtime: an open Runtime (or a background runtime: `agt.runtime()`).
        jit: a TinyJit that has captured (tinygrad captures on a jit's second call).
        verify: prove each plan deadlock- and race-free (default: the runtime's
            `verify_plans`).

    Returns:
        The JitGraph.

    Raises:
        UsageError: the jit has not captured, holds work actorgraph cannot run here, or
            runs on AG devices and `runtime` is not install()'s.
    """
    return JitGraph(runtime, jit, verify=verify)
