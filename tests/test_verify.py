"""The plan verifier, on plans broken by hand: it must name what is wrong."""

from __future__ import annotations

import re

import attrs
import pytest
from actorgraph.scheduler import (
    Access,
    DeviceCaps,
    ItemKind,
    Plan,
    PlanDeadlockError,
    PlanItem,
    PlanRaceError,
    QueueId,
    QueueKind,
    Run,
    Signal,
    SyncDevice,
    Wait,
    WaitKick,
    build_plan,
    verify_plan,
)

CAPS = {f"CPU:{i}": DeviceCaps(f"CPU:{i}", "CPU", is_cpu=True) for i in range(3)}
A, B = QueueId("CPU:0", QueueKind.COMPUTE), QueueId("CPU:1", QueueKind.COMPUTE)


def write(device: str, alloc: int, label: str) -> PlanItem:
    return PlanItem(label, ItemKind.EXEC, device, (Access(device, alloc, 0, 64, True),))


def read_into(device: str, dst: int, src_device: str, src: int) -> PlanItem:
    return PlanItem(
        "pull",
        ItemKind.COPY,
        device,
        (Access(device, dst, 0, 64, True), Access(src_device, src, 0, 64, False)),
        src_device,
    )


def replace_program(plan: Plan, queue: QueueId, messages: list[object]) -> Plan:
    programs = list(plan.programs)
    programs[plan.queues.index(queue)] = tuple(messages)  # type: ignore[arg-type]
    return attrs.evolve(plan, programs=tuple(programs))


def two_queue_plan(program_a: list[object], program_b: list[object]) -> Plan:
    """Two compute queues, item 0 on CPU:0 and item 1 on CPU:1, each writing its own memory."""
    return Plan(
        items=(write("CPU:0", 1, "left"), write("CPU:1", 2, "right")),
        queues=(A, B),
        programs=(tuple(program_a), tuple(program_b)),  # type: ignore[arg-type]
        item_queue=(0, 1),
        devices=("CPU:0", "CPU:1"),
        device_queues=((0,), (1,)),
    )


def test_a_built_plan_verifies() -> None:
    plan = build_plan([write("CPU:0", 1, "produce"), read_into("CPU:1", 2, "CPU:0", 1)], CAPS)
    verify_plan(plan)
    plan.verify()


def test_a_missing_wait_is_a_race_naming_both_items() -> None:
    # CPU:0's copy queue reads what its compute queue wrote.
    plan = build_plan([write("CPU:0", 1, "produce"), read_into("CPU:0", 2, "CPU:0", 1)], CAPS)
    copy_queue = QueueId("CPU:0", QueueKind.COPY)
    assert Wait(A, 1) in plan.programs[plan.queues.index(copy_queue)]
    broken = [m for m in plan.programs[plan.queues.index(copy_queue)] if not isinstance(m, Wait)]
    with pytest.raises(PlanRaceError, match=re.escape("items #0 produce and #1 pull conflict")):
        replace_program(plan, copy_queue, broken).verify()


def test_a_wait_for_too_low_a_value_is_a_race() -> None:
    plan = build_plan(
        [
            write("CPU:0", 3, "first"),
            write("CPU:0", 1, "second"),
            read_into("CPU:1", 2, "CPU:0", 1),
        ],
        CAPS,
    )
    copy_queue = QueueId("CPU:1", QueueKind.COPY)
    prog = plan.programs[plan.queues.index(copy_queue)]
    assert Wait(A, 2) in prog
    lowered = [Wait(A, 1) if m == Wait(A, 2) else m for m in prog]
    # The producer must also signal 1 for the lowered wait to be satisfiable at all.
    producer = list(plan.programs[plan.queues.index(A)])
    producer.insert(producer.index(Run(0)) + 1, Signal(1))
    broken = replace_program(replace_program(plan, copy_queue, lowered), A, producer)
    with pytest.raises(PlanRaceError, match=re.escape("items #1 second and #2 pull conflict")):
        broken.verify()


def test_a_wait_cycle_is_a_deadlock_naming_the_cycle() -> None:
    plan = two_queue_plan(
        [WaitKick(), SyncDevice("CPU:0"), Wait(B, 1), Run(0), Signal(1)],
        [WaitKick(), SyncDevice("CPU:1"), Wait(A, 1), Run(1), Signal(1)],
    )
    expected = "plan deadlocks: CPU:0/compute waits for CPU:1/compute>=1, CPU:1/compute waits for CPU:0/compute>=1"
    with pytest.raises(PlanDeadlockError, match=re.escape(expected)):
        plan.verify()


def test_a_cycle_reached_through_another_blocked_queue_is_named_alone() -> None:
    c = QueueId("CPU:2", QueueKind.COMPUTE)
    plan = Plan(
        items=(write("CPU:0", 1, "x"), write("CPU:1", 2, "y"), write("CPU:2", 3, "z")),
        queues=(A, B, c),
        programs=(
            (WaitKick(), SyncDevice("CPU:0"), Wait(B, 1), Run(0), Signal(1)),
            (WaitKick(), SyncDevice("CPU:1"), Wait(c, 1), Run(1), Signal(1)),
            (WaitKick(), SyncDevice("CPU:2"), Wait(B, 1), Run(2), Signal(1)),
        ),
        item_queue=(0, 1, 2),
        devices=("CPU:0", "CPU:1", "CPU:2"),
        device_queues=((0,), (1,), (2,)),
    )
    with pytest.raises(PlanDeadlockError) as info:
        plan.verify()
    message = str(info.value)
    assert "CPU:1/compute waits for CPU:2/compute>=1" in message
    assert "CPU:2/compute waits for CPU:1/compute>=1" in message
    assert "CPU:0/compute waits" not in message


def test_a_wait_for_a_value_never_signalled_is_a_deadlock() -> None:
    plan = two_queue_plan(
        [WaitKick(), SyncDevice("CPU:0"), Run(0), Signal(1)],
        [WaitKick(), SyncDevice("CPU:1"), Wait(A, 2), Run(1), Signal(1)],
    )
    with pytest.raises(
        PlanDeadlockError, match=re.escape("CPU:1/compute waits for CPU:0/compute>=2")
    ):
        plan.verify()


def test_a_wait_on_a_queue_without_a_program_is_a_deadlock() -> None:
    ghost = QueueId("CPU:2", QueueKind.COPY)
    plan = two_queue_plan(
        [WaitKick(), SyncDevice("CPU:0"), Wait(ghost, 1), Run(0), Signal(1)],
        [WaitKick(), SyncDevice("CPU:1"), Run(1), Signal(1)],
    )
    with pytest.raises(
        PlanDeadlockError, match=re.escape("waits for CPU:2/copy, which has no program")
    ):
        plan.verify()


def test_a_signal_before_its_item_ran_is_refused() -> None:
    plan = two_queue_plan(
        [WaitKick(), SyncDevice("CPU:0"), Signal(1), Run(0)],
        [WaitKick(), SyncDevice("CPU:1"), Run(1), Signal(1)],
    )
    with pytest.raises(PlanDeadlockError, match="a waiter would run too early"):
        plan.verify()


def test_a_signal_going_back_is_refused() -> None:
    plan = two_queue_plan(
        [WaitKick(), SyncDevice("CPU:0"), Run(0), Signal(1), Signal(0)],
        [WaitKick(), SyncDevice("CPU:1"), Run(1), Signal(1)],
    )
    with pytest.raises(PlanDeadlockError, match="signal values must not go back"):
        plan.verify()


def test_an_item_run_twice_or_never_is_refused() -> None:
    twice = two_queue_plan(
        [WaitKick(), SyncDevice("CPU:0"), Run(0), Run(0), Signal(2)],
        [WaitKick(), SyncDevice("CPU:1"), Run(1), Signal(1)],
    )
    with pytest.raises(PlanRaceError, match=re.escape("item #0 left runs twice")):
        twice.verify()
    never = two_queue_plan(
        [WaitKick(), SyncDevice("CPU:0"), Run(0), Signal(1)],
        [WaitKick(), SyncDevice("CPU:1"), Signal(0)],
    )
    with pytest.raises(PlanRaceError, match=re.escape("items never run: [1]")):
        never.verify()


def test_touching_a_device_before_syncing_with_it_is_refused() -> None:
    # Nothing in the plan writes what the copy reads, so only its own sync orders it after
    # earlier work on CPU:0.
    plan = build_plan([write("CPU:1", 3, "other"), read_into("CPU:1", 2, "CPU:0", 1)], CAPS)
    copy_queue = QueueId("CPU:1", QueueKind.COPY)
    prog = [m for m in plan.programs[plan.queues.index(copy_queue)] if m != SyncDevice("CPU:0")]
    assert len(prog) == len(plan.programs[plan.queues.index(copy_queue)]) - 1
    with pytest.raises(
        PlanRaceError, match=re.escape("#1 pull touches CPU:0 before its queue synchronised")
    ):
        replace_program(plan, copy_queue, prog).verify()


def test_a_missing_wait_that_also_carried_a_device_sync_is_refused() -> None:
    # CPU:1's copy queue learns that CPU:0 was synced through its wait on CPU:0's compute
    # queue; without the wait it would touch CPU:0 unsynchronised.
    plan = build_plan([write("CPU:0", 1, "produce"), read_into("CPU:1", 2, "CPU:0", 1)], CAPS)
    copy_queue = QueueId("CPU:1", QueueKind.COPY)
    prog = plan.programs[plan.queues.index(copy_queue)]
    assert SyncDevice("CPU:0") not in prog
    broken = [m for m in prog if not isinstance(m, Wait)]
    with pytest.raises(PlanRaceError, match=re.escape("#1 pull touches CPU:0 before its queue")):
        replace_program(plan, copy_queue, broken).verify()


def test_order_through_a_third_queue_is_enough() -> None:
    # No direct wait between the writer and the last reader: the chain orders them.
    plan = build_plan(
        [
            write("CPU:0", 1, "produce"),
            read_into("CPU:1", 2, "CPU:0", 1),
            read_into("CPU:2", 3, "CPU:1", 2),
            read_into("CPU:2", 4, "CPU:0", 1),
        ],
        CAPS,
    )
    copy2 = plan.programs[plan.queues.index(QueueId("CPU:2", QueueKind.COPY))]
    assert not any(isinstance(m, Wait) and m.queue == A for m in copy2)
    plan.verify()
