"""Timeline pictures of a Profile: a Gantt chart with one row per queue actor.

matplotlib is an optional extra (`pip install 'actorgraph[plot]'`), imported only here and
only when a plot is asked for, so the default install stays lean.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Union

import attrs

from ._errors import MissingExtraError, UsageError
from ._log import logger
from ._profile import EventKind, Profile, ProfileEvent

KERNEL_COLOR = "#4c72b0"
COPY_COLOR = "#dd8452"
WAIT_COLOR = "#d0d0d0"
CRITICAL_COLOR = "#c00000"


def require_matplotlib() -> Any:
    """Import matplotlib's Figure, or say which extra to install."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtraError(
            "plot_timeline needs matplotlib, which is not installed; "
            "install the plot extra: pip install 'actorgraph[plot]'"
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
    ax.set_ylim(len(labels) - 0.3, -0.6)


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
    """Draw `profile` as a Gantt chart and save it to `path` (format from its suffix).

    One row per actor; kernels and copies in different colours, parked waits in grey,
    the critical path of each replay underlined in red. `replays=[9, 10]` draws only those
    replays (by number, of every graph), so the axis spans them alone and their items can
    be told apart. Returns the path written.

    For many devices: `groups` (a mapping or a function of a device or actor name, say
    `ag.sim_nodes(rt)`) draws the rows of one group together, in bands labelled with the
    group on the right (an int group is labelled "node N"); `fold_idle=True` leaves out the rows that ran nothing (each
    group's label counts them); `row_per_device=True` draws a device's queues in one
    row, kernels in its upper half and copies in its lower half.
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
    many = len(labels) > 32
    row_height = 0.45 if not many else max(0.14, 14.0 / len(labels))
    figure = figure_class(figsize=(12, 1.4 + row_height * max(len(labels), 1)), dpi=100)
    ax = figure.add_subplot(1, 1, 1)
    chart = _Chart(ax, layout.rows, place, scale, width, row_per_device)
    chart.draw_bands(bands)
    chart.draw_events(by_actor)
    legend = [
        Patch(facecolor=KERNEL_COLOR, label="kernel"),
        Patch(facecolor=COPY_COLOR, label="copy"),
        Patch(facecolor=WAIT_COLOR, label="parked wait"),
    ]
    if critical_path and profile.events:
        chart.draw_critical_path(profile.critical_path())
        legend.append(Patch(facecolor=CRITICAL_COLOR, label="critical path"))
    _label_rows(ax, labels, profile.clock_errors(), many)
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

    def draw_events(self, by_actor: Mapping[str, list[ProfileEvent]]) -> None:
        """Each drawn actor's parked waits, kernels and copies in its lane."""
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
            for kind, color in ((EventKind.KERNEL, KERNEL_COLOR), (EventKind.COPY, COPY_COLOR)):
                spans = [self.span(e.start, e.end) for e in events if e.kind is kind]
                if spans:
                    self.ax.broken_barh(spans, where, facecolors=color)

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
