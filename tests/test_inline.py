"""Submissions on idle queues run in the submitter's own task (devices.run_inline); work
that needs a task of its own, or waits on work still in flight, goes to the actors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

import actorgraph as ag

I32 = np.int32


def _xor(out: np.ndarray[Any, Any], a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> None:
    np.bitwise_xor(a, b, out=out)


XOR = ag.Kernel("xor", cpu=_xor, outs=(0,), ins=(1, 2))


def _tasks_kernel(seen: list[Any]) -> ag.Kernel:
    def record(out: np.ndarray[Any, Any], a: np.ndarray[Any, Any]) -> None:
        seen.append(trio.lowlevel.current_task())
        np.add(a, 1, out=out)

    return ag.Kernel("record", cpu=record, outs=(0,), ins=(1,))


async def test_a_replay_on_idle_queues_runs_in_the_callers_task() -> None:
    seen: list[Any] = []
    inc = _tasks_kernel(seen)
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        a = rt.alloc("CPU:0", 16, I32)
        b = rt.alloc("CPU:0", 16, I32)
        c = rt.alloc("CPU:1", 16, I32)
        d = rt.alloc("CPU:1", 16, I32)
        await rt.copyin(a, np.arange(16, dtype=I32))
        items = [ag.Launch(inc, [b, a]), ag.Copy(dst=c, src=b), ag.Launch(inc, [d, c])]
        graph = await rt.compile(items, inputs=[a])
        before = [s.jobs_done for s in rt.statistics().actors]
        replay = graph.submit_nowait([a])
        # Three queues on two devices, handing data over twice: done before any checkpoint.
        assert replay.done
        assert seen == [trio.lowlevel.current_task()] * 2
        await replay.wait()
        stats = rt.statistics()
        assert sum(s.jobs_done for s in stats.actors) - sum(before) == 3
        assert stats.replays_done == 1 and graph.statistics().replays_done == 1
        assert graph.statistics().bytes_copied == 64
        np.testing.assert_array_equal(await rt.copyout(d), np.arange(16) + 2)


async def test_work_on_a_worker_thread_goes_to_the_actor_and_later_work_waits_for_it() -> None:
    # Kernels touching >= 4 KiB run on the device's worker thread; smaller ones inline.
    async with ag.open_runtime(["CPU:0", "CPU:1"], cpu_thread_bytes=4096) as rt:
        big = [rt.alloc("CPU:0", 4096, I32) for _ in range(3)]
        small = [rt.alloc("CPU:0", 8, I32), rt.alloc("CPU:1", 8, I32), rt.alloc("CPU:1", 8, I32)]
        key = rt.alloc("CPU:1", 8, I32)
        await rt.copyin(big[0], np.arange(4096, dtype=I32))
        await rt.copyin(big[1], np.full(4096, 7, I32))
        await rt.copyin(key, np.full(8, 3, I32))
        heavy = await rt.compile([ag.Launch(XOR, [big[2], big[0], big[1]])], inputs=[big[0]])
        # The first items need the heavy result: they wait for the thread, and the copy
        # and the kernel on CPU:1 wait for them.
        light = await rt.compile(
            [
                ag.Copy(dst=small[0], src=big[2].view(0, 8)),
                ag.Copy(dst=small[1], src=small[0]),
                ag.Launch(XOR, [small[2], small[1], key]),
            ],
            inputs=[small[0]],
        )
        with trio.fail_after(30):
            first = heavy.submit_nowait([big[0]])
            assert not first.done  # its kernel is on the worker thread
            second = light.submit_nowait([small[0]])
            assert not second.done  # CPU:0's queue is busy: posted, in order behind it
            await second.wait()
            assert first.done
        expect = (np.arange(8, dtype=I32) ^ 7) ^ 3
        np.testing.assert_array_equal(await rt.copyout(small[2]), expect)


async def test_a_replay_that_starts_inline_hands_a_thread_item_to_its_actor() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"], cpu_thread_bytes=4096) as rt:
        x = rt.alloc("CPU:0", 8, I32)
        y = rt.alloc("CPU:0", 8, I32)
        wide = [rt.alloc("CPU:1", 2048, I32) for _ in range(3)]
        out = rt.alloc("CPU:1", 8, I32)
        await rt.copyin(x, np.arange(8, dtype=I32))
        await rt.copyin(wide[1], np.full(2048, 5, I32))
        items = [
            ag.Launch(XOR, [y, x, x]),  # inline on CPU:0
            ag.Copy(dst=wide[0].view(0, 8), src=x),  # inline copy to CPU:1
            ag.Launch(XOR, [wide[2], wide[0], wide[1]]),  # 24 KiB: CPU:1's worker thread
            ag.Copy(dst=out, src=wide[2].view(8, 8)),
        ]
        graph = await rt.compile(items)
        with trio.fail_after(30):
            replay = graph.submit_nowait()
            assert not replay.done
            await replay.wait()
            await graph()
        np.testing.assert_array_equal(await rt.copyout(y), np.zeros(8, I32))
        np.testing.assert_array_equal(await rt.copyout(out), np.full(8, 5, I32))
        got = await rt.copyout(wide[2])
        np.testing.assert_array_equal(got[:8], np.arange(8, dtype=I32) ^ 5)


async def _chain_state(thread_bytes: int) -> tuple[Any, ...]:
    """Replay a two-device chain three times; every count and timeline value the runtime,
    its actors, its devices and the graph show, and the result. With thread_bytes=0 every
    kernel goes to a worker thread (the actors' own loops); otherwise the replays run
    inline, as one loop."""
    async with ag.open_runtime(["CPU:0", "CPU:1"], cpu_thread_bytes=thread_bytes) as rt:
        bufs = [rt.alloc(f"CPU:{i % 2}", 8, I32) for i in range(6)]
        await rt.copyin(bufs[0], np.arange(8, dtype=I32))
        await rt.copyin(bufs[1], np.full(8, 9, I32))
        items = [
            ag.Launch(XOR, [bufs[2], bufs[0], bufs[0]]),
            ag.Copy(dst=bufs[3], src=bufs[2]),
            ag.Copy(dst=bufs[4], src=bufs[1]),
            ag.Launch(XOR, [bufs[5], bufs[3], bufs[1]]),
        ]
        graph = await rt.compile(items, inputs=[bufs[0]])
        for _ in range(3):
            await graph([bufs[0]])
        graph.submit_nowait([bufs[0]])  # a Replay object of its own
        await graph([bufs[0]])
        stats = rt.statistics()
        devices = [rt.device(name) for name in rt.devices]
        g = graph.statistics()
        # Not compared: waits parked and time blocked, which only the actors' loops have.
        return (
            [
                (a.name, a.jobs_done, a.items_run, a.signal_value, a.bytes_copied)
                for a in stats.actors
            ],
            (stats.submissions, stats.replays, stats.replays_done, stats.bytes_copied),
            [(d.timeline.value, d.next_ticket) for d in devices],
            rt.kick.value,
            (g.replays, g.replays_done, g.in_flight, g.bytes_copied),
            await rt.copyout(bufs[5]),
        )


async def test_an_inline_replay_leaves_signals_and_counts_where_the_actors_would() -> None:
    inline = await _chain_state(1 << 20)
    actors = await _chain_state(0)
    assert inline[:-1] == actors[:-1]
    # 2 copyins and 5 replays; bytes: the copyins (32 each) and 2 copies of 32 per replay.
    assert inline[1] == (7, 5, 5, 2 * 32 + 5 * 64)
    np.testing.assert_array_equal(inline[-1], actors[-1])
    np.testing.assert_array_equal(inline[-1], np.full(8, 9, I32))


async def test_a_failing_item_in_an_inline_replay_is_named_and_stops_the_items_after_it() -> None:
    def boom(out: np.ndarray[Any, Any], a: np.ndarray[Any, Any]) -> None:
        raise ValueError("no good")

    bad = ag.Kernel("boom", cpu=boom, outs=(0,), ins=(1,))
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        a, b = rt.alloc("CPU:0", 8, I32), rt.alloc("CPU:0", 8, I32)
        c, d = rt.alloc("CPU:1", 8, I32), rt.alloc("CPU:1", 8, I32)
        await rt.copyin(a, np.full(8, 4, I32))
        await rt.copyin(b, np.full(8, 7, I32))
        items = [
            ag.Copy(dst=c, src=a),
            ag.Launch(bad, [b, a]),
            ag.Launch(XOR, [d, c, c]),
            ag.Copy(dst=c, src=b),
        ]
        graph = await rt.compile(items, inputs=[a])
        with pytest.raises(
            ag.ItemError, match=r"item 1 \(boom\) on CPU:0/compute raised ValueError: no good"
        ):
            await graph([a])
        # The copy of b waits for the failed item, so it was skipped: c never holds b.
        assert not np.array_equal(await rt.copyout(c), np.full(8, 7, I32))
        await rt.run([ag.Launch(XOR, [b, a, a])])  # the runtime goes on
        np.testing.assert_array_equal(await rt.copyout(b), np.zeros(8, I32))


async def test_a_replay_run_as_one_loop_is_still_a_schedule_point() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        a, b = rt.alloc("CPU:0", 8, I32), rt.alloc("CPU:0", 8, I32)
        graph = await rt.compile([ag.Launch(XOR, [b, a, a])], inputs=[a])
        await graph([a])  # bound once: the next calls take the cached path
        steps = 0

        async def other() -> None:
            nonlocal steps
            while True:
                steps += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            for _ in range(10):
                await graph([a])
            # Each call let the scheduler run a batch, which holds the other task too
            # (the batch order is random, so its first step may come after the call).
            assert steps >= 9
            nursery.cancel_scope.cancel()
        assert graph.statistics().replays_done == 11


async def test_a_replay_after_work_posted_to_its_queue_waits_for_that_work() -> None:
    # `small` runs as one loop; `big` (4 KiB and more: a worker thread) is posted to the
    # same queue. A loop found ready before must not run while `big` is queued there.
    async with ag.open_runtime(["CPU:0"], cpu_thread_bytes=4096) as rt:
        x, y = rt.alloc("CPU:0", 8, I32), rt.alloc("CPU:0", 8, I32)
        src, dst, zeros = (rt.alloc("CPU:0", 1024, I32) for _ in range(3))
        await rt.copyin(src, np.full(1024, 6, I32))
        small = await rt.compile([ag.Launch(XOR, [y, x, dst.view(0, 8)])])
        big = await rt.compile([ag.Launch(XOR, [dst, src, zeros])])  # dst = src
        await small()
        with trio.fail_after(30):
            first = big.submit_nowait()
            assert not first.done
            second = small.submit_nowait()  # y = dst's head: after first, before third
            assert not second.done
            await rt.copyin(src, np.full(1024, 5, I32))  # after them, on the same device
            third = big.submit_nowait()
            for replay in (first, second, third):
                await replay.wait()
        np.testing.assert_array_equal(await rt.copyout(y), np.full(8, 6, I32))
        np.testing.assert_array_equal(await rt.copyout(dst), np.full(1024, 5, I32))
        assert small.statistics().replays_done == 2


class Interrupted(BaseException):
    """Stands for a KeyboardInterrupt raised inside a kernel's call."""


async def test_an_interrupted_one_loop_replay_leaves_every_timeline_consistent() -> None:
    interrupt = {"on": False}

    def maybe_interrupt(out: np.ndarray[Any, Any], a: np.ndarray[Any, Any]) -> None:
        if interrupt["on"]:
            raise Interrupted
        np.add(a, 1, out=out)

    inc = ag.Kernel("inc", cpu=maybe_interrupt, outs=(0,), ins=(1,))
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        a, b = rt.alloc("CPU:0", 8, I32), rt.alloc("CPU:0", 8, I32)
        c, d = rt.alloc("CPU:1", 8, I32), rt.alloc("CPU:1", 8, I32)
        graph = await rt.compile(
            [ag.Launch(inc, [b, a]), ag.Copy(dst=c, src=b), ag.Launch(inc, [d, c])]
        )
        await graph()
        before = rt.statistics()
        interrupt["on"] = True
        with pytest.raises(Interrupted):
            await graph()
        # Nothing of it was booked: no timeline value reserved, no device ticket taken.
        after = rt.statistics()
        assert [s.signal_value for s in after.actors] == [s.signal_value for s in before.actors]
        assert after.submissions == before.submissions
        interrupt["on"] = False
        with trio.fail_after(30):
            await graph()  # would wait forever on a ticket taken and never reached
            await rt.run([ag.Launch(inc, [d, c])])  # eager work on the same devices too
        np.testing.assert_array_equal(await rt.copyout(d), np.full(8, 2, I32))


async def _replays_below_the_top(thread_bytes: int) -> tuple[int, list[int]]:
    """Replays back to back from just below 2**64-1 until one is refused: how many ran,
    and the timeline values they left."""
    top = (1 << 64) - 1
    async with ag.open_runtime(
        ["CPU:0"], timeline_start=top - 7, cpu_thread_bytes=thread_bytes
    ) as rt:
        a, b = rt.alloc("CPU:0", 8, I32), rt.alloc("CPU:0", 8, I32)
        graph = await rt.compile([ag.Launch(XOR, [b, a, a]), ag.Launch(XOR, [a, b, b])])
        ran = 0
        with trio.fail_after(30):
            while True:
                try:
                    await graph()
                except OverflowError as error:
                    assert "would pass 2**64-1" in str(error)
                    break
                ran += 1
        values = [s.signal_value for s in rt.statistics().actors]
        return ran, values + [rt.device("CPU:0").timeline.value]


async def test_replays_as_one_loop_stop_below_2_64_where_posted_ones_do() -> None:
    inline = await _replays_below_the_top(1 << 20)
    posted = await _replays_below_the_top(0)  # every kernel on the worker thread
    assert inline == posted
    assert inline[0] == 3  # two values a replay on the compute queue: 7 // 2


async def test_a_one_loop_run_is_quiet_only_while_no_task_waits_on_what_it_moves() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        a, b = rt.alloc("CPU:0", 8, I32), rt.alloc("CPU:1", 8, I32)
        graph = await rt.compile([ag.Launch(XOR, [a, a, a]), ag.Copy(dst=b, src=a)])
        linear = graph.bind((), None).linear
        assert linear is not None and linear.quiet()
        for signal in (rt.device("CPU:1").timeline, rt.kick):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(signal.wait_value, 1 << 40)
                await trio.testing.wait_all_tasks_blocked()
                # Moving it could wake that task: only the runtime's thread may do that.
                assert not linear.quiet()
                nursery.cancel_scope.cancel()
            assert linear.quiet()  # a cancelled wait leaves nobody waiting
