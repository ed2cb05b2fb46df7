"""The messages of a plan: what one queue actor does, in order (frozen, one line each)."""

from __future__ import annotations

from typing import Union

import attrs

from ._records import QueueId


@attrs.frozen
class WaitKick:
    """Wait until the replay is admitted (the runtime's KICK signal reaches its value)."""

    def __str__(self) -> str:
        return "wait KICK"


@attrs.frozen
class SyncDevice:
    """Wait until every earlier submission on `device` is complete (its timeline)."""

    device: str

    def __str__(self) -> str:
        return f"sync {self.device}"


@attrs.frozen
class Wait:
    """Wait until `queue`'s signal reaches base(queue) + value for this replay."""

    queue: QueueId
    value: int

    def __str__(self) -> str:
        return f"wait {self.queue}>={self.value}"


@attrs.frozen
class Run:
    """Execute item `item` (a kernel launch or a copy)."""

    item: int

    def __str__(self) -> str:
        return f"run #{self.item}"


@attrs.frozen
class Signal:
    """Set this queue's own signal to base + value."""

    value: int

    def __str__(self) -> str:
        return f"signal ={self.value}"


Message = Union[WaitKick, SyncDevice, Wait, Run, Signal]
