"""Plans drawn as SVG by Graphviz's `dot` program.

The planner writes the DOT text (`Plan.to_dot()`, pure); running a program is I/O, so
it happens here, in the public layer.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from actorgraph.scheduler import Plan

from ._errors import GraphvizError


def plan_to_svg(plan: Plan, path: str | os.PathLike[str] | None = None) -> str:
    """`plan` drawn by `dot -Tsvg`; written to `path` too when given."""
    dot = shutil.which("dot")
    if dot is None:
        raise GraphvizError(
            "graph.to_svg() needs Graphviz's `dot` program on PATH and it is not there; "
            "install Graphviz (apt install graphviz, brew install graphviz) or use "
            "graph.plan.to_dot() and render the text elsewhere"
        )
    done = subprocess.run(
        [dot, "-Tsvg"], input=plan.to_dot(), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise GraphvizError(
            f"Graphviz `dot -Tsvg` failed ({done.returncode}): {done.stderr.strip()}"
        )
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(done.stdout)
    return done.stdout
