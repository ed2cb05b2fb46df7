"""Range-aware last-writer / readers-since tracking, per base allocation."""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence

from ._records import Access


class _Segment:
    __slots__ = ("readers", "start", "stop", "writer")

    def __init__(self, start: int, stop: int, writer: int | None, readers: list[int]) -> None:
        self.start = start
        self.stop = stop
        self.writer = writer
        self.readers = readers


class RangeTracker:
    """Tracks, for every byte range ever accessed, its last writer and the readers since.

    Invariants: the segments of one allocation are sorted, disjoint and non-empty; a
    byte never accessed has no segment.
    """

    def __init__(self) -> None:
        self._segments: dict[Hashable, list[_Segment]] = {}
        self._starts: dict[Hashable, list[int]] = {}

    def access(self, alloc: Hashable, start: int, stop: int, write: bool, who: int) -> set[int]:
        """Record an access by `who`; return the earlier accessors it must come after."""
        if stop <= start:
            return set()
        covered = self._cover(alloc, start, stop)
        deps: set[int] = set()
        for seg in covered:
            if seg.writer is not None:
                deps.add(seg.writer)
            if write:
                deps.update(seg.readers)
        if write and len(covered) == 1:
            seg = covered[0]
            seg.writer = who
            seg.readers = []
        elif write:
            segs = self._segments[alloc]
            first = bisect.bisect_left(self._starts[alloc], start)
            # A write leaves the whole range with one state: fold it into one segment.
            merged = _Segment(start, stop, who, [])
            segs[first : first + len(covered)] = [merged]
            self._starts[alloc][first : first + len(covered)] = [start]
        else:
            for seg in covered:
                if not seg.readers or seg.readers[-1] != who:
                    seg.readers.append(who)
        deps.discard(who)
        return deps

    def item(self, accesses: Sequence[Access], who: int) -> set[int]:
        """Record all of item `who`'s accesses; return the earlier items it must come after.

        The same as `access` for each of them, with the common cases (an allocation's
        first access, an access to exactly one known segment) done inline: the planner
        calls this once per item. The order of one item's accesses does not change what
        it comes after: a write adds the writer and the readers of what it covers as they
        were before the item, and a later access of the item to those bytes finds only
        the item itself there (it may stay listed as a reader of bytes it wrote, which
        adds nothing: whoever writes them next comes after it as their writer).
        """
        deps: set[int] = set()
        segments = self._segments
        for access in accesses:
            alloc, start, stop = access.alloc, access.start, access.stop
            if stop <= start:
                continue
            segs = segments.get(alloc)
            if segs is None:
                first = (
                    _Segment(start, stop, who, [])
                    if access.write
                    else _Segment(start, stop, None, [who])
                )
                segments[alloc] = [first]
                self._starts[alloc] = [start]
                continue
            if len(segs) == 1:  # an allocation only ever accessed whole, say
                seg = segs[0]
                if seg.start != start or seg.stop != stop:
                    deps |= self.access(alloc, start, stop, access.write, who)
                    continue
            else:
                idx = bisect.bisect_left(self._starts[alloc], start)
                if idx == len(segs) or segs[idx].start != start or segs[idx].stop != stop:
                    deps |= self.access(alloc, start, stop, access.write, who)
                    continue
                seg = segs[idx]
            if seg.writer is not None:
                deps.add(seg.writer)
            if access.write:
                deps.update(seg.readers)
                seg.writer = who
                seg.readers = []
            elif not seg.readers or seg.readers[-1] != who:
                seg.readers.append(who)
        deps.discard(who)
        return deps

    def _cover(self, alloc: Hashable, start: int, stop: int) -> list[_Segment]:
        """Split and fill so that [start, stop) is exactly a run of segments; return it."""
        segs = self._segments.setdefault(alloc, [])
        starts = self._starts.setdefault(alloc, [])
        # Fast path: the range is exactly one existing segment (whole-buffer accesses).
        idx = bisect.bisect_left(starts, start)
        if idx < len(segs) and segs[idx].start == start and segs[idx].stop == stop:
            return [segs[idx]]
        self._split(segs, starts, start)
        self._split(segs, starts, stop)
        lo = bisect.bisect_left(starts, start)
        out: list[_Segment] = []
        pos = start
        idx = lo
        while pos < stop:
            if idx < len(segs) and segs[idx].start == pos:
                seg = segs[idx]
                out.append(seg)
                pos = seg.stop
                idx += 1
            else:
                gap_end = segs[idx].start if idx < len(segs) and segs[idx].start < stop else stop
                seg = _Segment(pos, gap_end, None, [])
                segs.insert(idx, seg)
                starts.insert(idx, pos)
                out.append(seg)
                pos = gap_end
                idx += 1
        return out

    @staticmethod
    def _split(segs: list[_Segment], starts: list[int], at: int) -> None:
        idx = bisect.bisect_right(starts, at) - 1
        if idx < 0:
            return
        seg = segs[idx]
        if seg.start < at < seg.stop:
            right = _Segment(at, seg.stop, seg.writer, list(seg.readers))
            seg.stop = at
            segs.insert(idx + 1, right)
            starts.insert(idx + 1, at)
