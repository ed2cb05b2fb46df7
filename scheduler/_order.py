"""A jit-cache order that list-schedules a plan's items, given how long each takes.

Queues run in order, and the planner keeps jit-cache order on each queue. When an item
waits for data from another queue, every later item of its queue waits too, even if its
own data is ready (head-of-line blocking). Given item durations (plain floats from the
caller), `list_schedule_order` simulates a list scheduler: whenever a queue is idle it
starts, among its items whose dependencies are done, the one with the longest remaining
chain (its duration plus the longest path after it). The order in which items start is a
topological order of the dependency DAG, so every pair of conflicting accesses keeps its
jit-cache order: the reordered jit cache computes the same results.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ._bounds import check_durations, item_dependencies
from ._errors import PlanError
from ._plan import Plan


def list_schedule_order(plan: Plan, durations: Sequence[float]) -> tuple[int, ...]:
    """Item indices in the order a list scheduler would start them on the plan's queues."""
    count = check_durations(plan, durations, "list_schedule_order")
    deps = item_dependencies(plan.items)
    successors: list[list[int]] = [[] for _ in range(count)]
    waiting = [len(d) for d in deps]
    for j, before in enumerate(deps):
        for d in before:
            successors[d].append(j)
    rank = _chain_ranks(successors, durations)
    nqueues = len(plan.queues)
    ready: list[list[tuple[float, int]]] = [[] for _ in range(nqueues)]
    free_at = [0.0] * nqueues
    running: list[tuple[float, int, int]] = []  # (finish time, start sequence, item)
    for j in range(count):
        if waiting[j] == 0:
            heapq.heappush(ready[plan.item_queue[j]], (-rank[j], j))
    order: list[int] = []
    now = 0.0
    while len(order) < count:
        # Finish everything due by now; that may make items of idle queues ready.
        while running and running[0][0] <= now:
            _, _, done = heapq.heappop(running)
            for s in successors[done]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    heapq.heappush(ready[plan.item_queue[s]], (-rank[s], s))
        if not _start_idle(now, ready, free_at, running, order, durations):
            if not running:
                raise PlanError("list_schedule_order: dependencies form a cycle")
            now = max(now, running[0][0])
    return tuple(order)


def _chain_ranks(successors: Sequence[Sequence[int]], durations: Sequence[float]) -> list[float]:
    """Per item, the longest chain from its start to the end: its priority (jit order is
    topological, so every successor comes later)."""
    rank = [0.0] * len(successors)
    for j in range(len(successors) - 1, -1, -1):
        rank[j] = durations[j] + max((rank[s] for s in successors[j]), default=0.0)
    return rank


def _start_idle(
    now: float,
    ready: list[list[tuple[float, int]]],
    free_at: list[float],
    running: list[tuple[float, int, int]],
    order: list[int],
    durations: Sequence[float],
) -> bool:
    """Each idle queue with a ready item starts the one of highest rank; whether any did."""
    started = False
    for q, queue_ready in enumerate(ready):
        if free_at[q] <= now and queue_ready:
            _, j = heapq.heappop(queue_ready)
            free_at[q] = now + durations[j]
            heapq.heappush(running, (free_at[q], len(order), j))
            order.append(j)
            started = True
    return started
