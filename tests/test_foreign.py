"""Foreign memory (rt.wrap), views with their own dtype, address kernels, inputs of varying
size, and ordering against an external timeline."""

from __future__ import annotations

import ctypes
import re
import threading

import numpy as np
import pytest
import trio
import trio.testing

import actorgraph as ag

add_one = ag.Kernel("add_one", cpu=lambda out, a: np.add(a, 1, out=out), outs=(0,), ins=(1,))


def _addr_double(out: int, src: int, n: int) -> None:
    # A body that takes pointers, as compiled code would.
    dst = np.ctypeslib.as_array((ctypes.c_int32 * n).from_address(out))
    dst[:] = np.ctypeslib.as_array((ctypes.c_int32 * n).from_address(src)) * 2


double_ptr = ag.Kernel("double_ptr", cpu=_addr_double, cpu_args="addresses", outs=(0,), ins=(1,))


async def test_wrap_numpy_memory_runs_kernels_in_place() -> None:
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:
            src = np.arange(16, dtype=np.int32)
            dst = np.zeros(16, np.int32)
            a, b = rt.wrap("CPU:0", src, dtype=np.int32), rt.wrap("CPU:0", dst, dtype=np.int32)
            assert a.foreign and a.address == src.ctypes.data and a.shape == (16,)
            await rt.run([ag.Launch(add_one, [b, a])])
            assert (dst == src + 1).all()
            assert (await rt.copyout(b) == src + 1).all()


async def test_wrap_by_address_and_buffer_protocol() -> None:
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:
            raw = bytearray(64)
            buf = rt.wrap("CPU:0", raw, dtype=np.float32, shape=(4, 4))
            await rt.copyin(buf, np.full((4, 4), 2.5, np.float32))
            assert np.frombuffer(raw, np.float32).tolist() == [2.5] * 16
            holder = np.zeros(8, np.int64)
            by_address = rt.wrap("CPU:0", holder.ctypes.data, nbytes=64, dtype=np.int64)
            await rt.copyin(by_address, np.arange(8, dtype=np.int64))
            assert holder.tolist() == list(range(8))


async def test_two_wrappers_of_one_region_alias() -> None:
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:
            memory = np.zeros(32, np.int32)
            whole = rt.wrap("CPU:0", memory, dtype=np.int32)
            half = rt.wrap("CPU:0", memory[16:], dtype=np.int32)
            other = rt.wrap("CPU:0", np.zeros(16, np.int32), dtype=np.int32)
            assert whole.overlaps(half) and half.within(whole) and not half.overlaps(other)
            assert not whole.overlaps(rt.alloc("CPU:0", 32, np.int32))
            # The planner sees the alias: the copy (copy queue) writing `half` waits for
            # the kernel (compute queue) reading `whole`; into unrelated memory it does not.
            tmp = rt.alloc("CPU:0", 32, np.int32)
            aliased = await rt.compile(
                [ag.Launch(add_one, [tmp, whole]), ag.Copy(dst=half, src=other)], verify=True
            )
            apart = rt.wrap("CPU:0", np.zeros(16, np.int32), dtype=np.int32)
            separate = await rt.compile(
                [ag.Launch(add_one, [tmp, whole]), ag.Copy(dst=apart, src=other)], verify=True
            )
            assert aliased.plan.wait_count == 1 and separate.plan.wait_count == 0
            with pytest.raises(ag.InputError, match="share memory"):
                await rt.compile([ag.Launch(add_one, [tmp, whole])], inputs=[whole, half])


def _gated_add_one(gate: threading.Event) -> ag.Kernel:
    """add_one that waits (on its device's worker thread) until `gate` is set: work that
    is not ordered after it runs meanwhile, and reads what the replay before left."""

    def body(out: np.ndarray, a: np.ndarray) -> None:
        if not gate.wait(10):
            raise TimeoutError("the test never opened the gate")
        np.add(a, 1, out=out)

    return ag.Kernel("gated_add_one", cpu=body, outs=(0,), ins=(1,))


async def _replays_read_this_replays_data(
    rt: ag.Runtime,
    items: list[ag.Launch | ag.Copy],
    src: ag.Buffer,
    out: ag.Buffer,
    gate: threading.Event,
) -> None:
    graph = await rt.compile(items, inputs=[src], verify=True)
    for value in (10, 20, 30):
        await rt.copyin(src, np.full(src.size, value, np.int32))
        gate.clear()
        replay = await graph.submit([src])
        # Everything not ordered after the gated kernel runs now, while it waits.
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await replay.wait()
        np.testing.assert_array_equal(await rt.copyout(out), value + 1)


async def test_wrappers_on_one_device_alias_across_replays() -> None:
    # A kernel writes through one wrapper while a copy on another queue reads through a
    # second wrapper of part of the same memory: the copy waits for the kernel, replay
    # after replay, and reads this replay's data.
    gate = threading.Event()
    with trio.fail_after(20):
        async with ag.open_runtime(["CPU:0", "CPU:1"], cpu_thread_bytes=0) as rt:
            memory = np.zeros(64, np.int32)
            whole = rt.wrap("CPU:0", memory, dtype=np.int32)
            half = rt.wrap("CPU:0", memory[32:], dtype=np.int32)
            src = rt.alloc("CPU:0", 64, np.int32)
            out = rt.alloc("CPU:1", 32, np.int32)
            items = [ag.Launch(_gated_add_one(gate), [whole, src]), ag.Copy(dst=out, src=half)]
            await _replays_read_this_replays_data(rt, items, src, out, gate)


async def test_one_memory_wrapped_on_two_devices_is_refused() -> None:
    # Each device orders the work on its own wrappers, so a wrapper of the same memory on
    # a second device would race with the first one's work (stale reads): refused, and
    # what the replays do instead (one wrapper, a Copy to the other device) reads fresh data.
    gate = threading.Event()
    with trio.fail_after(20):
        async with ag.open_runtime(["CPU:0", "CPU:1"], cpu_thread_bytes=0) as rt:
            memory = np.zeros(64, np.int32)
            first = rt.wrap("CPU:0", memory, dtype=np.int32)
            for source in (memory, memory[8:16], memory.ctypes.data + 4):
                with pytest.raises(
                    ag.UsageError,
                    match=(
                        rf"wrap: that memory \(bytes 0x[0-9a-f]+\.\.0x[0-9a-f]+\) is wrapped on "
                        rf"CPU:0 already \(by the wrapper of {memory.ctypes.data:#x}\.\."
                        rf"{memory.ctypes.data + memory.nbytes:#x}\); host memory is one address "
                        rf"space, but a runtime orders work on wrapped memory per device, so "
                        rf"wrappers on CPU:0 and CPU:1 would race: wrap it on one device and move "
                        rf"the data with Copy items, or rt.free the other wrapper first"
                    ),
                ):
                    rt.wrap(
                        "CPU:1",
                        source,
                        dtype=np.int32,
                        nbytes=8 if isinstance(source, int) else None,
                    )
            beside = rt.wrap("CPU:1", np.zeros(64, np.int32), dtype=np.int32)  # other memory
            assert not first.overlaps(beside)
            src = rt.alloc("CPU:0", 64, np.int32)
            out = rt.alloc("CPU:1", 64, np.int32)
            items = [ag.Launch(_gated_add_one(gate), [first, src]), ag.Copy(dst=out, src=first)]
            await _replays_read_this_replays_data(rt, items, src, out, gate)
            rt.free(first)  # the memory is free to be wrapped elsewhere now
            assert rt.wrap("CPU:1", memory, dtype=np.int32).overlaps(beside) is False


@pytest.mark.parametrize("device", ["CPU:0", "SIM:0"])
async def test_a_wrapper_of_an_allocated_buffers_memory_is_refused(device: str) -> None:
    # np.from_dlpack(b) is b's memory: a wrapper of it would alias nothing (a kernel on b
    # and a copy from the wrapper would race, and the two as graph inputs would pass).
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0", device] if device != "CPU:0" else ["CPU:0"]) as rt:
            b = rt.alloc(device, 64, np.int32)
            for memory in (np.from_dlpack(b), np.from_dlpack(b)[16:32], b.address + 8):
                with pytest.raises(
                    ag.UsageError,
                    match=(
                        rf"wrap: that memory \(bytes 0x[0-9a-f]+\.\.0x[0-9a-f]+\) belongs to "
                        rf"buffer #{b.alloc_id} on {device}, which rt.alloc made: use that buffer, "
                        rf"or a view of it \(buf.view\(...\)\), whose work the runtime orders"
                    ),
                ):
                    rt.wrap(
                        "CPU:0",
                        memory,
                        dtype=np.int32,
                        nbytes=8 if isinstance(memory, int) else None,
                    )
            with pytest.raises(ag.UsageError, match=r"is a Buffer of this runtime already"):
                rt.wrap("CPU:0", b)
            rt.free(b)
            rt.wrap("CPU:0", np.zeros(4, np.int32))  # unrelated memory still wraps


async def test_wrap_refuses_bad_memory() -> None:
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0", "SIM:0"]) as rt:
            with pytest.raises(ag.UsageError, match="read-only"):
                rt.wrap("CPU:0", b"immutable")
            with pytest.raises(ag.UsageError, match="needs its size in bytes"):
                rt.wrap("CPU:0", 12345)
            with pytest.raises(ag.UsageError, match="buffer protocol or __dlpack__"):
                rt.wrap("CPU:0", "text")
            with pytest.raises(ag.UsageError, match="does not hold host memory"):
                rt.wrap("SIM:0", bytearray(8))
            with pytest.raises(ag.UsageError, match="whole number of float32"):
                rt.wrap("CPU:0", bytearray(6), dtype=np.float32)
            with pytest.raises(ag.UsageError, match="needs 64 bytes"):
                rt.wrap("CPU:0", bytearray(8), dtype=np.float32, shape=16)
            wrapped = rt.wrap("CPU:0", bytearray(8))
            rt.free(wrapped)
            with pytest.raises(ag.BufferFreedError, match="was freed"):
                await rt.copyout(wrapped)


async def test_views_with_their_own_dtype_at_a_byte_offset() -> None:
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:
            a = rt.alloc("CPU:0", 16, np.float32)
            await rt.copyin(a, np.arange(16, dtype=np.float32))
            bits = a.view(byte_offset=8, dtype=np.int32, shape=(2, 2))
            assert bits.shape == (2, 2) and bits.dtype == np.int32 and bits.base is a
            expected = np.arange(16, dtype=np.float32).view(np.int32)[2:6].reshape(2, 2)
            assert (await rt.copyout(bits) == expected).all()
            halves = a.view(dtype=np.float16)
            assert halves.size == 32 and halves.overlaps(bits)
            with pytest.raises(ag.UsageError, match="multiple of 8 bytes"):
                a.view(byte_offset=4, dtype=np.float64)
            with pytest.raises(ag.UsageError, match="runs past its end"):
                a.view(byte_offset=60, dtype=np.int32, shape=2)
            with pytest.raises(ag.UsageError, match="not both"):
                a.view(1, byte_offset=4)


async def test_address_kernels_and_rebased_dtype_views() -> None:
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:
            n = ag.Var("n", 1, 64)
            x = rt.alloc("CPU:0", 16, np.float32)
            out = rt.alloc("CPU:0", 8, np.int32)
            ints = x.view(byte_offset=16, dtype=np.int32, shape=8)
            launch = ag.Launch(double_ptr, [out, ints], vars=[n])
            graph = await rt.compile([launch], inputs=[x])
            for seed in range(3):
                fresh = rt.alloc("CPU:0", 16, np.float32)
                data = np.arange(16, dtype=np.int32) + seed
                await rt.copyin(fresh, data.view(np.float32))
                await graph([fresh], var_vals={n: 8})
                assert (await rt.copyout(out) == data[4:12] * 2).all()
            with pytest.raises(ag.UsageError, match="cpu_args is 'arrays'"):
                ag.Kernel("k", cpu=_addr_double, cpu_args="pointers", outs=(0,))


async def test_inputs_that_vary_in_size_up_to_a_maximum() -> None:
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:
            total = ag.Kernel(
                "total", cpu=lambda out, a: out.__setitem__(0, a.sum()), outs=(0,), ins=(1,)
            )
            x = rt.alloc("CPU:0", 4, np.int64)
            out = rt.alloc("CPU:0", 1, np.int64)
            graph = await rt.compile([ag.Launch(total, [out, x])], inputs=[x], max_sizes=[100])
            for size in (4, 1, 100, 37):
                buf = rt.alloc("CPU:0", size, np.int64)
                await rt.copyin(buf, np.arange(size, dtype=np.int64))
                await graph([buf])
                assert (await rt.copyout(out))[0] == size * (size - 1) // 2
            with pytest.raises(ag.InputError, match="at most 100"):
                await graph([rt.alloc("CPU:0", 101, np.int64)])
            with pytest.raises(ag.InputError, match="dtype"):
                await graph([rt.alloc("CPU:0", 10, np.int32)])
            with pytest.raises(ag.UsageError, match="already holds 4"):
                await rt.compile([ag.Launch(total, [out, x])], inputs=[x], max_sizes=[2])
            with pytest.raises(ag.UsageError, match="one per input"):
                await rt.compile([ag.Launch(total, [out, x])], inputs=[x], max_sizes=[])


async def test_replays_order_against_an_external_timeline() -> None:
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:
            word = [0]
            seen: list[int] = []
            released = threading.Event()

            def wait(value: int) -> None:
                released.wait(5)
                word[0] = max(word[0], value)

            timeline = ag.ExternalTimeline(
                "other", lambda: word[0], lambda v: word.__setitem__(0, v), wait=wait
            )
            probe = ag.Kernel("probe", cpu=lambda out: seen.append(word[0]), outs=(0,))
            buf = rt.alloc("CPU:0", 1, np.int32)
            graph = await rt.compile([ag.Launch(probe, [buf])])
            with pytest.raises(trio.WouldBlock):
                graph.submit_nowait(after=[(timeline, 1)])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: graph(after=[(timeline, 1)], then=[(timeline, 5)]))
                await trio.testing.wait_all_tasks_blocked()
                assert seen == []  # still waiting for the other side
                released.set()
            assert seen == [1] and word[0] == 5
            replay = graph.submit_nowait(after=[(timeline, 5)], then=[(timeline, 3)])
            await replay.wait()
            assert seen == [1, 5] and word[0] == 5  # never moved backwards
            with pytest.raises(ag.UsageError, match="ExternalTimeline, int"):
                await graph(after=[(word, 1)])
            # Timelines are 64-bit: a value past 2**64-1 (or below 0) is refused before
            # anything is submitted, never written to the other side at completion.
            replays = graph.replays
            for bad in (1 << 64, -1):
                with pytest.raises(ag.UsageError, match=r"then=\(other, "):
                    await graph(then=[(timeline, bad)])
                with pytest.raises(ag.UsageError, match=r"after=\(other, "):
                    await graph(after=[(timeline, bad)])
                with pytest.raises(
                    ag.UsageError, match=r"\(other, -1\)|\(other, 18446744073709551616\)"
                ):
                    graph.submit_nowait(then=[(timeline, bad)])
            assert graph.replays == replays and word[0] == 5


async def test_external_timeline_polls_and_times_out() -> None:
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:
            timeline = ag.ExternalTimeline("stuck", lambda: 0, lambda v: None, timeout=0.01)
            buf = rt.alloc("CPU:0", 1, np.int32)
            graph = await rt.compile([ag.Launch(add_one, [buf, rt.alloc("CPU:0", 1, np.int32)])])
            with pytest.raises(TimeoutError, match="stuck did not reach 1"):
                await graph(after=[(timeline, 1)])


async def test_replays_waiting_for_a_timeline_hold_their_place_in_the_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Six submits wait for one timeline with room for two in flight: once it moves, two
    # are posted and the other four wait for room, as submit says it blocks once
    # max_in_flight are in flight (they must not all be posted at once).
    # The timeline's waits and the held kernel run on threads: the clock jumps only once
    # nothing has happened for a while in real time, so it stands still while they work.
    autojump_clock.autojump_threshold = 0.01
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"], max_in_flight=2, cpu_thread_bytes=0) as rt:
            word = [0]
            released, gate = threading.Event(), threading.Event()

            def wait(value: int) -> None:
                released.wait(10)

            timeline = ag.ExternalTimeline(
                "other", lambda: word[0], lambda v: word.__setitem__(0, v), wait=wait
            )
            held = ag.Kernel("held", cpu=lambda out: gate.wait(10), outs=(0,))
            graph = await rt.compile([ag.Launch(held, [rt.alloc("CPU:0", 1, np.int32)])])
            posted: list[int] = []  # rt.in_flight as each submit returned

            async def submit_one() -> None:
                replay = await graph.submit(after=[(timeline, 1)])
                posted.append(rt.in_flight)
                await replay.wait()

            try:
                async with trio.open_nursery() as nursery:
                    for _ in range(6):
                        nursery.start_soon(submit_one)
                    await trio.testing.wait_all_tasks_blocked()
                    assert rt.in_flight == 0 and rt.statistics().reserved <= 2
                    word[0] = 1
                    released.set()
                    # Until every submit has been posted or waits for room (the held
                    # kernel keeps what is posted in flight).
                    while len(posted) + rt.statistics().waiting_for_room < 6:
                        await trio.sleep(0.001)
                    assert rt.in_flight == 2 and len(posted) == 2
                    gate.set()
            finally:
                gate.set()
            assert len(posted) == 6 and max(posted) <= 2 and rt.in_flight == 0
            assert rt.statistics().reserved == 0


async def test_cancelled_timeline_waits_leave_nothing_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 45 submits wait for a timeline that never moves, and are cancelled: their waits
    # end at once. A later replay, whose timeline is reached 0.3 s after it was
    # submitted, runs then (the watcher polls at least every millisecond), not after
    # the cancelled waits' 60 s timeout.
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:
            stuck = ag.ExternalTimeline("stuck", lambda: 0, lambda v: None)
            word = [0]
            later = ag.ExternalTimeline("later", lambda: word[0], word.__setitem__)
            out = rt.alloc("CPU:0", 1, np.int32)
            graph = await rt.compile([ag.Launch(add_one, [out, out])])

            async def wait_for_stuck() -> None:
                await graph.submit(after=[(stuck, 1)])

            async with trio.open_nursery() as nursery:
                for _ in range(45):
                    nursery.start_soon(wait_for_stuck)
                await trio.testing.wait_all_tasks_blocked()
                assert rt.statistics().reserved == 45
                nursery.cancel_scope.cancel()
            assert rt.statistics().reserved == 0 and rt.in_flight == 0
            submitted = trio.current_time()

            async def move_later() -> None:
                await trio.sleep(0.3)
                word[0] = 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(move_later)
                await graph(after=[(later, 1)])
            assert trio.current_time() - submitted < 0.3 + 0.002
            assert (await rt.copyout(out))[0] == 1


async def test_waits_on_a_timeline_share_one_helper_thread_and_take_no_trio_thread() -> None:
    # Twenty replays wait for values of a timeline with a `wait` function: one helper
    # thread at a time blocks in it, off trio's thread limiter (to_thread callers never
    # wait behind it). Its return wakes the waits for that value or less, and the next
    # helper waits for the lowest of the rest: the wait function alone (its word never
    # moves here) lets every replay run.
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:
            lock = threading.Lock()
            inside = [0, 0]  # threads in the wait function now, most at once
            go = threading.Event()

            def wait(value: int) -> None:
                with lock:
                    inside[0] += 1
                    inside[1] = max(inside)
                go.wait(10)
                with lock:
                    inside[0] -= 1

            timeline = ag.ExternalTimeline("other", lambda: 0, lambda v: None, wait=wait)
            out = rt.alloc("CPU:0", 1, np.int32)
            graph = await rt.compile([ag.Launch(add_one, [out, out])])
            async with trio.open_nursery() as nursery:
                for value in range(1, 21):
                    nursery.start_soon(lambda v=value: graph(after=[(timeline, v)]))
                while inside[0] == 0:
                    await trio.sleep(0.001)
                await trio.sleep(0.01)
                assert trio.to_thread.current_default_thread_limiter().borrowed_tokens == 0
                go.set()
            assert inside == [0, 1]
            assert (await rt.copyout(out))[0] == 20


async def test_a_timeline_whose_read_or_wait_raises_fails_its_waits() -> None:
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:

            def broken(*args: object) -> int:
                raise OSError("the other runtime is gone")

            out = rt.alloc("CPU:0", 1, np.int32)
            graph = await rt.compile([ag.Launch(add_one, [out, out])])
            for timeline in (
                ag.ExternalTimeline("gone", broken, lambda v: None),
                ag.ExternalTimeline("gone", lambda: 0, lambda v: None, wait=broken),
            ):
                with pytest.raises(OSError, match="the other runtime is gone"):
                    await graph(after=[(timeline, 1)])
            assert rt.statistics().reserved == 0 and (await rt.copyout(out))[0] == 0


async def test_a_timeline_wait_ends_with_its_runtime() -> None:
    # A replay waits, in a task outside the runtime's block, for a timeline that never
    # moves; the block ends: the wait fails, saying why.
    stuck = ag.ExternalTimeline("stuck", lambda: 0, lambda v: None)
    ended: list[str] = []

    async def wait(graph: ag.Graph) -> None:
        with pytest.raises(ag.ClosedError) as info:
            await graph(after=[(stuck, 1)])
        ended.append(str(info.value))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async with ag.open_runtime(["CPU:0"]) as rt:
                out = rt.alloc("CPU:0", 1, np.int32)
                nursery.start_soon(wait, await rt.compile([ag.Launch(add_one, [out, out])]))
                await trio.testing.wait_all_tasks_blocked()
    assert ended == ["the runtime closed while a replay waited for an external timeline"]


# Run in a process of its own: a use of memory a freed wrapper no longer keeps alive can
# kill the process (SIGSEGV), which must fail the test rather than end pytest. Memory of
# 16 MiB is mapped for itself and unmapped when numpy lets go of it, so a write into it
# after that faults for certain.
_FREED_WRAPPERS = """
import gc, sys, threading
import numpy as np, trio
import actorgraph as ag

inc = ag.Kernel("inc", cpu=lambda out, a: np.add(a, 1, out=out), outs=(0,), ins=(1,))
N = 1 << 22

def wrapped(rt):
    return rt.wrap("CPU:0", np.zeros(N, np.int32), dtype=np.int32)

async def refused(what, call):
    try:
        await call()
    except ag.BufferFreedError as error:
        print(what, "refused:", error)
    else:
        print(what, "ran")

async def graphs(rt):
    wa, wc = wrapped(rt), wrapped(rt)
    graph = await rt.compile([ag.Launch(inc, [wa, wa]), ag.Launch(inc, [wc, wa])])
    await graph()
    rt.free(wc)
    print("freed", hex(wc.byte_range[0]))
    gc.collect()
    for _ in range(2):  # every time, not only the first
        await refused("call", graph)
    await refused("submit", lambda: graph.submit())
    await refused("submit_nowait", lambda: trio.lowlevel.checkpoint() if graph.submit_nowait() else None)
    await refused("run", lambda: rt.run([ag.Launch(inc, [wc, wa])]))
    await refused("copy", lambda: rt.run([ag.Copy(dst=wa, src=wc)]))

async def jits(rt):
    own = [wrapped(rt), wrapped(rt)]

    @ag.jit
    async def step(x):
        await rt.launch(inc, [own[0], x])
        await rt.launch(inc, [own[1], own[0]])

    x = rt.alloc("CPU:0", N, np.int32)
    for _ in range(3):
        await step(x)
    rt.free(own[1])
    print("freed", hex(own[1].byte_range[0]))
    gc.collect()
    await refused("jit", lambda: step(x))

async def in_flight(rt):
    gate = threading.Event()
    held = ag.Kernel("held", cpu=lambda out, a: (gate.wait(10), np.add(a, 1, out=out)), outs=(0,), ins=(1,))
    memory = np.zeros(N, np.int32)
    w = rt.wrap("CPU:0", memory, dtype=np.int32)
    src = rt.alloc("CPU:0", N, np.int32)
    graph = await rt.compile([ag.Launch(held, [w, src])])
    replay = await graph.submit()
    rt.free(w)
    del memory
    gc.collect()
    print("kept for work in flight:", rt.frees_pending)
    gate.set()
    await replay.wait()
    print("in flight: done, pending", rt.frees_pending)

async def main():
    async with ag.open_runtime(["CPU:0"], cpu_thread_bytes=0) as rt:
        await graphs(rt)
        await jits(rt)
        await in_flight(rt)

trio.run(main)
"""


async def test_a_freed_wrapper_is_refused_on_every_path_and_its_memory_outlives_work() -> None:
    # Every wrapper on a device shares one address space, so a graph over two wrappers
    # must check each of them, not one per address space; and rt.free of a wrapper while
    # submitted work uses it keeps its exporter alive until that work is done.
    import sys

    with trio.fail_after(120):
        done = await trio.run_process(
            [sys.executable, "-c", _FREED_WRAPPERS],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = done.stdout.decode()
    assert done.returncode == 0, (done.returncode, out, done.stderr.decode()[-2000:])
    lines = out.splitlines()
    for what in ("call", "call", "submit", "submit_nowait", "run", "copy", "jit"):
        if lines[0].startswith("freed "):
            freed = lines.pop(0).split()[1]  # the address of the wrapper freed
        line = lines.pop(0)
        assert re.fullmatch(
            rf"{what} refused: .*<Buffer CPU:0 4194304 int32 wrapping {freed} freed #\d+> "
            rf"was freed; wrap the memory again with rt.wrap\(...\) instead",
            line,
        ), line
    assert lines == ["kept for work in flight: 1", "in flight: done, pending 0"]
