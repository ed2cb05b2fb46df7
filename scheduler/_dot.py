"""Plans as pictures: Graphviz DOT text. Pure: running Graphviz is actorgraph's business
(actorgraph/_graphviz.py).

One cluster per queue actor holding its items in queue order; a solid arrow for every
cross-queue wait (from the item waited for to the item that waits), a dashed one for
same-queue order, and a note per queue for its device syncs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._messages import Run, Signal, SyncDevice, Wait
from ._records import ItemKind

if TYPE_CHECKING:
    from ._plan import Plan


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def plan_to_dot(plan: Plan, name: str = "plan") -> str:
    lines = [
        f"digraph {_quote(name)} {{",
        "  rankdir=TB;",
        '  fontname="Helvetica";',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=8];',
    ]
    runs: list[list[int]] = [[m.item for m in prog if isinstance(m, Run)] for prog in plan.programs]
    edges: list[str] = []
    for qi, (queue, program) in enumerate(zip(plan.queues, plan.programs)):
        lines.append(f"  subgraph cluster_q{qi} {{")
        lines.append(f"    label={_quote(str(queue))};")
        lines.append('    style="rounded"; color="#888888";')
        syncs = sorted({m.device for m in program if isinstance(m, SyncDevice)})
        head = f"q{qi}_start"
        lines.append(
            f'    {head} [shape=plaintext, style="", '
            f"label={_quote('start: KICK, sync ' + ', '.join(syncs))}];"
        )
        previous = head
        waits: list[tuple[int, int]] = []
        for msg in program:
            if isinstance(msg, Wait):
                waits.append((plan.queues.index(msg.queue), msg.value))
            elif isinstance(msg, Run):
                item = plan.items[msg.item]
                color = "#f6d0b1" if item.kind is ItemKind.COPY else "#c8d6ec"
                label = f"#{msg.item} {item.label}"
                lines.append(f"    i{msg.item} [label={_quote(label)}, fillcolor={_quote(color)}];")
                edges.append(f'  {previous} -> i{msg.item} [style=dashed, color="#999999"];')
                for src, value in waits:
                    source = runs[src][value - 1]
                    edges.append(
                        f"  i{source} -> i{msg.item} "
                        f"[label={_quote(f'wait {plan.queues[src]}>={value}')}];"
                    )
                waits = []
                previous = f"i{msg.item}"
            elif isinstance(msg, Signal):
                pass  # the arrows from the signalling item say everything a signal does
        lines.append("  }")
    lines.extend(edges)
    lines.append("}")
    return "\n".join(lines) + "\n"
