"""Execute the example notebooks in place, saving their outputs (plots included).

    python examples/run_notebooks.py                 # all of them
    python examples/run_notebooks.py 01_quickstart   # the ones whose names start so

Needs the `notebooks` extra (pip install -e ".[notebooks]").
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile

import nbformat
from nbclient import NotebookClient

HERE = pathlib.Path(__file__).resolve().parent


def execute(path: pathlib.Path, timeout: int = 300) -> nbformat.NotebookNode:
    """Run every cell of a notebook (from the examples folder); raise on the first error."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    return notebook


def use_this_python() -> None:
    """Make the `python3` kernel this interpreter (not whichever `python` is on PATH)."""
    spec = pathlib.Path(tempfile.mkdtemp()) / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python"}))
    os.environ["JUPYTER_PATH"] = str(spec.parent.parent)
    os.environ.setdefault("MPLBACKEND", "Agg")


def main(prefixes: list[str]) -> int:
    use_this_python()
    paths = sorted(HERE.glob("*.ipynb"))
    if prefixes:
        paths = [p for p in paths if any(p.stem.startswith(x) for x in prefixes)]
    for path in paths:
        print(f"running {path.name}")
        nbformat.write(execute(path), path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
