"""What a worker keeps of a client's program: its lowered ops, and refusals.

A `Session` (_session.py) lowers each program it is sent into a `Program` (with
_lowering.py); a batch posts one job of each. A request that breaks a rule raises
`Refused`, answered with an error.
"""

from __future__ import annotations

from typing import Any

from actorgraph.devices import Op, QueueActor
from actorgraph.scheduler import QueueKind

from ._placement import AdaptiveKernel

REL_MAX = 1 << 40  # a value a program names, relative to its slot's base
VALUE_MAX = 1 << 62  # a base or value a client sends


class Refused(Exception):
    """A request broke a rule; it is answered with an error and the session goes on.

    `item` is the client's item index when the refusal is about one item of a program.
    """

    def __init__(self, message: str, item: int = -1) -> None:
        super().__init__(message)
        self.item = item


class Program:
    """A client's program as the worker lowered it onto one of its queue actors."""

    __slots__ = (
        "actor",
        "count",
        "device",
        "early",
        "error",
        "kind",
        "local_waits",
        "max_slot",
        "ops",
        "slot",
        "store",
        "template",
        "version",
        "watches",
    )

    def __init__(self) -> None:
        self.actor: QueueActor | None = None
        self.ops: tuple[Op, ...] = ()
        self.count = 0
        self.slot = 0
        self.max_slot = 0
        self.local_waits: list[tuple[int, str, QueueKind]] = []
        self.store = False
        self.error: tuple[int, str] | None = None
        self.device = ""  # the queue's name in reports: DEVICE or DEVICE/copy
        self.kind = QueueKind.COMPUTE
        # With kernels placed by their times (_placement.py): the lowered ops they are
        # coded from, and the stamp they were coded at (KernelTimes.code).
        self.template: list[Op | AdaptiveKernel] | None = None
        self.version: tuple[int, int | None] = (0, None)
        # Copies from another worker asked for when a batch arrives: (item, the "p"
        # entry's source fields, the source device, the wait's slot and value, mirror id,
        # bytes)
        self.early: list[tuple[int, tuple[Any, ...], str, int, int, int, int]] = []
        # Waits on a queue of another worker, which tells this one when it gets there:
        # (slot, value, mirror id, (host, port, session, queue, ticket))
        self.watches: list[tuple[int, int, int, tuple[str, int, int, str, bytes]]] = []


def queue_kind(value: object) -> QueueKind:
    if value == "compute":
        return QueueKind.COMPUTE
    if value == "copy":
        return QueueKind.COPY
    raise Refused(
        f"queue kind {value!r} is not 'compute' or 'copy': a program runs on its device's "
        f"compute or copy queue; name one of the two"
    )


def queue_key(device: str, kind: QueueKind) -> str:
    return device if kind is QueueKind.COMPUTE else f"{device}/{kind.value}"


def signal_slot(entries: object) -> int:
    """The base slot a program's signal entries name (0 if none is well formed)."""
    if isinstance(entries, list):
        for entry in reversed(entries):
            if isinstance(entry, list) and len(entry) in (3, 4) and entry[0] == "s":
                if isinstance(entry[1], int):
                    return entry[1]
    return 0
