"""Chrome trace-event export: tracks, slices, flow arrows, counters; and the CLI that writes it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from _extras import importorskip

import actorgraph as ag
from actorgraph._cli import main as cli_main

N = 64
XOR = ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,), ins=(1, 2))
REPLAYS = 3


async def _profiled(rt: ag.Runtime) -> tuple[ag.Graph, ag.Profile]:
    a, b, c = (rt.alloc("CPU:0", N, np.int32) for _ in range(3))
    d, e = (rt.alloc("CPU:1", N, np.int32) for _ in range(2))
    items = [
        ag.Launch(XOR, [c, a, b]),
        ag.Copy(dst=d, src=c),
        ag.Launch(XOR, [e, d, d]),
        ag.Launch(XOR, [a, c, b]),
    ]
    graph = await rt.compile(items, inputs=[])
    for _ in range(REPLAYS):
        await graph(profile=True)
    return graph, rt.profile()


async def test_trace_loads_with_a_track_per_actor_and_a_slice_per_item_per_replay(
    tmp_path: Path,
) -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        graph, profile = await _profiled(rt)
        path = tmp_path / "trace.json"
        returned = ag.write_trace(profile, path)
        actors = rt.actor_names()
    trace = json.loads(path.read_text())
    assert trace == returned
    events = trace["traceEvents"]

    threads = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert sorted(t["args"]["name"] for t in threads) == sorted(actors)
    assert len({(t["pid"], t["tid"]) for t in threads}) == len(actors)
    processes = {
        e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert {"CPU:0", "CPU:1"} <= processes

    slices = [e for e in events if e["ph"] == "X" and e["cat"] in ("kernel", "copy")]
    per_item = Counter((s["args"]["item"], s["args"]["replay"]) for s in slices)
    assert per_item == Counter({(j, r): 1 for j in range(4) for r in range(1, REPLAYS + 1)})
    track_of = {t["args"]["name"]: (t["pid"], t["tid"]) for t in threads}
    for s in slices:
        item = graph.plan.items[s["args"]["item"]]
        queue = graph.plan.queues[graph.plan.item_queue[s["args"]["item"]]]
        assert (s["pid"], s["tid"]) == track_of[str(queue)]
        assert s["name"].startswith(item.label)
        assert s["cat"] == ("copy" if item.kind.value == "copy" else "kernel")
        assert s["dur"] > 0 and s["ts"] >= 0

    # One arrow per cross-queue wait per replay, each with a start and an end.
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys()
    assert len(starts) == graph.plan.wait_count * REPLAYS
    assert all(e["bp"] == "e" for e in ends.values())

    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == 2 * REPLAYS
    assert counters[-1]["args"]["replays"] == 0
    assert max(c["args"]["replays"] for c in counters) == 1  # replays ran one at a time


async def test_profile_to_chrome_trace_returns_or_writes(tmp_path: Path) -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        _, profile = await _profiled(rt)
    trace = profile.to_chrome_trace()
    assert trace["otherData"]["replays"] == REPLAYS
    profile.to_chrome_trace(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == trace


async def test_parked_waits_show_as_wait_slices() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"], cpu_thread_bytes=0) as rt:
        _, profile = await _profiled(rt)
    parked = [w for e in profile.events for w in e.waits if w.parked]
    waits = [
        e
        for e in profile.to_chrome_trace()["traceEvents"]
        if e.get("cat") == "wait" and e["ph"] == "X"
    ]
    assert len(waits) == len(parked) > 0
    assert all(w["name"].startswith("wait ") for w in waits)


async def test_an_empty_profile_is_an_empty_trace() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        trace = rt.profile().to_chrome_trace()
    assert not [e for e in trace["traceEvents"] if e["ph"] != "M"]


def test_cli_demo_writes_trace_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    importorskip("matplotlib")
    trace, plot = tmp_path / "out.json", tmp_path / "out.png"
    code = cli_main(
        [
            "demo",
            "--devices",
            "CPU:0,CPU:1",
            "--replays",
            "2",
            "--trace",
            str(trace),
            "--plot",
            str(plot),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "2 replays checked against eager: OK" in out
    assert f"trace written to {trace}" in out
    loaded = json.loads(trace.read_text())
    assert loaded["otherData"]["replays"] == 2
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_cli_demo_plot_without_matplotlib_fails_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    code = cli_main(["demo", "--replays", "1", "--plot", str(tmp_path / "x.png")])
    assert code == 2
    assert (
        'install the plot extra: pip install -e ".[plot]" in a checkout' in capsys.readouterr().err
    )
    assert not (tmp_path / "x.png").exists()


async def test_replays_submitted_together_show_in_the_in_flight_counter() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"], profile=True) as rt:
        a, b, c = (rt.alloc("CPU:0", N, np.int32) for _ in range(3))
        d = rt.alloc("CPU:1", N, np.int32)
        graph = await rt.compile([ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c)])
        replays = [await graph.submit() for _ in range(3)]  # no checkpoint in between
        for replay in replays:
            await replay.wait()
        trace = rt.profile().to_chrome_trace()
    counts = [e["args"]["replays"] for e in trace["traceEvents"] if e["ph"] == "C"]
    assert counts[:3] == [1, 2, 3] and counts[-1] == 0
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "wait"]
    assert sorted(s["args"]["replay"] for s in slices) == [1, 1, 2, 2, 3, 3]
