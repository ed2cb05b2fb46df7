"""The Plan: one static message list per queue actor, and how it reads as text."""

from __future__ import annotations

import attrs

from ._messages import Message, Run, Wait
from ._records import PlanItem, QueueId


@attrs.frozen
class Plan:
    """The planner's output (`build_plan(items, caps)` makes one).

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

    def verify(self) -> None:
        """Raise PlanError if the plan can deadlock or lets two conflicting accesses race."""
        from ._verify import verify_plan

        verify_plan(self)

    def to_dot(self, name: str = "plan") -> str:
        """The plan as Graphviz DOT text: a cluster per queue, an arrow per wait."""
        from ._dot import plan_to_dot

        return plan_to_dot(self, name)

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
