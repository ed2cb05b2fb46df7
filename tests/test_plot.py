"""Timeline pictures: a PNG that is really an image, and clear errors when it cannot be drawn."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from _extras import importorskip

import actorgraph as ag

N = 64
XOR = ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,), ins=(1, 2))


async def _profile() -> ag.Profile:
    async with ag.open_runtime(["CPU:0", "CPU:1"], profile=True) as rt:
        a, b, c = (rt.alloc("CPU:0", N, np.int32) for _ in range(3))
        d, e = (rt.alloc("CPU:1", N, np.int32) for _ in range(2))
        graph = await rt.compile(
            [ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c), ag.Launch(XOR, [e, d, d])]
        )
        for _ in range(3):
            await graph()
        return rt.profile()


async def test_plot_timeline_writes_a_real_png(tmp_path: Path) -> None:
    importorskip("matplotlib")
    from matplotlib.image import imread

    path = tmp_path / "timeline.png"
    assert ag.plot_timeline(await _profile(), path, title="three replays") == str(path)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 10_000
    image = imread(path)
    height, width = image.shape[:2]
    assert width >= 800 and height >= 200
    assert image[..., :3].std() > 0.05  # not a blank canvas


async def test_plot_timeline_draws_svg_and_empty_profiles(tmp_path: Path) -> None:
    importorskip("matplotlib")
    ag.plot_timeline(await _profile(), tmp_path / "t.svg", critical_path=False)
    assert "<svg" in (tmp_path / "t.svg").read_text()
    async with ag.open_runtime(["CPU:0"]) as rt:
        empty = rt.profile()
    ag.plot_timeline(empty, tmp_path / "empty.png")
    assert (tmp_path / "empty.png").stat().st_size > 1000


async def test_plot_timeline_takes_a_profile(tmp_path: Path) -> None:
    with pytest.raises(
        ag.UsageError, match=r"plot_timeline takes a Profile \(from rt.profile\(\)\)"
    ):
        ag.plot_timeline("trace.json", tmp_path / "x.png")  # type: ignore[arg-type]


async def test_plot_timeline_without_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = await _profile()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(
        ag.MissingExtraError, match=r'install the plot extra: pip install -e "\.\[plot\]" in a'
    ):
        ag.plot_timeline(profile, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


async def test_plot_timeline_zooms_to_chosen_replays(tmp_path: Path) -> None:
    importorskip("matplotlib")
    from matplotlib.image import imread

    profile = await _profile()
    path = tmp_path / "zoom.png"
    ag.plot_timeline(profile, path, replays=[2, 3])
    assert imread(path)[..., :3].std() > 0.05
    with pytest.raises(
        ag.UsageError,
        match=re.escape(
            "plot_timeline(replays=[7]): the profile has no such replay (its replays: 1 to 3); "
            "pass numbers from ReplaySpan.replay or Replay.number"
        ),
    ):
        ag.plot_timeline(profile, tmp_path / "none.png", replays=[7])
    assert not (tmp_path / "none.png").exists()


def test_the_zoomed_profile_keeps_only_those_replays() -> None:
    from actorgraph._plot import _only

    profile = trio.run(_profile)
    part = _only(profile, [2])
    assert {e.replay for e in part.events} == {2} and [r.replay for r in part.replays] == [2]
    assert part.start >= profile.start and part.end <= profile.end
    assert len(part.events) == len(profile.events) // 3


@pytest.fixture
def saved_figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The matplotlib Figures plot_timeline saves, kept to look into."""
    importorskip("matplotlib")
    from matplotlib.figure import Figure

    saved: list[Figure] = []
    real_savefig = Figure.savefig

    def keep(self: Figure, *args: object, **kwargs: object) -> None:
        saved.append(self)
        real_savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def test_the_legend_sits_beside_the_axes(tmp_path: Path, saved_figures: list[Any]) -> None:
    saved = saved_figures
    ag.plot_timeline(trio.run(_profile), tmp_path / "legend.png")
    (ax,) = saved[0].axes
    saved[0].canvas.draw()
    legend_box = ax.get_legend().get_window_extent()
    axes_box = ax.get_window_extent()
    assert legend_box.x0 >= axes_box.x1  # right of the plotting area: never over the bars


async def _replays_seconds_apart() -> ag.Profile:
    # SIM devices keep time on trio's clock: with the autojump clock the replays take
    # simulated microseconds, and the seconds between them cost no wall time.
    async with ag.open_runtime(["SIM:0", "SIM:1"], profile=True) as rt:
        a, b, c = (rt.alloc("SIM:0", N, np.int32) for _ in range(3))
        d = rt.alloc("SIM:1", N, np.int32)
        graph = await rt.compile([ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c)])
        for _ in range(3):
            await graph()
            await trio.sleep(2.0)  # a person between two notebook cells
        return rt.profile()


async def test_idle_time_between_replays_is_cut_from_the_axis(
    tmp_path: Path, saved_figures: list[Any], autojump_clock: trio.testing.MockClock
) -> None:
    from actorgraph._plot import _time_axis

    profile = await _replays_seconds_apart()
    busy = sum(r.done - r.submitted for r in profile.replays)
    assert profile.end - profile.start > 4.0 > 1000 * busy  # microseconds in seconds
    place, cuts, width = _time_axis(profile)
    assert [round(idle) for _, idle in cuts] == [2, 2]
    assert width == pytest.approx(busy * 1.1)  # the replays, and a sliver per cut
    starts = [place(e.start) for e in sorted(profile.events, key=lambda e: e.start)]
    assert starts == sorted(starts) and 0 <= starts[0] and starts[-1] < width
    for event in profile.events:  # an item keeps its length
        assert place(event.end) - place(event.start) == pytest.approx(event.end - event.start)

    ag.plot_timeline(profile, tmp_path / "apart.png")
    (ax,) = saved_figures[0].axes
    low, high = ax.get_xlim()
    kernels = [e for e in profile.events if e.kind is ag.EventKind.KERNEL]
    shortest = min(e.end - e.start for e in kernels) * 1e6  # us, the axis's unit here
    assert shortest / (high - low) > 0.02  # a bar, not a hairline
    assert "idle time between replays cut at the dashed lines" in ax.get_xlabel()
    cuts = [t.get_text() for t in ax.texts if "idle cut" in t.get_text()]
    assert cuts == [" 2 s idle cut", " 2 s idle cut"]


async def _two_graphs_back_to_back() -> ag.Profile:
    # Two graphs' replays submitted back to back: their items interleave on the queues.
    async with ag.open_runtime(["CPU:0", "CPU:1"], profile=True) as rt:
        a, b, c = (rt.alloc("CPU:0", N, np.int32) for _ in range(3))
        d, e = (rt.alloc("CPU:1", N, np.int32) for _ in range(2))
        first = await rt.compile([ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c)])
        second = await rt.compile([ag.Launch(XOR, [e, d, d])])
        replays = [await first.submit(), await first.submit(), await second.submit()]
        await replays[-1].wait()
        return rt.profile()


def _replay_labels(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.texts if "replay" in t.get_text()]


async def test_each_replay_drawn_is_labelled_and_told_apart(
    tmp_path: Path, saved_figures: list[Any]
) -> None:
    profile = await _profile()
    ag.plot_timeline(profile, tmp_path / "three.png")
    (ax,) = saved_figures[-1].axes
    assert _replay_labels(ax) == ["replay 1", "replay 2", "replay 3"]
    # Every other replay's items are hatched, its label's bar too, so the bars of two
    # replays that overlap on the axis are told apart.
    hatched = [c for c in ax.collections if c.get_hatch()]
    assert hatched and all(c.get_hatch() == "////" for c in hatched)
    ag.plot_timeline(profile, tmp_path / "two.png", replays=[2, 3])
    (ax,) = saved_figures[-1].axes
    assert _replay_labels(ax) == ["replay 2", "replay 3"]
    # Replays of several graphs: each label names its graph too.
    ag.plot_timeline(await _two_graphs_back_to_back(), tmp_path / "graphs.png")
    (ax,) = saved_figures[-1].axes
    labels = _replay_labels(ax)
    assert len(labels) == 3 and len(set(labels)) == 3, labels
    assert all(re.fullmatch(r"graph \d+, replay [12]", label) for label in labels), labels
    assert "label" not in ax.get_title()


def _cluster_profile() -> tuple[ag.Profile, dict[str, int]]:
    """A replay on 16 SIM GPUs of two nodes in which SIM:3 and SIM:11 run nothing."""
    names = [f"SIM:{i}" for i in range(16)]
    busy = [n for n in names if n not in ("SIM:3", "SIM:11")]
    kernel = ag.Kernel("k", cpu=lambda out, x: np.add(x, 1, out=out), outs=(0,), ins=(1,))
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def main() -> tuple[ag.Profile, dict[str, int]]:
        async with ag.open_runtime(names, sim_preset="nvlink8x8", profile=True) as rt:
            bufs = {n: (rt.alloc(n, 64, np.float32), rt.alloc(n, 64, np.float32)) for n in busy}
            items: list[ag.Launch | ag.Copy] = [
                ag.Launch(kernel, [bufs[n][1], bufs[n][0]]) for n in busy
            ]
            items += [ag.Copy(dst=bufs[b][0], src=bufs[a][1]) for a, b in zip(busy, busy[1:])]
            graph = await rt.compile(items)
            await graph()
            return rt.profile(), ag.sim_nodes(rt)

    return trio.run(main, clock=clock)


def test_plot_timeline_groups_rows_by_node_and_folds_idle_queues(tmp_path: Path) -> None:
    importorskip("matplotlib")
    from actorgraph._plot import _grouping, _rows

    profile, nodes = _cluster_profile()
    events: dict[str, list[ag.ProfileEvent]] = {a: [] for a in profile.actors}
    for event in profile.events:
        events[event.actor].append(event)
    layout = _rows(list(profile.actors), events, _grouping(nodes), True, True)
    # One row per device that ran something, in node order; the idle devices' two queues
    # (and the copy queue of SIM:0, which receives nothing) are folded and counted.
    assert layout.labels == [f"SIM:{i}" for i in range(16) if i not in (3, 11)]
    assert layout.bands == [("node 0 (3 idle folded)", 0, 6), ("node 1 (2 idle folded)", 7, 13)]
    assert layout.rows["SIM:1/compute"] == layout.rows["SIM:1/copy"] == 1
    per_queue = _rows(list(profile.actors), events, _grouping(nodes), False, False)
    assert len(per_queue.labels) == 32 and per_queue.bands[1] == ("node 1", 16, 31)
    path = tmp_path / "cluster.png"
    ag.plot_timeline(profile, path, groups=nodes, fold_idle=True, row_per_device=True)
    assert path.read_bytes().startswith(b"\x89PNG")
    by_name = _grouping(lambda actor: "first" if actor < "SIM:5" else "second")
    assert by_name is not None and by_name("SIM:10/copy") == "first"
    with pytest.raises(ag.UsageError, match=r"groups=...\) takes a mapping or a function"):
        ag.plot_timeline(profile, path, groups=3)  # type: ignore[arg-type]
