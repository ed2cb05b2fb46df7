"""Timeline signals (devices/_signal.py): values only rise; waiters and callbacks run
exactly when their threshold is reached, never before, once."""

from __future__ import annotations

import trio
import trio.testing
from actorgraph.devices._signal import Signal


def test_a_callback_due_at_a_value_reached_runs_at_once() -> None:
    signal = Signal("s", 5)
    calls: list[int] = []
    signal.when(5, lambda: calls.append(signal.value))
    assert calls == [5]
    assert not signal.waiting


def test_callbacks_run_from_the_set_that_reaches_them_in_threshold_order() -> None:
    signal = Signal("s")
    calls: list[tuple[str, int]] = []
    signal.when(3, lambda: calls.append(("three", signal.value)))
    signal.when(1, lambda: calls.append(("one", signal.value)))
    signal.when(9, lambda: calls.append(("nine", signal.value)))
    assert signal.waiting and signal.statistics().waiters == 3
    signal.set(0)
    assert calls == []
    signal.set(4)  # reaches two thresholds: both run, lowest first, with the new value
    assert calls == [("one", 4), ("three", 4)]
    signal.set(4)
    signal.set(8)
    assert len(calls) == 2 and signal.waiting
    signal.set(9)
    assert calls[-1] == ("nine", 9) and len(calls) == 3
    assert not signal.waiting
    signal.set(20)
    assert len(calls) == 3  # each ran once


def test_a_callback_may_set_other_signals_and_its_own() -> None:
    first, second = Signal("first"), Signal("second")
    seen: list[int] = []
    first.when(2, lambda: second.set(first.value * 10))
    second.when(20, lambda: seen.append(second.value))
    first.when(2, lambda: first.set(7))  # re-entrant: its own signal moves further
    first.when(7, lambda: seen.append(first.value))
    first.set(2)
    assert second.value == 20 and first.value == 7
    assert sorted(seen) == [7, 20]


async def test_tasks_and_callbacks_on_one_signal_are_all_released() -> None:
    signal = Signal("s")
    woken: list[str] = []

    async def waiter(threshold: int) -> None:
        await signal.wait_value(threshold)
        woken.append(f"task{threshold}")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, 2)
            nursery.start_soon(waiter, 4)
            await trio.testing.wait_all_tasks_blocked()
            signal.when(3, lambda: woken.append("callback3"))
            signal.set(3)  # the callback runs in this task, before set returns
            assert woken == ["callback3"]
            await trio.testing.wait_all_tasks_blocked()
            assert woken == ["callback3", "task2"]
            signal.set(4)
    assert woken == ["callback3", "task2", "task4"]
    assert not signal.waiting
