"""Lower bounds on a plan's makespan, given how long each item takes.

Pure: the durations are plain floats that the caller computed (a cost model lives with
the devices, not here). No schedule of the same items on the same queues can finish
sooner than any of these bounds:

- critical path: the longest chain of data dependencies (read after write, write after
  read, write after write, by byte range), summing item durations along it;
- busiest queue: the most work any one queue has to do, since a queue runs one item at
  a time;
- queue window: each queue as one machine whose items have release times (the longest
  dependency chain before each, its head) and delivery times (the longest chain after
  it, its tail): any set of the queue's items needs its earliest head, plus its work,
  plus its shortest tail. The largest such sum, over all sets, is the optimum of the
  preemptive relaxation, which Jackson's schedule finds (run the released item with the
  longest tail first). It is at least the busiest-queue bound, and it sees what the
  other two miss: a pipeline's fill and drain, and a stage that must do all its forward
  and backward work while the micro-batches it finishes last still have the rest of the
  pipeline (and an all-reduce) ahead of them;
- busiest link and link window, where the caller says which shared links each item
  crosses and for how long it would hold each at the link's full bandwidth (copies
  between the GPUs of a simulated cluster: a GPU's port, a node's NIC). A link carries
  one link-second of bytes per second whoever shares it, so its work bounds the
  makespan like a queue's, and its window like a queue's window. An item's time on its
  links comes at the end of its duration (a copy's latency first, then its bytes), so
  in the window its link work is released that much after the item can start.
"""

from __future__ import annotations

import heapq
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


def _window(
    members: Sequence[int], work: Sequence[float], head: Sequence[float], tail: Sequence[float]
) -> float:
    """The one-machine bound for `members` on one queue (or link): each can start no
    sooner than its head, needs its work on the machine, and is followed by its tail.

    Jackson's preemptive schedule (at every moment run, of the released members, the one
    with the longest tail) is optimal for the preemptive relaxation, so its largest
    end + tail bounds every schedule; it equals the largest, over subsets of the members,
    of their earliest head + their work + their shortest tail (so it is at least the
    whole queue's earliest head + its work + its shortest tail).
    """
    order = sorted(members, key=lambda j: head[j])
    ready: list[tuple[float, int]] = []  # (-tail, item): the longest tail first
    left = {j: work[j] for j in order}
    best = 0.0
    now = 0.0
    k = 0
    while k < len(order) or ready:
        if not ready and head[order[k]] > now:
            now = head[order[k]]
        while k < len(order) and head[order[k]] <= now:
            heapq.heappush(ready, (-tail[order[k]], order[k]))
            k += 1
        _, j = ready[0]
        release = head[order[k]] if k < len(order) else math.inf
        if now + left[j] <= release:
            heapq.heappop(ready)
            now += left[j]
            best = max(best, now + tail[j])
        else:  # run it until the next release, which may have a longer tail
            left[j] -= release - now
            now = release
    return best


def _widest_window(
    members: dict[str, list[int]],
    work: dict[str, list[float]],
    head: Sequence[float],
    tail: Sequence[float],
) -> tuple[float, str]:
    """The largest window over named machines; `work[name][j]` is item j's work on it."""
    best, best_name = 0.0, ""
    for name in sorted(members):
        window = _window(members[name], work[name], head, tail)
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
    cover each of them, and the longest ends it (what comes before is its latency).
    """
    check_durations(plan, durations, "lower_bounds")
    if link_use is not None:
        check_link_use(plan, link_use)
    deps = item_dependencies(plan.items)
    head, parent = _heads(deps, durations)
    tail = _tails(deps, durations)
    critical, chain = _critical_chain(head, parent, durations)
    busiest, busiest_name, window, window_name = _queue_bounds(plan, durations, head, tail)
    link, link_name, link_window, link_window_name = _link_bounds(
        link_use or (), durations, head, tail
    )
    return Bounds(
        critical_path=critical,
        busiest_queue=busiest,
        busiest_queue_name=busiest_name,
        queue_window=window,
        queue_window_name=window_name,
        critical_items=chain,
        busiest_link=link,
        busiest_link_name=link_name,
        link_window=link_window,
        link_window_name=link_window_name,
    )


def _heads(
    deps: Sequence[Sequence[int]], durations: Sequence[float]
) -> tuple[list[float], list[int]]:
    """head[j]: the earliest start of item j (the longest chain before it), and parent[j]:
    the dependency that ends last before it (-1 where none). Jit order is a topological
    order: an item only depends on earlier ones."""
    head = [0.0] * len(deps)
    parent = [-1] * len(deps)
    for j, before in enumerate(deps):
        for d in before:
            done = head[d] + durations[d]
            if done > head[j]:
                head[j] = done
                parent[j] = d
    return head, parent


def _tails(deps: Sequence[Sequence[int]], durations: Sequence[float]) -> list[float]:
    """tail[j]: the longest chain that must still run after item j finishes."""
    tail = [0.0] * len(deps)
    for j in range(len(deps) - 1, -1, -1):
        after = tail[j] + durations[j]
        for d in deps[j]:
            if after > tail[d]:
                tail[d] = after
    return tail


def _critical_chain(
    head: Sequence[float], parent: Sequence[int], durations: Sequence[float]
) -> tuple[float, tuple[int, ...]]:
    """The critical path's length and its items, first to last."""
    critical = 0.0
    last = -1
    for j, start in enumerate(head):
        if start + durations[j] > critical:
            critical = start + durations[j]
            last = j
    chain: list[int] = []
    while last >= 0:
        chain.append(last)
        last = parent[last]
    return critical, tuple(reversed(chain))


def _queue_bounds(
    plan: Plan, durations: Sequence[float], head: Sequence[float], tail: Sequence[float]
) -> tuple[float, str, float, str]:
    """The busiest queue's work and the widest queue window, each with its queue's name
    (0 and "" for a plan without queues)."""
    nqueues = len(plan.queues)
    work = [0.0] * nqueues
    on_queue: list[list[int]] = [[] for _ in range(nqueues)]
    for j, qi in enumerate(plan.item_queue):
        work[qi] += durations[j]
        on_queue[qi].append(j)
    if not nqueues:
        return 0.0, "", 0.0, ""
    busiest = max(range(nqueues), key=lambda q: work[q])
    window = [_window(on_queue[q], durations, head, tail) for q in range(nqueues)]
    widest = max(range(nqueues), key=lambda q: window[q])
    return work[busiest], str(plan.queues[busiest]), window[widest], str(plan.queues[widest])


def _link_bounds(
    link_use: LinkUse, durations: Sequence[float], head: Sequence[float], tail: Sequence[float]
) -> tuple[float, str, float, str]:
    """The busiest link's work and the widest link window, each with its link's name
    (0 and "" where no item crosses a link)."""
    count = len(durations)
    link_work: dict[str, list[float]] = {}
    link_items: dict[str, list[int]] = {}
    for j, uses in enumerate(link_use):
        for name, seconds in uses:
            if name not in link_work:
                link_work[name] = [0.0] * count
                link_items[name] = []
            link_work[name][j] += seconds
            link_items[name].append(j)
    link_total = {name: sum(seconds) for name, seconds in link_work.items()}
    busiest = max(sorted(link_total), key=lambda name: link_total[name], default="")
    # An item's bytes start moving once the rest of its duration (its latency) is over.
    released = list(head)
    for j, uses in enumerate(link_use):
        if uses:
            released[j] += max(0.0, durations[j] - max(seconds for _, seconds in uses))
    window, window_name = _widest_window(link_items, link_work, released, tail)
    return link_total.get(busiest, 0.0), busiest, window, window_name
