"""What a caller holds of a submission, and where it runs: a submission of a program
(a replay, an eager item, a host copy) runs where it is made when it can (`run_here`),
else is posted; its caller holds it as a Submitted (a graph's Replay is one), and a
graph counts its replays (ReplayCounts). `check_var_vals` checks the var values a call
gives against those its items need."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from actorgraph.devices import NOT_RUN, NotRun, Ran

from ._errors import VarError
from ._program import Bound, Program, raise_failure, raise_item_failure
from ._vars import Var

if TYPE_CHECKING:
    from actorgraph.devices import Submission


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


def run_here(bound: Bound, posted: bool = False, quiet: bool = False) -> Ran | NotRun:
    """Where a submission of `bound` runs (a replay, an eager item, a host copy), decided
    for all of them in this one place: here and now, as one run of calls (its LinearRun),
    when its items all run inline, the caller does not need the actors (`posted`: a
    profile, a check), (`quiet`) it moves no signal that a task waits on, and its queues
    are idle and its devices done with earlier work. Returns its first failure or None
    then; else NOT_RUN, having done nothing: the caller posts it (`Program.submit`). It
    takes no room in the in-flight window (it is never in flight), so a full window does
    not hold it back."""
    linear = bound.linear
    if linear is None or posted or (quiet and not linear.quiet()):
        return NOT_RUN
    return linear.run()


class ReplayCounts:
    """A graph's replays as they happen: those finished (`done`, whether they ran where
    they were called or were posted) and the submissions of those in flight. Its runtime
    keeps every graph's, and adds them up for its own statistics."""

    __slots__ = ("done", "in_flight")

    def __init__(self) -> None:
        self.done = 0
        self.in_flight: set[Submission] = set()


class Submitted:
    """A submission of `program` that its caller does not wait for (a replay, a host
    copy): posted as `sub`, or (None) run where it was submitted (`run_here`), with `ran`
    its failure or None. `await it.wait()` returns once it is complete (or raises its
    failure)."""

    __slots__ = ("_program", "_ran", "_sub")

    def __init__(self, program: Program, sub: Submission | None, ran: Ran = None) -> None:
        self._program = program
        self._sub = sub
        self._ran = ran

    @property
    def done(self) -> bool:
        """Whether it is complete (finished or failed)."""
        return self._sub is None or self._sub.done.is_set()

    async def wait(self) -> None:
        """Wait until it is complete (a checkpoint, even when it is already).

        Raises:
            ItemError: an item raised; the original error is its `__cause__`.
            ClosedError: the runtime closed, or a worker it used was lost.
            DeadlockError: the runtime found its waits can never be met.
        """
        if self._sub is None:
            await trio.lowlevel.checkpoint()
        else:
            await self._sub.done.wait()
        self.finish()

    async def wait_here(self) -> None:
        """Wait until its jobs on this host's devices are done (a worker's may still run):
        what it reads or writes of this host's memory is read or written then. Raises its
        failure if it is done by then and failed; a later `wait` raises it otherwise."""
        sub = self._sub
        if sub is None or sub.done.is_set():
            await self.wait()
            return
        here = [
            (sub.timelines[d], sub.tickets[d])
            for d, device in enumerate(self._program.devices)
            if not device.host_io and sub.timelines[d].value < sub.tickets[d]
        ]
        if not here:
            return
        reached = trio.Event()
        left = [len(here)]

        def one_more() -> None:
            left[0] -= 1
            if not left[0]:
                reached.set()

        for timeline, ticket in here:
            timeline.when(ticket, one_more)
        sub.when_done(lambda _: reached.set())  # failed from outside: timelines stay
        await reached.wait()
        if sub.done.is_set():
            self.finish()

    def finish(self) -> None:
        """Raise the failure of a submission that is done (nothing if it succeeded)."""
        if self._sub is not None:
            raise_failure(self._program, self._sub)
        elif self._ran is not None:
            raise_item_failure(self._program, self._ran)
