"""What a program reads of its op templates' waits and signals, once, when it is made.

A `Program` (_program.py) lowers its plan to an op template per queue (None where an
item's op is lowered per call). Two things follow from the templates' waits and signals
alone, each found by walking them (an `OpWalker`, devices/_walk.py, which refuses an op
it does not know), once:

- `linear_order`: an order one task can run every item in, each queue's waits met by
  the queues before it (what a `LinearRun` runs, devices/_linear.py);
- `mark_host_signals`: which signals an actor waits on through the trio side, so GPU
  queues tell the host of those alone.

Both compare values relative to one submission's bases (every queue's waits and signals
of a submission share them), so they read `rel` where a job reads `target(bases)`.
"""

from __future__ import annotations

from collections.abc import Sequence

from actorgraph.devices import (
    FIRST_QUEUE_SLOT,
    Op,
    OpWalker,
    QueueActor,
    SignalOp,
    WaitOp,
    WorkOp,
    signal_op,
)

Template = list[Op | None]


def linear_order(templates: Sequence[Template]) -> tuple[tuple[int, int], ...] | None:
    """Every item op of the templates as (queue, op index), in an order one task can run
    them in: each queue runs until a wait on another queue of the plan is not yet
    signalled, then the next queue runs (waits for the kick and the devices' earlier
    work are taken as reached: the caller checks those). None if no order finishes,
    which a verified plan never does.

    Raises OpCodeError for an op that is none of the op format's."""
    walk = _LinearOrder(len(templates))
    at = [0] * len(templates)
    moved = True
    while moved:
        moved = False
        for q, ops in enumerate(templates):
            walk.queue = q
            i = walk.walk(ops, at[q])
            if i != at[q]:
                at[q] = i
                moved = True
    if any(at[q] < len(ops) for q, ops in enumerate(templates)):
        return None
    return tuple(walk.order)


def mark_host_signals(actors: Sequence[QueueActor], templates: Sequence[Template]) -> None:
    """Flag each SIGNAL of `templates` (one per queue, run by `actors`) by whether an
    actor waits on it through the trio side: the first signal at or past each such
    wait's value. GPU queues report only those (and job ends) to the host, so their
    streams do not stop for host callbacks that nobody needs.

    Raises OpCodeError for an op that is none of the op format's."""
    walk = _HostWaits(actors)
    for queue, ops in enumerate(templates):
        walk.queue = queue
        walk.walk(ops)
    for queue, ops in enumerate(templates):
        pending = sorted(walk.values[queue])
        for index, op in walk.signals[queue]:
            reached = 0
            while reached < len(pending) and pending[reached] <= op.rel:
                reached += 1
            ops[index] = signal_op(op.signal, op.slot, op.rel, reached > 0)
            del pending[:reached]


class _LinearOrder(OpWalker):
    """Walks the templates queue by queue (`queue`: the one walked now), each as far as
    its waits on the plan's queues are signalled by what was walked before; the item ops
    in the order walked (`order`: queue, op index)."""

    taker = "a program's linear order"

    def __init__(self, nqueues: int) -> None:
        super().__init__("the linear order of a program")
        self.nqueues = nqueues
        self.signalled = [0] * nqueues
        self.order: list[tuple[int, int]] = []
        self.queue = 0

    def wait(self, op: WaitOp, index: int) -> bool:
        src = op.slot - FIRST_QUEUE_SLOT
        return not (0 <= src < self.nqueues and self.signalled[src] < op.rel)

    def signal(self, op: SignalOp, index: int) -> None:
        self.signalled[self.queue] = max(self.signalled[self.queue], op.rel)

    def work(self, op: WorkOp, index: int) -> bool:
        self.order.append((self.queue, index))
        return True

    def later(self, index: int) -> bool:
        self.order.append((self.queue, index))
        return True


class _HostWaits(OpWalker):
    """Per queue, the values of its signal an actor waits for through the trio side
    (`values`), from the waits of every queue's template (`queue`: the one walked now),
    and its signals, by op index (`signals`)."""

    taker = "a program's signals"

    def __init__(self, actors: Sequence[QueueActor]) -> None:
        super().__init__("the host waits of a program")
        self.actors = actors
        self.values: list[list[int]] = [[] for _ in actors]
        self.signals: list[list[tuple[int, SignalOp]]] = [[] for _ in actors]
        self.queue = 0

    def wait(self, op: WaitOp, index: int) -> bool:
        src = op.slot - FIRST_QUEUE_SLOT
        actors = self.actors
        if 0 <= src < len(actors) and not actors[self.queue].waits_without_host(actors[src]):
            self.values[src].append(op.rel)
        return True

    def signal(self, op: SignalOp, index: int) -> None:
        self.signals[self.queue].append((index, op))

    def later(self, index: int) -> bool:
        return True
