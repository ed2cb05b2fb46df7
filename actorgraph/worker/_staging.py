"""Host memory a worker's host writes land in, and the bytes of host-visible buffers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._buffer import Buffer


class StagingPool:
    """Reused landing space for host writes. Fresh pages are slow to fault in while the
    kernel copies into them, so bulk data lands in memory that was used before."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self.free: list[bytearray] = []

    def take(self, nbytes: int) -> bytearray:
        for i, buf in enumerate(self.free):
            if len(buf) >= nbytes:
                return self.free.pop(i)
        return bytearray(nbytes)

    def give(self, buf: bytearray) -> None:
        # Called from a device's worker thread too: list operations are atomic.
        if len(self.free) < self.keep:
            self.free.append(buf)

    def clear(self) -> None:
        """Let go of the memory kept for reuse (no client is left to reuse it)."""
        self.free.clear()


def chunks_into(
    dst: np.ndarray[Any, Any], chunks: Sequence[tuple[bytearray, int]], pool: StagingPool
) -> None:
    flat = dst.reshape(-1).view(np.uint8)
    pos = 0
    for buf, size in chunks:
        flat[pos : pos + size] = np.frombuffer(buf, np.uint8, size)
        pos += size
        pool.give(buf)


class Taken:
    """The blobs a host write took for the batch now running it, until they land: its
    queue runs its take and its landing one after the other, a batch at a time."""

    __slots__ = ("chunks",)

    def __init__(self) -> None:
        self.chunks: list[tuple[bytearray, int]] = []


def land(dst: np.ndarray[Any, Any], taken: Taken, pool: StagingPool) -> None:
    """A host write's blobs, as taken (`Taken`), into `dst`."""
    chunks, taken.chunks = taken.chunks, []
    chunks_into(dst, chunks, pool)


def bytes_of(buf: Buffer) -> memoryview:
    """A host-visible buffer's bytes (a worker's CPU and SIM devices)."""
    return buf.host_view().reshape(-1).view(np.uint8).data
