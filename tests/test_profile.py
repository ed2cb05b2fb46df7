"""Profiling replays: what is recorded, when, and the statistics that count it."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest
from actorgraph.devices._actor import QueueActor

import actorgraph as ag
from actorgraph._progress import progress

N = 64
XOR = ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,), ins=(1, 2))


def _boom(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    raise ValueError("boom")


BOOM = ag.Kernel("boom", cpu=_boom, outs=(0,), ins=(1, 2))


async def _two_device_graph(rt: ag.Runtime) -> tuple[ag.Graph, list[ag.Buffer]]:
    """xor on CPU:0, copy to CPU:1, xor there: two cross-queue waits per replay."""
    a, b, c = (rt.alloc("CPU:0", N, np.int32) for _ in range(3))
    d, e = (rt.alloc("CPU:1", N, np.int32) for _ in range(2))
    await rt.copyin(a, np.arange(N, dtype=np.int32))
    await rt.copyin(b, np.full(N, 3, np.int32))
    items = [ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c), ag.Launch(XOR, [e, d, d])]
    return await rt.compile(items, inputs=[a, b]), [a, b, c, d, e]


async def test_runtime_profile_has_every_item_of_every_replay() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"], profile=True) as rt:
        graph, (a, b, *_) = await _two_device_graph(rt)
        for _ in range(4):
            await graph([a, b])
        profile = rt.profile()
    assert profile.actors == ("CPU:0/compute", "CPU:0/copy", "CPU:1/compute", "CPU:1/copy")
    assert len(profile.events) == 3 * 4
    assert [r.replay for r in profile.replays] == [1, 2, 3, 4]
    for replay in range(1, 5):
        events = sorted(profile.events_of(graph.number, replay), key=lambda e: e.item)
        assert [(e.item, e.label, e.actor, e.kind) for e in events] == [
            (0, "xor", "CPU:0/compute", ag.EventKind.KERNEL),
            (1, "copy CPU:0->CPU:1", "CPU:1/copy", ag.EventKind.COPY),
            (2, "xor", "CPU:1/compute", ag.EventKind.KERNEL),
        ]
        # Each item starts after the one it waited for ended.
        assert events[0].end <= events[1].start and events[1].end <= events[2].start
        assert all(e.start <= e.end for e in events)
        span = profile.replays[replay - 1]
        assert span.submitted <= events[0].start and events[2].end <= span.done
        queue_waits = [
            (w.on, w.item) for e in events for w in e.waits if w.kind is ag.WaitKind.QUEUE
        ]
        assert queue_waits == [("CPU:0/compute", 0), ("CPU:1/copy", 1)]
    first = sorted(profile.events_of(graph.number, 1), key=lambda e: e.item)
    assert first[0].buffers[0] == first[1].buffers[1]  # the copy reads what xor wrote
    assert first[0].name.startswith("xor #") and " <- " in first[0].name


async def test_per_call_profile_records_only_that_call() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        graph, (a, b, *_) = await _two_device_graph(rt)
        await graph([a, b])
        assert graph.last_profile is None
        assert len(rt.profile()) == 0
        await graph([a, b], profile=True)
        await graph([a, b])
        last = graph.last_profile
        assert last is not None and len(last.events) == 3
        assert {e.replay for e in last.events} == {2}
        assert len(rt.profile(clear=True)) == 3
        assert len(rt.profile()) == 0


async def test_profile_false_overrides_the_runtime_option() -> None:
    async with ag.open_runtime(["CPU:0"], profile=True) as rt:
        a, b, c = (rt.alloc("CPU:0", N, np.int32) for _ in range(3))
        graph = await rt.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, b])
        await graph([a, b], profile=False)
        assert graph.last_profile is None
        await graph([a, b])
        assert len(rt.profile()) == 1


async def test_profile_names_the_buffers_each_call_passed() -> None:
    async with ag.open_runtime(["CPU:0"], profile=True) as rt:
        a, b, c, a2 = (rt.alloc("CPU:0", N, np.int32) for _ in range(4))
        out = c.view(0, 16)
        graph = await rt.compile(
            [ag.Launch(XOR, [out, a.view(8, 16), b.view(0, 16)])], inputs=[a, b]
        )
        await graph([a2, b])
        (event,) = graph.last_profile.events  # type: ignore[union-attr]
        assert event.buffers == (
            f"#{c.alloc_id}[0:16]",
            f"#{a2.alloc_id}[8:24]",
            f"#{b.alloc_id}[0:16]",
        )
        assert event.writes == (True, False, False)


async def test_profile_tells_wrappers_on_one_device_apart() -> None:
    # Every wrapper on a device shares its #number (its address space): a profile names
    # each by the address it wraps too.
    async with ag.open_runtime(["CPU:0"], profile=True) as rt:
        memory = [np.zeros(N, np.int32) for _ in range(3)]
        a, b, c = (rt.wrap("CPU:0", m, dtype=np.int32) for m in memory)
        graph = await rt.compile(
            [ag.Launch(XOR, [c.view(0, 16), a.view(0, 16), b.view(0, 16)])], inputs=[a]
        )
        fresh = rt.wrap("CPU:0", np.zeros(N, np.int32), dtype=np.int32)
        for first in (a, fresh):
            await graph([first])
            (event,) = graph.last_profile.events  # type: ignore[union-attr]
            assert event.buffers == (
                f"#{c.alloc_id}@{c.address:#x}[0:16]",
                f"#{a.alloc_id}@{first.address:#x}[0:16]",
                f"#{b.alloc_id}@{b.address:#x}[0:16]",
            )


async def test_worker_thread_batches_get_a_time_per_item() -> None:
    # cpu_thread_bytes=0 sends every kernel to the worker thread, three in one batch.
    async with ag.open_runtime(["CPU:0"], profile=True, cpu_thread_bytes=0) as rt:
        a, b, c, d, e = (rt.alloc("CPU:0", N, np.int32) for _ in range(5))
        await rt.copyin(a, np.arange(N, dtype=np.int32))
        items = [ag.Launch(XOR, [c, a, b]), ag.Launch(XOR, [d, c, b]), ag.Launch(XOR, [e, d, b])]
        graph = await rt.compile(items)
        await graph()
        events = sorted(graph.last_profile.events, key=lambda e: e.item)  # type: ignore[union-attr]
        assert [e.item for e in events] == [0, 1, 2]
        for earlier, later in zip(events, events[1:]):
            assert earlier.start <= earlier.end <= later.start <= later.end
        np.testing.assert_array_equal(await rt.copyout(e), np.arange(N, dtype=np.int32))


async def test_failed_profiled_replay_still_raises_and_keeps_what_ran() -> None:
    async with ag.open_runtime(["CPU:0"], profile=True) as rt:
        a, b, c, d = (rt.alloc("CPU:0", N, np.int32) for _ in range(4))
        graph = await rt.compile([ag.Launch(XOR, [c, a, b]), ag.Launch(BOOM, [d, c, b])])
        with pytest.raises(
            ag.ItemError, match=r"item 1 \(boom\) on CPU:0/compute raised ValueError"
        ):
            await graph()
        assert [e.item for e in rt.profile().events] == [0, 1]


async def test_critical_path_follows_the_waits() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"], profile=True) as rt:
        graph, (a, b, *_) = await _two_device_graph(rt)
        await graph([a, b])
        await graph([a, b])
        path = rt.profile().critical_path()
    assert [(e.replay, e.item) for e in path] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]


async def test_statistics_count_replays_parked_waits_and_copied_bytes() -> None:
    # With every kernel on the worker thread, CPU:1/copy always reaches its wait for
    # CPU:0/compute before the thread is done: exactly one parked wait per replay.
    async with ag.open_runtime(["CPU:0", "CPU:1"], cpu_thread_bytes=0) as rt:
        a, b, c = (rt.alloc("CPU:0", N, np.int32) for _ in range(3))
        d = rt.alloc("CPU:1", N, np.int32)
        graph = await rt.compile([ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c)], inputs=[a, b])
        before = rt.statistics()
        for _ in range(5):
            await graph([a, b])
        stats = graph.statistics()
        assert (stats.replays, stats.replays_done, stats.in_flight) == (5, 5, 0)
        assert stats.waits_parked == 5
        assert stats.time_blocked > 0
        assert stats.bytes_copied == 5 * N * 4
        runtime = rt.statistics()
        assert (runtime.replays, runtime.replays_done) == (5, 5)
        assert runtime.waits_parked - before.waits_parked == 5
        assert runtime.bytes_copied - before.bytes_copied == 5 * N * 4
        copy = next(s for s in runtime.actors if s.name == "CPU:1/copy")
        assert (copy.waits_parked, copy.bytes_copied, copy.jobs_done) == (5, 5 * N * 4, 5)
        assert copy.time_blocked > 0
        compute = next(s for s in runtime.actors if s.name == "CPU:0/compute")
        assert compute.bytes_copied == 0
        await rt.copyin(d, np.zeros(N, np.int32))
        copy = next(s for s in rt.statistics().actors if s.name == "CPU:1/copy")
        assert copy.bytes_copied == 6 * N * 4  # host copies count too


async def test_profile_summary_lists_every_actor() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"], profile=True) as rt:
        graph, (a, b, *_) = await _two_device_graph(rt)
        await graph([a, b])
        text = rt.profile().summary()
    assert text.splitlines()[0] == "1 replays, 3 items"
    for actor in rt.actor_names():
        assert actor in text


def test_the_default_clock_is_perf_counter_and_overridable() -> None:
    class Simulated(QueueActor):
        def _now(self) -> float:
            return 42.0

    assert Simulated("SIM:0/compute")._now() == 42.0
    assert isinstance(QueueActor("CPU:9/compute")._now(), float)


async def test_logging_is_quiet_by_default_and_says_what_compile_did(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("actorgraph")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    with caplog.at_level(logging.DEBUG, logger="actorgraph"):
        async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
            await _two_device_graph(rt)
    assert "compiled 3 items onto 3 queues with 2 cross-queue waits" in caplog.messages


def test_progress_passes_items_through_with_or_without_tqdm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert list(progress(range(5), enabled=False)) == [0, 1, 2, 3, 4]
    assert list(progress(range(5), desc="x")) == [0, 1, 2, 3, 4]
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if the extra were not installed
    assert list(progress(range(3), enabled=True)) == [0, 1, 2]


def test_profiling_names_are_public() -> None:
    for name in (
        "Profile",
        "ProfileEvent",
        "ReplaySpan",
        "WaitRecord",
        "EventKind",
        "WaitKind",
        "MissingExtraError",
        "plot_timeline",
        "write_trace",
    ):
        assert name in ag.__all__ and hasattr(ag, name)
