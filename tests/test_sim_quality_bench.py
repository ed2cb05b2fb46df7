"""benchmarks/sim_quality.py and benchmarks/core.py at quick sizes: every row is there and
says what it should (the figures themselves come from full runs)."""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest
import trio
import trio.testing

import actorgraph as ag
from benchmarks import core, sim_quality


@pytest.mark.parametrize("cluster", ["nvlink8x8", "pcie4x4"])
def test_sim_quality_quick_run_has_the_cluster_rows(tmp_path: pathlib.Path, cluster: str) -> None:
    out = tmp_path / "sim_quality.json"
    path = list(sys.path)
    assert sim_quality.main(["--quick", "--cluster", cluster, "--out", str(out)]) == 0
    # The example it builds on is loaded from its file: a folder put on sys.path would
    # let its modules (examples/remote_kernels.py) stand in for the tests' own.
    assert sys.path == path
    result = json.loads(out.read_text())
    assert result["quick"] and result["cluster"] == cluster
    names = [row["name"] for row in result["results"]]
    assert len(names) == 7
    cluster_rows = [row for row in result["results"] if row["name"].startswith(cluster)]
    assert [row["name"].split(": ")[1].split(",")[0] for row in cluster_rows] == [
        "pipeline",
        "data parallel on 16 GPUs" if cluster == "nvlink8x8" else "data parallel on 8 GPUs",
        "training step",
    ]
    for row in result["results"]:
        # A lower bound is below every schedule: the simulated one and the list-scheduled one.
        assert row["bound_s"] <= row["makespan_s"] * (1 + 1e-9), row["name"]
        assert row["bound_s"] <= row["makespan_list_scheduled_s"] * (1 + 1e-9), row["name"]
        assert row["target"] == (1.10 if row in cluster_rows else 1.05)
    # Copies between nodes cross NICs: the cluster rows count work on shared links.
    assert all(row["busiest_link_s"] > 0 for row in cluster_rows)


def test_core_quick_run_writes_the_planning_rows(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "core.json"
    assert core.main(["--quick", "--planning", "--out", str(out)]) == 0
    planning = json.loads(out.read_text())["planning"]
    assert planning["build_plan"]["plan_ms"] > 0
    rows = [(row["items"], row["devices"]) for row in planning["compile"]]
    assert rows == [(500, 8), (500, 64)]
    assert all(row["compile_ms"] >= row["min_ms"] > 0 for row in planning["compile"])


async def test_link_analysis_splits_a_replay_into_fill_bytes_gaps_and_drain(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Two copies from node 0 into one GPU of node 1 (pcie4x4: one 100 GbE NIC a node, 10 us
    # across): they queue on that GPU's copy queue, so the NIC moves the first one's bytes
    # after its latency, idles through the second one's latency, then moves its bytes.
    names = [f"SIM:{i}" for i in range(16)]
    model = ag.SIM_PRESETS["pcie4x4"]
    async with ag.open_runtime(names, sim_preset="pcie4x4") as rt:
        src = [rt.alloc("SIM:0", 1 << 18, np.float32), rt.alloc("SIM:1", 1 << 18, np.float32)]
        dst = [rt.alloc("SIM:4", 1 << 18, np.float32) for _ in range(2)]
        items = [ag.Copy(dst=d, src=s) for d, s in zip(dst, src)]
        graph = await rt.compile(items)
        start = trio.current_time()
        await graph()
        makespan = trio.current_time() - start
        records = ag.sim_timeline(rt, submission=rt.kick.value)
    use = sim_quality.link_analysis(model, items, records, "node 1 NIC 0 in")
    one = (1 << 20) / 12.5e9
    assert use["work_s"] == pytest.approx(2 * one)
    assert use["busy_s"] == pytest.approx(2 * one)
    assert use["before_first_s"] == pytest.approx(10e-6)
    assert use["gaps"] == 1 and use["idle_inside_s"] == pytest.approx(10e-6)
    assert use["after_last_s"] == pytest.approx(0.0, abs=1e-12)
    parts = use["before_first_s"] + use["busy_s"] + use["idle_inside_s"] + use["after_last_s"]
    assert parts == pytest.approx(makespan)
    # A link no copy crossed carried nothing.
    assert sim_quality.link_analysis(model, items, records, "node 3 NIC 0 in")["work_s"] == 0.0
