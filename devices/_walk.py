"""Walking a job's ops for what its waits and signals do, without running them.

What ops mean when they run is `step` (devices/_step.py). Others follow a job's order
without running it: the deadlock monitor runs pending jobs abstractly
(devices/_monitor.py), a program finds an order one task can run its queues' items in
and marks the signals the trio side waits on (actorgraph/_program.py), a connection
writes an op list as a worker's program entries and finds the copies it can ask for
ahead (devices/remote/_programs.py), a worker checks the ops it lowered a program to and
maps them back to the program's entries (actorgraph/worker/), and a CUDA queue turns a
job's ops into stream commands (devices/cuda/_translate.py).

Each is an `OpWalker`: `walk` hands every op, in order, to `wait` (a WaitOp), `signal`
(a SignalOp) or `work` (any other op: a `WorkOp`), and stops at an op whose `wait` or
`work` says so. An op of no code of the op format, or not of its code's shape, is
refused (`OpCodeError`, naming the op, its index and what walked it), never skipped; a
walker that takes only some kinds of work refuses the others with `refuse`, in the same
words.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import ClassVar

from ._ops import SIGNAL, WAIT, Op, OpCodeError, SignalOp, WaitOp, WorkOp, is_op, refuse_op


class OpWalker:
    """A walk over one op list's waits, signals and work (see the module's docstring).

    `who` names the walk in refusals (what walks which queue's ops); `taker` (a class
    attribute) says in them what takes the ops, e.g. "a CUDA queue".
    """

    taker: ClassVar[str] = "this walker"

    def __init__(self, who: str) -> None:
        self.who = who

    def walk(self, ops: Sequence[Op | None], at: int = 0) -> int:
        """Hand ops[at:] to `wait`, `signal` and `work` in order; return the index of the
        op where `wait` or `work` said to stop, else len(ops). None stands for a work op
        to be lowered later (a program's template): it goes to `later`.

        Raises OpCodeError for an op that is none of the op format's."""
        count = len(ops)
        while at < count:
            op = ops[at]
            if op is None:
                if not self.later(at):
                    return at
            elif not is_op(op):
                raise self.refuse(op, at)
            elif op.code == WAIT:
                if not self.wait(op, at):
                    return at
            elif op.code == SIGNAL:
                self.signal(op, at)
            elif not self.work(op, at):
                return at
            at += 1
        return at

    def wait(self, op: WaitOp, index: int) -> bool:
        """Op `index`, a wait: whether the walk goes on past it (by default, it does)."""
        return True

    def signal(self, op: SignalOp, index: int) -> None:
        """Op `index`, a signal (by default, nothing)."""

    def work(self, op: WorkOp, index: int) -> bool:
        """Op `index`, an op that runs something: whether the walk goes on past it (by
        default, it does)."""
        return True

    def later(self, index: int) -> bool:
        """Op `index` of a template, a work op to be lowered later: whether the walk goes
        on past it. By default it is refused: a job's ops are all lowered."""
        raise self.refuse(None, index)

    def refuse(self, op: object, index: int, takes: Collection[int] = ()) -> OpCodeError:
        """The error for op `index`, which this walk cannot take: no op of the op format,
        or else one of a code that `taker` does not run (it runs `takes`)."""
        return refuse_op(self.who, op, index, self.taker, takes)
