"""A runtime's eager work: items run now, one after another (`Eager.run`), and host
copies into and out of buffers (`copyin`, `copyout`).

Each is a one-item program run as `await graph(...)` runs a replay: a cancel point, then
here and now where it can be (`_graph.run_here`), else posted once there is room in the
in-flight window, and waited for. `Runtime.run`, `copyin` and `copyout` are the public
calls (their docstrings say what a user sees).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import trio

from actorgraph.devices import NOT_RUN, Op
from actorgraph.scheduler import build_plan

from . import _capture
from ._await import Hinted, Pending, described
from ._buffer import Buffer
from ._compile import build_slow, checked_items, slow_builds
from ._errors import UsageError
from ._graph import GraphHost, check_var_vals, run_here
from ._kernel import Item
from ._program import Bound, Program, host_program, plan_item, raise_failure, raise_item_failure


class Eager:
    """The eager work of one runtime (see the module)."""

    def __init__(self, runtime: GraphHost) -> None:
        self._runtime = runtime

    async def run(self, items: Sequence[Item], var_vals: Mapping[Any, int] | None) -> None:
        """Run `items` now, one after another (inside an @ag.jit function: recorded, and
        run unless it only traces). Raises what checking them raises, and an item's
        failure as an ItemError naming it."""
        runtime = self._runtime
        checked = checked_items(runtime, items, "rt.run")
        scope = _capture.current_scope()
        if scope is not None:
            # Inside an @ag.jit function: the scope records the items and supplies the
            # call's var values; it skips running them when it only traces.
            if not scope.issue(runtime, checked, var_vals):
                return
            var_vals = scope.values_for(checked)
        # var_vals covers the whole list: check it once, then give each item its own vars.
        needed: frozenset[Any] = frozenset().union(*(item.free_vars() for item in checked))
        values = check_var_vals(needed, var_vals, "run()")
        await build_slow(slow_builds(checked))
        for index, item in enumerate(checked):
            plan = build_plan([plan_item(item)], runtime.caps)
            program = Program(runtime, (item,), (), plan, index_offset=index)
            own = {var: values[var] for var in program.free_vars}
            await _run(program, program.bind((), own), runtime)

    async def copyin(self, buffer: Buffer, array: Any) -> None:
        """Copy host data `array` into `buffer`, after all earlier work on its device.
        Raises UsageError for anything but host data of the buffer's dtype and size."""
        _capture.check_host_transfer("copyin")
        data = self._host_array(buffer, array)
        runtime = self._runtime
        program = host_program(runtime, runtime.caps, buffer, write=True)
        queue = program.plan.queues[0]
        op = runtime.device(buffer.device).lower_host_write(buffer, data, queue.kind)
        await self._run_host(program, op)

    async def copyout(self, buffer: Buffer) -> np.ndarray[Any, Any]:
        """A host copy of `buffer`'s contents, after all earlier work on its device."""
        _capture.check_host_transfer("copyout")
        if not isinstance(buffer, Buffer):
            raise UsageError(f"copyout takes a Buffer, got {described(buffer)}")
        runtime = self._runtime
        runtime.check_own(buffer, "copyout: ")
        buffer.check_live("copyout: ")
        out = np.empty(buffer.shape, dtype=buffer.dtype)
        program = host_program(runtime, runtime.caps, buffer, write=False)
        queue = program.plan.queues[0]
        op = runtime.device(buffer.device).lower_host_read(buffer, out, queue.kind)
        await self._run_host(program, op)
        return out

    async def _run_host(self, program: Program, op: Op) -> None:
        # The host op fills the one Run placeholder of a single-item host program.
        await _run(program, program.bind_host(op), self._runtime)

    def _host_array(self, buffer: Buffer, array: Any) -> np.ndarray[Any, Any]:
        if not isinstance(buffer, Buffer):
            raise UsageError(f"copyin takes a Buffer, got {described(buffer)}")
        self._runtime.check_own(buffer, "copyin: ")
        buffer.check_live("copyin: ")
        if isinstance(array, (Buffer, Hinted, Pending)) or inspect.iscoroutine(array):
            # Not data: an un-awaited copyout (a coroutine), a buffer, a graph... (a
            # background runtime's Call says what to wait for itself, as an array)
            what = (
                f"{array!r}, a Buffer: copy between buffers with `await rt.copy(dst, src)` "
                f"or an ag.Copy item"
                if isinstance(array, Buffer)
                else described(array)
            )
            raise UsageError(f"copyin takes host data (a numpy array) for {buffer!r}, got {what}")
        data = np.asarray(array)
        if data.dtype != buffer.dtype:
            raise UsageError(
                f"copyin: array dtype {data.dtype} does not match {buffer!r}; "
                f"convert with array.astype(np.{buffer.dtype.name})"
            )
        if data.size != buffer.size:
            raise UsageError(
                f"copyin: array has {data.size} elements but {buffer!r} holds {buffer.size}"
            )
        # Own the data: the caller may change its array while the copy waits its turn.
        return np.array(data.reshape(buffer.shape), copy=True)


async def _run(program: Program, bound: Bound, runtime: GraphHost) -> None:
    """A one-off program, as `await graph(...)` runs a replay (see the module)."""
    await trio.lowlevel.checkpoint_if_cancelled()
    ran = run_here(bound)
    if ran is NOT_RUN:
        await runtime.window.admit()
        sub = program.submit(bound)
        await sub.done.wait()
        raise_failure(program, sub)
        return
    await trio.lowlevel.cancel_shielded_checkpoint()
    if ran is not None:
        raise_item_failure(program, ran)
