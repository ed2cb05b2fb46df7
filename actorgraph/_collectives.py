"""Collectives as items: an all-reduce over buffers on several devices, written out as the
Launch and Copy items that do it, so a data-parallel step is one jit cache that the
planner orders, a graph replays and SIM devices time like any other work.

    items = ag.all_reduce(rt, grads)                     # ring: reduce-scatter + all-gather
    items = ag.all_reduce(rt, grads, algorithm="tree")   # binary tree: reduce, then broadcast

Ring (for large buffers: every link carries 2 (n-1)/n of a buffer, the least any
all-reduce moves): the buffers are cut into n chunks; in n-1 steps each device sends a
chunk to the next device in the list, which adds it into its own (reduce-scatter), so
device i ends with the whole of chunk i + 1; in n-1 more steps each passes its whole
chunk on (all-gather). Tree (for small buffers: 2 log2 n steps of latency instead of
2 (n-1)): pairs add up the tree towards the first buffer, which then goes back down.

The list's order is the ring's and the tree's: put the devices of one node next to each
other so that the ring leaves a node once (devices of a cluster preset are numbered node
by node, so SIM:0, SIM:1, ... already are). The items need scratch buffers, allocated
here, one per device (ring: the size of a buffer; tree: one buffer's size for each level
at which the device receives). Sums of floats are added in a different order than numpy
adds them, so they match numpy's to rounding; integer sums, max and min match exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from actorgraph.devices import Work

from ._await import described
from ._buffer import Buffer
from ._errors import UsageError
from ._kernel import Copy, Kernel, Launch


class Allocator(Protocol):
    """What all_reduce allocates its scratch buffers with (a Runtime, a BackgroundRuntime)."""

    def alloc(self, device: str, shape: int | tuple[int, ...], dtype: Any = ...) -> Buffer: ...


def _reduce_cost(buffer_nbytes: Sequence[int], var_values: Sequence[int]) -> Work:
    # acc op= x reads acc and x and writes acc: three times a chunk through memory.
    return Work(nbytes=3 * buffer_nbytes[1])


def _reducer(name: str, ufunc: np.ufunc) -> Kernel:
    def body(acc: np.ndarray[Any, Any], x: np.ndarray[Any, Any]) -> None:
        ufunc(acc, x, out=acc)

    return Kernel(f"all_reduce_{name}", cpu=body, outs=(0,), ins=(0, 1), cost=_reduce_cost)


REDUCERS = {
    "sum": _reducer("sum", np.add),
    "prod": _reducer("prod", np.multiply),
    "max": _reducer("max", np.maximum),
    "min": _reducer("min", np.minimum),
}
ALGORITHMS = ("ring", "tree")


def all_reduce(
    rt: Allocator, buffers: Sequence[Buffer], *, algorithm: str = "ring", op: str = "sum"
) -> list[Launch | Copy]:
    """The Launch and Copy items of an all-reduce over `buffers`.

    Once they have run, every buffer holds the element-wise `op` of all of them, as they
    were before. Run the items eagerly (`rt.run`) or put them in a graph with the rest of a
    step. Integer sums, max and min equal numpy's exactly; float sums are added in another
    order, so they match to rounding.

    Args:
        rt: the runtime (or background runtime) that allocates the scratch buffers, now; a
            graph of the items reuses them on every replay.
        buffers: one Buffer per participant (usually one per device), of one dtype and
            size, no two sharing memory. Their order is the ring's (or the tree's): on a
            cluster preset, `SIM:0, SIM:1, ...` leaves each node once.
        algorithm: "ring" (reduce-scatter, then all-gather: 2 (n - 1) steps of a chunk, the
            fewest bytes per link) or "tree" (pairs add up towards the first buffer, which
            goes back down: 2 log2 n steps of a whole buffer, for small buffers).
        op: "sum", "prod", "max" or "min".

    Returns:
        The items, in an order that runs them correctly; none for one buffer.

    Raises:
        UsageError: an unknown algorithm or op, no buffers, something that is no Buffer,
            buffers of different dtypes or sizes, or buffers that overlap.
        BufferFreedError: a buffer was freed.
    """
    bufs = _checked(buffers, algorithm, op)
    if len(bufs) == 1:
        return []
    reduce = REDUCERS[op]
    if algorithm == "ring":
        return _ring(rt, bufs, reduce)
    return _tree(rt, bufs, reduce)


def _checked(buffers: Sequence[Buffer], algorithm: str, op: str) -> list[Buffer]:
    if algorithm not in ALGORITHMS:
        raise UsageError(f"all_reduce(algorithm=...) is 'ring' or 'tree', got {algorithm!r}")
    if op not in REDUCERS:
        raise UsageError(f"all_reduce(op=...) is one of {sorted(REDUCERS)}, got {op!r}")
    if isinstance(buffers, Buffer) or not isinstance(buffers, Sequence):
        raise UsageError(
            f"all_reduce takes a list of Buffers, one per participant, got {described(buffers)}"
        )
    bufs = list(buffers)
    if not bufs:
        raise UsageError("all_reduce got no buffers; give one Buffer per participant")
    for i, buf in enumerate(bufs):
        if not isinstance(buf, Buffer):
            raise UsageError(f"all_reduce: buffers[{i}] must be a Buffer, got {described(buf)}")
        buf.check_live(f"all_reduce: buffers[{i}] ")
    first = bufs[0]
    for i, buf in enumerate(bufs[1:], 1):
        if buf.dtype != first.dtype or buf.size != first.size:
            raise UsageError(
                f"all_reduce needs buffers of one dtype and size: buffers[0] is {first!r}, "
                f"buffers[{i}] is {buf!r}; pass views of matching size"
            )
        for j, other in enumerate(bufs[:i]):
            if buf.overlaps(other):
                raise UsageError(
                    f"all_reduce: buffers[{j}] and buffers[{i}] share memory ({other!r} and "
                    f"{buf!r}); each participant needs a buffer of its own"
                )
    return bufs


def _part(buf: Buffer, start: int, size: int) -> Buffer:
    return buf.view(offset=start, size=size)


def _ring(rt: Allocator, bufs: list[Buffer], reduce: Kernel) -> list[Launch | Copy]:
    n = len(bufs)
    total = bufs[0].size
    # Chunk c is [bounds[c], bounds[c + 1]); a buffer smaller than n has empty chunks,
    # which move nothing and are left out.
    bounds = [c * total // n for c in range(n + 1)]
    # Device i receives chunk c into the same place of its scratch buffer: every step's
    # chunk has a place of its own, so no copy waits for an earlier reduction to free it.
    scratch = [rt.alloc(buf.device, total, buf.dtype) for buf in bufs]

    def chunk(c: int) -> tuple[int, int]:
        """Where chunk c (mod n) starts, and its size."""
        c %= n
        return bounds[c], bounds[c + 1] - bounds[c]

    items: list[Launch | Copy] = []
    for step in range(n - 1):  # reduce-scatter: device i sends chunk i - step on
        parts = [((i + 1) % n, *chunk(i - step)) for i in range(n)]
        for i, (nxt, start, size) in enumerate(parts):
            if size:
                items.append(
                    Copy(dst=_part(scratch[nxt], start, size), src=_part(bufs[i], start, size))
                )
        for nxt, start, size in parts:
            if size:
                acc, came = _part(bufs[nxt], start, size), _part(scratch[nxt], start, size)
                items.append(Launch(reduce, [acc, came]))
    for step in range(n - 1):  # all-gather: device i holds the whole of chunk i + 1 - step
        for i in range(n):
            start, size = chunk(i + 1 - step)
            if size:
                nxt = (i + 1) % n
                items.append(
                    Copy(dst=_part(bufs[nxt], start, size), src=_part(bufs[i], start, size))
                )
    return items


def _tree(rt: Allocator, bufs: list[Buffer], reduce: Kernel) -> list[Launch | Copy]:
    n = len(bufs)
    total = bufs[0].size
    strides = []
    stride = 1
    while stride < n:
        strides.append(stride)
        stride *= 2
    # Device i receives at the levels where it leads a pair: a scratch slot for each.
    receives = [[s for s in strides if i % (2 * s) == 0 and i + s < n] for i in range(n)]
    scratch = {
        i: rt.alloc(bufs[i].device, total * len(levels), bufs[i].dtype)
        for i, levels in enumerate(receives)
        if levels
    }
    items: list[Launch | Copy] = []
    for stride in strides:  # up the tree: the pair's leader adds in its partner's sum
        for i in range(0, n, 2 * stride):
            if i + stride < n:
                slot = _part(scratch[i], receives[i].index(stride) * total, total)
                items.append(Copy(dst=slot, src=_flat(bufs[i + stride])))
                items.append(Launch(reduce, [_flat(bufs[i]), slot]))
    for stride in reversed(strides):  # down the tree: leaders pass the total on
        for i in range(0, n, 2 * stride):
            if i + stride < n:
                items.append(Copy(dst=_flat(bufs[i + stride]), src=_flat(bufs[i])))
    return items


def _flat(buf: Buffer) -> Buffer:
    """The buffer as one run of elements (the scratch slots are flat)."""
    return buf if len(buf.shape) == 1 else buf.view(offset=0, size=buf.size)
