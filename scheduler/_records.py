"""Plain records the planner reads: device capabilities, memory accesses, items, queues."""

from __future__ import annotations

import enum

import attrs


class QueueKind(enum.Enum):
    COMPUTE = "compute"
    COPY = "copy"


class ItemKind(enum.Enum):
    EXEC = "exec"
    COPY = "copy"


@attrs.frozen
class DeviceCaps:
    """What a device tells the planner about itself."""

    name: str
    kind: str
    has_copy_queue: bool = True
    peer_group: str = ""
    host_visible: bool = True
    # Its memory is this host's, read in place by its kernels (a CPU device's).
    is_cpu: bool = False
    # Its memory is host RAM underneath (CPU, SIM), so another kind's copy engine can
    # reach it through the host; a GPU's memory (CUDA) only its own kind's engines reach.
    host_backed: bool = True
    # Its memory is reached only through I/O that the host runs (REMOTE: a worker's), so a
    # copy between it and host memory is moved by the host-backed side's copy queue; its
    # own copy queue moves data between such devices (one worker, or worker to worker).
    host_io: bool = False


@attrs.frozen
class QueueId:
    device: str
    kind: QueueKind

    def __str__(self) -> str:
        return f"{self.device}/{self.kind.value}"


@attrs.frozen
class Access:
    """A byte range [start, stop) of one base allocation, read or written by an item."""

    device: str
    alloc: int
    start: int
    stop: int
    write: bool


@attrs.frozen
class PlanItem:
    """One unit of work as the planner sees it.

    `device` is where an EXEC runs, or the destination of a COPY; `src_device` is the
    source of a COPY (None for EXEC).
    """

    label: str
    kind: ItemKind
    device: str
    accesses: tuple[Access, ...]
    src_device: str | None = None
