"""Lower bounds on a plan's makespan, given how long each item takes.

Pure: the durations are plain floats that the caller computed (a cost model lives with
the devices, not here). No schedule of the same items on the same queues can finish
sooner than any of these bounds:

- critical path: the longest chain of data dependencies (read after write, write after
  read, write after write, by byte range), summing item durations along it;
- busiest queue: the most work any one queue has to do, since a queue runs one item at
  a time;
- queue window: for each queue, the earliest any of its items can start (the longest
  dependency chain before it), plus the queue's work, plus the shortest chain that must
  still run after one of its items (one-machine relaxation with release and delivery
  times). It is at least the busiest-queue bound, and it sees a pipeline's fill and
  drain, which the other two miss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from ._errors import PlanError
from ._plan import Plan
from ._ranges import RangeTracker
from ._records import PlanItem


@attrs.frozen
class Bounds:
    """Lower bounds (seconds) for one plan under one set of item durations."""

    critical_path: float
    busiest_queue: float
    busiest_queue_name: str
    queue_window: float
    queue_window_name: str
    critical_items: tuple[int, ...]

    @property
    def best(self) -> float:
        """The tightest bound: the largest."""
        return max(self.critical_path, self.busiest_queue, self.queue_window)


def item_dependencies(items: Sequence[PlanItem]) -> list[tuple[int, ...]]:
    """For each item, the earlier items it must come after (conflicting byte ranges)."""
    tracker = RangeTracker()
    deps: list[tuple[int, ...]] = []
    for j, item in enumerate(items):
        found: set[int] = set()
        for access in sorted(item.accesses, key=lambda a: a.write):
            found |= tracker.access(access.alloc, access.start, access.stop, access.write, j)
        deps.append(tuple(sorted(found)))
    return deps


def check_durations(plan: Plan, durations: Sequence[float], what: str) -> int:
    """Check there is one finite duration >= 0 per item; return the item count."""
    count = len(plan.items)
    if len(durations) != count:
        raise PlanError(
            f"{what} needs one duration per item: the plan has {count} items, "
            f"got {len(durations)} durations"
        )
    for j, d in enumerate(durations):
        if not (isinstance(d, (int, float)) and 0 <= d < math.inf):
            raise PlanError(
                f"duration of item {plan.describe_item(j)} must be seconds >= 0, got {d!r}"
            )
    return count


def lower_bounds(plan: Plan, durations: Sequence[float]) -> Bounds:
    """Bounds on the makespan of `plan` when item j takes `durations[j]` seconds."""
    count = check_durations(plan, durations, "lower_bounds")
    deps = item_dependencies(plan.items)

    # head[j]: earliest start of j; finish[j] = head[j] + durations[j]. Jit order is a
    # topological order (an item only depends on earlier ones).
    head = [0.0] * count
    parent = [-1] * count
    for j in range(count):
        for d in deps[j]:
            done = head[d] + durations[d]
            if done > head[j]:
                head[j] = done
                parent[j] = d
    # tail[j]: the longest chain that must still run after j finishes.
    tail = [0.0] * count
    for j in range(count - 1, -1, -1):
        after = tail[j] + durations[j]
        for d in deps[j]:
            if after > tail[d]:
                tail[d] = after

    critical = 0.0
    last = -1
    for j in range(count):
        if head[j] + durations[j] > critical:
            critical = head[j] + durations[j]
            last = j
    chain: list[int] = []
    while last >= 0:
        chain.append(last)
        last = parent[last]

    nqueues = len(plan.queues)
    work = [0.0] * nqueues
    first_start = [math.inf] * nqueues
    last_tail = [math.inf] * nqueues
    for j in range(count):
        qi = plan.item_queue[j]
        work[qi] += durations[j]
        first_start[qi] = min(first_start[qi], head[j])
        last_tail[qi] = min(last_tail[qi], tail[j])
    busiest = max(range(nqueues), key=lambda q: work[q], default=-1)
    # Every queue of a plan has at least one item, so its start and tail are finite.
    window = [first_start[q] + work[q] + last_tail[q] for q in range(nqueues)]
    widest = max(range(nqueues), key=lambda q: window[q], default=-1)
    return Bounds(
        critical_path=critical,
        busiest_queue=work[busiest] if busiest >= 0 else 0.0,
        busiest_queue_name=str(plan.queues[busiest]) if busiest >= 0 else "",
        queue_window=window[widest] if widest >= 0 else 0.0,
        queue_window_name=str(plan.queues[widest]) if widest >= 0 else "",
        critical_items=tuple(reversed(chain)),
    )
