"""CUDA devices on the fake driver: ordering against eager, graphs, copies, errors.

The same cases run on a real GPU in the `gpu`-marked tests at the end (skipped here
without one): only the driver differs.
"""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from _cuda_kernels import XOR, gpu_count, inc, needs_gpus, xor
from _extras import importorskip
from _model import ProgramSpec, check_program, random_programs
from _paths import ROOT, child_pythonpath
from actorgraph.devices.cuda import CopyKind, FakeDriver
from actorgraph.devices.cuda import _commands as C
from actorgraph.devices.cuda._driver import CudaError
from actorgraph.devices.remote.wire import decode
from actorgraph.scheduler import DeviceCaps, ItemKind, PlanItem, QueueId, QueueKind, assign_queue
from hypothesis import given, settings
from hypothesis import strategies as st

import actorgraph as ag

SIZE = 64
Make = Callable[[dict[str, ag.Buffer]], list[Any]]


def _alloc_set(rt: ag.Runtime, layout: dict[str, str]) -> dict[str, ag.Buffer]:
    return {name: rt.alloc(device, SIZE, np.int32) for name, device in layout.items()}


async def check_against_eager(
    rt: ag.Runtime,
    layout: dict[str, str],
    inputs: Sequence[str],
    make: Make,
    replays: int = 3,
    seed: int = 0,
) -> ag.Graph:
    """Replay `make`'s items as a graph (alternating two sets of input buffers) and run
    them eagerly on a third set; after every replay all buffers must be equal."""
    rng = np.random.default_rng(seed)
    eager = _alloc_set(rt, layout)
    graph_set = _alloc_set(rt, layout)
    alt = {name: rt.alloc(layout[name], SIZE, np.int32) for name in inputs}
    for name in layout:
        data = rng.integers(0, 1 << 20, SIZE, dtype=np.int32)
        await rt.copyin(eager[name], data)
        await rt.copyin(graph_set[name], data)
    graph = await rt.compile(make(graph_set), inputs=[graph_set[n] for n in inputs], verify=True)
    eager_items = make(eager)
    for replay in range(replays):
        chosen = {n: (alt[n] if replay % 2 else graph_set[n]) for n in inputs}
        for name in inputs:
            data = rng.integers(0, 1 << 20, SIZE, dtype=np.int32)
            await rt.copyin(eager[name], data)
            await rt.copyin(chosen[name], data)
        await rt.run(eager_items)
        await graph([chosen[n] for n in inputs])
        for name in layout:
            got = chosen.get(name, graph_set[name])
            np.testing.assert_array_equal(
                await rt.copyout(got),
                await rt.copyout(eager[name]),
                err_msg=f"buffer {name} after replay {replay}",
            )
    return graph


# tests/test_cuda_shim.py runs this file on the real driver (over a test libcuda):
# `runtime()` then opens real CUDA devices, and tests of what only the fake driver does
# (kernels that run their own CPU bodies, host-memory DLPack) are left out.
ON_REAL_DRIVER = os.environ.get("ACTORGRAPH_TEST_CUDA_DRIVER") == "real"
fake_only = pytest.mark.skipif(ON_REAL_DRIVER, reason="tests what the fake driver does")


def runtime(devices: Sequence[str], driver: Any = None, **options: Any) -> Any:
    if driver is None and ON_REAL_DRIVER:
        driver = "real"
    return ag.open_runtime(list(devices), cuda_driver=driver or FakeDriver(), **options)


# -- the ordering cases every graph runner must get right --

CASES: dict[str, tuple[dict[str, str], list[str], Make]] = {
    "two writes to one buffer": (
        {"a": "CUDA:0", "b": "CUDA:0", "c": "CUDA:0"},
        ["a", "b"],
        lambda s: [xor(s["c"], s["a"], s["b"]), xor(s["c"], s["c"], s["a"])],
    ),
    "read then write": (
        {"a": "CUDA:0", "b": "CUDA:0", "c": "CUDA:0", "d": "CUDA:1"},
        ["a"],
        lambda s: [ag.Copy(dst=s["d"], src=s["b"]), xor(s["b"], s["a"], s["c"])],
    ),
    "write then read": (
        {"a": "CUDA:0", "b": "CUDA:0", "c": "CUDA:0", "d": "CUDA:1"},
        ["a"],
        lambda s: [xor(s["c"], s["a"], s["b"]), ag.Copy(dst=s["d"], src=s["c"]), inc(s["d"])],
    ),
    "copy after a kernel writes its source": (
        {"a": "CUDA:0", "b": "CUDA:0", "d": "CUDA:1"},
        ["a"],
        lambda s: [inc(s["a"]), ag.Copy(dst=s["d"], src=s["a"]), inc(s["a"])],
    ),
    "kernel after a copy writes its input": (
        {"a": "CUDA:1", "b": "CUDA:0", "c": "CUDA:0"},
        ["a"],
        lambda s: [ag.Copy(dst=s["b"], src=s["a"]), xor(s["c"], s["b"], s["b"]), inc(s["b"])],
    ),
    "copies across 4 devices": (
        {f"x{i}": f"CUDA:{i}" for i in range(4)},
        ["x0"],
        lambda s: (
            [inc(s["x0"])]
            + [ag.Copy(dst=s[f"x{i + 1}"], src=s[f"x{i}"]) for i in range(3)]
            + [inc(s["x3"]), ag.Copy(dst=s["x0"], src=s["x3"])]
        ),
    ),
    "offset views, overlapping and disjoint": (
        {"a": "CUDA:0", "b": "CUDA:1"},
        ["a"],
        lambda s: [
            inc(s["a"].view(0, 32)),
            inc(s["a"].view(16, 32)),
            ag.Copy(dst=s["b"].view(0, 16), src=s["a"].view(48, 16)),
            ag.Copy(dst=s["b"].view(16, 16), src=s["a"].view(0, 16)),
            inc(s["a"].view(32, 32)),
        ],
    ),
    "CPU and CUDA in one graph": (
        {"h": "CPU:0", "g": "CUDA:0", "k": "CUDA:1", "h2": "CPU:0"},
        ["h"],
        lambda s: [
            inc(s["h"]),
            ag.Copy(dst=s["g"], src=s["h"]),
            inc(s["g"]),
            ag.Copy(dst=s["k"], src=s["g"]),
            ag.Copy(dst=s["h2"], src=s["k"]),
            inc(s["h2"]),
            ag.Copy(dst=s["h"], src=s["g"]),
        ],
    ),
}
DEVICES = ["CUDA:0", "CUDA:1", "CUDA:2", "CUDA:3", "CPU:0"]


@pytest.mark.parametrize("case", sorted(CASES))
async def test_ordering_case_matches_eager(case: str) -> None:
    layout, inputs, make = CASES[case]
    async with runtime(DEVICES) as rt:
        await check_against_eager(rt, layout, inputs, make)


@pytest.mark.parametrize(
    "variant",
    [
        {"driver": lambda: FakeDriver(stream_mem_ops=False)},
        {"driver": lambda: FakeDriver(peer=False)},
        {"driver": FakeDriver, "cuda_graphs": False},
        {"driver": FakeDriver, "cuda_mem_ops": False},
        {"driver": FakeDriver, "cuda_graph_min_items": 1},
        {"driver": FakeDriver, "timeline_start": (1 << 63) - 3},
        {"driver": FakeDriver, "timeline_start": (1 << 64) - 1000},
    ],
    ids=[
        "event fallback",
        "no peer access",
        "streams only",
        "mem ops off",
        "graphs of one item",
        "timeline near 2**63",
        "timeline near 2**64",
    ],
)
@pytest.mark.parametrize(
    "case",
    [
        "copies across 4 devices",
        "CPU and CUDA in one graph",
        "offset views, overlapping and disjoint",
    ],
)
async def test_ordering_variants(case: str, variant: dict[str, Any]) -> None:
    options = dict(variant)
    driver = options.pop("driver")()
    layout, inputs, make = CASES[case]
    async with runtime(DEVICES, driver, **options) as rt:
        await check_against_eager(rt, layout, inputs, make, replays=4)


async def test_several_graphs_share_buffers_and_replay_back_to_back() -> None:
    async with runtime(["CUDA:0", "CUDA:1"]) as rt:
        a, b, c = (rt.alloc("CUDA:0", SIZE, np.int32) for _ in range(3))
        d = rt.alloc("CUDA:1", SIZE, np.int32)
        await rt.copyin(a, np.arange(SIZE, dtype=np.int32))
        first = await rt.compile([inc(a), ag.Copy(dst=d, src=a)], verify=True)
        second = await rt.compile([inc(d), ag.Copy(dst=c, src=d)], verify=True)
        async with trio.open_nursery() as nursery:
            for _ in range(5):  # submitted back to back: device timelines keep them in order
                nursery.start_soon(first)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(second)
                await trio.testing.wait_all_tasks_blocked()
        expected = np.arange(SIZE, dtype=np.int32) + 5
        np.testing.assert_array_equal(await rt.copyout(a), expected)
        np.testing.assert_array_equal(await rt.copyout(c), expected + 1)


# -- the fast path --


async def test_a_replay_is_one_graph_launch_and_updates_only_changed_nodes() -> None:
    driver = FakeDriver()
    async with runtime(["CUDA:0"], driver) as rt:
        a, b, c = (rt.alloc("CUDA:0", SIZE, np.int32) for _ in range(3))
        graph = await rt.compile([xor(c, a, b)] + [inc(c) for _ in range(8)], inputs=[a])
        compute = rt.device("CUDA:0").queues[QueueKind.COMPUTE]
        await graph([a])
        await graph([a])
        assert (compute.graph_builds, compute.graph_launches) == (1, 2)
        updates = driver.statistics().node_updates
        a2 = rt.alloc("CUDA:0", SIZE, np.int32)
        await rt.copyin(a2, np.full(SIZE, 7, np.int32))
        await graph([a2])
        assert compute.graph_builds == 1  # new input: the same graph, nodes updated
        # Only the kernel reading the input changed (plus the per-replay signal values).
        assert driver.statistics().node_updates - updates <= 3
        np.testing.assert_array_equal(await rt.copyout(c), np.full(SIZE, 7 + 8, np.int32))


async def test_one_graph_switched_between_input_sets_is_updated_each_time_it_switches() -> None:
    driver = FakeDriver()
    async with runtime(["CUDA:0"], driver) as rt:
        a, a2, b, c = (rt.alloc("CUDA:0", SIZE, np.int32) for _ in range(4))
        await rt.copyin(a2, np.full(SIZE, 7, np.int32))
        graph = await rt.compile([xor(c, a, b)] + [inc(c) for _ in range(8)], inputs=[a])
        compute = rt.device("CUDA:0").queues[QueueKind.COMPUTE]
        await graph([a])
        for src, fill in ((a2, 7), (a, 0), (a2, 7), (a2, 7)):
            updates = driver.statistics().node_updates
            await graph([src])
            np.testing.assert_array_equal(await rt.copyout(c), np.full(SIZE, fill + 8, np.int32))
        # The last call found the graph as the one before left it: only its per-replay
        # signal values moved; every switch before it updated the input's node as well.
        assert driver.statistics().node_updates - updates <= 2
        assert compute.graph_builds == 1 and compute.graph_launches == 5


@fake_only
async def test_back_to_back_replays_are_queued_on_the_gpu_without_the_host() -> None:
    # The second replay's wait for the first (the device timeline) is a stream wait on a
    # mapped word, so its graph is launched while the first is still running.
    gate = threading.Event()

    def held(buf: np.ndarray, n: int) -> None:
        gate.wait(30)
        buf[:n] += 1

    kernel = ag.Kernel("inc_k", cpu=held, cuda="inc_k", outs=(0,), ins=(0,))
    n = ag.Var("n", 1, SIZE)
    async with runtime(["CUDA:0", "CPU:0"]) as rt:
        g = rt.alloc("CUDA:0", SIZE, np.int32)
        h = rt.alloc("CPU:0", SIZE, np.int32)
        launch = ag.Launch(kernel, [g], vars=[n], fixedvars={n: SIZE})
        graph = await rt.compile([inc(h), ag.Copy(dst=g, src=h), launch, inc(g)])
        copy = rt.device("CUDA:0").queues[QueueKind.COPY]
        compute = rt.device("CUDA:0").queues[QueueKind.COMPUTE]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(graph)
            nursery.start_soon(graph)
            await trio.testing.wait_all_tasks_blocked()
            assert compute.graph_launches == 2  # both queued behind the held kernel
            # The copy queue's waits (on the CPU queue of replay 2, which itself waits for
            # replay 1) are stream waits on mirrored words: both jobs are already on the GPU.
            assert copy.jobs_done == 2 and copy.parks == 0
            gate.set()
        np.testing.assert_array_equal(await rt.copyout(g), np.full(SIZE, 2 + 2, np.int32))


@fake_only
async def test_symbolic_launch_dims_are_evaluated_per_call() -> None:
    seen: list[tuple[int, ...]] = []

    def body(
        buf: np.ndarray, n: int, *, global_size: tuple[int, ...], local_size: tuple[int, ...]
    ) -> None:
        seen.append(global_size)
        buf[:n] += 1

    kernel = ag.Kernel("inc_k", cpu=body, cuda="inc_k", outs=(0,), ins=(0,), pass_dims=True)
    n = ag.Var("n", 1, SIZE)
    async with runtime(["CUDA:0"]) as rt:
        buf = rt.alloc("CUDA:0", SIZE, np.int32)
        launch = ag.Launch(kernel, [buf], vars=[n], global_size=ag.cdiv(n, 16), local_size=16)
        graph = await rt.compile([launch, launch])
        await graph(var_vals={n: 16})
        await graph(var_vals={n: 64})
        await graph(var_vals={n: 16})
        expected = np.zeros(SIZE, np.int32)
        expected[:16] += 6
        expected[16:] += 2
        np.testing.assert_array_equal(await rt.copyout(buf), expected)
    assert [g[0] for g in seen] == [1, 1, 4, 4, 1, 1]


async def test_kernels_compile_once_per_arch_and_load_once_per_device() -> None:
    driver = FakeDriver()
    async with runtime(["CUDA:0", "CUDA:1"], driver) as rt:
        bufs = [rt.alloc(d, SIZE, np.int32) for d in ("CUDA:0", "CUDA:1") for _ in range(3)]
        await rt.run([xor(*bufs[:3]), xor(*bufs[3:]), xor(*bufs[:3])])
        assert driver.statistics().compiles == 1
    other_arch = FakeDriver(arch=(8, 0))
    async with runtime(["CUDA:0"], other_arch) as rt:
        bufs = [rt.alloc("CUDA:0", SIZE, np.int32) for _ in range(3)]
        await rt.run([xor(*bufs)])
        assert rt.device("CUDA:0").arch == "sm_80"


# -- copies and DLPack --


async def test_gpu_queues_stop_for_a_host_callback_only_where_the_host_waits() -> None:
    # A host node holds its stream until the callback has run (and has the GIL): a
    # signal only GPU queues wait on is a word write alone; one a CPU queue waits on
    # also tells the host.
    async with runtime(["CUDA:0", "CUDA:1", "CPU:0"], cuda_graph_min_items=1) as rt:
        a, b = rt.alloc("CUDA:0", SIZE, np.int32), rt.alloc("CUDA:1", SIZE, np.int32)
        h = rt.alloc("CPU:0", SIZE, np.int32)
        graph = await rt.compile(
            [inc(a), inc(a), ag.Copy(dst=b, src=a), inc(b), ag.Copy(dst=h, src=b), inc(h)]
        )
        await rt.copyin(a, np.zeros(SIZE, np.int32))
        for _ in range(2):
            await graph()
        np.testing.assert_array_equal(await rt.copyout(h), np.full(SIZE, 6, np.int32))
        if not rt.device("CUDA:0").mem_ops:
            return  # (a GPU without stream memory operations: no graphs, events order it)

        def nodes(name: str, queue: QueueKind) -> tuple[int, int]:
            actor: Any = rt.device(name).queues[queue]
            (entry,) = actor._graphs.values()
            writes = sum(1 for c in entry.cmds if c[0] == C.WRITE_VALUE)
            reports = sum(1 for c in entry.cmds if c[0] == C.HOST and c[1] == actor.host_signal)
            return writes, reports

        # CUDA:0 signals CUDA:1's copy queue only; CUDA:1's copy queue signals CUDA:1's
        # compute queue (a GPU) and then the CPU queue (the host).
        assert nodes("CUDA:0", QueueKind.COMPUTE) == (1, 0)
        assert nodes("CUDA:1", QueueKind.COMPUTE) == (1, 0)
        assert nodes("CUDA:1", QueueKind.COPY) == (2, 1)


async def test_a_graph_with_no_host_work_reports_its_end_from_a_side_stream() -> None:
    # Device-to-device copies only (on a GPU, kernels too): the graph holds no host node,
    # so replays queued back to back run without the stream stopping for the host.
    async with runtime(["CUDA:0", "CUDA:1", "CPU:0"]) as rt:
        a, b = rt.alloc("CUDA:0", SIZE, np.int32), rt.alloc("CUDA:1", SIZE, np.int32)
        c = rt.alloc("CUDA:1", SIZE, np.int32)
        # Both copies land on CUDA:1's copy queue: one graph of two items there.
        graph = await rt.compile([ag.Copy(dst=b, src=a), ag.Copy(dst=c, src=b)])
        for step in range(3):
            await rt.copyin(a, np.full(SIZE, step, np.int32))
            replays = [await graph.submit() for _ in range(3)]
            for replay in replays:
                await replay.wait()
            np.testing.assert_array_equal(await rt.copyout(c), np.full(SIZE, step, np.int32))
        if not rt.device("CUDA:1").mem_ops:
            return  # (a GPU without stream memory operations: no graphs)
        copier: Any = rt.device("CUDA:1").queues[QueueKind.COPY]
        (entry,) = copier._graphs.values()
        assert entry.notify and not any(cmd[0] == C.HOST for cmd in entry.cmds)
        assert copier.graph_launches == 9
        assert copier._notify is not None and not copier._notified  # all reported


async def test_kernels_compile_on_a_worker_thread_not_the_trio_thread() -> None:
    # NVRTC takes a good part of a second a kernel: compile() and run() build kernels
    # on a worker thread first, so the runtime's other work goes on meanwhile.
    class TimedCompiles(FakeDriver):
        name = "timed"  # not "fake": its compiles count as slow, as NVRTC's do

        def __init__(self) -> None:
            super().__init__()
            self.threads: list[int] = []

        def compile(self, source: str, name: str, arch: str) -> bytes:
            before = self.compiles
            image = super().compile(source, name, arch)
            if self.compiles > before:  # a real compile, not a cache hit
                self.threads.append(threading.get_ident())
            return image

    driver = TimedCompiles()
    async with runtime(["CUDA:0"], driver) as rt:
        a, b, c = (rt.alloc("CUDA:0", SIZE, np.int32) for _ in range(3))
        await rt.compile([xor(c, a, b)])
        await rt.run([inc(c)])
        await rt.run([inc(c)])  # built already: no thread hop
    assert len(driver.threads) == 2
    assert threading.get_ident() not in driver.threads


async def test_closing_the_runtime_gives_back_its_gpu_memory_except_exported_buffers() -> None:
    driver = FakeDriver()
    for export in (False, True):
        async with runtime(["CUDA:0", "CUDA:1", "CPU:0"], driver) as rt:
            a, b = rt.alloc("CUDA:0", SIZE, np.int32), rt.alloc("CUDA:1", SIZE, np.int32)
            h = rt.alloc("CPU:0", SIZE, np.int32)
            graph = await rt.compile([inc(a), ag.Copy(dst=b, src=a), ag.Copy(dst=h, src=b), inc(h)])
            await graph()
            await rt.copyin(a, np.arange(SIZE, dtype=np.int32))
            if export:
                view = np.from_dlpack(b)  # may outlive the runtime: b must stay
        if export:
            assert driver.statistics().live_allocations == 1
            assert view.sum() == SIZE  # (the fake's device memory is host memory)
            del view, a, b, h, graph  # the consumer and the user let go: it goes too
            gc.collect()
        else:
            with pytest.raises(
                BufferError, match="its runtime has closed and its GPU memory is gone"
            ):
                np.from_dlpack(b)
        assert driver.statistics().live_allocations == 0  # buffers, staging, words


async def test_freeing_an_exported_buffer_keeps_its_memory_until_the_consumer_lets_go() -> None:
    driver = FakeDriver()
    async with runtime(["CUDA:0"], driver) as rt:
        b = rt.alloc("CUDA:0", SIZE, np.int32)
        await rt.copyin(b, np.arange(SIZE, dtype=np.int32))
        view = np.from_dlpack(b)
        pointer = b.memory.pointer
        rt.free(b)
        assert driver.allocated(pointer) and view.sum() == SIZE * (SIZE - 1) // 2
        del view
        gc.collect()  # now it goes (on the device's helper thread)
    assert not driver.allocated(pointer)  # closing waited for the helper


async def test_host_copies_go_through_pinned_staging_on_the_gpu_copy_queue() -> None:
    async with runtime(["CPU:0", "CUDA:0"]) as rt:
        h = rt.alloc("CPU:0", SIZE, np.int32)
        g = rt.alloc("CUDA:0", SIZE, np.int32)
        await rt.copyin(h, np.arange(SIZE, dtype=np.int32))
        graph = await rt.compile([ag.Copy(dst=g, src=h)])
        assert graph.plan.queues == (QueueId("CUDA:0", QueueKind.COPY),)
        await graph()
        np.testing.assert_array_equal(await rt.copyout(g), np.arange(SIZE, dtype=np.int32))
        with pytest.raises(ag.UsageError, match="not in host-visible memory"):
            g.host_view()


def test_planner_puts_host_gpu_copies_on_the_gpu_side() -> None:
    caps = {
        "CPU:0": DeviceCaps("CPU:0", "CPU", is_cpu=True),
        "CUDA:0": DeviceCaps("CUDA:0", "CUDA", host_visible=False),
    }
    to_cpu = PlanItem("copy", ItemKind.COPY, "CPU:0", (), "CUDA:0")
    to_gpu = PlanItem("copy", ItemKind.COPY, "CUDA:0", (), "CPU:0")
    assert assign_queue(to_cpu, caps) == QueueId("CUDA:0", QueueKind.COPY)
    assert assign_queue(to_gpu, caps) == QueueId("CUDA:0", QueueKind.COPY)


@fake_only
async def test_dlpack_views_cpu_and_cuda_buffers_without_a_copy() -> None:
    async with runtime(["CPU:0", "CUDA:0"]) as rt:
        h = rt.alloc("CPU:0", (4, 8), np.int32)
        g = rt.alloc("CUDA:0", (4, 8), np.float32)
        await rt.copyin(h, np.arange(32, dtype=np.int32).reshape(4, 8))
        await rt.copyin(g, np.ones((4, 8), np.float32))
        assert h.__dlpack_device__() == (1, 0)
        view = np.from_dlpack(h)
        np.testing.assert_array_equal(view, np.arange(32).reshape(4, 8))
        gview = np.from_dlpack(g)
        assert gview.shape == (4, 8) and gview.dtype == np.float32
        gview[0, 0] = 5.0  # the fake's device memory is host memory: a true view
        assert (await rt.copyout(g))[0, 0] == 5.0
        sub = np.from_dlpack(g.view(offset=8, size=8))
        np.testing.assert_array_equal(sub, np.ones(8, np.float32))
        for _ in range(100):  # unconsumed capsules release what they hold
            g.__dlpack__()
        with pytest.raises(BufferError, match="never copies"):
            g.__dlpack__(copy=True)
        with pytest.raises(BufferError, match=r"lives on DLPack device \(1, 0\), not \(2, 0\)"):
            g.__dlpack__(dl_device=(2, 0))


@fake_only
async def test_a_gpu_refuses_a_dtype_of_the_other_byte_order() -> None:
    # A GPU's kernels read memory in its own byte order: a big-endian buffer or view would
    # hold other numbers there than its dtype says.
    async with runtime(["CPU:0", "CUDA:0"]) as rt:
        with pytest.raises(
            ag.DeviceError,
            match=r"CUDA:0: dtype >i4 is not in this machine's byte order, and a GPU's kernels "
            r"read memory in theirs: allocate int32 and convert on the host "
            r"\(array.astype\(np.int32\)\)",
        ):
            rt.alloc("CUDA:0", 4, ">i4")
        g = rt.alloc("CUDA:0", 4, np.int32)
        with pytest.raises(
            ag.UsageError,
            match=r"view\(dtype='>i2'\) of <Buffer CUDA:0 4 int32 #\d+>: CUDA:0's kernels "
            r"read memory in this machine's byte order, so as int16 big-endian the view would hold "
            r"other numbers; view it as int16 and convert on the host",
        ):
            g.view(dtype=">i2")
        assert g.view(dtype="<i2").size == 8  # its own byte order: a view as any other
        big = rt.alloc("CPU:0", 4, ">i4")  # a CPU kernel reads it through its dtype
        assert big.view(dtype=">i2").size == 8


# -- errors --


def test_opening_cuda_with_the_real_driver_without_a_gpu_says_how_to_go_on() -> None:
    if gpu_count():
        pytest.skip("this machine has a GPU")

    async def main() -> None:
        async with ag.open_runtime(["CUDA:0"]):
            pass

    with pytest.raises(ag.DeviceError, match=r"cannot open CUDA:0: .*cuda_driver='fake'"):
        trio.run(main)


async def test_bad_cuda_device_and_driver_names() -> None:
    with pytest.raises(ag.DeviceError, match=r"cannot open CUDA:3: this machine has 2 CUDA"):
        async with runtime(["CUDA:3"], FakeDriver(devices=2)):
            pass
    with pytest.raises(ag.DeviceError, match=r"cuda_driver='bogus' is not a CUDA driver"):
        async with ag.open_runtime(["CUDA:0"], cuda_driver="bogus"):
            pass


async def test_env_var_picks_the_fake_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACTORGRAPH_CUDA_DRIVER", "fake")
    async with ag.open_runtime(["CUDA:0"]) as rt:
        assert rt.device("CUDA:0").driver.name == "fake"


@fake_only
@pytest.mark.actorgraph(devices=1)
async def test_kernels_without_the_needed_bodies_are_refused(ag_cuda_runtime: ag.Runtime) -> None:
    cpu_only = ag.Kernel("k", cpu=lambda out: None, outs=(0,))
    cuda_only = ag.Kernel("k", cuda='extern "C" __global__ void k(int *o) {}', outs=(0,))
    rt = ag_cuda_runtime
    buf = rt.alloc("CUDA:0", SIZE, np.int32)
    with pytest.raises(ag.DeviceError, match="has no CUDA source"):
        await rt.run([ag.Launch(cpu_only, [buf])])
    with pytest.raises(ag.DeviceError, match="fake CUDA driver runs kernels with their CPU"):
        await rt.run([ag.Launch(cuda_only, [buf])])
    missing = ag.Kernel("nope", cpu=lambda out: None, cuda="__global__ void k() {}", outs=(0,))
    with pytest.raises(ag.DeviceError, match="did not build for CUDA:0"):
        await rt.run([ag.Launch(missing, [buf])])
    big = ag.Var("big", 0, 1 << 40)
    with pytest.raises(ag.DeviceError, match="does not fit the 32-bit int"):
        await rt.run([ag.Launch(XOR, [buf, buf, buf], vars=[big])], var_vals={big: 1 << 33})


async def test_a_block_larger_than_cuda_allows_is_refused_when_lowered() -> None:
    async with runtime(["CUDA:0"]) as rt:
        buf = rt.alloc("CUDA:0", SIZE, np.int32)
        n = ag.Var("n", 1, 99)
        launch = ag.Launch(
            XOR, [buf, buf, buf], vars=[n], fixedvars={n: 1}, global_size=1, local_size=(64, 32)
        )
        with pytest.raises(
            ag.DeviceError,
            match=r"'xor_k' on CUDA:0: local_size=\(64, 32, 1\) "
            r"is 2048 threads a block, and CUDA allows at most 1024",
        ):
            await rt.compile([launch])


@pytest.mark.parametrize(
    "driver", ["fake", pytest.param("real", marks=[pytest.mark.gpu, needs_gpus(1)])]
)
async def test_empty_buffers_copy_as_nothing_between_gpus_and_the_host(driver: str) -> None:
    # The driver takes no zero-length copies (a graph memcpy node of 0 bytes is invalid):
    # copies of empty buffers lower to nothing, in graphs, eagerly and through copyin/out.
    devices = (
        ["CUDA:0", "CUDA:1", "CPU:0"]
        if driver == "fake" or gpu_count() > 1
        else ["CUDA:0", "CPU:0"]
    )
    async with ag.open_runtime(devices, cuda_driver=driver) as rt:
        a, b, h = (rt.alloc(d, 0, np.int32) for d in (devices[0], devices[-2], "CPU:0"))
        items = [ag.Copy(dst=b, src=a), ag.Copy(dst=h, src=b), ag.Copy(dst=a, src=h)]
        graph = await rt.compile(items)
        for _ in range(2):
            await graph()
        await rt.run(items)
        await rt.copyin(a, np.zeros(0, np.int32))
        assert (await rt.copyout(b)).shape == (0,)


_FREE_WHILE_GPU_WAITS = """
import threading, numpy as np, trio, actorgraph as ag
from _cuda_kernels import inc
from actorgraph.devices.cuda import FakeDriver

gate = threading.Event()

def gated(buf, n):
    assert gate.wait(30)
    buf[:n] += 1

GATED = ag.Kernel("inc_k", cpu=gated, cuda="inc_k", outs=(0,), ins=(0,))
N = ag.Var("n", 1, 64)

async def main():
    driver = FakeDriver()
    # cpu_thread_bytes=1: the gated kernel runs on the CPU worker thread, not in trio.
    async with ag.open_runtime(["CUDA:0", "CPU:0"], cuda_driver=driver, cpu_thread_bytes=1) as rt:
        h, g, spare = rt.alloc("CPU:0", 64, np.int32), rt.alloc("CUDA:0", 64, np.int32), rt.alloc("CUDA:0", 8, np.int32)
        graph = await rt.compile([ag.Launch(GATED, [h], vars=[N], fixedvars={N: 64}),
                                  ag.Copy(dst=g, src=h), inc(g), inc(g)])
        replay = await graph.submit()
        await trio.sleep(0)  # the GPU queue is now waiting on the CPU kernel's signal
        pointer = spare.memory.pointer
        rt.free(spare)  # must neither block nor give the memory back yet
        assert rt.frees_pending == 1 and driver.allocated(pointer)
        gate.set()
        await replay.wait()
        assert rt.frees_pending == 0  # handed to the device (which may free it on a thread)
        assert (await rt.copyout(g)).tolist() == [3] * 64
    assert not driver.allocated(pointer)  # closing the runtime waited for the free
    print("ok")

trio.run(main)
"""


def test_freeing_a_buffer_while_the_gpu_waits_on_cpu_work_neither_blocks_nor_frees_early() -> None:
    # Run apart, with a time limit: the failure this guards against is a hang (free
    # waiting on the GPU, which waits on a CPU signal that needs the blocked trio thread).
    done = subprocess.run(
        [sys.executable, "-c", _FREE_WHILE_GPU_WAITS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": child_pythonpath()},
    )
    assert done.stdout.strip() == "ok", done.stdout + done.stderr


class _NoGraphs(FakeDriver):
    """A driver that will not build kernel nodes into graphs, with the error given."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error

    def graph_add_kernel(self, *args: Any, **kwargs: Any) -> Any:
        raise CudaError(self.error, "refused for the test")


async def test_a_job_the_driver_will_not_build_as_a_graph_runs_on_the_stream() -> None:
    async with runtime(["CUDA:0", "CPU:0"], _NoGraphs("CUDA_ERROR_NOT_SUPPORTED")) as rt:
        g = rt.alloc("CUDA:0", SIZE, np.int32)
        graph = await rt.compile([inc(g) for _ in range(4)])
        for _ in range(3):
            await graph()
        np.testing.assert_array_equal(await rt.copyout(g), np.full(SIZE, 12, np.int32))
        compute = rt.device("CUDA:0").queues[QueueKind.COMPUTE]
        assert (compute.graph_refusals, compute.graph_launches) == (1, 0)  # asked once


async def test_a_sticky_error_while_building_a_graph_fails_the_call_and_loses_the_gpu() -> None:
    async with runtime(["CUDA:0", "CPU:0"], _NoGraphs("CUDA_ERROR_ILLEGAL_ADDRESS")) as rt:
        g = rt.alloc("CUDA:0", SIZE, np.int32)
        graph = await rt.compile([inc(g) for _ in range(4)])
        with pytest.raises(ag.ItemError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
            await graph()
        with pytest.raises(
            ag.ItemError, match="CUDA:0 hit CUDA_ERROR_ILLEGAL_ADDRESS.*open a new runtime"
        ):
            await graph()
        h = rt.alloc("CPU:0", SIZE, np.int32)
        await rt.run([inc(h)])  # the CPU carries on


@fake_only
async def test_a_kernel_that_raises_fails_its_call_and_the_runtime_goes_on() -> None:
    def boom(out: np.ndarray, n: int) -> None:
        raise ValueError("bad value")

    kernel = ag.Kernel("inc_k", cpu=boom, cuda="inc_k", outs=(0,), ins=(0,))
    async with runtime(["CUDA:0"]) as rt:
        buf = rt.alloc("CUDA:0", SIZE, np.int32)
        launch = ag.Launch(
            kernel, [buf], vars=[ag.Var("n", 1, 99)], fixedvars={ag.Var("n", 1, 99): 1}
        )
        graph = await rt.compile([inc(buf), launch, inc(buf)])
        for _ in range(2):  # every call fails the same way; nothing hangs
            with pytest.raises(
                ag.ItemError, match=r"item 1 \(inc_k\) on CUDA:0/compute raised ValueError"
            ):
                await graph()
        other = rt.alloc("CUDA:0", SIZE, np.int32)
        await rt.run([inc(other)])
        np.testing.assert_array_equal(await rt.copyout(other), np.ones(SIZE, np.int32))


# -- the fuzzer --


@st.composite
def random_program(draw: st.DrawFn) -> tuple[list[str], list[tuple[Any, ...]], list[int]]:
    devices = draw(st.lists(st.sampled_from(DEVICES), min_size=1, max_size=4, unique=True))
    names = [f"{d}#{i}" for d in devices for i in range(3)]
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["xor", "inc", "copy"]))
        half = draw(st.sampled_from([(0, SIZE), (0, SIZE // 2), (SIZE // 2, SIZE // 2)]))
        if kind == "copy":
            dst, src = draw(st.lists(st.sampled_from(names), min_size=2, max_size=2, unique=True))
            ops.append(("copy", dst, src, half, draw(st.sampled_from([0, SIZE // 2]))))
        else:
            dev = draw(st.sampled_from(devices))
            local = [n for n in names if n.startswith(dev + "#")]
            ops.append((kind, *(draw(st.sampled_from(local)) for _ in range(3)), half))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(ops) - 1)), max_size=2))))
    return devices, ops, [c for c in cuts if c < len(ops)]


def _build(ops: list[tuple[Any, ...]], bufs: dict[str, ag.Buffer]) -> list[Any]:
    items: list[Any] = []
    for op in ops:
        if op[0] == "copy":
            _, dst, src, (start, count), src_start = op
            count = min(count, SIZE - src_start)
            items.append(
                ag.Copy(dst=bufs[dst].view(start, count), src=bufs[src].view(src_start, count))
            )
        elif op[0] == "xor":
            _, out, a, b, (start, count) = op
            items.append(xor(*(bufs[n].view(start, count) for n in (out, a, b))))
        else:
            _, out, _a, _b, (start, count) = op
            items.append(inc(bufs[out].view(start, count)))
    return items


@settings(max_examples=30)
@given(random_program(), st.sampled_from(["memops", "events", "nopeer"]))
def test_fuzz_random_graphs_replay_like_eager(
    program: tuple[list[str], list[tuple[Any, ...]], list[int]],
    mode: str,
) -> None:
    devices, ops, cuts = program
    driver = FakeDriver(stream_mem_ops=mode != "events", peer=mode != "nopeer")

    async def main() -> None:
        async with runtime(devices, driver) as rt:
            names = [f"{d}#{i}" for d in devices for i in range(3)]
            rng = np.random.default_rng(len(ops))
            eager = {n: rt.alloc(n.split("#")[0], SIZE, np.int32) for n in names}
            graphed = {n: rt.alloc(n.split("#")[0], SIZE, np.int32) for n in names}
            for n in names:
                data = rng.integers(0, 1000, SIZE, dtype=np.int32)
                await rt.copyin(eager[n], data)
                await rt.copyin(graphed[n], data)
            bounds = [0, *cuts, len(ops)]
            chunks = [ops[a:b] for a, b in zip(bounds, bounds[1:]) if a < b]
            graphs = [await rt.compile(_build(c, graphed), verify=True) for c in chunks]
            for _ in range(2):
                for chunk, graph in zip(chunks, graphs):
                    await rt.run(_build(chunk, eager))
                    await graph()
            for n in names:
                np.testing.assert_array_equal(
                    await rt.copyout(graphed[n]), await rt.copyout(eager[n])
                )

    trio.run(main)


# The project's shared fuzzer (tests/_model.py): random jit caches with its own kernels
# (each with a CUDA body), graphs called concurrently with fresh inputs, checked against
# eager and the host model. CPU:0 takes part, so host <-> GPU copies and waits are in it.
CUDA_FUZZ_DEVICES = ["CUDA:0", "CUDA:1", "CPU:0", "CUDA:2"]


@settings(max_examples=40)
@given(
    random_programs(max_devices=4, max_items=16),
    st.sampled_from(["memops", "events", "nopeer", "streams"]),
)
def test_shared_fuzzer_on_the_fake_driver(spec: ProgramSpec, mode: str) -> None:
    driver = FakeDriver(stream_mem_ops=mode != "events", peer=mode != "nopeer")

    async def main() -> None:
        async with runtime(CUDA_FUZZ_DEVICES, driver, cuda_graphs=mode != "streams") as rt:
            await check_program(rt, CUDA_FUZZ_DEVICES, spec)

    trio.run(main)


# -- the same on a real GPU (skipped without one) --


@pytest.mark.gpu
@needs_gpus(1)
@pytest.mark.parametrize("case", sorted(c for c in CASES if "4 devices" not in c))
async def test_gpu_ordering_case_matches_eager(case: str) -> None:
    layout, inputs, make = CASES[case]
    count = gpu_count()
    layout = {
        k: (f"CUDA:{int(v[5:]) % count}" if v.startswith("CUDA") else v) for k, v in layout.items()
    }
    devices = sorted({*layout.values()})
    async with ag.open_runtime(devices, cuda_driver="real") as rt:
        await check_against_eager(rt, layout, inputs, make, replays=4)


@pytest.mark.gpu
@needs_gpus(1)
async def test_gpu_graph_replay_and_dlpack() -> None:
    async with ag.open_runtime(["CUDA:0"], cuda_driver="real") as rt:
        a, b, c = (rt.alloc("CUDA:0", SIZE, np.int32) for _ in range(3))
        await rt.copyin(a, np.arange(SIZE, dtype=np.int32))
        await rt.copyin(b, np.full(SIZE, 3, np.int32))
        graph = await rt.compile([xor(c, a, b)] + [inc(c) for _ in range(10)], inputs=[a])
        for _ in range(3):
            await graph([a])
        np.testing.assert_array_equal(await rt.copyout(c), (np.arange(SIZE) ^ 3) + 10)
        device = rt.device("CUDA:0")
        # CUDA graphs need 64-bit stream memory operations; without them, plain streams.
        assert device.queues[QueueKind.COMPUTE].graph_launches == (3 if device.mem_ops else 0)
        torch = importorskip("torch")
        tensor = torch.from_dlpack(c)
        assert tensor.device.type == "cuda"
        assert tensor.cpu().numpy().tolist() == ((np.arange(SIZE) ^ 3) + 10).tolist()


@pytest.mark.gpu
@needs_gpus(1)
async def test_gpu_dlpack_export_orders_the_consumers_stream_and_never_blocks() -> None:
    # The GPU's queued work waits on a CPU kernel held by a gate: an export that drained
    # the streams on this thread would hang here. The consumer's stream must instead wait
    # for that work on the GPU, so its copy of the buffer sees the final values.
    gate = threading.Event()

    def gated(buf: np.ndarray, n: int) -> None:
        assert gate.wait(30)
        buf[:n] += 1

    held = ag.Kernel("held", cpu=gated, outs=(0,), ins=(0,))
    n = ag.Var("n", 1, SIZE)
    async with ag.open_runtime(["CUDA:0", "CPU:0"], cuda_driver="real", cpu_thread_bytes=1) as rt:
        h, g = rt.alloc("CPU:0", SIZE, np.int32), rt.alloc("CUDA:0", SIZE, np.int32)
        graph = await rt.compile(
            [ag.Launch(held, [h], vars=[n], fixedvars={n: SIZE}), ag.Copy(dst=g, src=h), inc(g)]
        )
        replay = await graph.submit()
        device = rt.device("CUDA:0")
        drv = device.driver
        drv.set_context(device.context)
        consumer = drv.stream_create()
        host, _ = drv.host_alloc_mapped(SIZE * 4)
        if not device.mem_ops:
            # Only events could order it, and the work is not on the streams yet.
            with pytest.raises(BufferError, match="await that work, then export"):
                g.__dlpack__(stream=int(consumer))
            gate.set()
            await replay.wait()
        capsule = g.__dlpack__(stream=int(consumer))
        drv.memcpy(consumer, CopyKind.DTOH, host, g.memory.pointer, SIZE * 4)
        gate.set()
        await replay.wait()
        drv.stream_synchronize(consumer)
        seen = np.ctypeslib.as_array((ctypes.c_int32 * SIZE).from_address(host)).copy()
        assert seen.tolist() == [2] * SIZE
        del capsule
        drv.stream_destroy(consumer)
        drv.host_free(host)


GPU_FUZZ_LAYOUT = {f"b{i}": ("CUDA:0" if i % 3 else "CPU:0") for i in range(6)}


def _gpu_fuzz_items(s: dict[str, ag.Buffer], seed: int) -> list[Any]:
    r = np.random.default_rng(seed)
    names = list(GPU_FUZZ_LAYOUT)
    items: list[Any] = []
    for _ in range(12):
        x, y, z = r.choice(names, 3, replace=False)
        same_device = GPU_FUZZ_LAYOUT[x] == GPU_FUZZ_LAYOUT[y] == GPU_FUZZ_LAYOUT[z]
        if same_device and r.random() < 0.5:
            items.append(xor(s[x], s[y], s[z]))
        elif r.random() < 0.5:
            items.append(inc(s[x]))
        else:
            items.append(ag.Copy(dst=s[x], src=s[y]))
    return items


@pytest.mark.gpu
@needs_gpus(1)
@pytest.mark.parametrize("seed", range(5))
async def test_gpu_fuzz_like_eager(seed: int) -> None:
    # A fixed handful of random programs on the real driver (hypothesis stays on the fake).
    async with ag.open_runtime(["CUDA:0", "CPU:0"], cuda_driver="real") as rt:
        await check_against_eager(
            rt,
            GPU_FUZZ_LAYOUT,
            [f"b{seed}"],
            lambda s: _gpu_fuzz_items(s, seed),
            replays=3,
            seed=seed,
        )


@pytest.mark.gpu
@needs_gpus(1)
@settings(max_examples=20)
@given(random_programs(max_devices=4, max_items=16), st.booleans())
def test_shared_fuzzer_on_the_real_driver(spec: ProgramSpec, graphs: bool) -> None:
    # The fuzzer's random programs through cuda-python, with CUDA graphs and without.
    count = gpu_count()
    names = [f"CUDA:{int(d[5:]) % count}" if d.startswith("CUDA") else d for d in CUDA_FUZZ_DEVICES]

    async def main() -> None:
        async with ag.open_runtime(
            sorted(set(names)), cuda_driver="real", cuda_graphs=graphs
        ) as rt:
            await check_program(rt, names, spec)
            # Every graph the driver refused ran on the stream (still correct), but a
            # refusal means a graph was built or updated against the driver's rules.
            refusals = {
                actor.name: actor.graph_refusals
                for name in set(names)
                if name.startswith("CUDA")
                for actor in rt.device(name).queues.values()
            }
            assert not any(refusals.values()), refusals

    trio.run(main)


# -- with the runtime's monitor and profiler --


@fake_only
async def test_gpu_work_in_flight_is_not_mistaken_for_a_deadlock(autojump_clock: Any) -> None:
    # Virtual time races ahead while the (fake) GPU computes, so the monitor looks many
    # times at a CPU queue waiting on GPU work; it must see that work as pending.
    def slow(buf: np.ndarray, n: int) -> None:
        for _ in range(200):
            buf[:n] = (buf[:n] * 3 + 1) % 1000

    kernel = ag.Kernel("inc_k", cpu=slow, cuda="inc_k", outs=(0,), ins=(0,))
    n = ag.Var("n", 1, 1 << 20)
    async with runtime(["CUDA:0", "CPU:0"], deadlock_check=0.001) as rt:
        g = rt.alloc("CUDA:0", 1 << 14, np.int32)
        h = rt.alloc("CPU:0", 1 << 14, np.int32)
        launch = ag.Launch(kernel, [g], vars=[n], fixedvars={n: 1 << 14})
        graph = await rt.compile([launch, launch, ag.Copy(dst=h, src=g), inc(h)])
        for _ in range(3):
            await graph()


async def test_profiled_cuda_replays_time_every_item() -> None:
    async with runtime(["CUDA:0", "CPU:0"], profile=True) as rt:
        g = rt.alloc("CUDA:0", SIZE, np.int32)
        h = rt.alloc("CPU:0", SIZE, np.int32)
        graph = await rt.compile([inc(g), inc(g), ag.Copy(dst=h, src=g)])
        await graph()
        await graph()
        profile = rt.profile()
    cuda_events = [e for e in profile.events if e.actor.startswith("CUDA:0")]
    assert len(cuda_events) == 6
    assert all(e.start <= e.end for e in cuda_events)
    assert {e.actor for e in cuda_events} == {"CUDA:0/compute", "CUDA:0/copy"}


async def test_a_sticky_cuda_error_fails_every_later_call_clearly() -> None:
    driver = FakeDriver()
    async with runtime(["CUDA:0", "CPU:0"], driver) as rt:
        g = rt.alloc("CUDA:0", SIZE, np.int32)
        graph = await rt.compile([inc(g), inc(g)])
        await graph()
        driver.fault = "CUDA_ERROR_ILLEGAL_ADDRESS"
        with pytest.raises(ag.ItemError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
            await graph()
        driver.fault = None  # even if the driver answered again, the context is gone
        with pytest.raises(
            ag.ItemError, match="CUDA:0 hit CUDA_ERROR_ILLEGAL_ADDRESS.*open a new runtime"
        ):
            await rt.run([inc(g)])
        h = rt.alloc("CPU:0", SIZE, np.int32)
        await rt.run([inc(h)])  # other devices carry on
        np.testing.assert_array_equal(await rt.copyout(h), np.ones(SIZE, np.int32))


async def test_gpus_with_and_without_stream_memory_operations_in_one_runtime() -> None:
    # One GPU signals with words, the other with events: waits across them still hold.
    class Mixed(FakeDriver):
        def device_attribute(self, ordinal: int, attribute: str) -> int:
            if attribute == "CAN_USE_64_BIT_STREAM_MEM_OPS":
                return int(ordinal == 0)
            return super().device_attribute(ordinal, attribute)

    layout, inputs, make = CASES["copies across 4 devices"]
    async with runtime(DEVICES, Mixed()) as rt:
        assert [rt.device(f"CUDA:{i}").mem_ops for i in range(2)] == [True, False]
        await check_against_eager(rt, layout, inputs, make, replays=4)


class _DirtyDriver(FakeDriver):
    """A fake GPU whose new memory holds garbage, as a real GPU's may."""

    def mem_alloc(self, nbytes: int) -> int:
        pointer = super().mem_alloc(nbytes)
        ctypes.memset(pointer, 0xAB, nbytes)
        return pointer


async def test_alloc_on_a_gpu_starts_zeroed_and_counts_elements() -> None:
    driver = _DirtyDriver(devices=1)
    async with ag.open_runtime(["CUDA:0", "CPU:0"], cuda_driver=driver) as rt:
        with trio.fail_after(30):
            buf = rt.alloc("CUDA:0", (3, 5), np.int16)
            assert (buf.size, buf.nbytes) == (15, 30)
            np.testing.assert_array_equal(await rt.copyout(buf), np.zeros((3, 5), np.int16))
            empty = rt.alloc("CUDA:0", 0, np.float32)  # nothing to zero
            assert empty.nbytes == 0
            view = buf.view(5, 5)  # elements, not bytes
            await rt.copyin(view, np.arange(5, dtype=np.int16))
            got = await rt.copyout(buf)
            np.testing.assert_array_equal(got.reshape(-1)[5:10], np.arange(5))
            assert not got.reshape(-1)[:5].any() and not got.reshape(-1)[10:].any()


async def test_each_client_of_a_worker_gets_a_stream_of_its_own() -> None:
    """Two clients of a worker on one GPU (in process, with the worker's sessions): A's
    job waits for a signal A has not set (on its stream, with stream memory operations);
    B's job on the same GPU runs and reports meanwhile. When they leave, their streams go, and the words A's wait used
    are reused by the next client. On the real driver too (test_cuda_shim.py)."""
    from _cuda_kernels import INC
    from _workers import Replies
    from actorgraph.devices.remote.wire import Limits

    from actorgraph.worker._server import Worker as WorkerServer
    from actorgraph.worker._session import Session

    inc_all = ["k", 0, "inc_k", [[1, 0, [SIZE]]], [SIZE], [1, 1, 1], [SIZE, 1, 1]]
    with trio.fail_after(30):
        async with runtime(["CUDA:0"]) as rt:
            device = rt.device("CUDA:0")
            server = WorkerServer(rt, {"inc_k": INC}, None, Limits())
            replies = [Replies(), Replies()]
            async with trio.open_nursery() as nursery:
                a, b = (Session(server, i + 1, replies[i], nursery) for i in range(2))  # type: ignore[arg-type]
                for session in (a, b):
                    session.handle(decode(["alloc", 1, "CUDA:0", SIZE, "<i4"]))
                # A waits for its mirror 7 on base slot 3: on the stream, on a mapped word.
                a.handle(
                    decode(["prog", 1, "CUDA:0", [["w", 7, 3, 1], inc_all, ["s", 2, 1]], False])
                )
                a.handle(decode(["batch", 5, [0, 0, 0, 0], [1], []]))
                for batch in (5, 6):
                    b.handle(decode(["prog", 1, "CUDA:0", [inc_all, ["s", 2, 1]], False]))
                    b.handle(decode(["batch", batch, [0, 0, 0], [1], []]))
                    assert (await replies[1].wait_for(batch - 4))[-1] == ["done", batch, 2, None]
                assert replies[0].sent == []  # A's job still waits
                a.handle(decode(["ext", [[7, 1]]]))
                assert (await replies[0].wait_for(1)) == [["done", 5, 2, None]]
                streams = [s.queues[("CUDA:0", QueueKind.COMPUTE)].stream for s in (a, b)]
                assert len(set(map(id, streams))) == 2 and len(device.all_queues()) == 4
                nursery.cancel_scope.cancel()
            words = len(device._mirrors)
            for session in (a, b):
                session.abandon()
                rt.free(session.buffers.pop(1))
            assert len(device.all_queues()) == 2
            # With stream memory operations the wait was on a word; without, on the host.
            assert device._mirrors == {} and len(device._spare_words) == words
            assert words == (1 if device.mem_ops else 0)


async def test_a_gpu_buffer_is_read_into_host_memory_from_a_trio_task() -> None:
    """`CUDADevice.read_into`, what a worker's CPU queue copies from its GPU with: the
    bytes land in the host array, the event loop free meanwhile (views included)."""
    with trio.fail_after(30):
        async with runtime(["CUDA:0"]) as rt:
            x = rt.alloc("CUDA:0", SIZE, np.int32)
            await rt.copyin(x, np.arange(SIZE, dtype=np.int32))
            device = rt.device("CUDA:0")
            out = np.zeros(SIZE, np.int32)
            await device.read_into(out, x)
            np.testing.assert_array_equal(out, np.arange(SIZE))
            part = np.zeros(8, np.int32)
            await device.read_into(part, x.view(offset=5, size=8))
            np.testing.assert_array_equal(part, np.arange(5, 13))


async def test_an_exported_buffer_collected_on_another_thread_is_freed_off_that_thread() -> None:
    # The collector may run an exported buffer's finalizer on any thread it interrupts,
    # a stream's host function's among them (where the driver may not be called), even
    # before that function's first line: its memory goes from a thread of its own.
    freed_on: list[int] = []

    class Recording(FakeDriver):
        def mem_free(self, pointer: int) -> None:
            freed_on.append(threading.get_ident())
            super().mem_free(pointer)

    driver = Recording()
    async with runtime(["CUDA:0"], driver) as rt:
        b = rt.alloc("CUDA:0", SIZE, np.int32)
        view = np.from_dlpack(b)
        pointer = b.memory.pointer
        del b
    freed_on.clear()
    host: list[int] = []

    def collect_in_a_host_function() -> None:
        nonlocal view
        host.append(threading.get_ident())
        del view
        gc.collect()

    thread = threading.Thread(target=collect_in_a_host_function)
    thread.start()
    thread.join(30)
    for freeing in [t for t in threading.enumerate() if t.name == "CUDA:0/free"]:
        freeing.join(30)
    assert not driver.allocated(pointer)
    assert freed_on and host[0] not in freed_on


async def test_a_free_reaped_while_its_reaper_starts_does_not_wait_on_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Starting the device's freeing thread allocates, and the collector may run another
    # buffer's finalizer right there, on the same thread, which frees through it too: it
    # must not wait for the first to finish starting it (that would never come).
    from actorgraph.devices.cuda import _device as cuda_device

    driver = FakeDriver()
    async with runtime(["CUDA:0"], driver) as rt:
        device = rt.device("CUDA:0")
        first, second = driver.mem_alloc(64), driver.mem_alloc(64)
        start = cuda_device._Reaper.__init__

        def start_with_a_finalizer(reaper: Any, dev: Any) -> None:
            monkeypatch.setattr(cuda_device._Reaper, "__init__", start)
            start(reaper, dev)
            dev._reap(second)  # as a finalizer the collector ran here would

        monkeypatch.setattr(cuda_device._Reaper, "__init__", start_with_a_finalizer)
        freeing = threading.Thread(target=device._reap, args=(first,), daemon=True)
        freeing.start()
        freeing.join(30)
        if freeing.is_alive():
            device._reaper_lock.release()  # let the runtime close, then fail
            pytest.fail("the free waited on itself")
    # Closing the runtime stops the freeing thread once it freed what it was given.
    assert not driver.allocated(first) and not driver.allocated(second)


async def test_a_staging_buffer_given_back_while_its_lock_is_held_on_this_thread() -> None:
    # A staging buffer goes back to its device's pool from a finalizer, which the
    # collector may run at any allocation, on a thread that holds the pool's lock then
    # (taking or giving back another, or freeing them all at close).
    async with runtime(["CUDA:0"], FakeDriver()) as rt:
        device = rt.device("CUDA:0")
        pointer, size, array = device._take_staging(100)

        def give_back_under_the_lock() -> None:
            with device._staging_lock:
                device._give_staging(pointer, size, array)  # as such a finalizer would

        giving = threading.Thread(target=give_back_under_the_lock, daemon=True)
        giving.start()
        giving.join(30)
        if giving.is_alive():
            device._staging_lock.release()  # let the runtime close, then fail
            pytest.fail("the finalizer waited on a lock its own thread held")
        assert device._take_staging(100)[0] == pointer  # back in the pool
