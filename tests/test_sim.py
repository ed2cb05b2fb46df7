"""SIM devices: real results, simulated time on trio's clock, determinism, mixed graphs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from actorgraph.devices import SIMDevice
from actorgraph.scheduler import QueueId, QueueKind
from hypothesis import given
from hypothesis import strategies as st

import actorgraph as ag
from benchmarks import sim_quality

ADD = ag.Kernel("add", cpu=lambda out, a, b: np.add(a, b, out=out), outs=(0,), ins=(1, 2))
XOR = ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,), ins=(1, 2))
INC = ag.Kernel("inc", cpu=lambda out, a: np.add(a, 1, out=out), outs=(0,), ins=(1,))

# Round figures so durations are easy to reason about: no launch latency, 1 GB/s links.
FLAT = ag.CostModel(
    name="flat",
    devices={
        "SIM": ag.DeviceCost(launch_latency=0.0, compute_throughput=1e12, memory_bandwidth=1e9)
    },
    same_device=ag.LinkCost(latency=0.0, bandwidth=1e9),
    peer=ag.LinkCost(latency=0.0, bandwidth=1e9),
    host=ag.LinkCost(latency=0.0, bandwidth=0.5e9),
)
MS = 1e-3


def _sleeper(seconds: float) -> ag.Kernel:
    return ag.Kernel(
        "busy", cpu=lambda out, a: np.add(a, 1, out=out), outs=(0,), ins=(1,), cost=seconds
    )


async def _timed(graph: ag.Graph, inputs: list[ag.Buffer] | None = None) -> float:
    t0 = trio.current_time()
    await graph(inputs or [])
    return trio.current_time() - t0


# -- results are real --


@pytest.mark.actorgraph(verify_plans=True)
async def test_graph_on_sim_matches_eager_and_numpy(
    ag_sim_runtime: ag.Runtime, autojump_clock: trio.testing.MockClock
) -> None:
    rt = ag_sim_runtime
    a, b, c = (rt.alloc("SIM:0", 64, np.int32) for _ in range(3))
    d, e = rt.alloc("SIM:1", 64, np.int32), rt.alloc("SIM:1", 64, np.int32)
    av, bv = np.arange(64, dtype=np.int32), np.full(64, 7, np.int32)
    await rt.copyin(a, av)
    await rt.copyin(b, bv)
    items = [ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c), ag.Launch(ADD, [e, d, d])]
    await rt.run(items)
    eager = await rt.copyout(e)
    await rt.copyin(e, np.zeros(64, np.int32))
    graph = await rt.compile(items, inputs=[a])
    await graph([a])
    np.testing.assert_array_equal(await rt.copyout(e), eager)
    np.testing.assert_array_equal(eager, (av ^ bv) * 2)


@st.composite
def _programs(draw: Any) -> list[tuple[Any, ...]]:
    """Random items over 2 SIM devices and one CPU device, on views of 3 buffers each."""
    count = draw(st.integers(1, 12))
    ops = []
    for _ in range(count):
        kind = draw(st.sampled_from(["xor", "inc", "copy"]))
        dev = draw(st.integers(0, 2))
        slots = draw(
            st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1)), min_size=3, max_size=3)
        )
        ops.append((kind, dev, draw(st.integers(0, 2)), slots))
    return ops


DEVICES = ["SIM:0", "SIM:1", "CPU:0"]


def _view(bufs: list[list[ag.Buffer]], dev: int, slot: tuple[int, int]) -> ag.Buffer:
    # Each buffer has two halves: views that do not overlap must not serialize.
    return bufs[dev][slot[0]].view(offset=slot[1] * 8, size=8)


def _model_run(program: list[tuple[Any, ...]], state: list[list[np.ndarray]]) -> None:
    """The host model: what the items do to plain numpy arrays, in order."""

    def arr(dev: int, slot: tuple[int, int]) -> np.ndarray:
        return state[dev][slot[0]][slot[1] * 8 : slot[1] * 8 + 8]

    for kind, dev, src_dev, slots in program:
        out, x, y = slots
        if kind == "xor":
            arr(dev, out)[:] = arr(dev, x) ^ arr(dev, y)
        elif kind == "inc":
            arr(dev, out)[:] = arr(dev, x) + 1
        else:
            if src_dev == dev and out[0] == x[0] and out[1] == x[1]:
                continue
            arr(dev, out)[:] = arr(src_dev, x)


def _items(program: list[tuple[Any, ...]], bufs: list[list[ag.Buffer]]) -> list[Any]:
    items: list[Any] = []
    for kind, dev, src_dev, slots in program:
        out, x, y = slots
        if kind == "xor":
            items.append(
                ag.Launch(XOR, [_view(bufs, dev, out), _view(bufs, dev, x), _view(bufs, dev, y)])
            )
        elif kind == "inc":
            items.append(ag.Launch(INC, [_view(bufs, dev, out), _view(bufs, dev, x)]))
        elif not (src_dev == dev and out[0] == x[0] and out[1] == x[1]):
            items.append(ag.Copy(dst=_view(bufs, dev, out), src=_view(bufs, src_dev, x)))
    return items


@given(program=_programs())
def test_fuzz_sim_and_cpu_graph_equals_eager_and_host_model(program: list[tuple[Any, ...]]) -> None:
    rng = np.random.default_rng(len(program))
    start = [[rng.integers(0, 1000, 16, dtype=np.int32) for _ in range(3)] for _ in DEVICES]

    async def main() -> None:
        async with ag.open_runtime(DEVICES, sim_preset=FLAT, verify_plans=True) as rt:
            bufs = [[rt.alloc(d, 16, np.int32) for _ in range(3)] for d in DEVICES]

            async def reset() -> None:
                for d in range(len(DEVICES)):
                    for k in range(3):
                        await rt.copyin(bufs[d][k], start[d][k])

            async def read() -> list[list[np.ndarray]]:
                return [[await rt.copyout(b) for b in row] for row in bufs]

            items = _items(program, bufs)
            model = [[a.copy() for a in row] for row in start]
            _model_run(program, model)
            await reset()
            if items:
                await rt.run(items)
            eager = await read()
            await reset()
            if items:
                graph = await rt.compile(items)
                await graph()
            replay = await read()
            await reset()
            if items:
                # The list-scheduled order must compute the same thing.
                await (await rt.compile(ag.sim_reorder(graph)))()
            reordered = await read()
            for d in range(len(DEVICES)):
                for k in range(3):
                    np.testing.assert_array_equal(eager[d][k], model[d][k])
                    np.testing.assert_array_equal(replay[d][k], model[d][k])
                    np.testing.assert_array_equal(reordered[d][k], model[d][k])

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# -- time is simulated, and overlap is real --


@pytest.mark.actorgraph(devices=1)
async def test_kernel_takes_declared_cost_plus_launch_latency(
    ag_sim_runtime: ag.Runtime, autojump_clock: trio.testing.MockClock
) -> None:
    rt = ag_sim_runtime
    a, b = rt.alloc("SIM:0", 16, np.float32), rt.alloc("SIM:0", 16, np.float32)
    graph = await rt.compile([ag.Launch(_sleeper(5 * MS), [b, a])])
    latency = ag.SIM_PRESETS["nvlink8"].devices["SIM"].launch_latency
    assert await _timed(graph) == pytest.approx(5 * MS + latency)
    assert ag.sim_durations(graph) == [pytest.approx(5 * MS + latency)]


async def test_compute_and_copy_queues_overlap(autojump_clock: trio.testing.MockClock) -> None:
    # Four 1 ms kernels on the compute queue and four 1 ms copies (1 MB at 1 GB/s) on the
    # copy queue, independent: together they take 4 ms, not 8.
    async with ag.open_runtime(["SIM:0"], sim_preset=FLAT) as rt:
        src = [rt.alloc("SIM:0", 250_000, np.float32) for _ in range(4)]
        dst = [rt.alloc("SIM:0", 250_000, np.float32) for _ in range(4)]
        x = [rt.alloc("SIM:0", 4, np.float32) for _ in range(5)]
        items: list[Any] = []
        for k in range(4):
            items.append(ag.Launch(_sleeper(MS), [x[k + 1], x[k]]))
            items.append(ag.Copy(dst=dst[k], src=src[k]))
        graph = await rt.compile(items)
        assert {q.kind for q in graph.plan.queues} == {QueueKind.COMPUTE, QueueKind.COPY}
        assert await _timed(graph) == pytest.approx(4 * MS)
        assert ag.sim_bounds(graph).best == pytest.approx(4 * MS)


async def test_eight_independent_chains_take_the_time_of_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    names = [f"SIM:{i}" for i in range(8)]
    async with ag.open_runtime(names, sim_preset=FLAT) as rt:
        items: list[Any] = []
        for name in names:
            chain = [rt.alloc(name, 4, np.float32) for _ in range(6)]
            items += [ag.Launch(_sleeper(MS), [chain[k + 1], chain[k]]) for k in range(5)]
        graph = await rt.compile(items)
        assert await _timed(graph) == pytest.approx(5 * MS)


async def test_copies_pay_their_link(autojump_clock: trio.testing.MockClock) -> None:
    model = ag.CostModel(
        name="links",
        devices=FLAT.devices,
        same_device=ag.LinkCost(latency=1 * MS, bandwidth=1e9),
        peer=ag.LinkCost(latency=2 * MS, bandwidth=1e9),
        host=ag.LinkCost(latency=3 * MS, bandwidth=1e9),
    )
    async with ag.open_runtime(["SIM:0", "SIM:1", "CPU:0"], sim_preset=model) as rt:
        a, a2 = rt.alloc("SIM:0", 250_000, np.float32), rt.alloc("SIM:0", 250_000, np.float32)
        b, h = rt.alloc("SIM:1", 250_000, np.float32), rt.alloc("CPU:0", 250_000, np.float32)
        for dst, src, seconds in [(a2, a, 2 * MS), (b, a, 3 * MS), (h, a, 4 * MS), (a, h, 4 * MS)]:
            graph = await rt.compile([ag.Copy(dst=dst, src=src)])
            assert await _timed(graph) == pytest.approx(seconds), (dst, src)
        t0 = trio.current_time()
        await rt.copyin(a, np.zeros(250_000, np.float32))
        await rt.copyout(a)
        assert trio.current_time() - t0 == pytest.approx(8 * MS)


async def test_presets_differ_where_their_hardware_does(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times = {}
    for preset in ("nvlink8", "pcie8"):
        async with ag.open_runtime(["SIM:0", "SIM:1"], sim_preset=preset) as rt:
            a, b = rt.alloc("SIM:0", 1 << 20, np.float32), rt.alloc("SIM:1", 1 << 20, np.float32)
            graph = await rt.compile([ag.Copy(dst=b, src=a)])
            times[preset] = await _timed(graph)
            assert rt.caps["SIM:0"].peer_group == rt.caps["SIM:1"].peer_group == f"SIM/{preset}"
    assert times["pcie8"] > 5 * times["nvlink8"]


async def test_cost_as_work_or_function(autojump_clock: trio.testing.MockClock) -> None:
    n = ag.Var("n", 1, 1 << 20)
    flops = ag.Kernel(
        "flops", cpu=lambda out, a: None, outs=(0,), ins=(1,), cost=ag.Work(flops=2e12)
    )
    by_bytes = ag.Kernel("bytes", cpu=lambda out, a: None, outs=(0,), ins=(1,))
    per_var = ag.Kernel(
        "per_var",
        cpu=lambda out, a, k: None,
        outs=(0,),
        ins=(1,),
        cost=lambda nbytes, values: values[0] * 1e-6 + sum(nbytes) * 0.0,
    )
    async with ag.open_runtime(["SIM:0"], sim_preset=FLAT) as rt:
        a, b = rt.alloc("SIM:0", 250_000, np.float32), rt.alloc("SIM:0", 250_000, np.float32)
        graph = await rt.compile(
            [
                ag.Launch(flops, [b, a]),
                ag.Launch(by_bytes, [b, a]),
                ag.Launch(per_var, [b, a], vars=[n]),
            ]
        )
        # 2e12 flops at 1e12 flop/s; 2 MB at 1 GB/s; n us.
        assert ag.sim_durations(graph, var_vals={n: 500}) == pytest.approx([2.0, 2e-3, 500e-6])
        assert await _timed_with(graph, {n: 500}) == pytest.approx(2.0 + 2e-3 + 500e-6)


async def _timed_with(graph: ag.Graph, var_vals: dict[Any, int]) -> float:
    t0 = trio.current_time()
    await graph(var_vals=var_vals)
    return trio.current_time() - t0


# -- determinism and timelines --


def _run_dag_twice() -> list[tuple[float, tuple[ag.SimRecord, ...]]]:
    async def once() -> tuple[float, tuple[ag.SimRecord, ...]]:
        names = [f"SIM:{i}" for i in range(4)]
        async with ag.open_runtime(names) as rt:
            items, firsts, _ = sim_quality.random_dag(rt, names, count=120, seed=3, elems=64)
            for buf in firsts:
                await rt.copyin(buf, np.ones(buf.size, np.float32))
            graph = await rt.compile(items)
            t0 = trio.current_time()
            await graph()
            return trio.current_time() - t0, ag.sim_timeline(rt, submission=rt.kick.value)

    return [trio.run(once, clock=trio.testing.MockClock(autojump_threshold=0)) for _ in range(2)]


def test_two_runs_give_identical_timelines() -> None:
    (span1, timeline1), (span2, timeline2) = _run_dag_twice()
    assert span1 == span2
    assert timeline1 == timeline2
    assert len(timeline1) == 120


async def _two_kernels_and_a_copy(rt: ag.Runtime) -> ag.Graph:
    """SIM:0 runs a 1 ms then a 2 ms kernel in a chain; SIM:1 copies the result."""
    x = [rt.alloc("SIM:0", 4, np.float32) for _ in range(3)]
    y = rt.alloc("SIM:1", 4, np.float32)
    items = [
        ag.Launch(_sleeper(MS), [x[1], x[0]]),
        ag.Launch(_sleeper(2 * MS), [x[2], x[1]]),
        ag.Copy(dst=y, src=x[2]),
    ]
    return await rt.compile(items)


async def test_timeline_records_each_item_once_in_queue_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with ag.open_runtime(["SIM:0", "SIM:1"], sim_preset=FLAT) as rt:
        graph = await _two_kernels_and_a_copy(rt)
        ag.clear_sim_timeline(rt)
        await graph()
        await graph()
        first, second = rt.kick.value - 1, rt.kick.value
        one = ag.sim_timeline(rt, submission=first)
        assert [(r.queue, r.item) for r in one] == [
            ("SIM:0/compute", 0),
            ("SIM:0/compute", 1),
            ("SIM:1/copy", 2),
        ]
        assert [r.end - r.start for r in one] == pytest.approx([MS, 2 * MS, 16e-9])
        assert one[1].start == one[0].end and one[2].start == one[1].end
        two = ag.sim_timeline(rt, submission=second)
        assert two[0].start == pytest.approx(one[2].end)  # the second replay follows the first
        device = rt.device("SIM:0")
        assert isinstance(device, SIMDevice)
        assert len(device.sim_records()) == 4
        ag.clear_sim_timeline(rt)
        assert ag.sim_timeline(rt) == ()


# -- SIM and CPU in one graph --


async def test_mixed_sim_and_cpu_graph(autojump_clock: trio.testing.MockClock) -> None:
    async with ag.open_runtime(
        ["CPU:0", "SIM:0", "SIM:1"], sim_preset=FLAT, verify_plans=True
    ) as rt:
        h_in, h_out = rt.alloc("CPU:0", 1000, np.int32), rt.alloc("CPU:0", 1000, np.int32)
        h_mid = rt.alloc("CPU:0", 1000, np.int32)
        s0, s0b, s1 = (
            rt.alloc("SIM:0", 1000, np.int32),
            rt.alloc("SIM:0", 1000, np.int32),
            rt.alloc("SIM:1", 1000, np.int32),
        )
        await rt.copyin(h_in, np.arange(1000, dtype=np.int32))
        items = [
            ag.Launch(INC, [h_mid, h_in]),  # CPU kernel
            ag.Copy(dst=s0, src=h_mid),  # host -> SIM: host link
            ag.Launch(INC, [s0b, s0]),  # SIM kernel
            ag.Copy(dst=s1, src=s0b),  # SIM -> SIM: peer link
            ag.Copy(dst=h_out, src=s1),  # SIM -> host, on the SIM's copy engine
        ]
        graph = await rt.compile(items, inputs=[h_in])
        assert [str(graph.plan.queues[q]) for q in graph.plan.item_queue] == [
            "CPU:0/compute",
            "SIM:0/copy",
            "SIM:0/compute",
            "SIM:1/copy",
            "SIM:1/copy",
        ]
        span = await _timed(graph, [h_in])
        # 4000 bytes: host link 8 us each way, kernel 8 us (8000 bytes at 1 GB/s), peer 4 us.
        assert span == pytest.approx(8e-6 + 8e-6 + 4e-6 + 8e-6)
        np.testing.assert_array_equal(await rt.copyout(h_out), np.arange(1000) + 2)


def test_planner_puts_device_to_host_copies_on_the_device_copy_engine() -> None:
    from actorgraph.scheduler import Access, DeviceCaps, ItemKind, PlanItem, assign_queue

    caps = {
        "CPU:0": DeviceCaps("CPU:0", "CPU", is_cpu=True),
        "SIM:0": DeviceCaps("SIM:0", "SIM", host_visible=False),
    }
    down = PlanItem("copy", ItemKind.COPY, "CPU:0", (Access("CPU:0", 1, 0, 4, True),), "SIM:0")
    up = PlanItem("copy", ItemKind.COPY, "SIM:0", (Access("SIM:0", 2, 0, 4, True),), "CPU:0")
    assert assign_queue(down, caps) == QueueId("SIM:0", QueueKind.COPY)
    assert assign_queue(up, caps) == QueueId("SIM:0", QueueKind.COPY)


async def test_eager_work_on_sim_takes_simulated_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with ag.open_runtime(["SIM:0"], sim_preset=FLAT) as rt:
        x = [rt.alloc("SIM:0", 4, np.float32) for _ in range(3)]
        t0 = trio.current_time()
        await rt.run([ag.Launch(_sleeper(MS), [x[1], x[0]]), ag.Launch(_sleeper(MS), [x[2], x[1]])])
        assert trio.current_time() - t0 == pytest.approx(2 * MS)
        np.testing.assert_array_equal(await rt.copyout(x[2]), np.full(4, 2, np.float32))


# -- the benchmark's graphs, small --


async def test_pipeline_and_tensor_parallel_schedules_meet_their_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    names = [f"SIM:{i}" for i in range(4)]
    async with ag.open_runtime(names) as rt:
        items, firsts, outs = sim_quality.pipeline(rt, names, micro_batches=6, elems=256)
        await rt.copyin(firsts[0], np.full(256, 4.0, np.float32))
        for buf in firsts[1:]:
            await rt.copyin(buf, np.zeros(256, np.float32))
        graph = await rt.compile(items, verify=True)
        span = await _timed(graph)
        assert span <= 1.05 * ag.sim_bounds(graph).best
        expected = 4.0
        for _ in names:
            expected = expected * 0.5 + 1.0
        np.testing.assert_allclose(await rt.copyout(outs[0]), expected)

    async with ag.open_runtime(names) as rt:
        items, firsts, accs = sim_quality.tensor_parallel(rt, names, layers=2, elems=64)
        acts, weights = firsts[:4], firsts[4:]
        for i, buf in enumerate(acts):
            await rt.copyin(buf, np.full(64, 1.0, np.float32))
            await rt.copyin(weights[i], np.array([i + 1], np.float32))
        graph = await rt.compile(items, verify=True)
        span = await _timed(graph)
        assert span <= 1.05 * ag.sim_bounds(graph).best
        # Each layer: sum over devices of act * w_i = act * 10.
        for acc in accs:
            np.testing.assert_allclose(await rt.copyout(acc), 100.0)


async def test_list_scheduled_order_keeps_results_and_removes_head_of_line_stalls(
    autojump_clock: trio.testing.MockClock,
) -> None:
    names = [f"SIM:{i}" for i in range(8)]
    async with ag.open_runtime(names, verify_plans=True) as rt:
        items, firsts, made = sim_quality.random_dag(rt, names, count=300, seed=0, elems=64)
        rng = np.random.default_rng(0)
        for buf in firsts:
            await rt.copyin(buf, rng.standard_normal(buf.size).astype(np.float32))
        graph = await rt.compile(items)
        span = await _timed(graph)
        expected = [await rt.copyout(b) for b in made]
        for buf in made:
            await rt.copyin(buf, np.zeros(buf.size, np.float32))
        reordered = await rt.compile(ag.sim_reorder(graph))
        span_reordered = await _timed(reordered)
        for buf, want in zip(made, expected):
            np.testing.assert_array_equal(await rt.copyout(buf), want)
        bound = ag.sim_bounds(graph).best
        assert ag.sim_bounds(reordered).best == pytest.approx(bound)
        assert span > 1.05 * bound  # jit order stalls on this DAG...
        assert span_reordered <= 1.05 * bound  # ...and the list-scheduled order does not


# -- bad input --


def test_bad_kernel_cost_is_refused() -> None:
    with pytest.raises(ag.UsageError, match=r"Kernel 'k': cost= must be seconds >= 0"):
        ag.Kernel("k", cpu=lambda o: None, outs=(0,), cost=-1.0)
    with pytest.raises(ag.UsageError, match=r"cost= must be seconds >= 0"):
        ag.Kernel("k", cpu=lambda o: None, outs=(0,), cost="fast")


async def test_cost_function_returning_nonsense_fails_the_compile() -> None:
    bad = ag.Kernel(
        "bad", cpu=lambda o, a: None, outs=(0,), ins=(1,), cost=lambda nbytes, values: "soon"
    )
    async with ag.open_runtime(["SIM:0"]) as rt:
        a, b = rt.alloc("SIM:0", 4, np.float32), rt.alloc("SIM:0", 4, np.float32)
        with pytest.raises(
            ag.DeviceError, match=r"kernel 'bad': cost must give seconds >= 0 or a Work"
        ):
            await rt.compile([ag.Launch(bad, [b, a])])


async def test_unknown_preset_is_refused() -> None:
    with pytest.raises(
        ag.DeviceError,
        match=r"unknown sim_preset 'dgx': use one of \['nvlink8', 'nvlink8x8', 'pcie4x4', 'pcie8'\]",
    ):
        async with ag.open_runtime(["SIM:0"], sim_preset="dgx"):
            pass


def test_cost_model_checks_its_figures() -> None:
    with pytest.raises(ValueError, match=r"LinkCost.bandwidth must be > 0"):
        ag.LinkCost(latency=0.0, bandwidth=0.0)
    with pytest.raises(ValueError, match=r"DeviceCost.launch_latency must be a number >= 0"):
        ag.DeviceCost(launch_latency=-1.0, compute_throughput=1.0, memory_bandwidth=1.0)
    with pytest.raises(ValueError, match=r"CostModel.devices\['SIM'\] must be a DeviceCost"):
        ag.CostModel("x", {"SIM": 3}, FLAT.same_device, FLAT.peer, FLAT.host)  # type: ignore[dict-item]
    with pytest.raises(ag.DeviceError, match=r"cost model 'x' has no figures for SIM devices"):
        ag.CostModel("x", {}, FLAT.same_device, FLAT.peer, FLAT.host).device("SIM")


async def test_a_failing_kernel_on_sim_names_item_and_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def boom(out: np.ndarray, a: np.ndarray) -> None:
        raise ZeroDivisionError("no")

    bad = ag.Kernel("boom", cpu=boom, outs=(0,), ins=(1,), cost=MS)
    async with ag.open_runtime(["SIM:0"]) as rt:
        a, b = rt.alloc("SIM:0", 4, np.float32), rt.alloc("SIM:0", 4, np.float32)
        graph = await rt.compile([ag.Launch(INC, [b, a]), ag.Launch(bad, [a, b])])
        with pytest.raises(
            ag.ItemError, match=r"item 1 \(boom\) on SIM:0/compute raised ZeroDivisionError"
        ):
            await graph()
        await graph.aclose()


def test_sim_is_a_device_kind() -> None:
    from actorgraph.devices import DEVICE_KINDS, DeviceError, parse_device_name

    assert DEVICE_KINDS["SIM"] is SIMDevice
    assert parse_device_name("SIM:7") == ("SIM", 7)
    with pytest.raises(DeviceError, match=r"expected one of .*SIM:N"):
        parse_device_name("GPU:0")


async def test_profile_of_a_sim_replay_is_in_simulated_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with ag.open_runtime(["SIM:0", "SIM:1"], sim_preset=FLAT) as rt:
        graph = await _two_kernels_and_a_copy(rt)
        await graph(profile=True)
        events = sorted(rt.profile().events, key=lambda e: e.start)
        records = ag.sim_timeline(rt, submission=rt.kick.value)
        assert [(e.item, e.start, e.end) for e in events] == [
            (r.item, r.start, r.end) for r in records
        ]
        assert events[1].end - events[1].start == pytest.approx(2 * MS)


# -- compile(order="cost") ----------------------------------------------------------------


async def test_cost_order_runs_ready_work_first_and_keeps_results(autojump_clock: object) -> None:
    slow = ag.Kernel(
        "slow", cpu=lambda out, a: np.add(a, 1, out=out), outs=(0,), ins=(1,), cost=5e-3
    )
    fast = ag.Kernel(
        "fast", cpu=lambda out, a: np.multiply(a, 3, out=out), outs=(0,), ins=(1,), cost=4e-3
    )
    boom_on = {"on": False}

    def maybe_boom(out: np.ndarray, a: np.ndarray) -> None:
        if boom_on["on"]:
            raise ValueError("boom")
        np.subtract(a, 2, out=out)

    late = ag.Kernel("late", cpu=maybe_boom, outs=(0,), ins=(1,), cost=1e-3)
    async with ag.open_runtime(["SIM:0", "SIM:1"]) as rt:
        x1, y1 = rt.alloc("SIM:1", 64, np.float32), rt.alloc("SIM:1", 64, np.float32)
        y0, z0 = rt.alloc("SIM:0", 64, np.float32), rt.alloc("SIM:0", 64, np.float32)
        w0, v0 = rt.alloc("SIM:0", 64, np.float32), rt.alloc("SIM:0", 64, np.float32)
        await rt.copyin(x1, np.arange(64, dtype=np.float32))
        await rt.copyin(v0, np.full(64, 2, np.float32))
        # In jit order SIM:0's compute queue waits for SIM:1's slow kernel before it runs
        # the independent `fast` kernel queued behind `late`.
        items = [
            ag.Launch(slow, [y1, x1]),
            ag.Copy(dst=y0, src=y1),
            ag.Launch(late, [z0, y0]),
            ag.Launch(fast, [w0, v0]),
        ]
        jit = await rt.compile(items, inputs=[x1])
        cost = await rt.compile(items, inputs=[x1], order="cost", verify=True)
        times = {}
        for name, graph in (("jit", jit), ("cost", cost)):
            t0 = trio.current_time()
            await graph([x1])
            times[name] = trio.current_time() - t0
            np.testing.assert_array_equal(await rt.copyout(z0), np.arange(64) + 1 - 2)
            np.testing.assert_array_equal(await rt.copyout(w0), np.full(64, 6))
        assert times["cost"] < times["jit"]
        # Errors still name the item by its place in the list the user gave.
        boom_on["on"] = True
        with pytest.raises(
            ag.ItemError, match=r"item 2 \(late\) on SIM:0/compute raised ValueError: boom"
        ):
            await cost([x1])
        with pytest.raises(
            ag.UsageError, match="compile\\(order=...\\) is 'jit' or 'cost', got 'fast'"
        ):
            await rt.compile(items, order="fast")
