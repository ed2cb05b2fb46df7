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
