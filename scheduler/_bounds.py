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
  drain, which the other two miss;
- busiest link and link window, where the caller says which shared links each item
  crosses and for how long it would hold each at the link's full bandwidth (copies
  between the GPUs of a simulated cluster: a GPU's port, a node's NIC). A link carries
  one link-second of bytes per second whoever shares it, so its work bounds the
  makespan like a queue's, and so does its window (the earliest its first item can
  start, its work, the shortest chain after one of its items).
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
    """Lower bounds (seconds) for one plan under one set of item durations (and, where
    the caller gave them, the links its items share: else the link bounds are 0)."""

    critical_path: float
    busiest_queue: float
    busiest_queue_name: str
    queue_window: float
    queue_window_name: str
    critical_items: tuple[int, ...]
    busiest_link: float = 0.0
    busiest_link_name: str = ""
    link_window: float = 0.0
    link_window_name: str = ""

    @property
    def best(self) -> float:
        """The tightest bound: the largest."""
        return max(
            self.critical_path,
            self.busiest_queue,
            self.queue_window,
            self.busiest_link,
            self.link_window,
        )

    @property
    def binding(self) -> str:
        """Which bound is the tightest, and on what: 'critical path', 'queue window on
        SIM:3/copy', 'link window on node 0 NIC 3 out', ..."""
        named = [
            (self.critical_path, "critical path"),
            (self.busiest_queue, f"busiest queue {self.busiest_queue_name}"),
            (self.queue_window, f"queue window on {self.queue_window_name}"),
            (self.busiest_link, f"busiest link {self.busiest_link_name}"),
            (self.link_window, f"link window on {self.link_window_name}"),
        ]
        return max(named, key=lambda pair: pair[0])[1]


def item_dependencies(items: Sequence[PlanItem]) -> list[tuple[int, ...]]:
    """For each item, the earlier items it must come after (conflicting byte ranges)."""
    tracker = RangeTracker()
    return [tuple(sorted(tracker.item(item.accesses, j))) for j, item in enumerate(items)]


LinkUse = Sequence[Sequence[tuple[str, float]]]


def check_link_use(plan: Plan, link_use: LinkUse) -> None:
    """One list of (link name, seconds >= 0) per item."""
    if len(link_use) != len(plan.items):
        raise PlanError(
            f"lower_bounds needs one list of (link, seconds) per item: the plan has "
            f"{len(plan.items)} items, got {len(link_use)} lists"
        )
    for j, uses in enumerate(link_use):
        for use in uses:
            if (
                not isinstance(use, tuple)
                or len(use) != 2
                or not isinstance(use[0], str)
                or not isinstance(use[1], (int, float))
                or not 0 <= use[1] < math.inf
            ):
                raise PlanError(
                    f"link use of item {plan.describe_item(j)} must be (link name, seconds "
                    f">= 0) pairs, got {use!r}"
                )


def _widest_window(
    members: dict[str, list[int]],
    work: dict[str, float],
    head: Sequence[float],
    tail: Sequence[float],
) -> tuple[float, str]:
    """The largest (earliest start + work + shortest tail) over named machines."""
    best, best_name = 0.0, ""
    for name in sorted(members):
        items = members[name]
        window = min(head[j] for j in items) + work[name] + min(tail[j] for j in items)
        if window > best:
            best, best_name = window, name
    return best, best_name


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


def lower_bounds(plan: Plan, durations: Sequence[float], link_use: LinkUse | None = None) -> Bounds:
    """Bounds on the makespan of `plan` when item j takes `durations[j]` seconds.

    `link_use[j]`, if given, lists the shared links item j crosses as (link name,
    seconds it would hold the link at the link's full bandwidth); its duration must
    cover each of them.
    """
    count = check_durations(plan, durations, "lower_bounds")
    if link_use is not None:
        check_link_use(plan, link_use)
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
    link_work: dict[str, float] = {}
    link_items: dict[str, list[int]] = {}
    for j, uses in enumerate(link_use or ()):
        for name, seconds in uses:
            link_work[name] = link_work.get(name, 0.0) + seconds
            link_items.setdefault(name, []).append(j)
    busiest_link = max(sorted(link_work), key=lambda name: link_work[name], default="")
    link_window, link_window_name = _widest_window(link_items, link_work, head, tail)
    return Bounds(
        critical_path=critical,
        busiest_queue=work[busiest] if busiest >= 0 else 0.0,
        busiest_queue_name=str(plan.queues[busiest]) if busiest >= 0 else "",
        queue_window=window[widest] if widest >= 0 else 0.0,
        queue_window_name=str(plan.queues[widest]) if widest >= 0 else "",
        critical_items=tuple(reversed(chain)),
        busiest_link=link_work.get(busiest_link, 0.0),
        busiest_link_name=busiest_link,
        link_window=link_window,
        link_window_name=link_window_name,
    )
