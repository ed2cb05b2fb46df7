"""The peer benchmark's workloads run at a tiny size and its JSON is well formed.

This checks the script, not performance: figures from a smoke run mean nothing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import _extras
import numpy as np
import pytest

from benchmarks import _workloads as wl
from benchmarks import peers

ROWS = ("tiny_1dev", "copies_2dev", "heavy_1dev", "heavy_2dev", "dag_1k", "heavy_speedup")


def run_quick(tmp_path: Path, names: str) -> dict[str, Any]:
    out = tmp_path / "peers.json"
    code = peers.main(["--quick", "--peers", names, "--json", str(out), "--no-plot"])
    assert code == 0
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def check_report(report: dict[str, Any], names: list[str]) -> None:
    assert report["benchmark"] == "peers"
    assert report["quick"] is True
    assert report["peers"] == names
    assert tuple(report["rows"]) == ROWS
    for key, row in report["rows"].items():
        assert list(row["peers"]) == names, key
        for name, entry in row["peers"].items():
            if "skipped" in entry:
                continue
            assert entry["value"] > 0, (key, name)
            assert entry["actorgraph_ahead"] > 0, (key, name)
            if key != "heavy_speedup":
                assert entry["correct"] is True, (key, name)
                assert len(entry["times_s"]) == row["runs"]
                assert entry["median_s"] == pytest.approx(float(np.median(entry["times_s"])))
        assert row["peers"]["actorgraph"]["actorgraph_ahead"] == pytest.approx(1.0)


def test_actorgraph_and_numpy_peers_write_well_formed_json(tmp_path: Path) -> None:
    report = run_quick(tmp_path, "actorgraph,numpy")
    check_report(report, ["actorgraph", "numpy"])
    tiny = report["rows"]["tiny_1dev"]
    assert tiny["unit"] == "us/item"
    assert tiny["items"] == 16
    assert report["rows"]["copies_2dev"]["copies"] == 32 // 8


@pytest.mark.skipif(importlib.util.find_spec("dask") is None, reason=_extras.missing("dask"))
def test_dask_peer(tmp_path: Path) -> None:
    check_report(run_quick(tmp_path, "actorgraph,dask"), ["actorgraph", "dask"])


@pytest.mark.skipif(
    importlib.util.find_spec("tinygrad") is None, reason=_extras.missing("tinygrad", "this test")
)
@pytest.mark.skipif(shutil.which("clang") is None, reason=_extras.NO_CLANG)
def test_tinygrad_peer_replays_through_its_graph_runner(tmp_path: Path) -> None:
    report = run_quick(tmp_path, "actorgraph,tinygrad")
    check_report(report, ["actorgraph", "tinygrad"])
    note = report["rows"]["tiny_1dev"]["peers"]["tinygrad"]["note"]
    if importlib.metadata.version("tinygrad") == "0.11.0":
        assert "HCQGraph" in note and "ungraphed" not in note
    else:  # tinygrad 0.14's CPU devices have no graph runner: its jit calls each kernel
        assert "program call x" in note and "Graph" not in note


def test_a_missing_compiler_skips_tinygrad_with_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-here")
    report = run_quick(tmp_path, "actorgraph,tinygrad")
    for row in report["rows"].values():
        assert "apt-get install clang" in row["peers"]["tinygrad"]["skipped"]


def test_unknown_peer_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        peers.main(["--peers", "actorgraph,ray"])
    assert "unknown peers ['ray']" in capsys.readouterr().err


@pytest.mark.parametrize(
    "workload",
    [
        wl.tiny_chain(8, 16),
        wl.two_device_copies(24, 8, 16),
        wl.heavy(1, 4, 16),
        wl.heavy(2, 4, 16),
        wl.random_dag(60, 3, 4, elems=16, seed=3),
    ],
    ids=lambda w: w.name,
)
def test_workloads_are_single_assignment_dags(workload: wl.Workload) -> None:
    written: set[int] = set(workload.inputs)
    for step in workload.steps:
        reads = (step.a, step.b) if isinstance(step, wl.Xor) else (step.src,)
        assert all(r in written for r in reads), "reads only what is already written"
        assert step.out not in written, "writes every buffer once"
        written.add(step.out)
        device_of = workload.buffer_devices
        assert device_of[step.out] == step.device
        if isinstance(step, wl.Xor):
            assert device_of[step.a] == device_of[step.b] == step.device
            assert step.a != step.b
        else:
            assert device_of[step.src] != step.device
    assert workload.outputs


def test_two_device_copies_has_one_copy_in_eight() -> None:
    workload = wl.two_device_copies(1024)
    assert len(workload.steps) == 1024
    assert workload.copies == 128


def test_random_dag_never_repeats_an_item() -> None:
    workload = wl.random_dag(1000)
    keys = [
        ("xor", frozenset((s.a, s.b))) if isinstance(s, wl.Xor) else ("move", s.src, s.device)
        for s in workload.steps
    ]
    assert len(workload.steps) == 1000
    assert len(set(keys)) == len(keys)


async def test_actorgraph_build_matches_the_reference() -> None:
    import actorgraph as ag

    workload = wl.random_dag(80, 2, 4, elems=32, seed=1)
    inputs = workload.host_inputs(seed=5)
    want = wl.reference(workload, inputs)
    async with ag.open_runtime(wl.cpu_devices(2)) as rt:
        build = wl.build_actorgraph(rt, workload)
        for buf, data in zip(build.inputs, inputs):
            await rt.copyin(buf, data)
        graph = await rt.compile(build.items, inputs=build.inputs, verify=True)
        await graph(build.inputs)
        for buf in range(len(workload.buffer_devices)):
            np.testing.assert_array_equal(await rt.copyout(build.buffers[buf]), want[buf])


def test_two_device_copies_go_both_ways() -> None:
    workload = wl.two_device_copies(64)
    assert {s.device for s in workload.steps if isinstance(s, wl.Move)} == {0, 1}
