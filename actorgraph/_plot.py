"""Timeline pictures of a Profile: a Gantt chart with one row per queue actor.

matplotlib is an optional extra (`pip install 'actorgraph[plot]'`), imported only here and
only when a plot is asked for, so the default install stays lean.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import attrs

from ._errors import MissingExtraError, UsageError
from ._log import logger
from ._profile import EventKind, Profile

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


def plot_timeline(
    profile: Profile,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    critical_path: bool = True,
    replays: Iterable[int] | None = None,
) -> str:
    """Draw `profile` as a Gantt chart and save it to `path` (format from its suffix).

    One row per actor; kernels and copies in different colours, parked waits in grey,
    the critical path of each replay underlined in red. `replays=[9, 10]` draws only those
    replays (by number, of every graph), so the axis spans them alone and their items can
    be told apart. Returns the path written.
    """
    if not isinstance(profile, Profile):
        raise UsageError(f"plot_timeline takes a Profile (from rt.profile()), got {profile!r}")
    if replays is not None:
        profile = _only(profile, replays)
    figure_class = require_matplotlib()
    from matplotlib.patches import Patch

    actors = list(profile.actors)
    origin = profile.start
    rows = {actor: i for i, actor in enumerate(actors)}
    width = max(profile.end - origin, 1e-9)
    scale, unit = (1e3, "ms") if width >= 1e-3 else (1e6, "us")

    figure = figure_class(figsize=(12, 1.2 + 0.45 * max(len(actors), 1)), dpi=100)
    ax = figure.add_subplot(1, 1, 1)
    height = 0.7

    def span(start: float, end: float) -> tuple[float, float]:
        # A minimum width keeps microsecond items visible on a long timeline.
        return ((start - origin) * scale, max((end - start) * scale, width * scale * 1e-4))

    for actor, row in rows.items():
        mine = [e for e in profile.events if e.actor == actor]
        lane = (row - height / 2, height)
        waits = [
            span(w.start, w.end)
            for e in mine
            for w in e.waits
            if w.start is not None and w.end is not None
        ]
        if waits:
            ax.broken_barh(waits, lane, facecolors=WAIT_COLOR)
        for kind, color in ((EventKind.KERNEL, KERNEL_COLOR), (EventKind.COPY, COPY_COLOR)):
            spans = [span(e.start, e.end) for e in mine if e.kind is kind]
            if spans:
                ax.broken_barh(spans, lane, facecolors=color)
    legend = [
        Patch(facecolor=KERNEL_COLOR, label="kernel"),
        Patch(facecolor=COPY_COLOR, label="copy"),
        Patch(facecolor=WAIT_COLOR, label="parked wait"),
    ]
    if critical_path and profile.events:
        path_events = profile.critical_path()
        spans = [span(e.start, e.end) for e in path_events]
        # A red strip under each item on the path leaves the item's own colour visible.
        strip = 0.14
        for event, (x, w) in zip(path_events, spans):
            ax.broken_barh(
                [(x, w)], (rows[event.actor] + height / 2, strip), facecolors=CRITICAL_COLOR
            )
        # Join the items of each replay's path so the chain reads as one line.
        chains: dict[tuple[int, int], list[tuple[float, int]]] = {}
        for event, (x, w) in zip(path_events, spans):
            chains.setdefault((event.graph, event.replay), []).append(
                (x + w / 2, rows[event.actor])
            )
        for chain in chains.values():
            ax.plot(
                [x for x, _ in chain],
                [y for _, y in chain],
                color=CRITICAL_COLOR,
                linewidth=0.8,
                alpha=0.4,
            )
        legend.append(Patch(facecolor=CRITICAL_COLOR, label="critical path"))
    ax.set_yticks(range(len(actors)))
    # A worker's queue is timed there: its row says how far off this host's clock it can be.
    errors = profile.clock_errors()
    ax.set_yticklabels([f"{a} (+-{errors[a] * 1e6:.0f} us)" if a in errors else a for a in actors])
    ax.set_ylim(len(actors) - 0.3, -0.6)
    ax.set_xlabel(f"time since first submission ({unit})")
    ax.set_title(title or f"{len(profile.replays)} replays, {len(profile.events)} items")
    ax.grid(axis="x", alpha=0.3)
    # Beside the axes, never over the data.
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    figure.tight_layout()
    figure.savefig(path, bbox_inches="tight")
    logger.info("wrote a timeline of %d items to %s", len(profile.events), os.fspath(path))
    return os.fspath(path)


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
