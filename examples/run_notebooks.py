"""Run the example notebooks headless and save copies with their outputs (plots included).

    python examples/run_notebooks.py                      # all of them, into build/notebooks/
    python examples/run_notebooks.py 01_quickstart        # the ones whose names start so
    python examples/run_notebooks.py path/to/other.ipynb  # a notebook by its path
    python examples/run_notebooks.py --out DIR            # the copies go to DIR
    python examples/run_notebooks.py --in-place           # refresh the committed notebooks

A notebook runs from its own folder (it imports the scripts beside it) on this
interpreter's kernel. The committed notebooks stay as they are unless `--in-place` is
given. A notebook that needs what is not installed here (its metadata's
`actorgraph.requires`: module -> the extra that brings it, say Ray's; `releases`: module ->
the release it needs; `programs`: commands on PATH, say clang) is skipped, saying how to
install it; a notebook that fails is reported and the others still run. The exit
status is 1 when any failed.

Needs the `notebooks` extra (pip install -e ".[notebooks]" in the checkout).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import tempfile

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE.parent / "build" / "notebooks"  # build/ is git-ignored


def execute(path: pathlib.Path, timeout: int = 300) -> nbformat.NotebookNode:
    """Run every cell of a notebook (from its own folder); raise on the first error."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    return notebook


def unmet(path: pathlib.Path) -> str | None:
    """Why this notebook cannot run here (a module it needs is not installed, or not at
    the release it needs, or a program it needs is not on PATH), or None."""
    notebook = nbformat.read(path, as_version=4)
    needs = notebook.metadata.get("actorgraph", {})
    requires = needs.get("requires", {})
    for module, extra in requires.items():
        if importlib.util.find_spec(module) is None:
            return (
                f"it needs {module}, which is not installed: "
                f'pip install -e ".[{extra}]" in the checkout'
            )
    for module, release in needs.get("releases", {}).items():
        have = importlib.metadata.version(module)
        if have != release:
            extra = requires.get(module, module)
            return (
                f"it needs {module} {release}, not {have}: "
                f'pip install -e ".[{extra}]" in the checkout'
            )
    for program in needs.get("programs", []):
        if shutil.which(program) is None:
            return (
                f"it needs {program}, which is not on PATH: install it (apt-get install {program})"
            )
    return None


def use_this_python(folder: pathlib.Path) -> None:
    """Make the `python3` kernel this interpreter (not whichever `python` is on PATH)."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python"}))
    os.environ["JUPYTER_PATH"] = str(folder)
    os.environ.setdefault("MPLBACKEND", "Agg")


def chosen(names: list[str]) -> list[pathlib.Path]:
    """The notebooks named: paths of notebooks, or prefixes of the examples' names (all
    of them when none is given)."""
    examples = sorted(HERE.glob("*.ipynb"))
    if not names:
        return examples
    paths: list[pathlib.Path] = []
    for name in names:
        if name.endswith(".ipynb"):
            paths.append(pathlib.Path(name).resolve())
            continue
        matched = [p for p in examples if p.stem.startswith(name)]
        if not matched:
            raise SystemExit(f"no notebook in {HERE} starts with {name!r}")
        paths += matched
    return paths


def run(path: pathlib.Path, out: pathlib.Path | None) -> tuple[str, str]:
    """Run one notebook: ("ran" | "skipped" | "FAILED", what to print after its name)."""
    why = unmet(path)
    if why is not None:
        return "skipped", why
    try:
        notebook = execute(path)
    except CellExecutionError as exc:
        return "FAILED", f"{exc.ename}: {exc.evalue}"
    target = path if out is None else out / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    return "ran", f"-> {target}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebook paths or name prefixes")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=pathlib.Path, default=OUT, help=f"default {OUT}")
    where.add_argument("--in-place", action="store_true", help="overwrite the notebooks run")
    args = parser.parse_args(argv)
    out = None if args.in_place else args.out.resolve()
    counts = {"ran": 0, "skipped": 0, "FAILED": 0}
    with tempfile.TemporaryDirectory() as kernels:
        use_this_python(pathlib.Path(kernels))
        for path in chosen(args.notebooks):
            print(f"running {path.name} ...", flush=True)
            outcome, said = run(path, out)
            counts[outcome] += 1
            print(f"{outcome} {path.name}{':' if outcome != 'ran' else ''} {said}", flush=True)
    print(f"{counts['ran']} ran, {counts['skipped']} skipped, {counts['FAILED']} failed")
    return 1 if counts["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
