"""list_schedule_order (scheduler/_order.py): a topological order that avoids queue stalls."""

from __future__ import annotations

import pytest
from _plan_items import copy, kernel
from actorgraph.scheduler import (
    DeviceCaps,
    PlanError,
    build_plan,
    item_dependencies,
    list_schedule_order,
    lower_bounds,
)

CAPS = {name: DeviceCaps(name, "SIM", host_visible=False) for name in ("D0", "D1")}


def test_ready_work_goes_ahead_of_an_item_waiting_for_data() -> None:
    # D0 compute, in jit order: #2 needs D1's long kernel (via a copy), #3 does not.
    items = [kernel("D1", 1), copy("D0", 2, "D1", 1), kernel("D0", 3, 2), kernel("D0", 4)]
    durations = [5.0, 1.0, 1.0, 4.0]
    plan = build_plan(items, CAPS)
    order = list_schedule_order(plan, durations)
    assert set(order[:2]) == {0, 3}  # both start at once, on their own queues
    assert order[2:] == (1, 2)
    reordered = build_plan([items[j] for j in order], CAPS)
    reordered.verify()
    # In jit order D0 idles 6 s, then runs 1 + 4 s: 11 s. Reordered: max(4, 5 + 1 + 1) = 7 s,
    # which is the critical path.
    assert lower_bounds(plan, durations).best == 7.0


def test_order_is_topological_and_keeps_conflicting_pairs() -> None:
    items = [
        kernel("D0", 1),
        kernel("D0", 2, 1),
        kernel("D0", 1, 2),
        kernel("D1", 3),
        kernel("D0", 4),
    ]
    order = list_schedule_order(build_plan(items, CAPS), [1.0, 1.0, 1.0, 1.0, 9.0])
    position = {j: k for k, j in enumerate(order)}
    for j, deps in enumerate(item_dependencies(items)):
        assert all(position[d] < position[j] for d in deps)
    assert sorted(order) == list(range(len(items)))
    # The longest remaining chain goes first on a free queue.
    assert order[0] == 4 or order[1] == 4


def test_zero_durations_are_fine() -> None:
    items = [kernel("D0", 1), copy("D1", 2, "D0", 1), kernel("D1", 3, 2)]
    assert list_schedule_order(build_plan(items, CAPS), [0.0, 0.0, 0.0]) == (0, 1, 2)


def test_order_refuses_bad_durations() -> None:
    plan = build_plan([kernel("D0", 1)], CAPS)
    with pytest.raises(PlanError, match=r"one duration per item: the plan has 1 items, got 2"):
        list_schedule_order(plan, [1.0, 2.0])
    with pytest.raises(PlanError, match=r"must be seconds >= 0, got inf"):
        list_schedule_order(plan, [float("inf")])
