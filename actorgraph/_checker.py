"""Checked replays: `open_runtime(check_replays=N)` has the first N replays of every Graph
also run the same work eagerly, item by item, on shadow copies of the memory the replay
touches, and compares every byte the items write (`_compare.py` says which item a
difference is blamed on).

One checked replay is posted as one run of submissions, with no checkpoint in between,
so nothing else runs between its parts on any device (a device runs submissions in the
order they are posted):

1. shadows: per cluster of overlapping bytes the call's items touch (its buffers: the
   call's inputs and views of them, the graph's own buffers), a copy in an arena of its
   device (one allocation per device and dtype), placed so its bytes keep the real
   memory's alignment, and a twin arena of the same layout for the replay's result;
2. the snapshot: one program of Copy items from the real buffers into the shadows, so
   the shadows hold the memory as the replay finds it;
3. the replay itself, posted to its actors (profiled if asked);
4. one program of Copy items from the real buffers into the twin arenas: the replay's
   result, kept before any later work can change it;
5. the items on the shadows, one submission each, in program order (as `rt.run` runs
   them), with the call's var values: the reference result;
6. host reads of both arenas of every device where an item writes.

When all of it is done the two results are compared on the host and the shadows go
back to their devices. The replay's own failure is raised as it would be unchecked; an
item that fails only in the eager run, or a difference, raises ReplayMismatchError
(and logs it, so a check nobody waits for is not lost). Nothing of this touches the
runtime's state beyond its own submissions: after a mismatch the runtime goes on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from actorgraph.devices import Submission
from actorgraph.scheduler import DeviceCaps, build_plan

from ._buffer import Buffer
from ._compare import Cluster, Compared, Written, clusters, first_mismatch, mismatch_error
from ._compare import shadow_offset as place_cluster
from ._errors import ReplayMismatchError, UsageError
from ._kernel import Copy, Item
from ._log import logger
from ._program import Bound, Host, Program, host_program, plan_item, plan_items
from ._vars import Var


class CheckHost(Host, Protocol):
    """What a check needs of its runtime (a `Runtime` is one): a Program's host, and
    shadow memory allocated and freed on its devices."""

    @property
    def caps(self) -> Mapping[str, DeviceCaps]: ...

    def alloc(self, device: str, shape: int | tuple[int, ...], dtype: Any = ...) -> Buffer: ...

    def free(self, buffer: Buffer) -> None: ...


# The real memory's alignment that shadows keep (a multiple of any vector load's).
_ALIGN = 64
U8 = np.dtype(np.uint8)

_EAGER = "running its items eagerly one by one on copies of the memory it found"
_FIX = (
    "Kernels must depend on their buffers and var values only (no state kept between "
    "calls, no memory read or written that their launch does not pass); if they do, "
    "this is a bug of actorgraph: please report it with this message."
)


def _real_address(cluster: Cluster[Buffer]) -> int:
    """Where the cluster's first byte is, as far as alignment goes: its host address on
    host-visible devices, else its offset (device allocations are aligned)."""
    start, _, buf = cluster.members[0]
    if buf.device_object.host_visible:
        return buf.address - (start - cluster.start)
    return cluster.start


class _Arena:
    """The shadows of the clusters of one device and dtype, side by side in one
    allocation, and a second allocation of the same layout for the replay's result.
    One dtype per arena, so its views are plain ones, as every device kind takes them
    (a worker's views keep their allocation's dtype); clusters whose buffers mix
    dtypes go to a raw-bytes arena, viewed with each buffer's own dtype."""

    def __init__(self, device: str, dtype: np.dtype[Any]) -> None:
        self.device = device
        self.dtype = dtype
        self.clusters: list[tuple[Cluster[Buffer], int, int, bool]] = []  # and slot, room
        self.nbytes = 0
        self.shadow: Buffer | None = None  # the reference's memory
        self.result: Buffer | None = None  # the replay's result, copied after it

    def add(self, cluster: Cluster[Buffer], written: bool) -> None:
        sizes = [buf.dtype.itemsize for _, _, buf in cluster.members]
        room = math.lcm(_ALIGN, self.dtype.itemsize, *sizes)
        slot = -(-self.nbytes // room) * room  # a multiple of every item size and _ALIGN
        self.clusters.append((cluster, slot, room, written))
        self.nbytes = slot + cluster.stop - cluster.start + room

    def view(self, arena: Buffer, offset: int, buf: Buffer) -> Buffer:
        """The view of `arena` at byte `offset` that stands for `buf`."""
        if self.dtype == buf.dtype:
            return arena.view(offset // self.dtype.itemsize, shape=buf.shape)
        return arena.view(byte_offset=offset, dtype=buf.dtype, shape=buf.shape)


class Shadows:
    """Shadow memory for one checked replay: per cluster of overlapping bytes that the
    items touch, a copy in an arena of its device (`of` gives the view that mirrors a
    buffer), and room of the same layout for the replay's result (`result_of`)."""

    def __init__(self, runtime: CheckHost, items: Sequence[Item]) -> None:
        self._runtime = runtime
        self._of: dict[Buffer, Buffer] = {}
        self._result_of: dict[Buffer, Buffer] = {}
        # Per written cluster: (cluster, its arena, where the cluster starts in it).
        self.written: list[tuple[Cluster[Buffer], _Arena, int]] = []
        self.covers: list[Buffer] = []  # real buffers whose bytes cover every cluster
        self.arenas: list[_Arena] = []
        self._allocations: list[Buffer] = []
        written: set[Buffer] = set()
        used: dict[Buffer, None] = {}
        for item in items:
            for buf, writes in item.reads_writes():
                used[buf] = None
                if writes:
                    written.add(buf)
        arenas: dict[tuple[str, np.dtype[Any]], _Arena] = {}
        for cluster in clusters([(buf.alloc_id, *buf.byte_range, buf) for buf in used]):
            bufs = [buf for _, _, buf in cluster.members]
            dtypes = {buf.dtype for buf in bufs}
            key = (bufs[0].device, bufs[0].dtype if len(dtypes) == 1 else U8)
            arena = arenas.get(key)
            if arena is None:
                arena = arenas[key] = _Arena(*key)
            arena.add(cluster, any(buf in written for buf in bufs))
        self.arenas = list(arenas.values())
        try:
            for arena in self.arenas:
                self._place(arena)
            for buf in used:
                if buf not in self._of:  # holds no byte: any shadow memory of its device
                    empty = self._allocate(buf.device, 1, buf.dtype)
                    self._of[buf] = self._result_of[buf] = empty.view(0, shape=buf.shape)
        except BaseException:
            self.free()
            raise

    def _allocate(self, device: str, count: int, dtype: np.dtype[Any]) -> Buffer:
        shadow = self._runtime.alloc(device, count, dtype)
        self._allocations.append(shadow)
        return shadow

    def _place(self, arena: _Arena) -> None:
        count = -(-arena.nbytes // arena.dtype.itemsize)
        shadow = arena.shadow = self._allocate(arena.device, count, arena.dtype)
        result = arena.result = self._allocate(arena.device, count, arena.dtype)
        base = shadow.address if shadow.device_object.host_visible else 0
        for cluster, slot, room, written in arena.clusters:
            sizes = [buf.dtype.itemsize for _, _, buf in cluster.members]
            preferred = (_real_address(cluster) - base - slot) % _ALIGN
            at = place_cluster(cluster, sizes, room, preferred)
            if at is None:
                raise UsageError(
                    f"check_replays: buffers {[m[2] for m in cluster.members]!r} share "
                    f"memory but start at offsets that disagree modulo their item sizes, "
                    f"so no one shadow can mirror them; open the runtime without "
                    f"check_replays to replay this graph"
                )
            at += slot
            for start, _, buf in cluster.members:
                offset = at + start - cluster.start
                self._of[buf] = arena.view(shadow, offset, buf)
                self._result_of[buf] = arena.view(result, offset, buf)
            self.covers += cluster.cover()
            if written:
                self.written.append((cluster, arena, at))

    def of(self, buf: Buffer) -> Buffer:
        """The shadow of `buf` (a buffer of the items)."""
        return self._of[buf]

    def result_of(self, buf: Buffer) -> Buffer:
        """Where the replay's result in `buf` is copied to."""
        return self._result_of[buf]

    def item(self, item: Item) -> Item:
        """`item` on the shadows of its buffers."""
        return item.with_buffers([self._of[buf] for buf in item.bufs])

    def free(self) -> None:
        """Give the shadow memory back once the work posted on it is done."""
        for shadow in self._allocations:
            if not shadow.freed:
                self._runtime.free(shadow)
        self._allocations = []


class Checks:
    """A graph's check mode: its next `left` replays are each posted with a check (the
    gate of the check stands for the replay). The graph drops it once none is left, so
    its later replays take the unchecked path, at no cost."""

    def __init__(self, runtime: CheckHost, left: int) -> None:
        self._runtime = runtime
        self.left = left

    def post(self, what: str, bound: Bound, replay: Callable[[], Submission]) -> Submission:
        """Post `replay()` (which posts the replay of `bound`, named `what` in errors) with
        its check; return the check's gate, done when all of it is (failed as the call
        fails). One check fewer is left once it is under way."""
        gate = ReplayCheck(self._runtime, what, bound).start(bound.inputs, replay)
        self.left -= 1  # a call refused before it ran (no shadows made) is not one
        return gate


class ReplayCheck:
    """One checked replay from its posting to its verdict (the module's steps 1-6).
    `gate` is done when every part is, failed with what the call raises."""

    def __init__(self, runtime: CheckHost, what: str, bound: Bound) -> None:
        self._runtime = runtime
        self._what = what
        self._program = bound.program
        self._values: Mapping[Var, int] = bound.var_vals or {}
        self.gate = Submission(1, (), (), ((),), ())
        self._left = 1  # parts not done, plus one held while they are being posted
        self._replay: Submission | None = None
        self._trouble: tuple[str, BaseException] | None = None  # a part failed (not an item)
        self._eager_failure: tuple[int, BaseException] | None = None
        # Per arena: the host reads of the replay's result and of the reference's.
        self._reads: dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
        self._written: list[tuple[Cluster[Buffer], _Arena, int]] = []
        self._writes: list[Written] = []

    def start(self, inputs: Sequence[Buffer], replay: Callable[[], Submission]) -> Submission:
        """Post the check around `replay()` (which starts the replay and returns its
        submission); return the gate."""
        program = self._program
        items = program.call_items(inputs)
        order = sorted(range(len(items)), key=lambda j: program.item_numbers[j])
        shadows = Shadows(self._runtime, items)
        try:
            self._post_copies([(shadows.of(buf), buf) for buf in shadows.covers])
            self._replay = replay()
            self._count(self._replay)
            self._post_copies([(shadows.result_of(buf), buf) for buf in shadows.covers])
            for j in order:
                self._post_eager(shadows.item(items[j]), program.item_numbers[j])
            self._post_reads(shadows)
        finally:
            shadows.free()
        for j in order:
            item = items[j]
            for buf, writes in item.reads_writes():
                if writes and buf.nbytes:
                    start, stop = buf.byte_range
                    self._writes.append(
                        Written(
                            program.item_numbers[j],
                            item.label,
                            repr(buf),
                            buf.alloc_id,
                            start,
                            stop,
                            buf.dtype,
                        )
                    )
        self._part_done()  # everything is posted
        return self.gate

    # -- posting --

    def _post(self, program: Program, bound: Bound) -> None:
        self._left += 1
        program.submit(bound, then=self._part_failed_or_done)

    def _post_copies(self, pairs: Sequence[tuple[Buffer, Buffer]]) -> None:
        """Post one program of Copy items (dst, src): a snapshot, or the result."""
        copies: list[Item] = [Copy(dst=dst, src=src) for dst, src in pairs]
        if not copies:
            return
        runtime = self._runtime
        program = Program(runtime, copies, (), build_plan(plan_items(copies), runtime.caps))
        self._post(program, program.bind((), {}))

    def _read(self, buf: Buffer) -> np.ndarray[Any, Any]:
        """Post a host read of `buf`; the array holds its bytes once that is done."""
        runtime = self._runtime
        out = np.empty(buf.shape, dtype=buf.dtype)
        program = host_program(runtime, runtime.caps, buf, write=False)
        op = runtime.device(buf.device).lower_host_read(buf, out, program.plan.queues[0].kind)
        self._post(program, program.bind_host(op))
        return out

    def _post_reads(self, shadows: Shadows) -> None:
        """Post host reads of every arena that holds a written cluster, both halves."""
        self._written = shadows.written
        for arena in {id(a): a for _, a, _ in shadows.written}.values():
            assert arena.result is not None and arena.shadow is not None
            self._reads[id(arena)] = (self._read(arena.result), self._read(arena.shadow))

    def _post_eager(self, item: Item, number: int) -> None:
        runtime = self._runtime
        plan = build_plan([plan_item(item)], runtime.caps)
        program = Program(runtime, (item,), (), plan, index_offset=number)
        values = {var: self._values[var] for var in program.free_vars}
        self._left += 1
        program.submit(program.bind((), values), then=self._eager_done)

    # -- completion --

    def _count(self, sub: Submission) -> None:
        """Count `sub` (the replay's) as a part: done now, or when it ends."""
        self._left += 1
        sub.when_done(lambda _: self._part_done())

    def _part_failed_or_done(self, sub: Submission) -> None:
        if sub.error is not None and self._trouble is None:
            self._trouble = (sub.failed_actor, sub.error)
        self._part_done()

    def _eager_done(self, sub: Submission) -> None:
        if sub.error is not None:
            failure = self._eager_failure
            if sub.failed_item < 0:
                if self._trouble is None:
                    self._trouble = (sub.failed_actor, sub.error)
            elif failure is None or sub.failed_item < failure[0]:
                self._eager_failure = (sub.failed_item, sub.error)
        self._part_done()

    def _part_done(self) -> None:
        self._left -= 1
        if self._left:
            return
        gate = self.gate
        try:
            self._verdict()
        except Exception as error:  # a fault of the check itself: the caller's, never an actor's
            gate.fail(-1, "", error)
        gate.job_done(0)

    def _verdict(self) -> None:
        gate, replay = self.gate, self._replay
        if replay is not None and replay.error is not None:  # the replay's own failure
            gate.fail(replay.failed_item, replay.failed_actor, replay.error)
            return
        if self._trouble is not None:
            gate.fail(-1, *self._trouble)
            return
        error = self._eager_error() if self._eager_failure is not None else self._compare()
        if error is not None:
            logger.error("%s", error)
            gate.fail(-1, "", error)

    def _eager_error(self) -> ReplayMismatchError:
        assert self._eager_failure is not None
        number, cause = self._eager_failure
        index = self._program.local_index(number)
        label = self._program.items[index].label if index is not None else "?"
        error = ReplayMismatchError(
            f"{self._what} differs from {_EAGER}: item {number} ({label}) raised "
            f"{type(cause).__name__}: {cause} when run eagerly, where the replay ran it "
            f"without error; a replay must do what running its items one after another "
            f"does. {_FIX}",
            graph=self._what,
            item=number,
            label=label,
            buffer="",
            index=-1,
            got=None,
            expected=cause,
        )
        error.__cause__ = cause
        return error

    def _compare(self) -> ReplayMismatchError | None:
        compared = []
        for cluster, arena, at in self._written:
            got, expected = (a.reshape(-1).view(U8) for a in self._reads[id(arena)])
            size = cluster.stop - cluster.start
            name = f"allocation #{cluster.space} (bytes {cluster.start}..{cluster.stop})"
            compared.append(
                Compared(
                    cluster.space,
                    cluster.start,
                    got[at : at + size],
                    expected[at : at + size],
                    name,
                )
            )
        mismatch = first_mismatch(self._writes, compared)
        if mismatch is None:
            return None
        return mismatch_error(self._what, _EAGER, _FIX, mismatch)
