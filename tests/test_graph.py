"""Graph (actorgraph/_graph.py): inputs that alias each other or the graph's own buffers,
refused or replanned, and what a graph counts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import actorgraph as ag
from actorgraph._graph import Spans

INC = ag.Kernel("inc", cpu=lambda x: np.add(x, 1, out=x), outs=(0,), ins=(0,))


async def fill(rt: ag.Runtime, buf: ag.Buffer, value: int) -> None:
    await rt.copyin(buf, np.full(buf.shape, value, buf.dtype))


async def test_aliased_inputs_refused_or_replanned() -> None:
    add = ag.Kernel("add", cpu=lambda out, a, b: np.add(a, b, out=out), outs=(0,), ins=(1, 2))
    async with ag.open_runtime(["CPU:0"]) as rt:
        a, b, tmp = (rt.alloc("CPU:0", 8, np.int32) for _ in range(3))
        # out = a + b written into b's role: items read a, then write b.
        items = [ag.Launch(add, [tmp, a, b]), ag.Launch(add, [b, tmp, a])]
        strict = await rt.compile(items, inputs=[a, b])
        with pytest.raises(
            ag.InputError, match=r"inputs 0 and 1 share memory .* compile with aliasing='replan'"
        ):
            await strict([a, a])
        with pytest.raises(ag.InputError, match="which the graph uses internally"):
            await strict([tmp, b])
        loose = await rt.compile(items, inputs=[a, b], aliasing="replan")
        x = rt.alloc("CPU:0", 8, np.int32)
        for _ in range(3):
            await fill(rt, x, 2)
            await loose([x, x])
            got = await rt.copyout(x)
            await fill(rt, x, 2)
            await rt.run([ag.Launch(add, [tmp, x, x]), ag.Launch(add, [x, tmp, x])])
            np.testing.assert_array_equal(got, await rt.copyout(x))
        np.testing.assert_array_equal(got, np.full(8, 6, np.int32))


@pytest.mark.parametrize("device", ["CPU:0", "SIM:0"])
async def test_replan_plans_views_of_one_region_and_overlapping_views(device: str) -> None:
    """aliasing="replan" takes inputs that are views of one region, overlapping views, and
    views of a buffer the graph uses internally; every replay equals numpy's result."""
    add = ag.Kernel("add", cpu=lambda out, a, b: np.add(a, b, out=out), outs=(0,), ins=(1, 2))
    async with ag.open_runtime([device], verify_plans=True) as rt:
        a, b, tmp = (rt.alloc(device, 8, np.int32) for _ in range(3))
        items = [ag.Launch(add, [tmp, a, b]), ag.Launch(add, [b, tmp, a]), ag.Launch(INC, [a])]
        graph = await rt.compile(items, inputs=[a, b], aliasing="replan")
        base = rt.alloc(device, 16, np.int32)
        start = np.arange(16, dtype=np.int32) * 3

        def reference(memory: np.ndarray, x: slice, y: slice, t: np.ndarray) -> None:
            np.add(memory[x], memory[y], out=t)
            np.add(t, memory[x], out=memory[y])
            np.add(memory[x], 1, out=memory[x])

        cases = [(0, 0), (0, 4), (4, 0), (2, 3), (0, 8)]  # same region, overlaps, disjoint
        for offset_x, offset_y in cases:
            x, y = base.view(offset_x, 8), base.view(offset_y, 8)
            expected = start.copy()
            scratch = np.zeros(8, np.int32)
            for _ in range(2):  # planned, then from the cache
                reference(
                    expected, slice(offset_x, offset_x + 8), slice(offset_y, offset_y + 8), scratch
                )
            await rt.copyin(base, start)
            with trio.fail_after(10):
                await graph([x, y])
                await graph([x, y])
            np.testing.assert_array_equal(
                await rt.copyout(base), expected, err_msg=str((offset_x, offset_y))
            )
        # An input that is a view of a buffer the graph uses internally.
        await rt.copyin(tmp, np.arange(8, dtype=np.int32))
        await rt.copyin(b, np.full(8, 5, np.int32))
        memory = np.concatenate([np.arange(8), np.full(8, 5)]).astype(np.int32)
        scratch = memory[0:8]
        reference(memory, slice(0, 8), slice(8, 16), scratch)
        await graph([tmp.view(0, 8), b])
        np.testing.assert_array_equal(await rt.copyout(tmp), memory[0:8])
        np.testing.assert_array_equal(await rt.copyout(b), memory[8:16])


async def test_a_submitted_replay_that_ran_where_it_was_submitted_is_done_and_tells_its_failure() -> (
    None
):
    fail = [False]

    def flaky(x: np.ndarray) -> None:
        if fail[0]:
            raise ValueError("flaky failed")
        np.add(x, 1, out=x)

    kernel = ag.Kernel("flaky", cpu=flaky, outs=(0,), ins=(0,))
    async with ag.open_runtime(["CPU:0"]) as rt:
        a = rt.alloc("CPU:0", 8, np.int32)
        graph = await rt.compile([ag.Launch(kernel, [a])])
        seen = [0]
        then = ag.ExternalTimeline("then", lambda: seen[0], lambda v: seen.__setitem__(0, v))
        replay = await graph.submit(then=[(then, 1)])  # idle queues: it runs at once
        assert replay.done and seen == [1] and "done" in repr(replay)
        with trio.fail_after(5):
            await replay.wait()
        fail[0] = True
        replay = graph.submit_nowait(then=[(then, 2)])
        assert replay.done and seen == [2]  # advanced, failed or not
        with pytest.raises(ag.ItemError, match=r"item 0 \(flaky\) .* ValueError: flaky failed"):
            replay.finish()
        with trio.fail_after(5), pytest.raises(ag.ItemError, match="flaky failed"):
            await replay.wait()
        assert graph.statistics().replays_done == 2


async def test_statistics_count_replays_in_flight_and_done() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        a, b = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:1", 8, np.int32)
        graph = await rt.compile([ag.Launch(INC, [a]), ag.Copy(dst=b, src=a)])
        replays = [await graph.submit() for _ in range(3)]
        assert graph.statistics().replays == 3
        for replay in replays:
            await replay.wait()
        stats = graph.statistics()
        assert (stats.in_flight, stats.replays_done) == (0, 3)
        assert stats.bytes_copied == 3 * b.nbytes
        assert rt.statistics().replays_done == 3
        np.testing.assert_array_equal(await rt.copyout(b), np.full(8, 3, np.int32))
        await graph.aclose()
        with pytest.raises(ag.ClosedError, match="closed with aclose"):
            await graph()


ADD = ag.Kernel("add", cpu=lambda out, a, b: np.add(a, b, out=out), outs=(0,), ins=(1, 2))


async def test_submit_reading_refuses_a_buffer_or_array_it_cannot_read_into() -> None:
    """graph.submit_reading (test_remote.py) checks what it is given first; a buffer of
    this host it leaves to submit and submit_copyout (None: nothing submitted)."""
    async with ag.open_runtime(["CPU:0"]) as rt, ag.open_runtime(["CPU:0"]) as other:
        x, gone = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
        graph = await rt.compile([ag.Launch(INC, [x])])
        out = np.empty(8, np.int32)
        with pytest.raises(ag.UsageError, match="submit_reading reads a Buffer, got"):
            await graph.submit_reading([], None, out, out)  # type: ignore[arg-type]
        with pytest.raises(ag.UsageError, match=r"submit_reading: out= is a int64 array"):
            await graph.submit_reading([], None, x, np.empty(8, np.int64))
        with pytest.raises(ag.UsageError, match="submit_reading: out= must be a writable"):
            await graph.submit_reading([], None, x, np.empty(16, np.int32)[::2])
        with pytest.raises(ag.UsageError, match=r"submit_reading: .* was allocated by"):
            await graph.submit_reading([], None, other.alloc("CPU:0", 8, np.int32), out)
        submissions = rt.statistics().submissions
        assert await graph.submit_reading([], None, x, out) is None
        assert rt.statistics().submissions == submissions
        rt.free(gone)
        with pytest.raises(ag.BufferFreedError, match="submit_reading: .* was freed"):
            await graph.submit_reading([], None, gone, out)


_RANGE = st.tuples(st.integers(0, 60), st.integers(1, 20)).map(lambda r: (r[0], r[0] + r[1]))


@given(st.lists(_RANGE, max_size=12), st.integers(0, 70), st.integers(0, 30))
def test_spans_find_a_range_that_overlaps_exactly_when_one_does(
    ranges: list[tuple[int, int]], start: int, length: int
) -> None:
    spans = Spans([(a, b, k) for k, (a, b) in enumerate(ranges)])  # ints stand for buffers
    stop = start + length
    found: Any = spans.overlapping(start, stop)
    overlapping = [k for k, (a, b) in enumerate(ranges) if start < b and a < stop and length]
    if overlapping:
        assert found in overlapping
    else:
        assert found is None
