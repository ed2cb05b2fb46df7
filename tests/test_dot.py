"""Plans as pictures: DOT text names every queue and item (scheduler/_dot.py); SVG through
Graphviz when present (actorgraph/_graphviz.py, `graph.to_svg()`)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from actorgraph.scheduler import (
    Access,
    DeviceCaps,
    ItemKind,
    Plan,
    PlanItem,
    build_plan,
)

import actorgraph as ag
from actorgraph import _graphviz

CAPS = {
    "CPU:0": DeviceCaps("CPU:0", "CPU", is_cpu=True),
    "CPU:1": DeviceCaps("CPU:1", "CPU", is_cpu=True),
}


def _acc(device: str, alloc: int, write: bool) -> Access:
    return Access(device, alloc, 0, 256, write)


def _plan() -> Plan:
    items = [
        PlanItem("xor", ItemKind.EXEC, "CPU:0", (_acc("CPU:0", 3, True), _acc("CPU:0", 1, False))),
        PlanItem(
            "copy CPU:0->CPU:1",
            ItemKind.COPY,
            "CPU:1",
            (_acc("CPU:1", 4, True), _acc("CPU:0", 3, False)),
            "CPU:0",
        ),
        PlanItem("add", ItemKind.EXEC, "CPU:1", (_acc("CPU:1", 5, True), _acc("CPU:1", 4, False))),
        PlanItem(
            'copy "back"',
            ItemKind.COPY,
            "CPU:0",
            (_acc("CPU:0", 1, True), _acc("CPU:1", 5, False)),
            "CPU:1",
        ),
    ]
    return build_plan(items, CAPS)


def test_dot_names_every_actor_and_item() -> None:
    plan = _plan()
    dot = plan.to_dot()
    assert dot.startswith('digraph "plan" {') and dot.rstrip().endswith("}")
    for queue in plan.queues:
        assert f'label="{queue}";' in dot
    for j, item in enumerate(plan.items):
        label = item.label.replace('"', '\\"')
        assert f'i{j} [label="#{j} {label}"' in dot
    # One solid arrow per cross-queue wait, labelled with what it waits for.
    waits = re.findall(r'-> i\d+ \[label="wait ', dot)
    assert len(waits) == plan.wait_count
    assert dot.count("subgraph cluster_") == len(plan.queues)
    assert plan.to_dot(name="g2").startswith('digraph "g2" {')


def test_text_form_stays_the_quick_view() -> None:
    text = str(_plan())
    assert "run xor#0" in text and "CPU:1/copy" in text


INC = ag.Kernel("inc", cpu=lambda out, a: np.add(a, 1, out=out), outs=(0,), ins=(1,))


async def _graph(rt: ag.Runtime) -> ag.Graph:
    a, b = rt.alloc("CPU:0", 4, np.int32), rt.alloc("CPU:1", 4, np.int32)
    return await rt.compile([ag.Launch(INC, [a, a]), ag.Copy(dst=b, src=a)])


async def test_svg_needs_graphviz(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_graphviz.shutil, "which", lambda name: None)
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        graph = await _graph(rt)
        with pytest.raises(
            ag.GraphvizError, match=r"needs Graphviz's `dot` program on PATH.*to_dot\(\)"
        ):
            graph.to_svg()


@pytest.mark.skipif(
    shutil.which("dot") is None,
    reason="Graphviz `dot` is not installed: apt-get install graphviz runs this test",
)
async def test_svg_when_graphviz_is_installed(tmp_path: Path) -> None:
    path = tmp_path / "plan.svg"
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        svg = (await _graph(rt)).to_svg(path)
    assert "<svg" in svg and path.read_text() == svg
    assert "CPU:1/copy" in svg
