"""Graph: a compiled plan that replays with `await graph(inputs, var_vals=...)`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from scheduler import Plan

from . import _jit
from ._buffer import Buffer
from ._errors import ClosedError, InputError, VarError
from ._vars import Var

if TYPE_CHECKING:
    from ._program import Program
    from ._runtime import Runtime


def check_var_vals(
    needed: frozenset[Var], var_vals: Mapping[Any, int] | None, what: str
) -> dict[Var, int]:
    values = dict(var_vals or {})
    for var, value in values.items():
        if not isinstance(var, Var):
            raise VarError(f"{what}: var_vals keys must be ag.Var objects, got {var!r}")
        if var not in needed:
            names = sorted(v.name for v in needed) or "none"
            raise VarError(f"{what} does not use Var {var.name!r} (it uses: {names}); drop it")
        var.check(value)
    missing = sorted(v.name for v in needed if v not in values)
    if missing:
        raise VarError(f"{what} needs values for Vars {missing}; pass var_vals={{var: value}}")
    return values


@attrs.frozen
class GraphStatistics:
    items: int
    queues: int
    replays: int
    in_flight: int


class Graph:
    """A jit cache planned once. Replays are ordered with all other work on its devices."""

    def __init__(self, runtime: Runtime, program: Program) -> None:
        self._runtime = runtime
        self._program = program
        self._inputs = program.inputs
        self._closed = False
        self._last_inputs: tuple[Buffer, ...] | None = None
        self._last_vars: dict[Var, int] | None = None
        self._last_ops: Any = None
        self._internal: dict[int, list[Buffer]] = {}
        input_allocs = {b.alloc_id for b in self._inputs}
        for j, item in enumerate(program.items):
            bound = {slot for slot, _ in program.item_inputs[j]}
            for slot, buf in enumerate(item.bufs):
                if slot not in bound:
                    self._internal.setdefault(buf.alloc_id, []).append(buf)
        del input_allocs
        self.replays = 0
        self.in_flight = 0

    @property
    def plan(self) -> Plan:
        return self._program.plan

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<Graph {len(self._program.items)} items on {len(self.plan.queues)} queues, "
            f"{len(self._inputs)} inputs, {state}>"
        )

    def statistics(self) -> GraphStatistics:
        return GraphStatistics(
            items=len(self._program.items),
            queues=len(self.plan.queues),
            replays=self.replays,
            in_flight=self.in_flight,
        )

    async def __call__(
        self, inputs: Sequence[Buffer] = (), var_vals: Mapping[Var, int] | None = None
    ) -> None:
        _jit.check_graph_call()
        program = self._program
        ops = self._bind(inputs, var_vals)
        sub = program.submit(ops)
        self.replays += 1
        self.in_flight += 1
        try:
            await self._runtime._await(program, sub)
        finally:
            self.in_flight -= 1

    def _bind(self, inputs: Sequence[Buffer], var_vals: Mapping[Var, int] | None) -> Any:
        if self._closed:
            raise ClosedError(f"{self!r} was closed with aclose(); compile a new graph")
        self._runtime.check_open()
        inputs = tuple(inputs)
        last = self._last_inputs
        same_inputs = (
            last is not None
            and len(last) == len(inputs)
            and all(a is b for a, b in zip(last, inputs))
            and not any(b.freed for b in inputs)
        )
        if not same_inputs:
            self._check_inputs(inputs)
        values = var_vals if var_vals is not None else {}
        if same_inputs and values == self._last_vars:
            return self._last_ops
        checked = check_var_vals(self._program.free_vars, values, "this graph")
        ops = self._program.bind(inputs, checked)
        self._last_inputs, self._last_vars, self._last_ops = inputs, dict(values), ops
        return ops

    def _check_inputs(self, inputs: tuple[Buffer, ...]) -> None:
        expected = self._inputs
        if len(inputs) != len(expected):
            raise InputError(
                f"graph was compiled with {len(expected)} inputs but was called with "
                f"{len(inputs)}; pass one buffer per input, in compile() order"
            )
        by_alloc: dict[int, list[tuple[int, Buffer]]] = {}
        for i, (new, old) in enumerate(zip(inputs, expected)):
            if not isinstance(new, Buffer):
                raise InputError(f"input {i} must be a Buffer, got {new!r}")
            new.check_live(f"input {i}: ")
            if new.device != old.device:
                raise InputError(
                    f"input {i} is on {new.device} but the graph was compiled for one on "
                    f"{old.device}; copy it to {old.device} first"
                )
            if new.dtype != old.dtype:
                raise InputError(
                    f"input {i} has dtype {new.dtype} but the graph was compiled for "
                    f"{old.dtype}"
                )
            if new.shape != old.shape:
                raise InputError(
                    f"input {i} has shape {new.shape} but the graph was compiled for "
                    f"{old.shape}"
                )
            for j, other in by_alloc.get(new.alloc_id, ()):
                if new.overlaps(other):
                    raise InputError(
                        f"inputs {j} and {i} share memory ({other!r} and {new!r}); the plan "
                        f"assumes distinct inputs: pass separate buffers"
                    )
            by_alloc.setdefault(new.alloc_id, []).append((i, new))
            for internal in self._internal.get(new.alloc_id, ()):
                if new.overlaps(internal):
                    raise InputError(
                        f"input {i} {new!r} shares memory with {internal!r}, which the graph "
                        f"uses internally; pass a buffer the graph does not touch"
                    )
        for buf in (b for bufs in self._internal.values() for b in bufs):
            buf.check_live("this graph uses ")

    async def aclose(self) -> None:
        """Refuse further calls. Replays already submitted still complete."""
        self._closed = True

    async def __aenter__(self) -> Graph:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
