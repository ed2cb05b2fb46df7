"""A runtime's eager work: items run now, one after another (`Eager.run`), and host
copies into and out of buffers (`copyin`, `copyout`, and `submit_copyin`,
`submit_copyout`, which do not wait for theirs: a `HostCopy` says when it is done).

Each is a one-item program run as `await graph(...)` runs a replay: a cancel point, then
here and now where it can be (`_submitted.run_here`), else posted once there is room in the
in-flight window, and waited for; a host copy not waited for goes as `graph.submit`
submits a replay. `Runtime.run`, `copyin`, `copyout`, `submit_copyin` and
`submit_copyout` are the public calls (their docstrings say what a user sees).
"""

from __future__ import annotations

import collections
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import trio

from actorgraph.devices import NOT_RUN, Ran, Submission
from actorgraph.scheduler import build_plan

from . import _capture
from ._await import Hinted, Pending, described
from ._buffer import Buffer, check_out, dtype_text
from ._compile import build_slow, checked_items, slow_builds
from ._errors import UsageError
from ._graph import GraphHost
from ._kernel import Item
from ._program import (
    Bound,
    Program,
    host_program,
    plan_item,
    post_and_wait,
    raise_failure,
    raise_item_failure,
)
from ._submitted import Submitted, check_var_vals, run_here


class HostCopy(Submitted):
    """A copyin or copyout submitted without waiting (`Runtime.submit_copyin`,
    `submit_copyout`): `await copy.wait()` returns once it is done (raising its
    failure).

    Attributes:
        array: a copyout's host array, holding the buffer's bytes once the copy is done
            (None for a copyin).
    """

    __slots__ = ("array",)

    def __init__(
        self,
        program: Program,
        sub: Submission | None,
        ran: Ran,
        array: np.ndarray[Any, Any] | None,
    ) -> None:
        """The copy of `program`: posted as `sub`, or (None) run where it was submitted,
        with `ran` its failure or None; `array` the host array a copyout fills."""
        super().__init__(program, sub, ran)
        self.array = array


_HOST_PROGRAMS = 64  # host copies' programs an Eager keeps (see Eager._host_program)


class Eager:
    """The eager work of one runtime (see the module)."""

    def __init__(self, runtime: GraphHost) -> None:
        self._runtime = runtime
        # The programs of recent host copies, by (device, into it, bytes), least recently
        # used first: a copy's program is the same for any buffer of that size there.
        self._host_programs: collections.OrderedDict[tuple[str, bool, int], Program] = (
            collections.OrderedDict()
        )

    def _host_program(self, buffer: Buffer, write: bool) -> Program:
        """The one-item program of a host copy into (`write`) or out of `buffer`: planned
        once per device, direction and size (a plan of one item on one queue orders it
        after earlier work on that device whatever bytes it touches), then reused."""
        key = (buffer.device, write, buffer.nbytes)
        programs = self._host_programs
        program = programs.get(key)
        if program is not None:
            programs.move_to_end(key)
            return program
        runtime = self._runtime
        program = programs[key] = host_program(runtime, runtime.caps, buffer, write)
        if len(programs) > _HOST_PROGRAMS:
            programs.popitem(last=False)
        return program

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
        program, bound = self._host_write("copyin", buffer, array)
        await _run(program, bound, self._runtime)

    async def copyout(
        self, buffer: Buffer, out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        """A host copy of `buffer`'s contents, after all earlier work on its device, in
        `out` if given (else a new array). Raises UsageError for anything but a live
        Buffer of the runtime, or an `out` that cannot hold it."""
        program, bound, out = self._host_read("copyout", buffer, out)
        await _run(program, bound, self._runtime, reads_bytes=True)
        return out

    async def submit_copyin(self, buffer: Buffer, array: Any) -> HostCopy:
        """`copyin` submitted (after all earlier work on its device) but not waited for:
        the HostCopy says when it is done. Raises what `copyin` raises."""
        program, bound = self._host_write("submit_copyin", buffer, array)
        return await self._submit(program, bound, None)

    async def submit_copyout(
        self, buffer: Buffer, out: np.ndarray[Any, Any] | None = None
    ) -> HostCopy:
        """`copyout` submitted but not waited for: once the HostCopy is done,
        `copy.array` (`out`, if given) holds the bytes of `buffer` as of that point.
        Raises what `copyout` raises."""
        program, bound, out = self._host_read("submit_copyout", buffer, out)
        return await self._submit(program, bound, out)

    def _host_write(self, what: str, buffer: Buffer, array: Any) -> tuple[Program, Bound]:
        """The one-item program of a copy of host data `array` into `buffer`, bound."""
        _capture.check_host_transfer("copyin")
        data = self._host_array(what, buffer, array)
        runtime = self._runtime
        program = self._host_program(buffer, write=True)
        queue = program.plan.queues[0]
        op = runtime.device(buffer.device).lower_host_write(buffer, data, queue.kind)
        # The host op fills the one Run placeholder of a single-item host program.
        return program, program.bind_host(op)

    def _host_read(
        self, what: str, buffer: Buffer, out: np.ndarray[Any, Any] | None = None
    ) -> tuple[Program, Bound, np.ndarray[Any, Any]]:
        """The one-item program of a copy of `buffer` out to `out` (a new host array if
        None), bound, and that array."""
        _capture.check_host_transfer("copyout")
        if not isinstance(buffer, Buffer):
            raise UsageError(f"{what} takes a Buffer, got {described(buffer)}")
        runtime = self._runtime
        runtime.check_own(buffer, f"{what}: ")
        buffer.check_live(f"{what}: ")
        if out is None:
            out = np.empty(buffer.shape, dtype=buffer.dtype)
        else:
            check_out(what, buffer, out)
        program = self._host_program(buffer, write=False)
        queue = program.plan.queues[0]
        op = runtime.device(buffer.device).lower_host_read(buffer, out, queue.kind)
        return program, program.bind_host(op), out

    async def _submit(
        self, program: Program, bound: Bound, out: np.ndarray[Any, Any] | None
    ) -> HostCopy:
        """A host copy submitted as `graph.submit` submits a replay: once the in-flight
        window has room, run here and now where it can be (then a cancel-shielded
        scheduler pass), else posted."""
        await self._runtime.window.admit()
        ran = run_here(bound)
        if ran is NOT_RUN:
            return HostCopy(program, program.submit(bound), None, out)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return HostCopy(program, None, ran, out)

    def _host_array(self, what: str, buffer: Buffer, array: Any) -> np.ndarray[Any, Any]:
        if not isinstance(buffer, Buffer):
            raise UsageError(f"{what} takes a Buffer, got {described(buffer)}")
        self._runtime.check_own(buffer, f"{what}: ")
        buffer.check_live(f"{what}: ")
        if isinstance(array, (Buffer, Hinted, Pending)) or inspect.iscoroutine(array):
            # Not data: an un-awaited copyout (a coroutine), a buffer, a graph... (a
            # background runtime's Call says what to wait for itself, as an array)
            got = (
                f"{array!r}, a Buffer: copy between buffers with `await rt.copy(dst, src)` "
                f"or an ag.Copy item"
                if isinstance(array, Buffer)
                else described(array)
            )
            raise UsageError(f"{what} takes host data (a numpy array) for {buffer!r}, got {got}")
        data = np.asarray(array)
        if data.dtype != buffer.dtype:
            raise UsageError(
                f"{what}: array dtype {dtype_text(data.dtype)} does not match {buffer!r}; "
                f"convert with array.astype({_dtype_code(buffer.dtype)})"
            )
        if data.size != buffer.size:
            raise UsageError(
                f"{what}: array has {data.size} elements but {buffer!r} holds {buffer.size}"
            )
        # Own the data: the caller may change its array while the copy waits its turn.
        return np.array(data.reshape(buffer.shape), copy=True)


def _dtype_code(dtype: np.dtype[Any]) -> str:
    """How to write `dtype` in Python: np.int32, or '>i4' when its byte order is not
    this machine's."""
    return f"np.{dtype.name}" if dtype.isnative else repr(dtype.str)


async def _run(
    program: Program, bound: Bound, runtime: GraphHost, reads_bytes: bool = False
) -> None:
    """A one-off program, as `await graph(...)` runs a replay (see the module). One on a
    single worker that reads no bytes back (a copy into its buffer, a kernel there) has
    this task read its end, as a replay on one worker does; the bytes of a read, the
    connection's reader task lands, and wakes this one."""
    await trio.lowlevel.checkpoint_if_cancelled()
    ran = run_here(bound)
    if ran is NOT_RUN:
        await runtime.window.admit()
        reader = None if reads_bytes else program.end_reader
        sub = await post_and_wait(reader, lambda: program.submit(bound))
        raise_failure(program, sub)
        return
    await trio.lowlevel.cancel_shielded_checkpoint()
    if ran is not None:
        raise_item_failure(program, ran)
