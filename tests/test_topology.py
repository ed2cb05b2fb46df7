"""Simulated clusters (devices/_topology.py, devices/_links.py): where a SIM GPU sits, what
a copy between two of them costs, and how copies that cross one link share it. All on
trio's virtual time."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from actorgraph.devices import Link, Network, Route, SharedLinks, SIMDevice, Topology
from actorgraph.devices._links import _Flow, fair_rates

import actorgraph as ag

CLUSTER = ag.SIM_PRESETS["nvlink8x8"]
ETHERNET = ag.SIM_PRESETS["pcie4x4"]
MIB = 1 << 20


async def _timed(graph: ag.Graph) -> float:
    t0 = trio.current_time()
    await graph()
    return trio.current_time() - t0


def _names(count: int) -> list[str]:
    return [f"SIM:{i}" for i in range(count)]


# -- the presets and where a GPU sits --


def test_presets_describe_their_machines() -> None:
    assert CLUSTER.topology is not None and ETHERNET.topology is not None
    assert CLUSTER.topology.describe() == (
        "8 nodes x 8 GPUs, NVLink in a node, 8 x 400 Gb/s InfiniBand NDR NICs per node"
    )
    assert ETHERNET.topology.describe() == (
        "4 nodes x 4 GPUs, PCIe in a node, 1 x 100 Gb/s RoCE Ethernet NICs per node"
    )
    assert CLUSTER.topology.gpus == 64 and ETHERNET.topology.gpus == 16
    # The 8-GPU presets are one node of the same figures.
    one_node = ag.SIM_PRESETS["nvlink8"]
    assert one_node.topology is not None and one_node.topology.gpus == 8
    assert one_node.peer == CLUSTER.peer and one_node.devices == CLUSTER.devices


async def test_device_names_say_their_node(autojump_clock: trio.testing.MockClock) -> None:
    async with ag.open_runtime(_names(64), sim_preset="nvlink8x8") as rt:
        nodes = ag.sim_nodes(rt)
        assert nodes["SIM:0"] == 0 and nodes["SIM:7"] == 0
        assert nodes["SIM:8"] == 1 and nodes["SIM:63"] == 7
        assert sorted(set(nodes.values())) == list(range(8))
        device = rt.device("SIM:13")
        assert isinstance(device, SIMDevice) and device.node == 1
    async with ag.open_runtime(["CPU:0", "SIM:5"], sim_preset="pcie4x4") as rt:
        assert ag.sim_nodes(rt) == {"SIM:5": 1}  # 4 GPUs per node


async def test_a_gpu_past_the_preset_is_refused() -> None:
    with pytest.raises(
        ag.DeviceError,
        match=r"SIM:64 is past the 64 GPUs of sim_preset 'nvlink8x8' \(8 nodes x 8 GPUs, "
        r".*\): use SIM:0 to SIM:63",
    ):
        async with ag.open_runtime(["SIM:64"], sim_preset="nvlink8x8"):
            pass
    with pytest.raises(
        ag.DeviceError,
        match=r"SIM:8 is past the 8 GPUs of sim_preset 'nvlink8' .* use SIM:0 to SIM:7, "
        r"or a preset with more GPUs: 'nvlink8x8' \(64 GPUs\), 'pcie4x4' \(16 GPUs\)",
    ):
        async with ag.open_runtime(["SIM:8"]):
            pass


def test_topology_checks_its_figures() -> None:
    with pytest.raises(ValueError, match=r"Topology of 2 nodes needs network=Network"):
        Topology(2, 8)
    with pytest.raises(ValueError, match=r"Topology.gpus_per_node must be an int >= 1"):
        Topology(1, 0)
    with pytest.raises(ValueError, match=r"Network.nic_bandwidth must be a finite number > 0"):
        Network("IB", latency=1e-6, nic_bandwidth=0.0, nics_per_node=1)
    with pytest.raises(ValueError, match=r"Network.latency must be a finite number >= 0"):
        Network("IB", latency=-1.0, nic_bandwidth=1e9, nics_per_node=1)
    with pytest.raises(ValueError, match=r"CostModel.topology must be a Topology or None"):
        ag.CostModel("x", CLUSTER.devices, CLUSTER.same_device, CLUSTER.peer, CLUSTER.host, "8x8")  # type: ignore[arg-type]


def test_routes_cross_ports_inside_a_node_and_nics_between_nodes() -> None:
    inside = CLUSTER.peer_route(3, 5)
    assert inside.latency == CLUSTER.peer.latency and inside.bandwidth == 450e9
    assert [link.name for link in inside.links] == ["SIM:3 NVLink out", "SIM:5 NVLink in"]
    across = CLUSTER.peer_route(3, 13)  # node 0 GPU 3 to node 1 GPU 5: each GPU's own NIC
    assert across.latency == 5e-6 and across.bandwidth == 50e9
    assert [link.name for link in across.links] == ["node 0 NIC 3 out", "node 1 NIC 5 in"]
    # One NIC per node: every GPU of a node sends through it.
    assert [link.name for link in ETHERNET.peer_route(2, 7).links] == [
        "node 0 NIC 0 out",
        "node 1 NIC 0 in",
    ]
    # Two NICs for four GPUs: GPUs 0, 1 on NIC 0 and GPUs 2, 3 on NIC 1.
    two = Topology(2, 4, "PCIe", Network("RoCE", 1e-5, 12.5e9, 2))
    assert [two.nic_of(g) for g in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


# -- what copies cost --


@pytest.mark.parametrize(
    ("preset", "src", "dst", "latency", "bandwidth"),
    [
        ("nvlink8x8", "SIM:0", "SIM:1", 3e-6, 450e9),  # NVLink inside a node
        ("nvlink8x8", "SIM:0", "SIM:8", 5e-6, 50e9),  # InfiniBand between nodes
        ("nvlink8x8", "SIM:62", "SIM:5", 5e-6, 50e9),
        ("pcie4x4", "SIM:0", "SIM:3", 10e-6, 64e9),  # PCIe inside a node
        ("pcie4x4", "SIM:1", "SIM:14", 10e-6, 12.5e9),  # 100 GbE between nodes
    ],
)
async def test_a_copy_takes_what_its_route_says(
    autojump_clock: trio.testing.MockClock,
    preset: str,
    src: str,
    dst: str,
    latency: float,
    bandwidth: float,
) -> None:
    async with ag.open_runtime([src, dst], sim_preset=preset) as rt:
        a, b = rt.alloc(src, 16 * MIB, np.float32), rt.alloc(dst, 16 * MIB, np.float32)
        await rt.copyin(a, np.arange(16 * MIB, dtype=np.float32))
        graph = await rt.compile([ag.Copy(dst=b, src=a)])
        span = await _timed(graph)
        assert span == pytest.approx(latency + 64 * MIB / bandwidth, rel=0.01)
        assert ag.sim_durations(graph) == [pytest.approx(span, rel=1e-9)]
        np.testing.assert_array_equal(await rt.copyout(b), np.arange(16 * MIB))


async def test_two_copies_sharing_a_nic_take_twice_as_long_as_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # pcie4x4: one 100 GbE NIC per node. SIM:0 -> SIM:4 and SIM:1 -> SIM:5 both leave
    # node 0 through its NIC and enter node 1 through its NIC.
    async with ag.open_runtime(_names(8), sim_preset="pcie4x4") as rt:
        src = [rt.alloc(f"SIM:{i}", 16 * MIB, np.float32) for i in (0, 1)]
        dst = [rt.alloc(f"SIM:{i}", 16 * MIB, np.float32) for i in (4, 5)]
        one = await _timed(await rt.compile([ag.Copy(dst=dst[0], src=src[0])]))
        both = await rt.compile([ag.Copy(dst=d, src=s) for d, s in zip(dst, src)])
        two = await _timed(both)
        assert two == pytest.approx(2 * one, rel=0.01)
        # Exactly: one latency, then both copies' bytes through the shared NIC.
        assert two == pytest.approx(10e-6 + 2 * 64 * MIB / 12.5e9, rel=1e-9)
        records = ag.sim_timeline(rt, submission=rt.kick.value)
        assert [r.end - r.start for r in records] == pytest.approx([two, two])
        device = rt.device("SIM:0")
        assert isinstance(device, SIMDevice)
        stats = device.links.statistics()
        assert stats.copies == 3 and stats.contended == 2
        assert stats.in_flight == stats.busy_links == 0


async def test_copies_on_different_nics_do_not_slow_each_other(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # nvlink8x8: a NIC per GPU. SIM:0 -> SIM:8 and SIM:1 -> SIM:9 use NICs 0 and 1.
    async with ag.open_runtime(_names(16), sim_preset="nvlink8x8") as rt:
        pairs = [(0, 8), (1, 9)]
        src = [rt.alloc(f"SIM:{s}", 16 * MIB, np.float32) for s, _ in pairs]
        dst = [rt.alloc(f"SIM:{d}", 16 * MIB, np.float32) for _, d in pairs]
        one = await _timed(await rt.compile([ag.Copy(dst=dst[0], src=src[0])]))
        two = await _timed(await rt.compile([ag.Copy(dst=d, src=s) for d, s in zip(dst, src)]))
        assert two == pytest.approx(one, rel=1e-9)
        # From one GPU to two other nodes: both leave through that GPU's NIC.
        far = rt.alloc("SIM:8", 16 * MIB, np.float32), rt.alloc("SIM:9", 16 * MIB, np.float32)
        fan = [ag.Copy(dst=far[0], src=src[0]), ag.Copy(dst=dst[1], src=src[0])]
        assert await _timed(await rt.compile(fan)) == pytest.approx(2 * one, rel=0.01)


async def test_copies_out_of_one_gpu_share_its_nvlink_port(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with ag.open_runtime(_names(3), sim_preset="nvlink8") as rt:
        a = rt.alloc("SIM:0", 16 * MIB, np.float32)
        b, c = rt.alloc("SIM:1", 16 * MIB, np.float32), rt.alloc("SIM:2", 16 * MIB, np.float32)
        one = await _timed(await rt.compile([ag.Copy(dst=b, src=a)]))
        both = await _timed(await rt.compile([ag.Copy(dst=b, src=a), ag.Copy(dst=c, src=a)]))
        assert both == pytest.approx(3e-6 + 2 * 64 * MIB / 450e9, rel=1e-9)
        assert both == pytest.approx(2 * one, rel=0.01)


async def test_a_copy_that_joins_halfway_slows_the_rest_of_the_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # pcie4x4, one 12.5 GB/s NIC per node: the first copy (SIM:0 -> SIM:4) runs alone
    # until a 1 ms kernel on SIM:1 is done, then shares the NIC with SIM:1 -> SIM:5.
    wait = ag.Kernel("wait", cpu=lambda out: None, outs=(0,), cost=1e-3)
    async with ag.open_runtime(_names(8), sim_preset="pcie4x4") as rt:
        nbytes = 25_000_000  # 2 ms alone
        a, b = (
            rt.alloc("SIM:0", nbytes // 4, np.float32),
            rt.alloc("SIM:4", nbytes // 4, np.float32),
        )
        c, d = (
            rt.alloc("SIM:1", nbytes // 4, np.float32),
            rt.alloc("SIM:5", nbytes // 4, np.float32),
        )
        latency, launch, nic = 10e-6, 2e-6, 12.5e9
        graph = await rt.compile(
            [ag.Copy(dst=b, src=a), ag.Launch(wait, [c]), ag.Copy(dst=d, src=c)]
        )
        await graph()
        first, second = sorted(
            (r for r in ag.sim_timeline(rt, submission=rt.kick.value) if "copy" in r.queue),
            key=lambda r: r.start,
        )
        joins = 1e-3 + launch + latency  # when the second copy's bytes start to move
        alone = (joins - latency) * nic  # the bytes the first moved by then
        assert first.end == pytest.approx(joins + 2 * (nbytes - alone) / nic, rel=1e-9)
        # While they shared, the second moved what the first had left; the rest, as many
        # bytes as the first moved alone, it moves alone.
        assert second.end == pytest.approx(first.end + alone / nic, rel=1e-9)
        assert ag.sim_bounds(graph).best <= second.end - first.start


def test_fair_rates_fill_the_tightest_link_first() -> None:
    wide, narrow = Link("wide", 10.0), Link("narrow", 4.0)
    flows = [
        _flow(Route(0.0, 10.0, (wide,))),  # A: shares `wide` with B
        _flow(Route(0.0, 4.0, (wide, narrow))),  # B: on both
        _flow(Route(0.0, 4.0, (narrow,))),  # C: shares `narrow` with B
        _flow(Route(0.0, 1.0, (wide,))),  # D: capped at 1 by its own route
    ]
    # narrow: B and C get 2 each; D its 1; A the rest of wide: 10 - 2 - 1 = 7.
    assert fair_rates(flows) == [7.0, 2.0, 2.0, 1.0]
    assert fair_rates(list(reversed(flows))) == [1.0, 2.0, 2.0, 7.0]


def _flow(route: Route) -> _Flow:
    async def make() -> _Flow:
        return _Flow(route, 1.0, 0.0)

    return trio.run(make)


async def test_shared_links_are_one_per_runtime(autojump_clock: trio.testing.MockClock) -> None:
    async with ag.open_runtime(["SIM:0", "SIM:8", "CPU:0"], sim_preset="nvlink8x8") as rt:
        first, second = rt.device("SIM:0"), rt.device("SIM:8")
        assert isinstance(first, SIMDevice) and isinstance(second, SIMDevice)
        assert first.links is second.links and isinstance(first.links, SharedLinks)
    async with ag.open_runtime(["SIM:0"], sim_preset="nvlink8x8") as rt:
        other = rt.device("SIM:0")
        assert isinstance(other, SIMDevice) and other.links is not first.links


def test_a_cluster_replay_is_deterministic() -> None:
    async def once() -> tuple[float, tuple[ag.SimRecord, ...]]:
        names = _names(16)
        async with ag.open_runtime(names, sim_preset="pcie4x4") as rt:
            bufs = [rt.alloc(n, 64 * 1024, np.float32) for n in names]
            items: list[Any] = [
                ag.Copy(dst=bufs[(i * 5 + 3) % 16], src=bufs[i]) for i in range(16) if i % 3
            ]
            graph = await rt.compile(items)
            t0 = trio.current_time()
            await graph()
            return trio.current_time() - t0, ag.sim_timeline(rt, submission=rt.kick.value)

    runs = [trio.run(once, clock=trio.testing.MockClock(autojump_threshold=0)) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


# -- lower bounds that know the links --


async def test_bounds_count_the_work_on_each_shared_link(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Four copies out of node 0 through its one NIC (pcie4x4), to four other GPUs with
    # their own copy queues: no queue and no chain says more than one copy's time, the
    # NIC says four, and its window the latency before the first byte too: the makespan.
    async with ag.open_runtime(_names(16), sim_preset="pcie4x4") as rt:
        src = [rt.alloc(f"SIM:{i}", 4 * MIB, np.float32) for i in range(4)]
        dst = [rt.alloc(f"SIM:{i}", 4 * MIB, np.float32) for i in (4, 8, 12, 13)]
        graph = await rt.compile([ag.Copy(dst=d, src=s) for d, s in zip(dst, src)])
        span = await _timed(graph)
        bounds = ag.sim_bounds(graph)
        alone = 10e-6 + 16 * MIB / 12.5e9
        assert bounds.critical_path == pytest.approx(alone)
        assert bounds.busiest_queue == pytest.approx(alone)
        assert bounds.busiest_link == pytest.approx(4 * 16 * MIB / 12.5e9)
        assert bounds.busiest_link_name == "node 0 NIC 0 out"
        assert bounds.link_window == pytest.approx(10e-6 + 4 * 16 * MIB / 12.5e9)
        assert bounds.binding == "link window on node 0 NIC 0 out"
        assert bounds.best <= span <= (1 + 1e-9) * bounds.best


async def test_a_cost_model_of_your_own_cluster(autojump_clock: trio.testing.MockClock) -> None:
    model = ag.CostModel(
        name="mine",
        devices=CLUSTER.devices,
        same_device=CLUSTER.same_device,
        peer=ag.LinkCost(latency=0.0, bandwidth=4e9),
        host=CLUSTER.host,
        topology=ag.Topology(2, 2, "PCIe", ag.Network("IB", 1e-6, 1e9, 1)),
    )
    assert model.describe() == (
        "2 nodes x 2 GPUs, PCIe in a node, 1 x 8 Gb/s IB NICs per node: SIM:0 to SIM:3, "
        "SIM:N in node N // 2"
    )
    async with ag.open_runtime(_names(4), sim_preset=model) as rt:
        a, b, c = (rt.alloc(f"SIM:{i}", 250_000, np.float32) for i in (0, 1, 2))
        inside = await _timed(await rt.compile([ag.Copy(dst=b, src=a)]))
        across = await _timed(await rt.compile([ag.Copy(dst=c, src=a)]))
        assert inside == pytest.approx(1e6 / 4e9) and across == pytest.approx(1e-6 + 1e6 / 1e9)
    with pytest.raises(ag.DeviceError, match=r"SIM:4 is past the 4 GPUs of sim_preset 'mine'"):
        async with ag.open_runtime(["SIM:4"], sim_preset=model):
            pass
    # A cost model without a topology is one node of any size, its copies alone on a link.
    flat = ag.CostModel("flat", CLUSTER.devices, CLUSTER.same_device, CLUSTER.peer, CLUSTER.host)
    assert flat.describe() == "one node of any number of GPUs (SIM:N), copies never share a link"
    async with ag.open_runtime(["SIM:0", "SIM:70"], sim_preset=flat) as rt:
        assert ag.sim_nodes(rt) == {"SIM:0": 0, "SIM:70": 0}
        assert flat.peer_route(0, 70).links == ()
