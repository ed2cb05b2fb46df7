"""Every example notebook runs headless (nbclient, this interpreter's python3 kernel) without
an error, and the committed copy carries its outputs."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from _paths import ROOT, child_pythonpath

nbformat = pytest.importorskip("nbformat", reason="needs the test extra (nbclient, ipykernel)")
nbclient = pytest.importorskip("nbclient", reason="needs the test extra (nbclient, ipykernel)")
pytest.importorskip("ipykernel", reason="needs the test extra (nbclient, ipykernel)")

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


# Examples of an optional extra: skipped, saying which, where it is not installed.
NEEDS = {
    "05_ray": "ray",
    "ray_cluster": "ray",
    "07_tinygrad_remote": "tinygrad",
    "tinygrad_remote": "tinygrad",
}


def needs(path: pathlib.Path) -> None:
    module = NEEDS.get(path.stem)
    if module is not None:
        pytest.importorskip(
            module, reason=f"needs the {module} extra: pip install -e '.[{module}]'"
        )
    if module == "tinygrad":
        # tinygrad's AG devices: tinygrad 0.14 (0.11 keeps its own REMOTE), clang, and
        # workers able to load shipped programs.
        from actorgraph.tinygrad._version import installed_version

        if installed_version() != "0.14.0":
            pytest.skip(
                f"needs tinygrad 0.14.0 (pip install -e '.[tinygrad]'), not {installed_version()}"
            )
        if shutil.which(os.environ.get("CC", "clang")) is None:
            pytest.skip("needs clang: tinygrad's CPU compiler")
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
