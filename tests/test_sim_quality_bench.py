"""benchmarks/sim_quality.py and benchmarks/core.py at quick sizes: every row is there and
says what it should (the figures themselves come from full runs)."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import core, sim_quality


@pytest.mark.parametrize("cluster", ["nvlink8x8", "pcie4x4"])
def test_sim_quality_quick_run_has_the_cluster_rows(tmp_path: pathlib.Path, cluster: str) -> None:
    out = tmp_path / "sim_quality.json"
    assert sim_quality.main(["--quick", "--cluster", cluster, "--out", str(out)]) == 0
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
