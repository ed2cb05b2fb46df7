"""Plan items for the pure scheduler tests: 16-byte accesses to numbered allocations."""

from __future__ import annotations

from actorgraph.scheduler import Access, ItemKind, PlanItem


def kernel(device: str, writes: int, *reads: int) -> PlanItem:
    """A kernel on `device` that reads allocations `reads` and writes `writes`."""
    accesses = [Access(device, alloc, 0, 16, False) for alloc in reads]
    accesses.append(Access(device, writes, 0, 16, True))
    return PlanItem(f"k{writes}", ItemKind.EXEC, device, tuple(accesses))


def copy(dst: str, writes: int, src: str, reads: int) -> PlanItem:
    """A copy of allocation `reads` on `src` into allocation `writes` on `dst`."""
    accesses = (Access(src, reads, 0, 16, False), Access(dst, writes, 0, 16, True))
    return PlanItem("copy", ItemKind.COPY, dst, accesses, src)
