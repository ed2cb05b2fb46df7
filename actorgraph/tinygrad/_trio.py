"""The trio-native path: a captured TinyJit as a Graph on a runtime the caller opened."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tinygrad.device import Buffer as TinyBuffer
from tinygrad.engine.jit import TinyJit, _prepare_jit_inputs
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops

from .._buffer import Buffer
from .._errors import InputError, UsageError
from .._graph import Graph
from .._runtime import Runtime
from .._vars import Var
from ._convert import PLANS_KEPT, Converter, Timelines, Wrapper, devices_of, numpy_dtype


class JitGraph:
    """A captured TinyJit replayed by actorgraph: `await jit_graph(*args, **kwargs)` takes
    the jit's own arguments (tensors, bound Variables), replays the captured work on the
    runtime's CPU devices and returns what the jit returns (its output tensors, which the
    replay wrote). `jit_graph.graph` is the ag.Graph (plan, statistics, profiles).

    Inputs whose size changes per call (symbolic shapes) get a graph per set of input
    sizes, planned on first use (`graphs` counts them).
    """

    def __init__(self, runtime: Runtime, jit: TinyJit[Any], *, verify: bool | None = None) -> None:
        captured = jit.captured
        if captured is None:
            raise UsageError(
                f"{jit!r} has not captured its work yet; call it twice first (tinygrad's "
                f"TinyJit captures on its second call)"
            )
        self.runtime = runtime
        self.jit = jit
        self._captured = captured
        self._cache = list(captured.jit_cache)
        self._input_replace = dict(captured.input_replace)
        self._views = list(captured.extra_view_inputs)
        self._wrapper = Wrapper(runtime)
        self._converter = Converter(self._wrapper)
        self._timelines = Timelines.of_runtime(runtime)
        self._verify = verify
        self._graphs: dict[tuple[int, ...], Graph] = {}
        self._latest: Graph | None = None
        # Every item kind and captured buffer is checked now, not on the first call.
        self._converter.check(self._cache, self._input_replace)

    def __repr__(self) -> str:
        return f"<JitGraph {len(self._cache)} items, {len(self._graphs)} graphs>"

    @property
    def graph(self) -> Graph:
        """The Graph of the latest call (the first input sizes before any call)."""
        if self._latest is None:
            raise UsageError("this JitGraph has not been called yet; await it once first")
        return self._latest

    @property
    def graphs(self) -> int:
        return len(self._graphs)

    def _inputs(
        self, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> tuple[list[TinyBuffer], dict[Any, int]]:
        named = [*enumerate(args), *sorted(kwargs.items())]
        for name, value in named:
            if isinstance(value, Tensor):
                uop = value.uop
                for part in uop.src if uop.op is Ops.MULTI else (uop,):
                    base = part.base
                    if base.op is Ops.BUFFER and not base.buffer.is_allocated():
                        raise InputError(
                            f"tensor argument {name!r}: its tinygrad buffer {base.buffer!r} was "
                            f"freed; pass a realized tensor"
                        )
        buffers, var_vals, names, layouts = _prepare_jit_inputs(tuple(args), kwargs)  # type: ignore[no-untyped-call]
        captured = self._captured
        if names != captured.expected_names:
            raise InputError(
                f"{self.jit!r} was captured with tensor arguments {captured.expected_names} "
                f"but got {names}; pass the same arguments"
            )
        for k, (got, want) in enumerate(zip(layouts, captured.expected_st_vars_dtype_device)):
            if got != want:
                raise InputError(
                    f"tensor argument {names[k]!r} has shape {got[0].shape} {got[2]} on "
                    f"{got[3]} but {self.jit!r} was captured for {want[0].shape} {want[2]} on "
                    f"{want[3]}; pass a tensor of the captured layout (symbolic dims may vary)"
                )
        return list(buffers), dict(var_vals)

    async def inputs(self, *args: Any, **kwargs: Any) -> tuple[Graph, list[Buffer], dict[Var, int]]:
        """(graph, input buffers, var values) for a call with these arguments, so that
        `await graph(buffers, values)` is the replay (with profile=, submit(), ...).
        Order it after tinygrad's own work yourself (or call the JitGraph instead)."""
        graph, roots, values, _ = await self._prepare(args, kwargs)
        return graph, roots, values

    async def _prepare(
        self, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> tuple[Graph, list[Buffer], dict[Var, int], list[TinyBuffer]]:
        tiny_inputs, tiny_vals = self._inputs(args, kwargs)
        roots = [
            self._wrapper.base(buf, f"tensor argument {k}") for k, buf in enumerate(tiny_inputs)
        ]
        key = tuple(b.nbytes for b in roots)
        graph = self._graphs.get(key)
        if graph is None:
            graph = await self._compile(roots)
            if len(self._graphs) >= PLANS_KEPT:
                self._graphs.pop(next(iter(self._graphs)))  # the oldest; planned again if needed
            self._graphs[key] = graph
        self._latest = graph
        values = self._converter.var_values(tiny_vals, graph._program.free_vars)
        return graph, roots, values, tiny_inputs

    async def _compile(self, roots: list[Buffer]) -> Graph:
        base_count = len(roots)

        def slot(j: int, i: int, buf: TinyBuffer | None) -> Buffer:
            index = self._input_replace.get((j, i))
            if index is None:
                if buf is None:
                    raise InputError(f"jit cache item {j} buffer {i} is missing (freed?)")
                return self._wrapper.buffer(buf, f"jit cache item {j} buffer {i}")
            if index < base_count:
                return roots[index]
            base, offset, _device, size, dtype = self._views[index - base_count]
            return roots[base].view(byte_offset=offset, dtype=numpy_dtype(dtype), shape=(size,))

        items = self._converter.convert(self._cache, slot)
        return await self.runtime.compile(items, inputs=roots, verify=self._verify)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        graph, roots, values, tiny_inputs = await self._prepare(args, kwargs)
        after, then = self._timelines.points(devices_of(self._cache, tiny_inputs))
        await graph(roots, values, after=after, then=then)
        return self._captured.ret


async def graph_from_jit(
    runtime: Runtime, jit: TinyJit[Any], *, verify: bool | None = None
) -> JitGraph:
    """A captured TinyJit as a JitGraph on `runtime` (which opens the CPU devices the jit
    uses: tinygrad's CPU is CPU:0, CPU:1 is CPU:1, ...). The jit must have captured
    (been called twice). `verify=True` proves each plan deadlock- and race-free."""
    return JitGraph(runtime, jit, verify=verify)
