"""The planner on PlanItems directly: queues, dependencies, pruning, syncs, signals."""

from __future__ import annotations

import random
import re

import attrs
import pytest
from actorgraph.scheduler import (
    Access,
    DeviceCaps,
    ItemKind,
    Plan,
    PlanError,
    PlanItem,
    QueueId,
    QueueKind,
    Run,
    Signal,
    SyncDevice,
    Wait,
    WaitKick,
    assign_queue,
    build_plan,
)
from hypothesis import given, settings
from hypothesis import strategies as st

CPU = {f"CPU:{i}": DeviceCaps(f"CPU:{i}", "CPU", is_cpu=True) for i in range(4)}
# Devices with no copy queue, to check where copies go without one.
BARE = {f"BARE:{i}": DeviceCaps(f"BARE:{i}", "BARE", has_copy_queue=False) for i in range(2)}
CAPS = {**CPU, **BARE}

COMPUTE, COPY = QueueKind.COMPUTE, QueueKind.COPY


def q(device: str, kind: QueueKind = COMPUTE) -> QueueId:
    return QueueId(device, kind)


def access(device: str, alloc: int, start: int = 0, stop: int = 64, write: bool = False) -> Access:
    return Access(device, alloc, start, stop, write)


def kernel(
    device: str,
    writes: list[tuple[int, int, int]],
    reads: tuple[tuple[int, int, int], ...] | list[tuple[int, int, int]] = (),
    label: str = "k",
) -> PlanItem:
    """A launch on `device` writing and reading (alloc, start, stop) ranges of its memory."""
    accesses = [access(device, *w, write=True) for w in writes]
    accesses += [access(device, *r) for r in reads]
    return PlanItem(label, ItemKind.EXEC, device, tuple(accesses))


def copy(
    dst: str, dst_range: tuple[int, int, int], src: str, src_range: tuple[int, int, int]
) -> PlanItem:
    return PlanItem(
        f"copy {src}->{dst}",
        ItemKind.COPY,
        dst,
        (access(dst, *dst_range, write=True), access(src, *src_range)),
        src,
    )


def program(plan: Plan, queue: QueueId) -> tuple[object, ...]:
    return plan.programs[plan.queues.index(queue)]


def waits(plan: Plan, queue: QueueId) -> list[Wait]:
    return [m for m in program(plan, queue) if isinstance(m, Wait)]


def waits_before(plan: Plan, item: int) -> list[Wait]:
    """The waits right before item `item` runs in its queue."""
    out: list[Wait] = []
    for msg in plan.programs[plan.item_queue[item]]:
        if isinstance(msg, Run):
            if msg.item == item:
                return out
            out = []
        elif isinstance(msg, Wait):
            out.append(msg)
    raise AssertionError(f"item {item} does not run")


def planned(items: list[PlanItem], caps: dict[str, DeviceCaps] = CAPS) -> Plan:
    plan = build_plan(items, caps)
    plan.verify()
    return plan


# -- queue assignment -----------------------------------------------------------------------


def test_a_launch_goes_to_its_devices_compute_queue() -> None:
    assert assign_queue(kernel("CPU:1", [(1, 0, 64)]), CAPS) == q("CPU:1")
    assert assign_queue(kernel("BARE:0", [(1, 0, 64)]), CAPS) == q("BARE:0")


def test_a_copy_prefers_the_destinations_copy_queue() -> None:
    assert assign_queue(copy("CPU:1", (1, 0, 8), "CPU:0", (2, 0, 8)), CAPS) == q("CPU:1", COPY)
    assert assign_queue(copy("CPU:1", (1, 0, 8), "BARE:0", (2, 0, 8)), CAPS) == q("CPU:1", COPY)
    assert assign_queue(copy("CPU:2", (1, 0, 8), "CPU:2", (2, 0, 8)), CAPS) == q("CPU:2", COPY)


def test_a_copy_without_a_destination_copy_queue_uses_the_sources() -> None:
    assert assign_queue(copy("BARE:0", (1, 0, 8), "CPU:3", (2, 0, 8)), CAPS) == q("CPU:3", COPY)


def test_a_copy_out_of_gpu_memory_into_another_kind_uses_the_gpus_copy_queue() -> None:
    caps = {
        "GPU:0": DeviceCaps("GPU:0", "GPU", host_visible=False, host_backed=False),
        "GPU:1": DeviceCaps("GPU:1", "GPU", host_visible=False, host_backed=False),
        "SIM:0": DeviceCaps("SIM:0", "SIM", host_visible=False),
    }
    # The SIM engine cannot reach GPU memory; the GPU's engine reaches SIM's host RAM.
    assert assign_queue(copy("SIM:0", (1, 0, 8), "GPU:0", (2, 0, 8)), caps) == q("GPU:0", COPY)
    assert assign_queue(copy("GPU:0", (1, 0, 8), "SIM:0", (2, 0, 8)), caps) == q("GPU:0", COPY)
    # Between GPUs of one kind, the destination's engine still pulls (peer copies).
    assert assign_queue(copy("GPU:1", (1, 0, 8), "GPU:0", (2, 0, 8)), caps) == q("GPU:1", COPY)


def test_a_copy_touching_a_device_reached_by_io_runs_where_the_host_moves_it() -> None:
    # REMOTE devices: memory of a worker. Copies between them (one worker, or two) run on
    # the destination's copy queue, there; copies between one and the client's memory on
    # the client-side device's queue (its copy queue if it has one), which moves the bytes.
    remote = {
        f"R:{i}": DeviceCaps(
            f"R:{i}", "REMOTE", host_visible=False, host_backed=False, host_io=True
        )
        for i in range(2)
    }
    caps = {**CAPS, **remote}
    for dst, src, where in [
        ("R:1", "R:0", q("R:1", COPY)),
        ("R:0", "R:0", q("R:0", COPY)),
        ("R:0", "CPU:1", q("CPU:1", COPY)),
        ("CPU:1", "R:0", q("CPU:1", COPY)),
        ("BARE:0", "R:1", q("BARE:0")),
        ("R:1", "BARE:1", q("BARE:1")),
    ]:
        assert assign_queue(copy(dst, (1, 0, 8), src, (2, 8, 16)), caps) == where, (dst, src)
    # A chain through all of them: the plan verifies, with both queues of a remote device.
    items = [
        copy("R:0", (1, 0, 8), "CPU:0", (2, 0, 8)),
        kernel("R:0", [(1, 0, 8)]),
        copy("R:1", (3, 0, 8), "R:0", (1, 0, 8)),
        kernel("R:1", [(3, 0, 8)]),
        copy("CPU:0", (2, 0, 8), "R:1", (3, 0, 8)),
    ]
    plan = build_plan(items, caps)
    plan.verify()
    assert [plan.queues[i] for i in plan.item_queue] == [
        q("CPU:0", COPY),
        q("R:0"),
        q("R:1", COPY),
        q("R:1"),
        q("CPU:0", COPY),
    ]


def test_a_copy_from_a_device_reached_by_io_keeps_its_waits_on_what_wrote_its_source() -> None:
    # D2 learns that D0's kernel is done through D1's copy queue. A copy from D0 into D2
    # needs no wait of its own for it, unless D0 is reached by I/O (a worker's): then its
    # bytes may be sent ahead on its own waits, which must say they are ready.
    def plan_for(kind: str, host_io: bool) -> Plan:
        names = [f"{kind}:{i}" for i in range(3)]
        caps = {n: DeviceCaps(n, kind, host_visible=False, host_io=host_io) for n in names}
        d0, d1, d2 = names
        items = [
            kernel(d0, [(1, 0, 8)]),
            copy(d1, (2, 0, 8), d0, (1, 0, 8)),
            copy(d2, (3, 0, 8), d1, (2, 0, 8)),
            copy(d2, (4, 0, 8), d0, (1, 0, 8)),
        ]
        plan = build_plan(items, caps)
        plan.verify()
        return plan

    for kind, host_io, waits in [
        ("SIM", False, [Wait(q("SIM:1", COPY), 1)]),
        ("REMOTE", True, [Wait(q("REMOTE:1", COPY), 1), Wait(q("REMOTE:0"), 1)]),
    ]:
        plan = plan_for(kind, host_io)
        d2_copy = plan.programs[plan.queues.index(q(f"{kind}:2", COPY))]
        assert [m for m in d2_copy if isinstance(m, Wait)] == waits, kind


def test_a_copy_with_no_copy_queue_anywhere_uses_the_destinations_compute_queue() -> None:
    assert assign_queue(copy("BARE:0", (1, 0, 8), "BARE:1", (2, 0, 8)), CAPS) == q("BARE:0")
    assert assign_queue(copy("BARE:1", (1, 0, 8), "BARE:1", (2, 8, 16)), CAPS) == q("BARE:1")


def test_an_item_on_a_device_not_in_caps_is_refused() -> None:
    with pytest.raises(
        PlanError, match=re.escape("uses device 'CPU:9', which this runtime did not open")
    ):
        build_plan([copy("CPU:0", (1, 0, 8), "CPU:9", (2, 0, 8))], CAPS)


def test_queues_are_ordered_by_device_then_compute_before_copy() -> None:
    plan = planned(
        [
            copy("CPU:1", (1, 0, 8), "CPU:0", (2, 0, 8)),
            kernel("CPU:1", [(3, 0, 8)]),
            kernel("CPU:0", [(4, 0, 8)]),
        ]
    )
    assert plan.queues == (q("CPU:0"), q("CPU:1"), q("CPU:1", COPY))
    assert plan.item_queue == (2, 1, 0)


# -- dependencies ---------------------------------------------------------------------------


def test_wait_values_are_positions_in_the_other_queue() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            kernel("CPU:0", [(2, 0, 64)]),
            kernel("CPU:0", [(3, 0, 64)]),
            copy(
                "CPU:1", (4, 0, 64), "CPU:0", (2, 0, 64)
            ),  # reads item 1's output: 2nd of its queue
        ]
    )
    assert waits_before(plan, 3) == [Wait(q("CPU:0"), 2)]


def test_same_queue_order_needs_no_wait() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            kernel("CPU:0", [(2, 0, 64)], [(1, 0, 64)]),
            kernel("CPU:0", [(1, 0, 64)], [(2, 0, 64)]),
        ]
    )
    assert plan.wait_count == 0


def test_a_read_waits_for_the_last_writer_only() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            copy("CPU:0", (1, 0, 64), "CPU:1", (2, 0, 64)),  # CPU:0/copy overwrites alloc 1
            copy("CPU:2", (3, 0, 64), "CPU:0", (1, 0, 64)),  # reads alloc 1: after the copy
        ]
    )
    assert waits_before(plan, 1) == [Wait(q("CPU:0"), 1)]
    assert waits_before(plan, 2) == [Wait(q("CPU:0", COPY), 1)]


def test_readers_do_not_wait_for_each_other_and_a_writer_waits_for_all_of_them() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            copy("CPU:1", (2, 0, 64), "CPU:0", (1, 0, 64)),
            copy("CPU:2", (3, 0, 64), "CPU:0", (1, 0, 64)),
            kernel("CPU:0", [(1, 0, 64)]),
        ]
    )
    assert waits_before(plan, 1) == [Wait(q("CPU:0"), 1)]
    assert waits_before(plan, 2) == [Wait(q("CPU:0"), 1)]
    assert sorted(waits_before(plan, 3), key=str) == [
        Wait(q("CPU:1", COPY), 1),
        Wait(q("CPU:2", COPY), 1),
    ]


def test_disjoint_ranges_of_one_allocation_do_not_serialize() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            copy("CPU:0", (1, 64, 128), "CPU:0", (2, 0, 64)),  # the next bytes: no overlap
            copy("CPU:1", (3, 0, 64), "CPU:0", (1, 64, 128)),  # reads only the copy's bytes
        ]
    )
    assert waits_before(plan, 1) == []
    assert waits_before(plan, 2) == [Wait(q("CPU:0", COPY), 1)]


def test_overlapping_ranges_of_one_allocation_serialize() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            copy("CPU:0", (1, 63, 127), "CPU:0", (2, 0, 64)),  # one byte in common
            copy("CPU:1", (3, 0, 8), "CPU:0", (1, 0, 8)),  # only item 0's bytes
            copy("CPU:2", (4, 0, 64), "CPU:0", (1, 32, 96)),  # both writers' bytes
        ]
    )
    assert waits_before(plan, 1) == [Wait(q("CPU:0"), 1)]
    assert waits_before(plan, 2) == [Wait(q("CPU:0"), 1)]
    # The copy's clock already covers item 0 (it waited for it): one wait suffices.
    assert waits_before(plan, 3) == [Wait(q("CPU:0", COPY), 1)]


def test_an_item_that_reads_and_writes_one_range_waits_once() -> None:
    plan = planned(
        [
            copy("CPU:1", (2, 0, 64), "CPU:0", (1, 0, 64)),  # reads alloc 1
            kernel("CPU:0", [(1, 0, 64)], [(1, 0, 64)]),  # reads and writes it: after the read
        ]
    )
    assert waits_before(plan, 1) == [Wait(q("CPU:1", COPY), 1)]


# -- pruning --------------------------------------------------------------------------------


def test_a_wait_already_covered_by_an_earlier_wait_is_dropped() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            kernel("CPU:0", [(2, 0, 64)]),
            copy("CPU:1", (3, 0, 64), "CPU:0", (2, 0, 64)),  # waits CPU:0 >= 2 ...
            copy("CPU:1", (4, 0, 64), "CPU:0", (1, 0, 64)),  # ... which covers >= 1
        ]
    )
    assert waits(plan, q("CPU:1", COPY)) == [Wait(q("CPU:0"), 2)]


def test_a_lower_wait_first_then_a_higher_one_both_stay() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            kernel("CPU:0", [(2, 0, 64)]),
            copy("CPU:1", (3, 0, 64), "CPU:0", (1, 0, 64)),
            copy("CPU:1", (4, 0, 64), "CPU:0", (2, 0, 64)),
        ]
    )
    assert waits(plan, q("CPU:1", COPY)) == [Wait(q("CPU:0"), 1), Wait(q("CPU:0"), 2)]


def test_waits_are_pruned_transitively() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),  # writes x
            copy("CPU:1", (2, 0, 64), "CPU:0", (1, 0, 64)),  # CPU:1/copy: x -> z, waits for item 0
            # CPU:0/copy overwrites x from z: after item 1 (reads z, and read x) and after item
            # 0 (wrote x); waiting for item 1 already implies item 0.
            copy("CPU:0", (1, 0, 64), "CPU:1", (2, 0, 64)),
        ]
    )
    assert waits_before(plan, 2) == [Wait(q("CPU:1", COPY), 1)]


def test_transitive_knowledge_passes_through_a_chain_of_queues() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            copy("CPU:1", (2, 0, 64), "CPU:0", (1, 0, 64)),
            copy("CPU:2", (3, 0, 64), "CPU:1", (2, 0, 64)),
            copy("CPU:3", (4, 0, 64), "CPU:2", (3, 0, 64)),
            kernel("CPU:3", [(5, 0, 64)], [(4, 0, 64)]),
            # CPU:3/copy reads x (item 0's): its earlier wait on CPU:2/copy covers it.
            copy("CPU:3", (6, 0, 64), "CPU:0", (1, 0, 64)),
        ]
    )
    assert waits(plan, q("CPU:3", COPY)) == [Wait(q("CPU:2", COPY), 1)]
    assert waits_before(plan, 4) == [Wait(q("CPU:3", COPY), 1)]


# -- device syncs, signals, completion ------------------------------------------------------


def test_every_queue_starts_with_the_kick_and_its_own_device() -> None:
    plan = planned([kernel("CPU:0", [(1, 0, 64)]), copy("CPU:1", (2, 0, 8), "CPU:1", (3, 0, 8))])
    for queue, prog in zip(plan.queues, plan.programs):
        assert prog[:2] == (WaitKick(), SyncDevice(queue.device))


def test_a_foreign_device_is_synced_once_per_queue_before_first_touching_it() -> None:
    plan = planned(
        [
            kernel("CPU:1", [(9, 0, 64)]),
            copy("CPU:1", (2, 0, 64), "CPU:0", (1, 0, 64)),
            copy("CPU:1", (3, 0, 64), "CPU:0", (1, 64, 128)),
            copy("CPU:1", (4, 0, 64), "CPU:2", (5, 0, 64)),
            copy("CPU:1", (6, 0, 64), "CPU:0", (1, 0, 64)),
        ]
    )
    prog = program(plan, q("CPU:1", COPY))
    syncs = [m for m in prog if isinstance(m, SyncDevice)]
    assert syncs == [SyncDevice("CPU:1"), SyncDevice("CPU:0"), SyncDevice("CPU:2")]
    assert prog.index(SyncDevice("CPU:0")) < prog.index(Run(1))
    assert prog.index(Run(2)) < prog.index(SyncDevice("CPU:2")) < prog.index(Run(3))
    # The compute queue of CPU:1 touches only CPU:1.
    assert [m for m in program(plan, q("CPU:1")) if isinstance(m, SyncDevice)] == [
        SyncDevice("CPU:1")
    ]


def test_a_wait_on_a_queue_that_synced_a_device_stands_for_that_sync() -> None:
    # The producer's queue synced with CPU:0 before it ran; waiting for it implies that.
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            copy("CPU:1", (2, 0, 64), "CPU:0", (1, 0, 64)),
        ]
    )
    prog = program(plan, q("CPU:1", COPY))
    assert SyncDevice("CPU:0") not in prog
    assert Wait(q("CPU:0"), 1) in prog


def test_the_plan_advances_every_device_it_touches_after_the_queues_that_touch_it() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            copy("CPU:1", (2, 0, 64), "CPU:0", (1, 0, 64)),
        ]
    )
    assert plan.devices == ("CPU:0", "CPU:1")
    by_device = dict(zip(plan.devices, plan.device_queues))
    assert {plan.queues[i] for i in by_device["CPU:0"]} == {q("CPU:0"), q("CPU:1", COPY)}
    assert {plan.queues[i] for i in by_device["CPU:1"]} == {q("CPU:1", COPY)}


def test_signals_only_where_waited_on_and_at_the_end() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)]),
            kernel("CPU:0", [(2, 0, 64)]),
            kernel("CPU:0", [(3, 0, 64)]),
            kernel("CPU:0", [(4, 0, 64)]),
            copy("CPU:1", (5, 0, 64), "CPU:0", (2, 0, 64)),  # waits for position 2
        ]
    )
    compute = program(plan, q("CPU:0"))
    assert [m for m in compute if isinstance(m, Signal)] == [Signal(2), Signal(4)]
    assert compute.index(Signal(2)) == compute.index(Run(1)) + 1
    assert compute[-1] == Signal(4)
    # Nobody waits on the copy queue: it signals only its end.
    assert [m for m in program(plan, q("CPU:1", COPY)) if isinstance(m, Signal)] == [Signal(1)]


def test_a_wait_on_a_queues_last_item_uses_its_end_signal() -> None:
    plan = planned([kernel("CPU:0", [(1, 0, 64)]), copy("CPU:1", (2, 0, 64), "CPU:0", (1, 0, 64))])
    assert [m for m in program(plan, q("CPU:0")) if isinstance(m, Signal)] == [Signal(1)]


def test_the_plan_prints_one_column_per_queue() -> None:
    plan = planned(
        [
            kernel("CPU:0", [(1, 0, 64)], label="mix"),
            copy("CPU:1", (2, 0, 64), "CPU:0", (1, 0, 64)),
        ]
    )
    header, rule, *_ = str(plan).splitlines()
    assert [h.strip() for h in header.split("|")] == ["CPU:0/compute", "CPU:1/copy"]
    assert set(rule.replace("|", "").split()) == {
        "-" * len("CPU:0/compute"),
        "-" * len("CPU:1/copy"),
    }
    text = str(plan)
    for needle in ("wait KICK", "sync CPU:0", "run mix#0", "wait CPU:0/compute>=1", "signal =1"):
        assert needle in text


# -- property: every plan of random items verifies ------------------------------------------

DEVICES = sorted(CAPS)


@st.composite
def random_items(draw: st.DrawFn) -> list[PlanItem]:
    items = []
    for _ in range(draw(st.integers(1, 30))):
        dst = draw(st.sampled_from(DEVICES))

        # Allocation ids 0..2 live on each device (id = device index * 3 + k).
        def rng(device: str) -> tuple[int, int, int]:
            alloc = DEVICES.index(device) * 3 + draw(st.integers(0, 2))
            start = draw(st.integers(0, 7)) * 8
            return alloc, start, start + draw(st.integers(1, 4)) * 8

        if draw(st.booleans()):
            writes = [rng(dst) for _ in range(draw(st.integers(1, 2)))]
            reads = [rng(dst) for _ in range(draw(st.integers(0, 2)))]
            items.append(kernel(dst, writes, reads))
        else:
            src = draw(st.sampled_from(DEVICES))
            items.append(copy(dst, rng(dst), src, rng(src)))
    return items


@settings(max_examples=5 * settings().max_examples)
@given(random_items())
def test_every_plan_of_random_items_verifies(items: list[PlanItem]) -> None:
    plan = build_plan(items, CAPS)
    plan.verify()
    # Each item runs exactly once, on the queue the plan says.
    runs = [
        (qi, m.item) for qi, prog in enumerate(plan.programs) for m in prog if isinstance(m, Run)
    ]
    assert sorted(item for _, item in runs) == list(range(len(items)))
    assert all(plan.item_queue[item] == qi for qi, item in runs)
    # Every queue ends with its end signal; no queue waits on itself.
    for qi, prog in enumerate(plan.programs):
        assert prog[-1] == Signal(sum(isinstance(m, Run) for m in prog))
        assert all(m.queue != plan.queues[qi] for m in prog if isinstance(m, Wait))


@given(random_items(), st.randoms(use_true_random=False))
def test_the_order_of_an_items_accesses_changes_nothing_in_its_plan(
    items: list[PlanItem], rnd: random.Random
) -> None:
    # Reads and writes of one item, in any order: the same waits (a write covers what an
    # earlier read of the item would wait for), the same syncs and signals.
    shuffled = [
        attrs.evolve(item, accesses=tuple(rnd.sample(item.accesses, len(item.accesses))))
        for item in items
    ]
    plan, other = build_plan(items, CAPS), build_plan(shuffled, CAPS)
    assert other.programs == plan.programs and other.item_queue == plan.item_queue
    assert other.devices == plan.devices and other.device_queues == plan.device_queues
