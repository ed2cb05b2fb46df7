"""Comparing a replay's result with a reference run's: which bytes differ, and which item
to blame. Pure: numpy arrays and byte ranges in, a `Mismatch` (or the error that
reports it) out; no runtime, no devices. Both checkers use it: a graph's
(`open_runtime(check_replays=N)`, reference: its items run eagerly) and
actorgraph.tinygrad's (`install(check_replays=N)`, reference: tinygrad running the
batch itself).

Memory is named by a `space` (an allocation, an address space) and byte offsets in it.
The replay leaves only a final state, so the rule for "the first item whose output
differs" is: for every differing byte, the item that wrote it last in program order is
the one whose output the final state shows there; of those items, the first in program
order is named, with the first differing element of the first buffer it writes that
shows a difference. An item whose wrong output a later item overwrote entirely cannot
be seen. A differing byte that no item writes is reported as such (item -1).

The same module groups the byte ranges work touches into clusters of overlapping
ranges (each cluster is one contiguous span of memory, mirrored by one shadow), and
picks, per cluster, buffers whose ranges cover it (what a snapshot copies).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Generic, TypeVar

import attrs
import numpy as np

from ._errors import ReplayMismatchError

T = TypeVar("T")


@attrs.frozen
class Written:
    """Bytes [start, stop) of memory `space` that item `item` (`label`) writes, through
    a buffer of `dtype` that a message names `name`."""

    item: int
    label: str
    name: str
    space: Hashable
    start: int
    stop: int
    dtype: np.dtype[Any]


@attrs.frozen(eq=False)
class Compared:
    """Bytes of memory `space` from `start` on, as the replay left them (`got`) and as
    the reference run left them (`expected`): uint8 arrays of one length. `name` says
    what memory it is, for a message about bytes no item writes."""

    space: Hashable
    start: int
    got: np.ndarray[Any, np.dtype[np.uint8]]
    expected: np.ndarray[Any, np.dtype[np.uint8]]
    name: str = ""


@attrs.frozen
class Mismatch:
    """The first difference by the rule of this module. `written`: the named item's
    buffer (None: a byte no item writes, then `index` is the byte's offset in
    `region`'s memory); `index`: the first differing element of that buffer; `got`,
    `expected`: the values there."""

    written: Written | None
    index: int
    got: object
    expected: object
    region: Compared | None = None


def _value(regions: Sequence[Compared], start: int, dtype: np.dtype[Any], got: bool) -> object:
    """The element of `dtype` at byte `start` of the regions' memory, as a Python value."""
    size = dtype.itemsize
    for region in regions:
        at = start - region.start
        if 0 <= at and at + size <= len(region.got):
            raw = (region.got if got else region.expected)[at : at + size].tobytes()
            value = np.frombuffer(raw, dtype=dtype)[0]
            return raw if dtype.kind == "V" else value.item()
    return None  # (unreachable: a written range lies inside one compared region)


def first_mismatch(writes: Sequence[Written], compared: Sequence[Compared]) -> Mismatch | None:
    """The first difference between `got` and `expected` of `compared`, blamed on an item
    of `writes` (every buffer each item writes, items in program order) by the module's
    rule; None when every compared byte is equal."""
    regions: dict[Hashable, list[Compared]] = {}
    found: dict[Hashable, list[np.ndarray[Any, Any]]] = {}
    for region in compared:
        regions.setdefault(region.space, []).append(region)
        differ = np.flatnonzero(region.got != region.expected)
        if differ.size:
            found.setdefault(region.space, []).append(differ + region.start)
    if not found:
        return None
    diffs = {space: np.sort(np.concatenate(parts)) for space, parts in found.items()}
    # The last writer of every differing byte: later writes overwrite earlier ones.
    last = {space: np.full(len(d), -1, dtype=np.int64) for space, d in diffs.items()}
    for k, written in enumerate(writes):
        d = diffs.get(written.space)
        if d is None:
            continue
        lo, hi = np.searchsorted(d, (written.start, written.stop))
        if lo < hi:
            last[written.space][lo:hi] = k
    shown = [int(w[w >= 0].min()) for w in last.values() if (w >= 0).any()]
    if not shown:
        space = next(iter(diffs))
        byte = int(diffs[space][0])
        region = next(r for r in regions[space] if r.start <= byte < r.start + len(r.got))
        u8 = np.dtype(np.uint8)
        return Mismatch(
            None,
            byte - region.start,
            _value([region], byte, u8, True),
            _value([region], byte, u8, False),
            region,
        )
    k = min(shown)
    written = writes[k]
    byte = int(diffs[written.space][last[written.space] == k][0])
    size = written.dtype.itemsize
    index = (byte - written.start) // size
    at = written.start + index * size
    space_regions = regions[written.space]
    return Mismatch(
        written,
        index,
        _value(space_regions, at, written.dtype, True),
        _value(space_regions, at, written.dtype, False),
    )


def mismatch_error(
    what: str, reference: str, fix: str, mismatch: Mismatch, noun: str = "item"
) -> ReplayMismatchError:
    """The error reporting `mismatch` of `what` (the replay, its graph) against
    `reference` (how the reference ran), with `fix` as the advice; `noun` is what the
    work's parts are called (items of a graph, calls of a tinygrad batch)."""
    rule = (
        f"a replay must leave every byte it writes as the reference run of its {noun}s, "
        f"one after another in program order, leaves it"
    )
    written = mismatch.written
    if written is None:
        region = mismatch.region
        where = region.name if region is not None else "memory"
        message = (
            f"{what} differs from {reference} at byte {mismatch.index} of {where}, which no "
            f"{noun} writes: {mismatch.got!r} after the replay, {mismatch.expected!r} by the "
            f"reference; {rule}. {fix}"
        )
        return ReplayMismatchError(
            message,
            graph=what,
            item=-1,
            label="",
            buffer=where,
            index=mismatch.index,
            got=mismatch.got,
            expected=mismatch.expected,
        )
    message = (
        f"{what} differs from {reference}: {noun} {written.item} ({written.label}) is the "
        f"first {noun}, in program order, whose output differs; it writes {written.name}, "
        f"whose element {mismatch.index} is {mismatch.got!r} after the replay but "
        f"{mismatch.expected!r} by the reference; {rule}. {fix}"
    )
    return ReplayMismatchError(
        message,
        graph=what,
        item=written.item,
        label=written.label,
        buffer=written.name,
        index=mismatch.index,
        got=mismatch.got,
        expected=mismatch.expected,
    )


@attrs.frozen(eq=False)
class Cluster(Generic[T]):
    """Bytes [start, stop) of memory `space`: the union of overlapping ranges of
    `members` ((start, stop, what) each), one contiguous span."""

    space: Hashable
    start: int
    stop: int
    members: tuple[tuple[int, int, T], ...]

    def cover(self) -> list[T]:
        """Members whose ranges together cover the whole cluster: the fewest that reach
        furthest, picked from the left."""
        ordered = sorted(self.members, key=lambda m: (m[0], -m[1]))
        chosen: list[T] = []
        reach = self.start
        i = 0
        while reach < self.stop:
            best: tuple[int, int, T] | None = None
            while i < len(ordered) and ordered[i][0] <= reach:
                if best is None or ordered[i][1] > best[1]:
                    best = ordered[i]
                i += 1
            assert best is not None and best[1] > reach, "a cluster is one contiguous span"
            chosen.append(best[2])
            reach = best[1]
        return chosen


def clusters(spans: Sequence[tuple[Hashable, int, int, T]]) -> list[Cluster[T]]:
    """The (space, start, stop, what) ranges grouped into clusters of ranges that
    overlap (directly or through others); ranges that only touch stay apart. Empty
    ranges are left out (they hold no byte)."""
    by_space: dict[Hashable, list[tuple[int, int, T]]] = {}
    for space, start, stop, what in spans:
        if stop > start:
            by_space.setdefault(space, []).append((start, stop, what))
    out: list[Cluster[T]] = []
    for space, members in by_space.items():
        members.sort(key=lambda m: m[0])
        group = [members[0]]
        end = members[0][1]
        for member in members[1:]:
            if member[0] < end:
                group.append(member)
                end = max(end, member[1])
                continue
            out.append(Cluster(space, group[0][0], end, tuple(group)))
            group, end = [member], member[1]
        out.append(Cluster(space, group[0][0], end, tuple(group)))
    return out


def shadow_offset(
    cluster: Cluster[T], itemsizes: Sequence[int], room: int, preferred: int
) -> int | None:
    """Where in a shadow allocation of `room` spare bytes the cluster's first byte goes:
    an offset p in [0, room) at which every member (whose items are `itemsizes[i]`
    bytes, in member order) starts a multiple of its item size into the allocation;
    `preferred` first (the one that keeps the real memory's alignment), else the
    lowest. None when no offset fits all members (starts that disagree modulo their
    item sizes)."""
    rules = {
        (size, (start - cluster.start) % size)
        for (start, _, _), size in zip(cluster.members, itemsizes)
    }

    def fits(p: int) -> bool:
        return all((p + residue) % size == 0 for size, residue in rules)

    if 0 <= preferred < room and fits(preferred):
        return preferred
    return next((p for p in range(room) if fits(p)), None)
