"""Every example notebook runs headless (nbclient, this interpreter's python3 kernel) without
an error, and the committed copy carries its outputs."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from _extras import NO_CLANG, importorskip
from _paths import ROOT, child_pythonpath

nbformat = importorskip("nbformat")
nbclient = importorskip("nbclient")
importorskip("ipykernel")

EXAMPLES = ROOT / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert any(p.name == "01_quickstart.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_carries_its_outputs(path: pathlib.Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    for i, cell in enumerate(code):
        assert cell.execution_count is not None, f"{path.name}: code cell {i} was not executed"
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{path.name}: code cell {i} was saved with an error: {errors[0].ename}"
    assert any(cell.outputs for cell in code), f"{path.name} was saved without outputs"


@pytest.fixture
def this_python_kernel(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A `python3` kernelspec that runs this interpreter (whatever else is installed)."""
    spec = tmp_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    # The kernel is a child process: let it import this checkout's packages.
    monkeypatch.setenv("PYTHONPATH", child_pythonpath())
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return "python3"


# Scripts of an optional extra: skipped, saying which, where it is not installed. A
# notebook says what it needs in its metadata (`actorgraph.requires`, and a module's
# release in `actorgraph.releases`, programs on PATH in `actorgraph.programs`), which
# run_notebooks.py reads too; a script needs what its notebook twin needs.
NEEDS = {"ray_cluster": "05_ray", "tinygrad_remote": "07_tinygrad_remote"}


def needs(path: pathlib.Path) -> None:
    if path.suffix != ".ipynb":
        if path.stem not in NEEDS:
            return
        path = EXAMPLES / f"{NEEDS[path.stem]}.ipynb"
    metadata = nbformat.read(path, as_version=4).metadata.get("actorgraph", {})
    for module in metadata.get("requires", {}):
        importorskip(module)
    for module, release in metadata.get("releases", {}).items():
        have = importlib.metadata.version(module)
        if have != release:
            pytest.skip(
                f"{path.stem} needs {module} {release}, not {have}: "
                f'pip install -e ".[test,{module}]" in the checkout installs it'
            )
    for program in metadata.get("programs", []):
        if shutil.which(program) is None:
            pytest.skip(NO_CLANG if program == "clang" else f"{program} is not on PATH")
    if path.stem == "07_tinygrad_remote":
        # tinygrad's AG devices: workers able to load shipped programs.
        from actorgraph.worker._machine_code import loader_problem

        if loader_problem() is not None:
            pytest.skip(f"workers cannot load shipped programs here: {loader_problem()}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_headless(path: pathlib.Path, this_python_kernel: str) -> None:
    needs(path)
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=120,
        kernel_name=this_python_kernel,
        resources={"metadata": {"path": str(EXAMPLES)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell


NOT_SCRIPTS = {"run_notebooks.py", "remote_kernels.py"}  # a tool, and a module the worker loads
SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if p.name not in NOT_SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_example_script_runs(path: pathlib.Path) -> None:
    needs(path)
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = child_pythonpath()
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=EXAMPLES,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (
        f"{path.name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )


# -- examples/run_notebooks.py: runs copies, skips what cannot run here ----------------------

RUNNER = EXAMPLES / "run_notebooks.py"


def _notebook(path: pathlib.Path, code: str, requires: dict[str, str] | None = None) -> None:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    if requires is not None:
        notebook.metadata["actorgraph"] = {"requires": requires}
    nbformat.write(notebook, path)


def _run_notebooks(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), MPLBACKEND="Agg")
    return subprocess.run(
        [sys.executable, str(RUNNER), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_run_notebooks_runs_copies_and_skips_what_cannot_run_saying_why(
    tmp_path: pathlib.Path,
) -> None:
    source, out = tmp_path / "source", tmp_path / "out"
    source.mkdir()
    _notebook(
        source / "a_needs.ipynb",
        "import actorgraph_no_such_module",
        {"actorgraph_no_such_module": "nosuchextra"},
    )
    _notebook(source / "b_fails.ipynb", "raise RuntimeError('this notebook fails')")
    _notebook(source / "c_runs.ipynb", "print(6 * 7)")
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    done = _run_notebooks(*(str(p) for p in sorted(source.iterdir())), "--out", str(out))
    # A failure fails the run, after every other notebook has had its turn.
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "skipped a_needs.ipynb: it needs actorgraph_no_such_module, which is not installed: "
        'pip install -e ".[nosuchextra]" in the checkout'
    ) in done.stdout
    assert "FAILED b_fails.ipynb: RuntimeError: this notebook fails" in done.stdout
    assert f"ran c_runs.ipynb -> {out / 'c_runs.ipynb'}" in done.stdout
    assert "1 ran, 1 skipped, 1 failed" in done.stdout
    # The committed copies are untouched; the run's copy carries its outputs.
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before
    assert sorted(p.name for p in out.iterdir()) == ["c_runs.ipynb"]
    ran = nbformat.read(out / "c_runs.ipynb", as_version=4)
    assert ran.cells[0].outputs[0]["text"] == "42\n"


def test_run_notebooks_leaves_the_examples_as_committed(tmp_path: pathlib.Path) -> None:
    notebook = EXAMPLES / "01_quickstart.ipynb"
    before = notebook.read_bytes()
    done = _run_notebooks("01_quickstart", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert notebook.read_bytes() == before
    assert nbformat.read(tmp_path / "01_quickstart.ipynb", as_version=4).cells


def test_the_ray_notebook_says_it_needs_ray() -> None:
    # What run_notebooks.py and the tests above read to skip it where Ray is missing.
    notebook = nbformat.read(EXAMPLES / "05_ray.ipynb", as_version=4)
    assert notebook.metadata["actorgraph"]["requires"] == {"ray": "ray"}
