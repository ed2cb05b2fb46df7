"""Lower bounds on a plan's makespan (scheduler/_bounds.py): pure, on hand-made plans."""

from __future__ import annotations

import pytest
from _plan_items import copy, kernel
from actorgraph.scheduler import (
    Access,
    DeviceCaps,
    ItemKind,
    PlanError,
    PlanItem,
    build_plan,
    item_dependencies,
    lower_bounds,
)

CAPS = {name: DeviceCaps(name, "SIM", host_visible=False) for name in ("D0", "D1", "D2")}


def test_dependencies_follow_byte_ranges() -> None:
    items = [
        kernel("D0", 1),
        kernel("D0", 2, 1),  # reads 1 after its write
        kernel("D0", 1),  # write after read of 1, and after write
        PlanItem("half", ItemKind.EXEC, "D0", (Access("D0", 3, 0, 8, True),)),
        PlanItem("other half", ItemKind.EXEC, "D0", (Access("D0", 3, 8, 16, True),)),
    ]
    assert item_dependencies(items) == [(), (0,), (0, 1), (), ()]


def test_chain_across_devices_is_the_critical_path() -> None:
    items = [kernel("D0", 1), copy("D1", 2, "D0", 1), kernel("D1", 3, 2), kernel("D2", 4)]
    bounds = lower_bounds(build_plan(items, CAPS), [1.0, 0.5, 2.0, 3.0])
    assert bounds.critical_path == 3.5
    assert bounds.critical_items == (0, 1, 2)
    assert bounds.busiest_queue == 3.0
    assert bounds.busiest_queue_name == "D2/compute"
    assert bounds.best == 3.5


def test_busiest_queue_sums_independent_work() -> None:
    items = [kernel("D0", k) for k in range(1, 5)]
    bounds = lower_bounds(build_plan(items, CAPS), [1.0, 2.0, 3.0, 4.0])
    assert bounds.critical_path == 4.0
    assert bounds.busiest_queue == 10.0
    assert bounds.best == 10.0


def test_queue_window_sees_a_pipeline_fill_and_drain() -> None:
    # Three stages (D0 -> D1 -> D2, copies on the destination's copy queue), four
    # micro-batches of 1 s per stage and 0 s copies: the last stage cannot start before
    # 2 s and has 4 s of work, so no schedule beats 6 s; the other bounds say 3 s and 4 s.
    items = []
    alloc = 100
    for m in range(4):
        x = m
        for s, dev in enumerate(("D0", "D1", "D2")):
            alloc += 1
            items.append(kernel(dev, alloc, x))
            x = alloc
            if s < 2:
                alloc += 1
                items.append(copy(("D1", "D2")[s], alloc, dev, x))
                x = alloc
    durations = [1.0 if it.kind is ItemKind.EXEC else 0.0 for it in items]
    bounds = lower_bounds(build_plan(items, CAPS), durations)
    assert bounds.critical_path == 3.0
    assert bounds.busiest_queue == 4.0
    assert bounds.queue_window == 6.0
    assert bounds.best == 6.0


def test_bounds_refuse_bad_durations() -> None:
    plan = build_plan([kernel("D0", 1), kernel("D0", 2)], CAPS)
    with pytest.raises(PlanError, match=r"one duration per item: the plan has 2 items, got 1"):
        lower_bounds(plan, [1.0])
    with pytest.raises(PlanError, match=r"duration of item #1 k2 must be seconds >= 0, got -1"):
        lower_bounds(plan, [1.0, -1.0])


def test_queue_window_sees_work_that_can_only_start_late() -> None:
    # D0 runs a 1 s kernel whose result goes through a 5 s kernel on D1 and comes back
    # (copies take 0 s) for a 1 s kernel on D0, followed by a 1 s kernel on D1; D0 also
    # has four independent 1 s kernels.
    items = [
        kernel("D0", 1),
        copy("D1", 2, "D0", 1),
        kernel("D1", 3, 2),
        copy("D0", 4, "D1", 3),
        kernel("D0", 5, 4),
        copy("D1", 6, "D0", 5),
        kernel("D1", 7, 6),
    ] + [kernel("D0", 10 + k) for k in range(4)]
    durations = [1.0, 0.0, 5.0, 0.0, 1.0, 0.0, 1.0] + [1.0] * 4
    bounds = lower_bounds(build_plan(items, CAPS), durations)
    assert bounds.critical_path == 8.0 and bounds.busiest_queue == 6.0
    # D0's late kernel is released at 6 and has 1 s of tail: 8.
    assert bounds.queue_window == 8.0
    # Two more kernels that need the value back from D1 (released at 6, no tail): from 6,
    # the one with the tail first (it ends at 7, + 1), then the two others: 9. The whole
    # queue from 0 says 8 s of work; the critical path 8.
    more = items + [kernel("D0", 20, 4), kernel("D0", 21, 4)]
    later = lower_bounds(build_plan(more, CAPS), durations + [1.0, 1.0])
    assert later.busiest_queue == 8.0 and later.critical_path == 8.0
    assert later.queue_window == 9.0
    assert later.queue_window_name == "D0/compute" and later.best == 9.0
    assert later.binding == "queue window on D0/compute"


def test_link_bounds_count_the_work_on_each_shared_link() -> None:
    # Three copies from D0 to D1, D1 to D2 and D0 to D2, the first and last through one
    # link "nic", each 2 s on it, and a 1 s kernel before the last.
    items = [
        copy("D1", 2, "D0", 1),
        copy("D2", 3, "D1", 4),
        kernel("D0", 5),
        copy("D2", 6, "D0", 5),
    ]
    durations = [2.5, 2.5, 1.0, 2.5]
    uses = [[("nic", 2.0)], [("other", 2.0)], [], [("nic", 2.0)]]
    bounds = lower_bounds(build_plan(items, CAPS), durations, uses)
    assert bounds.busiest_link == 4.0 and bounds.busiest_link_name == "nic"
    # A copy's 2 s on the link end its 2.5 s: the first moves bytes from 0.5 s at the
    # earliest, the last (after the kernel) from 1.5 s, once the first is done at 2.5 s.
    assert bounds.link_window == 4.5 and bounds.link_window_name == "nic"
    assert bounds.best == 5.0  # D2's copy queue: 2.5 + 2.5
    assert bounds.binding.startswith("busiest queue") or bounds.binding.startswith("queue window")
    without = lower_bounds(build_plan(items, CAPS), durations)
    assert without.busiest_link == without.link_window == 0.0 and without.busiest_link_name == ""


def test_bounds_refuse_bad_link_use() -> None:
    plan = build_plan([kernel("D0", 1), kernel("D0", 2)], CAPS)
    with pytest.raises(PlanError, match=r"one list of \(link, seconds\) per item: the plan has 2"):
        lower_bounds(plan, [1.0, 1.0], [[]])
    with pytest.raises(
        PlanError, match=r"link use of item #1 k2 must be \(link name, seconds >= 0\) pairs"
    ):
        lower_bounds(plan, [1.0, 1.0], [[], [("nic", -1.0)]])
