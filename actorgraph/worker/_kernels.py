"""A worker's kernel registry: a launch names one (shipped programs are _machine_code.py's).

`load_kernels` builds it from the modules given with `--kernels` (each defines `KERNELS`,
an iterable of `ag.Kernel` or a mapping name -> `ag.Kernel`), and the demo's kernels.
"""

from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from .._errors import UsageError
from .._kernel import Kernel


def _import_kernel_module(name: str) -> Any:
    """Import `name`, or raise a UsageError that says in one line why it cannot be."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            path = name.replace(".", os.sep)
            raise UsageError(
                f"kernel module {name!r} not found: no {path}.py (or package {path}) in the "
                f"current folder ({os.getcwd()}) or on the Python path; start the worker in "
                f"the module's folder, or install it"
            ) from None
        raise UsageError(f"kernel module {name!r} failed to import: {_where(exc)}") from exc
    except Exception as exc:  # the module's own code raised: name it and where
        raise UsageError(f"kernel module {name!r} failed to import: {_where(exc)}") from exc


def _where(exc: BaseException) -> str:
    """`Type: message (file:line)` of the innermost frame that raised `exc`."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{type(exc).__name__}: {exc.msg} ({exc.filename}:{exc.lineno})"
    if frames:
        place = f" ({frames[-1].filename}:{frames[-1].lineno})"
    else:
        place = ""
    return f"{type(exc).__name__}: {exc}{place}"


def load_kernels(modules: Iterable[str]) -> dict[str, Kernel]:
    """The kernel registry: name -> Kernel, from the demo's and each module's KERNELS.

    The demo's kernels are always there, so `actorgraph demo` runs on any worker.
    """
    from .._demo import KERNELS as DEMO_KERNELS

    registry: dict[str, Kernel] = {kernel.name: kernel for kernel in DEMO_KERNELS}
    for name in modules:
        module = _import_kernel_module(name)
        found = getattr(module, "KERNELS", None)
        if found is None:
            raise UsageError(
                f"kernel module {name!r} has no KERNELS; define KERNELS = [ag.Kernel(...), ...]"
            )
        kernels = list(found.values()) if isinstance(found, Mapping) else list(found)
        for kernel in kernels:
            if not isinstance(kernel, Kernel):
                raise UsageError(f"{name}.KERNELS holds {kernel!r}, which is not an ag.Kernel")
            other = registry.get(kernel.name)
            if other is not None and other is not kernel:
                raise UsageError(f"kernel {kernel.name!r} is defined twice (in {name} and before)")
            registry[kernel.name] = kernel
    return registry
