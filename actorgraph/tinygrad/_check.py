"""install(check_replays=N): the first N replays of every graphed batch also run the
batch the way tinygrad runs it itself, on shadow copies of the memory the replay
touches, and the two results are compared bitwise (actorgraph/_compare.py says which
call a difference is blamed on).

A checked replay, under install()'s lock, in order:

1. the batch's calls for this replay's inputs, as tinygrad resolves them (its
   adapter's `Reference`): every tinygrad buffer they touch, and which they write;
2. shadows: per cluster of overlapping host memory those buffers span, one tinygrad
   buffer on the same device, placed so its bytes keep the real memory's alignment
   (compiled kernels may rely on it), and a view of it per buffer;
3. where the replay stands (after tinygrad's earlier work; see _install's Ordering):
   the real memory copied into the shadows, the replay, and the real memory of every
   cluster a call writes copied out: the replay's result;
4. tinygrad runs the calls itself on the shadows (its own launch of each compiled
   kernel, its own copies) and finishes; the shadows' bytes are the reference result.

A difference raises ReplayMismatchError naming the batch, the call (its number in the
batch, its kernel) and the first differing element of the buffer it writes. tinygrad's
compiled kernels keep no state, so a difference is a fault of the replay: of
actorgraph's translation of the batch, its plan or its runner.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
from tinygrad.device import Buffer as TinyBuffer
from tinygrad.dtype import dtypes

from .._compare import Cluster, Compared, Written, clusters, first_mismatch, mismatch_error
from .._compare import shadow_offset as place_cluster
from .._errors import UsageError
from ._private import buffer_address, buffer_base

_ALIGN = 64
_HOST = "host memory"  # one address space: every CPU device's memory is in it

_REFERENCE = "tinygrad running the batch's calls itself on copies of the memory it found"
_FIX = (
    "tinygrad's compiled kernels keep no state, so this is a bug of actorgraph.tinygrad "
    "(its reading of the batch, its plan or its runner): please report it with this message."
)


class TinyCall(NamedTuple):
    """One call of a batch as tinygrad runs it (a lane of it: a call over a sharded
    tensor runs once per device): its number in the batch, its name (the kernel's, or
    "copy"), its tinygrad buffers and which of them it writes (positions in `bufs`)."""

    number: int
    name: str
    bufs: Sequence[Any]
    outs: Sequence[int]


class Reference(Protocol):
    """A release's view of one replay's batch, for the check: its calls for the
    replay's inputs, and tinygrad running them itself."""

    def calls(self) -> Sequence[TinyCall]:
        """The batch's calls, in order, on this replay's buffers."""

    def run(self, shadow: Callable[[Any], Any]) -> None:
        """Have tinygrad run the calls with each buffer `b` replaced by `shadow(b)`, as
        its own jit runs them, and wait until they are done."""


def _address(buf: Any) -> int:
    base = buffer_base(buf)
    if base is None:
        return buffer_address(buf)
    return buffer_address(base) + int(buf.offset)


def _numpy_dtype(buf: Any) -> np.dtype[Any]:
    fmt = getattr(buf.dtype, "fmt", None)
    dtype: np.dtype[Any] | None = np.dtype(fmt) if fmt else None
    if dtype is None or dtype.itemsize != buf.dtype.itemsize:
        return np.dtype(np.uint8)  # a dtype numpy lacks (bfloat16, ...): its bytes
    return dtype


def _host_bytes(address: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A numpy view of `nbytes` of host memory at `address`."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))


class TinyCheck:
    """One checked replay of a batch (see the module): shadows made, then `around`
    (snapshot, replay, result), then `verdict` (tinygrad on the shadows, compared)."""

    def __init__(self, what: str, reference: Reference) -> None:
        self._what = what
        self._reference = reference
        self._calls = list(reference.calls())
        self._shadow: dict[int, Any] = {}  # id(real tinygrad buffer) -> its shadow
        # (cluster, the shadow buffer, where the cluster starts in it, whether written)
        self._placed: list[tuple[Cluster[Any], Any, int, bool]] = []
        self._got: list[np.ndarray[Any, np.dtype[np.uint8]]] = []
        written: set[int] = set()
        used: dict[int, Any] = {}
        for call in self._calls:
            for k, buf in enumerate(call.bufs):
                used[id(buf)] = buf
                if k in call.outs:
                    written.add(id(buf))
        spans = [(_HOST, _address(b), _address(b) + b.nbytes, b) for b in used.values()]
        for cluster in clusters(spans):
            self._place(cluster, any(id(b) in written for _, _, b in cluster.members))

    def _place(self, cluster: Cluster[Any], written: bool) -> None:
        bufs = [buf for _, _, buf in cluster.members]
        sizes = [buf.dtype.itemsize for buf in bufs]
        room = math.lcm(_ALIGN, *sizes)
        shadow = TinyBuffer(bufs[0].device, cluster.stop - cluster.start + room, dtypes.uint8)
        shadow.allocate()
        preferred = (cluster.start - buffer_address(shadow)) % _ALIGN
        at = place_cluster(cluster, sizes, room, preferred)
        if at is None:
            raise UsageError(
                f"install(check_replays=...): tinygrad buffers {bufs!r} share memory but "
                f"start at offsets that disagree modulo their item sizes, so no one shadow "
                f"can mirror them; install() without check_replays to run this jit"
            )
        for start, _, buf in cluster.members:
            offset = at + start - cluster.start
            self._shadow[id(buf)] = shadow.view(buf.size, buf.dtype, offset).ensure_allocated()
        self._placed.append((cluster, shadow, at, written))

    def around(self, replay: Callable[[], None]) -> None:
        """Copy the real memory into the shadows, run `replay`, copy out what the
        replay left in the memory the calls write. Called where the replay stands."""
        for cluster, shadow, at, _ in self._placed:
            size = cluster.stop - cluster.start
            ctypes.memmove(buffer_address(shadow) + at, cluster.start, size)
        replay()
        for cluster, _, _, written in self._placed:
            if written:
                self._got.append(_host_bytes(cluster.start, cluster.stop - cluster.start).copy())

    def verdict(self) -> None:
        """tinygrad runs the calls on the shadows; raise ReplayMismatchError where the
        replay's result differs from theirs."""
        self._reference.run(lambda buf: self._shadow[id(buf)])
        compared = []
        got = iter(self._got)
        for cluster, shadow, at, written in self._placed:
            if not written:
                continue
            size = cluster.stop - cluster.start
            expected = _host_bytes(buffer_address(shadow) + at, size).copy()
            name = f"host memory {cluster.start:#x}..{cluster.stop:#x}"
            compared.append(Compared(_HOST, cluster.start, next(got), expected, name))
        writes = [
            Written(
                call.number,
                call.name,
                f"{call.bufs[k]!r} at {_address(call.bufs[k]):#x}",
                _HOST,
                _address(call.bufs[k]),
                _address(call.bufs[k]) + call.bufs[k].nbytes,
                _numpy_dtype(call.bufs[k]),
            )
            for call in self._calls
            for k in sorted(set(call.outs))
            if call.bufs[k].nbytes
        ]
        mismatch = first_mismatch(writes, compared)
        if mismatch is not None:
            raise mismatch_error(self._what, _REFERENCE, _FIX, mismatch, "call")
