"""The public surface of `actorgraph` is exactly what its __all__ says, and matches DESIGN.md."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import types
from pathlib import Path

import attrs
import numpy as np
import pytest
import trio
from _paths import ROOT

import actorgraph as ag
from actorgraph import scheduler

# Where each package of the distribution lives in this checkout (devices/ and scheduler/
# install as actorgraph.devices and actorgraph.scheduler).
PACKAGE_ROOTS = {
    "actorgraph": ROOT / "actorgraph",
    "actorgraph.devices": ROOT / "devices",
    "actorgraph.scheduler": ROOT / "scheduler",
}


@pytest.mark.parametrize("module", [ag, scheduler], ids=lambda m: m.__name__)
def test_public_names_are_exactly_all(module: types.ModuleType) -> None:
    # pytest rewrites the asserts of every module of a distribution that registers a
    # pytest11 plugin (ours does), which leaves its helpers, "@py_builtins" and
    # "@pytest_ar", in the package's namespace: not names anyone can import.
    public = {name for name in dir(module) if not name.startswith(("_", "@"))}
    # Subpackages (actorgraph.devices, .remote, .scheduler, .tinygrad, .ray, .worker) and
    # the test helpers (actorgraph.testing) appear once imported; they are reached by
    # their dotted names, not re-exported.
    subpackages = {n for n in public if isinstance(getattr(module, n), types.ModuleType)}
    allowed = {"devices", "remote", "scheduler", "tinygrad", "ray", "testing", "worker"}
    assert subpackages <= allowed, subpackages
    assert public - subpackages == set(module.__all__)
    assert len(module.__all__) == len(set(module.__all__)), "duplicate names in __all__"
    assert list(module.__all__) == sorted(module.__all__)


def test_every_public_object_is_documented_and_lives_in_a_private_module() -> None:
    module = ag
    for name in module.__all__:
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue  # a type alias such as scheduler.Message
        assert inspect.getdoc(obj), f"{module.__name__}.{name} has no docstring"
        owner = getattr(obj, "__module__", "")
        assert owner.rsplit(".", 1)[-1].startswith("_"), (
            f"{module.__name__}.{name} is defined in {owner}: implementation lives in "
            f"underscored modules and is re-exported"
        )


def test_the_api_of_the_design() -> None:
    for method in ("alloc", "free", "copyin", "copyout", "run", "compile", "statistics"):
        assert callable(getattr(ag.Runtime, method)), method
    for method in ("copyin", "copyout", "run"):
        assert inspect.iscoroutinefunction(getattr(ag.Runtime, method)), method
    # compile gives an awaitable that also explains a forgotten await (tests/test_errors.py).
    assert "Pending[Graph]" in str(inspect.signature(ag.Runtime.compile).return_annotation)
    for method in ("__call__", "aclose", "__aenter__", "__aexit__"):
        assert inspect.iscoroutinefunction(getattr(ag.Graph, method)), method
    assert isinstance(ag.Graph.plan, property)
    assert callable(ag.Buffer.view)
    launch = inspect.signature(ag.Launch)
    assert list(launch.parameters) == [
        "kernel",
        "bufs",
        "vars",
        "fixedvars",
        "global_size",
        "local_size",
    ]
    assert launch.parameters["global_size"].default is None
    assert launch.parameters["local_size"].default is None
    assert list(inspect.signature(ag.Copy).parameters) == ["dst", "src"]
    assert list(inspect.signature(ag.Var).parameters) == ["name", "lo", "hi"]
    graph_call = inspect.signature(ag.Graph.__call__)
    # The contract's positional parameters; keyword-only extras (profile=) may follow.
    assert list(graph_call.parameters)[:3] == ["self", "inputs", "var_vals"]
    extras = list(graph_call.parameters.values())[3:]
    assert all(p.kind is p.KEYWORD_ONLY for p in extras)


def test_values_are_frozen_attrs_classes() -> None:
    async def main() -> None:
        async with ag.open_runtime(["CPU:0"]) as rt:
            a, b = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
            kernel = ag.Kernel("k", cpu=lambda out: None, outs=(0,))
            values = [kernel, ag.Launch(kernel, [a]), ag.Copy(dst=a, src=b), ag.Var("n", 1, 2), a]
            for value in values:
                assert attrs.has(type(value))
                field = attrs.fields(type(value))[0].name
                with pytest.raises(attrs.exceptions.FrozenInstanceError):
                    setattr(value, field, None)

    trio.run(main)


def test_error_hierarchy() -> None:
    for error in (ag.InputError, ag.VarError, ag.BufferFreedError):
        assert issubclass(error, ag.UsageError)
    assert issubclass(ag.UsageError, ag.ActorGraphError) and issubclass(ag.UsageError, ValueError)
    assert issubclass(ag.ClosedError, ag.ActorGraphError) and issubclass(
        ag.ClosedError, RuntimeError
    )
    assert issubclass(ag.ItemError, ag.ActorGraphError)
    assert issubclass(ag.ReplayMismatchError, ag.ActorGraphError)
    assert issubclass(ag.ReplayMismatchError, RuntimeError)
    for error in (ag.PlanRaceError, ag.PlanDeadlockError):
        assert issubclass(error, ag.PlanError)
    assert ag.PlanError is scheduler.PlanError


def test_expressions_are_built_from_vars() -> None:
    n = ag.Var("n", 1, 100)
    for expr in (n + 1, 1 + n, n - 1, 10 - n, n * 2, 2 * n, n // 3, 300 // n, ag.cdiv(n, 7)):
        assert isinstance(expr, ag.Expr)
    assert ag.cdiv(10, 4) == 3
    assert (ag.cdiv(n, 4) * 2 + n - 1).evaluate({n: 9}) == 2 * 3 + 9 - 1
    assert str(ag.cdiv(n, 256)) == "cdiv(n, 256)"


def test_importing_actorgraph_does_not_import_cuda() -> None:
    # cuda-python is imported only when a CUDA device is opened.
    code = "import sys, actorgraph; print(any(m.startswith('cuda') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_buffer_reports_its_layout() -> None:
    async def main() -> None:
        async with ag.open_runtime(["CPU:0"]) as rt:
            a = rt.alloc("CPU:0", (4, 8), np.int32)
            v = a.view(offset=8, size=16)
            assert (a.device, a.shape, a.dtype, a.size, a.nbytes) == (
                "CPU:0",
                (4, 8),
                np.int32,
                32,
                128,
            )
            assert (v.offset, v.shape, v.base is a, v.is_view) == (8, (16,), True, True)

    trio.run(main)


def _modules() -> dict[str, Path]:
    """Every module of the distribution by its dotted name (a package by its own name)."""
    found = {}
    for top, root in PACKAGE_ROOTS.items():
        for path in root.rglob("*.py"):
            parts = [*top.split("."), *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(node: ast.AST, package: str) -> list[str]:
    """The dotted names an import statement reaches (a from-import: the module and each
    name under it, which may be a module too)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parent = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*parent, *([base] if base else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def private_imports_across_packages(modules: dict[str, Path]) -> list[str]:
    """Each import of a private module (`_name.py`) by a module outside the package that
    holds it (and outside that package's subpackages): a package's private modules are
    its own, and what another package needs of it is one of its public modules."""
    found = []
    for name, path in sorted(modules.items()):
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _imported(node, package):
                owner, _, last = target.rpartition(".")
                if target not in modules or not last.startswith("_"):
                    continue
                if package == owner or package.startswith(owner + "."):
                    continue
                found.append(
                    f"{path.name}:{node.lineno} ({name}) imports {target}, a private "
                    f"module of {owner}: import the names from a public module of {owner} "
                    f"(give them one if they have none)"
                )
    return found


def test_no_package_imports_a_private_module_of_another() -> None:
    assert private_imports_across_packages(_modules()) == []


def test_a_private_import_across_packages_is_found_and_named(tmp_path: Path) -> None:
    # The check itself, on modules of its own: a worker module reaching into
    # devices/remote's private module is named; its own package's, a parent package's
    # and a public module's are not.
    modules = _modules()
    worker = tmp_path / "_probe.py"
    worker.write_text(
        "from actorgraph.devices.remote._transport import Transport\n"
        "from ..devices.remote import _connection, wire\n"
        "from . import _session\n"
        "from .._errors import UsageError\n"
    )
    modules["actorgraph.worker._probe"] = worker
    found = [line for line in private_imports_across_packages(modules) if "_probe" in line]
    assert found == [
        "_probe.py:1 (actorgraph.worker._probe) imports actorgraph.devices.remote._transport, "
        "a private module of actorgraph.devices.remote: import the names from a public "
        "module of actorgraph.devices.remote (give them one if they have none)",
        "_probe.py:2 (actorgraph.worker._probe) imports actorgraph.devices.remote._connection, "
        "a private module of actorgraph.devices.remote: import the names from a public "
        "module of actorgraph.devices.remote (give them one if they have none)",
    ]
