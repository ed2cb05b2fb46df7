"""Check a Plan on its own terms: it cannot deadlock and no two conflicting accesses race.

The verifier does not trust the planner's bookkeeping. It executes the message lists
abstractly (every queue runs until it blocks on a Wait), derives happens-before from the
waits it saw satisfied, and then replays the items' memory accesses in jit-cache order,
checking each conflicting pair against that order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import PlanDeadlockError, PlanRaceError
from ._messages import Run, Signal, SyncDevice, Wait
from ._ranges import RangeTracker

if TYPE_CHECKING:
    from ._plan import Plan

_Clock = dict[int | tuple[str, str], int]


def verify_plan(plan: Plan) -> None:
    clocks = _simulate(plan)
    _check_runs(plan, clocks)
    _check_races(plan, clocks)


def _simulate(plan: Plan) -> dict[int, _Clock]:
    """Run every queue as far as it can; return the clock each item ran with."""
    sim = _Simulation(plan)
    progress = True
    while progress:
        progress = False
        for qi in range(len(plan.programs)):
            if sim.run(qi):
                progress = True
    blocked = [qi for qi in range(len(plan.queues)) if sim.pc[qi] < len(plan.programs[qi])]
    if blocked:
        raise PlanDeadlockError("plan deadlocks: " + _describe_cycle(plan, sim.pc, blocked))
    return sim.item_clock


class _Simulation:
    """The queues of a plan run abstractly: where each is (`pc`), the value it signalled,
    its vector clock, and the clocks it published with each signal."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.queue_index = {q: i for i, q in enumerate(plan.queues)}
        nqueues = len(plan.queues)
        self.pc = [0] * nqueues
        self.value = [0] * nqueues
        self.clock: list[_Clock] = [{} for _ in range(nqueues)]
        self.run_count = [0] * nqueues
        # (queue, signalled value) -> the clock the queue had when it signalled.
        self.published: list[list[tuple[int, _Clock]]] = [[] for _ in range(nqueues)]
        self.item_clock: dict[int, _Clock] = {}

    def run(self, qi: int) -> bool:
        """Run queue qi as far as it can; whether it moved."""
        program = self.plan.programs[qi]
        pc, clock = self.pc, self.clock
        moved = False
        while pc[qi] < len(program):
            msg = program[pc[qi]]
            if isinstance(msg, Wait):
                if not self._wait(qi, msg):
                    break
            elif isinstance(msg, Run):
                self.run_count[qi] += 1
                clock[qi][qi] = self.run_count[qi]
                self.item_clock[msg.item] = dict(clock[qi])
            elif isinstance(msg, Signal):
                self._signal(qi, msg)
            elif isinstance(msg, SyncDevice):
                clock[qi][("sync", msg.device)] = 1
            pc[qi] += 1
            moved = True
        return moved

    def _wait(self, qi: int, msg: Wait) -> bool:
        """Whether queue qi's wait is met (its clock then learns the waited queue's)."""
        src = self.queue_index.get(msg.queue)
        if src is None:
            raise PlanDeadlockError(
                f"{self.plan.queues[qi]} waits for {msg.queue}, which has no program"
            )
        if self.value[src] < msg.value:
            return False
        for signalled, snap in self.published[src]:
            if signalled >= msg.value:
                _merge(self.clock[qi], snap)
                break
        return True

    def _signal(self, qi: int, msg: Signal) -> None:
        queue = self.plan.queues[qi]
        if msg.value < self.value[qi]:
            raise PlanDeadlockError(
                f"{queue} signals {msg.value} after {self.value[qi]}: "
                "signal values must not go back"
            )
        if msg.value > self.run_count[qi]:
            raise PlanDeadlockError(
                f"{queue} signals {msg.value} after only {self.run_count[qi]} items ran: a "
                f"waiter would run too early"
            )
        self.value[qi] = msg.value
        self.published[qi].append((msg.value, dict(self.clock[qi])))


def _describe_cycle(plan: Plan, pc: list[int], blocked: list[int]) -> str:
    queue_index = {q: i for i, q in enumerate(plan.queues)}
    waits: dict[int, Wait] = {}
    for stuck in blocked:
        msg = plan.programs[stuck][pc[stuck]]
        if isinstance(msg, Wait):
            waits[stuck] = msg
    # Follow wait-for edges from the first blocked queue until one repeats.
    seen: list[int] = []
    at: int | None = blocked[0]
    while at is not None and at not in seen and at in waits:
        seen.append(at)
        at = queue_index.get(waits[at].queue)
    chain = seen[seen.index(at) :] if at is not None and at in seen else seen
    return ", ".join(
        f"{plan.queues[q]} waits for {waits[q].queue}>={waits[q].value}" for q in chain
    )


def _merge(into: _Clock, other: _Clock) -> None:
    for key, seen in other.items():
        if into.get(key, 0) < seen:
            into[key] = seen


def _check_runs(plan: Plan, clocks: dict[int, _Clock]) -> None:
    runs: dict[int, int] = {}
    for qi, program in enumerate(plan.programs):
        for msg in program:
            if isinstance(msg, Run):
                if msg.item in runs:
                    raise PlanRaceError(f"item {plan.describe_item(msg.item)} runs twice")
                runs[msg.item] = qi
    missing = [j for j in range(len(plan.items)) if j not in runs]
    if missing:
        raise PlanRaceError(f"items never run: {missing[:10]}")
    for j, item in enumerate(plan.items):
        for access in item.accesses:
            if not clocks[j].get(("sync", access.device)):
                raise PlanRaceError(
                    f"item {plan.describe_item(j)} touches {access.device} before its queue "
                    f"synchronised with that device's timeline"
                )


def _check_races(plan: Plan, clocks: dict[int, _Clock]) -> None:
    seq: dict[int, tuple[int, int]] = {}
    for j, c in clocks.items():
        qi = plan.item_queue[j]
        seq[j] = (qi, c[qi])

    def ordered(before: int, after: int) -> bool:
        qi, n = seq[before]
        return clocks[after].get(qi, 0) >= n

    tracker = RangeTracker()
    for j, item in enumerate(plan.items):
        for access in sorted(item.accesses, key=lambda a: a.write):
            for prev in tracker.access(access.alloc, access.start, access.stop, access.write, j):
                if not ordered(prev, j):
                    raise PlanRaceError(
                        f"items {plan.describe_item(prev)} and {plan.describe_item(j)} "
                        f"conflict on allocation {access.alloc} bytes "
                        f"[{access.start}, {access.stop}) but are not ordered"
                    )
