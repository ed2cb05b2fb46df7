"""Timeline pictures of a Profile: a Gantt chart with one row per queue actor.

matplotlib comes with the plot extra (`pip install -e ".[plot]"` in a checkout), imported
only here and only when a plot is asked for, so the default install stays lean.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Union

import attrs

from actorgraph.devices import install_hint

from ._errors import MissingExtraError, UsageError
from ._log import logger
from ._profile import EventKind, Profile, ProfileEvent

KERNEL_COLOR = "#4c72b0"
COPY_COLOR = "#dd8452"
WAIT_COLOR = "#d0d0d0"
CRITICAL_COLOR = "#c00000"
HATCH = "////"  # every other labelled replay's items, so overlapping replays tell apart
LABELLED = 16  # at most this many replays are labelled one by one


def require_matplotlib() -> Any:
    """Import matplotlib's Figure, or say which extra to install."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtraError(
            "plot_timeline needs matplotlib, which is not installed; "
            f"install the plot extra: {install_hint('plot')}"
        ) from exc
    return Figure


Groups = Union[Mapping[str, Any], Callable[[str], Any]]


def _label_rows(ax: Any, labels: list[str], errors: Mapping[str, float], many: bool) -> None:
    """Name the rows, top down. A worker's queue is timed there: its row says how far off
    this host's clock it can be (`errors`, by row)."""
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(
        [f"{row} (+-{errors[row] * 1e6:.0f} us)" if row in errors else row for row in labels],
        fontsize=6 if many else None,
    )


def plot_timeline(
    profile: Profile,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    critical_path: bool = True,
    replays: Iterable[int] | None = None,
    groups: Groups | None = None,
    fold_idle: bool = False,
    row_per_device: bool = False,
) -> str:
    """Draw `profile` as a Gantt chart and save it to `path`.

    One row per queue actor; kernels blue, copies orange, parked waits grey, each replay's
    critical path underlined in red, the legend beside the axes. Above the rows each
    replay's span is labelled ("replay 3", or "graph 2, replay 3" when the profile holds
    replays of several graphs) and every other replay's items are hatched, so replays that
    overlap (submitted back to back) can be told apart; a profile of more than 16 replays
    is drawn without them. An idle stretch longer than the longest run of work is cut from
    the time axis at a dashed line that says how long it was. Needs the plot extra
    (matplotlib).

    Args:
        profile: the Profile to draw (`rt.profile()`).
        path: the picture's file; its suffix (.png, .svg, .pdf) chooses the format.
        title: the chart's title (default: how many replays and items).
        critical_path: underline each replay's critical path.
        replays: draw only these replays (numbers as in Replay.number, of every graph), on
            an axis that spans them alone.
        groups: for many devices, a mapping or a function of device or actor names to a
            group (say `ag.sim_nodes(rt)`; an int group is labelled "node N"): each group's
            rows are drawn together in a labelled band.
        fold_idle: leave out the rows that ran nothing (each band counts them).
        row_per_device: draw a device's queues in one row, kernels in its upper half and
            copies in its lower half.

    Returns:
        The path written, as a string.

    Raises:
        UsageError: `profile` is no Profile, `replays` names no replay of it, or `groups`
            is neither a mapping nor a function.
        MissingExtraError: matplotlib is not installed (the message says how to install the
            plot extra).
    """
    if not isinstance(profile, Profile):
        raise UsageError(f"plot_timeline takes a Profile (from rt.profile()), got {profile!r}")
    if replays is not None:
        profile = _only(profile, replays)
    group_of = _grouping(groups)
    figure_class = require_matplotlib()
    from matplotlib.patches import Patch

    by_actor: dict[str, list[ProfileEvent]] = {actor: [] for actor in profile.actors}
    for event in profile.events:
        by_actor.setdefault(event.actor, []).append(event)
    layout = _rows(list(by_actor), by_actor, group_of, fold_idle, row_per_device)
    labels, bands = layout.labels, layout.bands
    place, cuts, width = _time_axis(profile)
    width = max(width, 1e-9)
    scale, unit = (1e3, "ms") if width >= 1e-3 else (1e6, "us")
    marks = _replay_marks(profile, place, width)
    lanes = 1 + max((mark.lane for mark in marks), default=-1)
    many = len(labels) > 32
    row_height = 0.45 if not many else max(0.14, 14.0 / len(labels))
    figure = figure_class(figsize=(12, 1.4 + row_height * (max(len(labels), 1) + lanes)), dpi=100)
    ax = figure.add_subplot(1, 1, 1)
    chart = _Chart(ax, layout.rows, place, scale, width, row_per_device)
    chart.draw_bands(bands)
    chart.draw_events(by_actor, {mark.key: mark.hatch for mark in marks})
    legend = [
        Patch(facecolor=KERNEL_COLOR, label="kernel"),
        Patch(facecolor=COPY_COLOR, label="copy"),
        Patch(facecolor=WAIT_COLOR, label="parked wait"),
    ]
    if critical_path and profile.events:
        chart.draw_critical_path(profile.critical_path())
        legend.append(Patch(facecolor=CRITICAL_COLOR, label="critical path"))
    if len(marks) > 1:
        legend.append(
            Patch(facecolor="white", edgecolor="0.35", hatch=HATCH, label="every other replay")
        )
    _label_rows(ax, labels, profile.clock_errors(), many)
    ax.set_ylim(len(labels) - 0.3, -0.6 - LANE * lanes - (0.2 if lanes else 0.0))
    chart.draw_replay_marks(marks)
    if group_of is not None:
        chart.draw_group_labels(bands)
    chart.draw_cuts(cuts)
    cut = "; idle time between replays cut at the dashed lines" if cuts else ""
    ax.set_xlabel(f"time since first submission ({unit}{cut})")
    ax.set_title(title or f"{len(profile.replays)} replays, {len(profile.events)} items")
    ax.grid(axis="x", alpha=0.3)
    # Beside the axes (and the group labels), never over the data.
    ax.legend(
        handles=legend,
        loc="upper left",
        bbox_to_anchor=(1.12 if group_of is not None else 1.01, 1.0),
        fontsize="small",
    )
    figure.tight_layout()
    figure.savefig(path, bbox_inches="tight")
    logger.info("wrote a timeline of %d items to %s", len(profile.events), os.fspath(path))
    return os.fspath(path)


@attrs.frozen
class _Chart:
    """The chart's axes, and where an actor's row and a stretch of time go on them."""

    ax: Any
    rows: dict[str, int]  # actor -> row
    place: Callable[[float], float]  # a moment -> seconds along the (cut) time axis
    scale: float  # seconds -> the axis unit
    width: float  # the time axis's seconds
    row_per_device: bool

    @property
    def height(self) -> float:
        """A row's bar height (its two halves' together where a device has one row)."""
        return 0.8 if self.row_per_device else 0.7

    def span(self, start: float, end: float) -> tuple[float, float]:
        # A minimum width keeps microsecond items visible on a long timeline.
        return (
            self.place(start) * self.scale,
            max((end - start) * self.scale, self.width * self.scale * 1e-4),
        )

    def lane(self, actor: str) -> tuple[float, float]:
        row, height = self.rows[actor], self.height
        if not self.row_per_device:
            return (row - height / 2, height)
        # Kernels in the upper half of their device's row, copies in the lower half.
        upper = _kind_of(actor) != "copy"
        return (row - height / 2, height / 2) if upper else (row, height / 2)

    def draw_bands(self, bands: list[tuple[str, int, int]]) -> None:
        """Every other group's rows on a grey background."""
        for index, (_, first, last) in enumerate(bands):
            if index % 2:
                self.ax.axhspan(first - 0.5, last + 0.5, color="#f2f2f2", zorder=0)

    def draw_events(
        self, by_actor: Mapping[str, list[ProfileEvent]], hatches: Mapping[tuple[int, int], str]
    ) -> None:
        """Each drawn actor's parked waits, kernels and copies in its lane; the items of a
        replay with a hatch in `hatches` (by graph and replay) drawn hatched."""
        for actor, events in by_actor.items():
            if actor not in self.rows:
                continue
            where = self.lane(actor)
            waits = [
                self.span(w.start, w.end)
                for e in events
                for w in e.waits
                if w.start is not None and w.end is not None
            ]
            if waits:
                self.ax.broken_barh(waits, where, facecolors=WAIT_COLOR)
            bars: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for e in events:
                color = KERNEL_COLOR if e.kind is EventKind.KERNEL else COPY_COLOR
                hatch = hatches.get((e.graph, e.replay), "")
                bars.setdefault((color, hatch), []).append(self.span(e.start, e.end))
            for (color, hatch), spans in bars.items():
                self.ax.broken_barh(
                    spans,
                    where,
                    facecolors=color,
                    hatch=hatch or None,
                    edgecolor="white",
                    linewidth=0,
                )

    def draw_replay_marks(self, marks: list[_Mark]) -> None:
        """Each replay's span above the rows, in its lane, with its label."""
        for mark in marks:
            y = -0.6 - LANE * (mark.lane + 0.5)
            x, w = mark.start * self.scale, (mark.end - mark.start) * self.scale
            self.ax.broken_barh(
                [(x, max(w, self.width * self.scale * 1e-3))],
                (y - 0.12, 0.24),
                facecolors="#e8e8e8",
                edgecolor="0.35",
                linewidth=0.6,
                hatch=mark.hatch or None,
            )
            self.ax.text(x, y - 0.15, mark.label, fontsize=7, va="bottom", color="0.2")

    def draw_critical_path(self, path: Iterable[ProfileEvent]) -> None:
        """A red strip under each item of the path (in a drawn row), and a line joining
        each replay's items."""
        path_events = [e for e in path if e.actor in self.rows]
        spans = [self.span(e.start, e.end) for e in path_events]
        # A red strip under each item on the path leaves the item's own colour visible.
        strip = 0.14
        for event, (x, w) in zip(path_events, spans):
            self.ax.broken_barh(
                [(x, w)],
                (self.rows[event.actor] + self.height / 2, strip),
                facecolors=CRITICAL_COLOR,
            )
        # Join the items of each replay's path so the chain reads as one line.
        chains: dict[tuple[int, int], list[tuple[float, int]]] = {}
        for event, (x, w) in zip(path_events, spans):
            chains.setdefault((event.graph, event.replay), []).append(
                (x + w / 2, self.rows[event.actor])
            )
        for chain in chains.values():
            self.ax.plot(
                [x for x, _ in chain],
                [y for _, y in chain],
                color=CRITICAL_COLOR,
                linewidth=0.8,
                alpha=0.4,
            )

    def draw_group_labels(self, bands: list[tuple[str, int, int]]) -> None:
        """A line between groups, and each group's label on the right."""
        for _, first, _last in bands[1:]:
            self.ax.axhline(first - 0.5, color="#808080", linewidth=0.6)
        side = self.ax.twinx()
        side.set_ylim(self.ax.get_ylim())
        side.set_yticks([(first + last) / 2 for _, first, last in bands])
        side.set_yticklabels([label for label, _, _ in bands], fontsize="small")
        side.tick_params(length=0)

    def draw_cuts(self, cuts: list[tuple[float, float]]) -> None:
        """A dashed line where idle time was cut out, saying how much."""
        for x, idle in cuts:
            self.ax.axvline(x * self.scale, color="0.45", linestyle=(0, (3, 3)), linewidth=0.8)
            self.ax.text(
                x * self.scale, -0.45, f" {_seconds(idle)} idle cut", fontsize=7, color="0.3"
            )


def _time_axis(
    profile: Profile,
) -> tuple[Callable[[float], float], list[tuple[float, float]], float]:
    """Where a moment goes on the time axis: seconds since the first submission, less the
    idle stretches cut out. A stretch with nothing drawn in it (no item, no parked wait)
    longer than the longest run of drawn work (say, between replays of microseconds run
    from notebook cells, milliseconds or seconds apart) becomes a sliver, so the axis
    spans the work and its items stay wide. Returns (place, cuts as (where on the axis,
    idle seconds cut), axis width)."""
    drawn = sorted(
        [(e.start, e.end) for e in profile.events]
        + [
            (w.start, w.end)
            for e in profile.events
            for w in e.waits
            if w.start is not None and w.end is not None
        ]
    )
    merged: list[list[float]] = []
    for start, end in drawn:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    busy = sum(end - start for start, end in merged)
    longest = max((end - start for start, end in merged), default=0.0)
    starts, offsets = [profile.start], [0.0]
    cuts: list[tuple[float, float]] = []
    x, last = 0.0, profile.start
    for start, end in merged:
        idle = start - last
        if idle > longest > 0:
            cuts.append((x + 0.025 * busy, idle))
            x += 0.05 * busy  # the sliver left of it
        else:
            x += idle
        starts.append(start)
        offsets.append(x)
        x += end - start
        last = end

    def place(moment: float) -> float:
        i = max(bisect.bisect_right(starts, moment) - 1, 0)
        return offsets[i] + moment - starts[i]

    return place, cuts, x + max(profile.end - last, 0.0)


LANE = 0.55  # the height of a lane of replay labels above the rows


@attrs.frozen
class _Mark:
    """A replay's span on the time axis, its label, lane and hatch."""

    key: tuple[int, int]  # (graph, replay)
    label: str
    start: float  # seconds along the (cut) axis
    end: float
    lane: int
    hatch: str


def _replay_marks(profile: Profile, place: Callable[[float], float], width: float) -> list[_Mark]:
    """A mark per replay drawn (none past LABELLED replays), in order of their first item,
    each in the first lane free at its start (room left for its label's text)."""
    spans: dict[tuple[int, int], list[float]] = {}
    for e in profile.events:
        span = spans.setdefault((e.graph, e.replay), [e.start, e.end])
        span[0], span[1] = min(span[0], e.start), max(span[1], e.end)
    if not spans or len(spans) > LABELLED:
        return []
    several = len({graph for graph, _ in spans}) > 1
    lane_ends: list[float] = []
    marks = []
    for index, (key, (start, end)) in enumerate(sorted(spans.items(), key=lambda kv: kv[1])):
        x0, x1 = place(start), place(end)
        lane = next((i for i, free in enumerate(lane_ends) if free <= x0), len(lane_ends))
        if lane == len(lane_ends):
            lane_ends.append(0.0)
        lane_ends[lane] = max(x1, x0 + 0.1 * width)  # a label's room, about
        label = f"graph {key[0]}, replay {key[1]}" if several else f"replay {key[1]}"
        marks.append(_Mark(key, label, x0, x1, lane, HATCH if index % 2 else ""))
    return marks


def _seconds(value: float) -> str:
    for scale, unit in ((1.0, "s"), (1e3, "ms")):
        if value * scale >= 1:
            return f"{value * scale:.3g} {unit}"
    return f"{value * 1e6:.3g} us"


@attrs.frozen
class _Layout:
    rows: dict[str, int]  # actor -> row
    labels: list[str]  # per row
    bands: list[tuple[str, int, int]]  # per group: its label, first and last row


def _device_of(actor: str) -> str:
    return actor.rpartition("/")[0] or actor


def _kind_of(actor: str) -> str:
    return actor.rpartition("/")[2]


def _grouping(groups: Groups | None) -> Callable[[str], str] | None:
    """A function from an actor's name to its group's label: the mapping's value for the
    actor, or else for its device ('other' where it has none)."""
    if groups is None:
        return None
    if callable(groups) and not isinstance(groups, Mapping):
        function = groups
        return lambda actor: str(function(actor))
    if not isinstance(groups, Mapping):
        raise UsageError(
            f"plot_timeline(groups=...) takes a mapping or a function of device names "
            f"(say ag.sim_nodes(rt)), got {groups!r}"
        )
    table = groups

    def label(actor: str) -> str:
        if actor in table:
            return _group_label(table[actor])
        device = _device_of(actor)
        return _group_label(table[device]) if device in table else "other"

    return label


def _group_label(value: Any) -> str:
    # ag.sim_nodes gives node numbers: label them as nodes.
    return f"node {value}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _rows(
    actors: list[str],
    events: Mapping[str, list[ProfileEvent]],
    group_of: Callable[[str], str] | None,
    fold_idle: bool,
    row_per_device: bool,
) -> _Layout:
    """Where each actor is drawn: groups in order of their first actor, actors in profile
    order inside them, idle ones left out if asked, one row per device if asked."""
    order: dict[str, list[str]] = {}
    for actor in actors:
        order.setdefault(group_of(actor) if group_of is not None else "", []).append(actor)
    rows: dict[str, int] = {}
    labels: list[str] = []
    bands: list[tuple[str, int, int]] = []
    for group, members in order.items():
        shown = [a for a in members if events.get(a) or not fold_idle]
        idle = len(members) - len(shown)
        first = len(labels)
        for actor in shown:
            key = _device_of(actor) if row_per_device else actor
            if row_per_device and labels and labels[-1] == key and len(labels) > first:
                rows[actor] = len(labels) - 1
                continue
            rows[actor] = len(labels)
            labels.append(key)
        if len(labels) > first:
            note = f" ({idle} idle folded)" if idle else ""
            bands.append((f"{group}{note}", first, len(labels) - 1))
    return _Layout(rows, labels, bands)


def _only(profile: Profile, replays: Iterable[int]) -> Profile:
    """The part of `profile` that belongs to these replay numbers."""
    wanted = set(replays)
    kept = attrs.evolve(
        profile,
        events=tuple(e for e in profile.events if e.replay in wanted),
        replays=tuple(r for r in profile.replays if r.replay in wanted),
    )
    if not kept.replays:
        have = sorted({r.replay for r in profile.replays})
        shown = f"{have[0]} to {have[-1]}" if have else "none"
        raise UsageError(
            f"plot_timeline(replays={sorted(wanted)}): the profile has no such replay "
            f"(its replays: {shown}); pass numbers from ReplaySpan.replay or Replay.number"
        )
    return kept
