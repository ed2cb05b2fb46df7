"""The Plan: one static message list per queue actor, and how it reads as text."""

from __future__ import annotations

import os
from typing import Union

import attrs

from ._records import PlanItem, QueueId


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


@attrs.frozen
class Plan:
    """The planner's output.

    `programs[i]` is the message list of `queues[i]`. `item_queue[j]` is the queue index
    item j runs on. `device_queues` maps every device whose timeline the plan advances
    to the queue indices that must finish before that timeline moves on.
    """

    items: tuple[PlanItem, ...]
    queues: tuple[QueueId, ...]
    programs: tuple[tuple[Message, ...], ...]
    item_queue: tuple[int, ...]
    devices: tuple[str, ...]
    device_queues: tuple[tuple[int, ...], ...]

    @classmethod
    def from_items(cls, items: list[PlanItem] | tuple[PlanItem, ...], caps: dict[str, object]) -> Plan:
        from ._planner import build_plan

        return build_plan(items, caps)  # type: ignore[arg-type]

    def verify(self) -> None:
        """Raise PlanError if the plan can deadlock or lets two conflicting accesses race."""
        from ._verify import verify_plan

        verify_plan(self)

    def to_dot(self, name: str = "plan") -> str:
        """The plan as Graphviz DOT text: a cluster per queue, an arrow per wait."""
        from ._dot import plan_to_dot

        return plan_to_dot(self, name)

    def to_svg(self, path: str | os.PathLike[str] | None = None) -> str:
        """The plan drawn as SVG by Graphviz's `dot` (GraphvizError if it is missing)."""
        from ._dot import plan_to_svg

        return plan_to_svg(self, path)

    @property
    def wait_count(self) -> int:
        return sum(isinstance(m, Wait) for prog in self.programs for m in prog)

    def describe_item(self, index: int) -> str:
        return f"#{index} {self.items[index].label}"

    def __str__(self) -> str:
        columns: list[list[str]] = []
        for queue, program in zip(self.queues, self.programs):
            lines = [str(queue), "-" * len(str(queue))]
            for msg in program:
                if isinstance(msg, Run):
                    lines.append(f"run {self.items[msg.item].label}#{msg.item}")
                else:
                    lines.append(str(msg))
            columns.append(lines)
        if not columns:
            return "(empty plan)"
        widths = [max(len(line) for line in col) for col in columns]
        height = max(len(col) for col in columns)
        rows = []
        for r in range(height):
            cells = [
                (col[r] if r < len(col) else "").ljust(width) for col, width in zip(columns, widths)
            ]
            rows.append(" | ".join(cells).rstrip())
        return "\n".join(rows)
