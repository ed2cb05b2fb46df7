"""A runtime's graphs: items checked, planned and lowered once (`Graphs.compile`), and
every graph's replays counted as they happen.

`Runtime.compile` is the public call (its docstring says what a user sees). The checks
of a list of items and the kernel builds that precede lowering are shared with eager
work (_eager.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from actorgraph.devices import Device, RemoteConnectionError
from actorgraph.scheduler import Plan, build_plan, list_schedule_order

from ._await import described, listed
from ._buffer import Buffer
from ._collector import collector_paused
from ._errors import ClosedError, InputError, UsageError
from ._graph import Graph, GraphHost
from ._kernel import Copy, Item, Kernel, Launch
from ._log import logger as _log
from ._options import check_max_sizes
from ._program import Program, check_item, plan_items
from ._submitted import ReplayCounts, check_var_vals


def checked_items(runtime: GraphHost, items: Sequence[Item], call: str) -> list[Item]:
    """The items of `call` (a run or a compile), each a Launch or Copy of live buffers
    that `runtime` made. Raises UsageError naming the first that is not."""
    checked = []
    takes = f"{call}(items) takes a list of items (ag.Launch, ag.Copy)"
    for i, item in enumerate(listed(items, takes, f"`{call}([item, ...])`")):
        if isinstance(item, (Launch, Copy)):
            for buf in item.bufs:
                if buf.runtime is not runtime:  # the message is made only for the error
                    runtime.check_own(buf, f"item {i} ({item.label}): buffer ")
        checked.append(check_item(item, i))
    return checked


def slow_builds(items: Sequence[Item]) -> list[tuple[Device, list[Any]]]:
    """Per device, the kernels of `items` that would compile slowly on first lowering
    (NVRTC for CUDA)."""
    wanted: dict[Device, set[Kernel]] = {}
    for item in items:
        if isinstance(item, Launch) and item.bufs:
            device = item.bufs[0].device_object
            if not device.builds_kernels:
                continue
            kernels = wanted.get(device)
            if kernels is None:
                kernels = wanted[device] = set()
            kernels.add(item.kernel)
    builds = [(device, device.slow_builds(kernels)) for device, kernels in wanted.items()]
    return [(device, slow) for device, slow in builds if slow]


async def build_slow(builds: Sequence[tuple[Device, list[Any]]]) -> None:
    """Build `slow_builds`' kernels on a worker thread, so the runtime's other work goes
    on meanwhile."""
    for device, slow in builds:
        await trio.to_thread.run_sync(device.build_kernels, slow)


@attrs.frozen
class _Planned:
    """A compile's checked items and inputs, the inputs' size limits (elements, and the
    bytes the plan gives them), and the plan."""

    items: list[Item]
    inputs: list[Buffer]
    limits: dict[int, int]
    widen: dict[Buffer, int]
    plan: Plan


class Graphs:
    """A runtime's graphs: compiled from items (`compile`), and counted as they replay
    (each graph's ReplayCounts, kept from when it is made: `adopt`)."""

    def __init__(self, runtime: GraphHost, check_replays: int) -> None:
        """Graphs on `runtime`, each with its first `check_replays` replays checked."""
        self._runtime = runtime
        self._checks = check_replays
        self._counts: list[ReplayCounts] = []

    def adopt(self, counts: ReplayCounts) -> int:
        """A graph was made on this runtime: keep its replay counts (the runtime's are
        their sums); return its number in profiles (0, 1, ...)."""
        self._counts.append(counts)
        return len(self._counts) - 1

    @property
    def compiled(self) -> int:
        return len(self._counts)

    @property
    def replays(self) -> int:
        """Replays submitted: those finished and those in flight, over every graph."""
        return sum(c.done + len(c.in_flight) for c in self._counts)

    @property
    def replays_done(self) -> int:
        """Replays finished, over every graph."""
        return sum(c.done for c in self._counts)

    async def compile(
        self,
        items: Sequence[Item],
        inputs: Sequence[Buffer],
        verify: bool | None,
        aliasing: str,
        order: str,
        var_vals: Mapping[Any, int] | None,
        max_sizes: Sequence[int | None] | None,
    ) -> Graph:
        """`items` checked, planned and lowered onto the actors once, as a Graph that
        replays them with new `inputs` and var values (see Runtime.compile). Raises
        UsageError, InputError or VarError for what breaks a rule, naming it."""
        if order not in ("jit", "cost"):
            raise UsageError(f"compile(order=...) is 'jit' or 'cost', got {order!r}")
        if verify is None:
            verify = self._runtime.verify_plans
        # One pause of the collector for all the synchronous work: kernels that compile
        # slowly (CUDA's) are built between two, with the collector on.
        with collector_paused():
            planned = self._plan(items, inputs, verify, max_sizes)
            builds = slow_builds(planned.items)
            if not builds:
                return self._graph(planned, verify, aliasing, order, var_vals)
        await build_slow(builds)
        with collector_paused():
            return self._graph(planned, verify, aliasing, order, var_vals)

    def _plan(
        self,
        items: Sequence[Item],
        inputs: Sequence[Buffer],
        verify: bool,
        max_sizes: Sequence[int | None] | None,
    ) -> _Planned:
        runtime = self._runtime
        checked = checked_items(runtime, items, "rt.compile")
        if not checked:
            raise UsageError("compile() got no items; a graph needs at least one Launch or Copy")
        for device in {buf.device_object for item in checked for buf in item.bufs}:
            try:
                device.check_reachable()
            except RemoteConnectionError as exc:
                raise ClosedError(f"compile for {device.name}: {exc}") from exc
        roots = self._inputs(inputs)
        limits = check_max_sizes(roots, max_sizes)
        widen = {roots[i]: n * roots[i].dtype.itemsize for i, n in limits.items()}
        plan = build_plan(plan_items(checked, widen), runtime.caps)
        if verify:
            plan.verify()
        return _Planned(checked, roots, limits, widen, plan)

    def _inputs(self, inputs: Sequence[Buffer]) -> list[Buffer]:
        """A compile's inputs: live, distinct Buffers of this runtime."""
        takes = "compile(..., inputs=...) takes a list of Buffers"
        roots = list(listed(inputs, takes, "`rt.compile(items, inputs=[x, ...])`"))
        for i, buf in enumerate(roots):
            if not isinstance(buf, Buffer):
                raise UsageError(f"input {i} must be a Buffer, got {described(buf)}")
            self._runtime.check_own(buf, f"input {i}: ")
            buf.check_live(f"input {i}: ")
            for j, other in enumerate(roots[:i]):
                if buf.overlaps(other):
                    raise InputError(
                        f"inputs {j} and {i} share memory ({other!r} and {buf!r}); the plan "
                        f"assumes distinct inputs: pass separate buffers"
                    )
        return roots

    def _graph(
        self,
        planned: _Planned,
        verify: bool,
        aliasing: str,
        order: str,
        var_vals: Mapping[Any, int] | None,
    ) -> Graph:
        """The plan lowered onto the actors (list-scheduled first for order="cost")."""
        runtime = self._runtime
        program = Program(
            runtime, planned.items, planned.inputs, planned.plan, max_sizes=planned.limits
        )
        if order == "cost":
            program = self._cost_ordered(program, var_vals, planned.widen)
            if verify:
                program.plan.verify()
        if _log.isEnabledFor(logging.DEBUG):  # counting the waits walks the whole plan
            _log.debug(
                "compiled %d items onto %d queues with %d cross-queue waits",
                len(planned.items),
                len(program.plan.queues),
                program.plan.wait_count,
            )
        return Graph(runtime, program, aliasing=aliasing, checks=self._checks)

    def _cost_ordered(
        self, program: Program, var_vals: Mapping[Any, int] | None, widen: Mapping[Buffer, int]
    ) -> Program:
        runtime = self._runtime
        values = check_var_vals(program.free_vars, var_vals, "compile(order='cost')")
        ops = program.bind(program.inputs, values).ops
        durations = []
        for j in range(len(program.items)):
            qi, pos = program.where[j]
            device = runtime.device(program.plan.queues[qi].device)
            durations.append(device.estimate_seconds(ops[qi][pos]))
        order = list_schedule_order(program.plan, durations)
        items = [program.items[j] for j in order]
        plan = build_plan(plan_items(items, widen), runtime.caps)
        return Program(
            runtime, items, program.inputs, plan, item_numbers=order, max_sizes=program.max_sizes
        )
