"""The runtime: opens devices, starts their actors in a nursery, runs eager work, compiles graphs."""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from actorgraph.devices import (
    NOT_RUN,
    Device,
    Op,
    RemoteConnectionError,
    Signal,
    Submission,
    find_deadlock,
    join_sim_devices,
    open_devices,
)
from actorgraph.scheduler import Plan, build_plan, list_schedule_order

from . import _capture
from ._await import Hinted, Pending, described, listed
from ._buffer import (
    Allocation,
    Buffer,
    _shape_of,
    buffer_dtype,
    check_buffer_size,
    dtype_text,
)
from ._checker import CheckedGraph
from ._collector import collector_paused
from ._errors import (
    ClosedError,
    DeadlockError,
    InputError,
    UsageError,
)
from ._foreign import ExternalTimeline, HostMemory, TimelineWaits, space_uid, wrap_memory
from ._graph import Graph, ReplayCounts, check_var_vals
from ._groups import sole_exception
from ._kernel import Copy, Item, Kernel, Launch
from ._log import logger as _log
from ._options import check_max_sizes, check_options
from ._profile import Profile, ReplayRecord, build_profile
from ._program import (
    Bound,
    Program,
    check_item,
    host_program,
    plan_item,
    plan_items,
    raise_failure,
    raise_item_failure,
)

# Numbers runtimes in messages that name two of them (a buffer of one passed to another).
_runtime_numbers = itertools.count(1)


class HostCopy:
    """A copyin or copyout submitted without waiting (`Runtime.submit_copyin`,
    `submit_copyout`): `await copy.wait()` returns once it is done (raising its
    failure); a copyout's `array` then holds the buffer's bytes."""

    __slots__ = ("_program", "_sub", "array")

    def __init__(
        self, program: Program, sub: Submission, array: np.ndarray[Any, Any] | None
    ) -> None:
        self._program = program
        self._sub = sub
        self.array = array

    @property
    def done(self) -> bool:
        return bool(self._sub.done.is_set())

    async def wait(self) -> None:
        await self._sub.done.wait()
        raise_failure(self._program, self._sub)

    def finish(self) -> None:
        """Raise the failure of a copy that is done (nothing if it succeeded)."""
        raise_failure(self._program, self._sub)


@attrs.frozen
class StallReport:
    """The watchdog saw no progress for `stalled_for` seconds (trio clock) at time `at`."""

    at: float
    stalled_for: float
    in_flight: int
    actors: tuple[str, ...]


def _dtype_code(dtype: np.dtype[Any]) -> str:
    """How to write `dtype` in Python: np.int32, or '>i4' when its byte order is not
    this machine's."""
    return f"np.{dtype.name}" if dtype.isnative else repr(dtype.str)


@attrs.frozen
class RuntimeStatistics:
    """`submissions` counts everything run (replays, eager items, host copies); the
    wait, blocked-time and byte totals add up its actors' own statistics."""

    devices: tuple[str, ...]
    submissions: int
    in_flight: int
    actors: tuple[Any, ...]
    replays: int = 0
    replays_done: int = 0
    waits_parked: int = 0
    time_blocked: float = 0.0
    bytes_copied: int = 0
    # Tasks waiting for room in the in-flight window, and places in it held for replays
    # that wait for an external timeline before they are posted.
    waiting_for_room: int = 0
    reserved: int = 0


class Runtime:
    """Devices and their actors, alive inside `async with open_runtime(...)`."""

    def __init__(self, device_names: Sequence[str], **options: Any) -> None:
        if isinstance(device_names, str) or not device_names:
            raise UsageError(
                f"open_runtime needs a list of device names like ['CPU:0', 'CPU:1'], "
                f"got {device_names!r}"
            )
        seen: set[str] = set()
        for name in device_names:
            if name in seen:
                raise UsageError(f"device {name!r} is listed twice in open_runtime(...)")
            seen.add(name)
        check_options(device_names, options)
        timeline_start = int(options.pop("timeline_start", 0))
        self.verify_plans = bool(options.pop("verify_plans", False))
        self.profiling = bool(options.pop("profile", False))
        self.max_in_flight = int(options.pop("max_in_flight", 256))
        # How many replays of each graph are checked against eager (0: none, no cost).
        self.check_replays = int(options.pop("check_replays", 0))
        self.deadlock_check = float(options.pop("deadlock_check", 0.25))
        watchdog = options.pop("watchdog", None)
        self.watchdog: float | None = None if watchdog is None else float(watchdog)
        self.stalls: list[StallReport] = []
        self._open = False
        self._closed = False
        self._broken: BaseException | None = None
        # Invariant: usable == (open and not broken), so a hot path tests one attribute
        # and calls check_open() for the error only when it is False.
        self.usable = False
        # Every graph's replay counts (`adopt`): the runtime's are their sums.
        self._graph_counts: list[ReplayCounts] = []
        self.frees = 0
        # Moves whenever a binding a graph keeps may no longer be used as it is: a buffer
        # was freed, or the runtime became unusable (broken, closed). See Graph.__call__.
        self.epoch = 0
        # In flight: each submission with what to call once it is done (a replay's graph
        # counting it), or None.
        self._pending: dict[Submission, Callable[[Submission], None] | None] = {}
        # (submissions still running, device, memory): frees waiting for that work.
        self._deferred_frees: list[tuple[set[Submission], Device | None, Any]] = []
        # Places in the window taken by replays not posted yet (`reserve`); callers wait
        # in `_space` for room. Invariant: len(_pending) + _reserved <= max_in_flight,
        # except for work posted without waiting for room (never in flight, or eager).
        self._reserved = 0
        self._space = trio.lowlevel.ParkingLot()
        self._activity = trio.Event()
        self._profiled: list[ReplayRecord] = []
        self.number = next(_runtime_numbers)
        self._devices: dict[str, Device] = open_devices(
            device_names, timeline_start=timeline_start, **options
        )
        # Its SIM devices are one simulated machine: their copies share its links.
        join_sim_devices(self._devices.values())
        self.caps = {name: dev.caps for name, dev in self._devices.items()}
        # KICK: a submission's queues start once the runtime admits it.
        self.kick = Signal("KICK", 0)
        # Per device: the address space every rt.wrap(...) buffer on it shares.
        self._foreign_spaces: dict[str, int] = {}
        self._host_memory = HostMemory()
        # Replays waiting for external timelines (graph.submit(after=...)): one watcher.
        self._timeline_waits = TimelineWaits()

    # -- lifecycle --

    async def _start(self, nursery: trio.Nursery) -> None:
        for device in self._devices.values():
            await device.start(nursery)
        nursery.start_soon(self._monitor)
        self._timeline_waits.start(nursery)
        self._open = True
        self.usable = self._broken is None

    def _close(self) -> None:
        self._open = False
        self.usable = False
        self.epoch += 1
        self._closed = True
        for device in self._devices.values():
            device.close()

    def check_open(self) -> None:
        if self._broken is not None:
            raise ClosedError(
                f"this runtime is broken by an earlier fault: {self._broken}"
            ) from self._broken
        if not self._open:
            if self._closed:
                raise ClosedError(
                    "this runtime has exited its `async with open_runtime(...)` block; "
                    "open a new runtime to run more work"
                )
            raise ClosedError(
                "this runtime is not started; use `async with open_runtime(...) as rt`"
            )

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self._devices)

    @property
    def submissions(self) -> int:
        """Submissions made (replays, eager items, host copies): each moves the KICK by one
        as it is made, posted or run where it was made."""
        return self.kick.value

    @property
    def replays(self) -> int:
        """Graph replays submitted: those finished and those in flight, over every graph."""
        return sum(c.done + len(c.in_flight) for c in self._graph_counts)

    @property
    def replays_done(self) -> int:
        """Graph replays finished, over every graph."""
        return sum(c.done for c in self._graph_counts)

    @property
    def graphs_compiled(self) -> int:
        return len(self._graph_counts)

    def adopt(self, counts: ReplayCounts) -> int:
        """A graph was compiled on this runtime: keep its replay counts (this runtime's
        are their sums); return its number in profiles (0, 1, ...)."""
        self._graph_counts.append(counts)
        return len(self._graph_counts) - 1

    @property
    def closed(self) -> bool:
        """Whether the runtime's `async with` block has exited."""
        return self._closed

    def __repr__(self) -> str:
        state = " (closed)" if self._closed else ""
        return f"<Runtime {self.number} on {', '.join(self._devices)}{state}>"

    def owns(self, buffer: Buffer) -> bool:
        """Whether this runtime made `buffer` (not another runtime, which may have a
        device of the same name)."""
        return buffer.runtime is self

    def check_own(
        self, buffer: Buffer, what: str = "", error: type[UsageError] = UsageError
    ) -> None:
        """Refuse a buffer that another runtime made. Each runtime orders only its own
        work on its devices' memory, so taking another's buffer would race with that
        runtime's work on it (and free or read memory that is not this runtime's)."""
        if buffer.runtime is self:
            return
        owner = buffer.runtime
        if owner is not None and owner.closed:
            raise error(
                f"{what}{buffer!r} was allocated by {owner!r}, which has closed, so the "
                f"buffer went with it; this is {self!r}: allocate a new buffer here with "
                f"rt.alloc(...) (and copyin its data again)"
            )
        raise error(
            f"{what}{buffer!r} was allocated by {owner!r}, not by this runtime {self!r}: "
            f"a runtime orders only its own work on a buffer, so the two runtimes' work on "
            f"it would race; use a buffer of this runtime, moving the data through the host "
            f"(copyout from the one, copyin to the other)"
        )

    def keep_profile(self, record: ReplayRecord) -> None:
        """Keep a profiled replay's record for `rt.profile()`."""
        self._profiled.append(record)

    def device(self, name: str) -> Device:
        try:
            return self._devices[name]
        except KeyError:
            raise UsageError(
                f"device {name!r} is not open in this runtime (open: {list(self._devices)}); "
                f"add it to open_runtime([...])"
            ) from None

    def statistics(self) -> RuntimeStatistics:
        actors = tuple(
            actor.statistics() for d in self._devices.values() for actor in d.queues.values()
        )
        return RuntimeStatistics(
            devices=self.devices,
            submissions=self.submissions,
            in_flight=self.in_flight,
            actors=actors,
            replays=self.replays,
            replays_done=self.replays_done,
            waits_parked=sum(a.waits_parked for a in actors),
            time_blocked=sum(a.time_blocked for a in actors),
            bytes_copied=sum(a.bytes_copied for a in actors),
            waiting_for_room=self._space.statistics().tasks_waiting,
            reserved=self._reserved,
        )

    def actor_names(self) -> tuple[str, ...]:
        return tuple(a.name for d in self._devices.values() for a in d.queues.values())

    def profile(self, *, clear: bool = False) -> Profile:
        """Every profiled replay so far, as one Profile (`clear=True` starts afresh after).

        Replays are profiled with `open_runtime(..., profile=True)` or `graph(..., profile=True)`.
        """
        profile = build_profile(self.actor_names(), self._profiled)
        if clear:
            self._profiled = []
        return profile

    # -- memory --

    def alloc(self, device: str, shape: int | tuple[int, ...], dtype: Any = np.float32) -> Buffer:
        """A new buffer on `device`, filled with zeros.

        `shape` (an int or a tuple) counts elements of `dtype`, never bytes:
        `rt.alloc("CPU:0", 1024, np.float32)` holds 1024 floats, 4096 bytes (`buf.nbytes`).
        Memory starts as zeros on every device kind (a CUDA device sets it with a memset).
        """
        self.check_open()
        dev = self.device(device)
        dims = _shape_of(shape)
        dt = buffer_dtype("alloc", dtype)
        nelems = check_buffer_size("alloc", dims, dt)
        try:
            memory = dev.allocate(nelems, dt)
        except RemoteConnectionError as exc:
            # Its worker is gone: as for every other later use of its devices, ClosedError.
            raise ClosedError(f"alloc on {device}: {exc}") from exc
        alloc = Allocation(device=dev, nelems=nelems, dtype=dt, memory=memory, runtime=self)
        self._host_memory.add(alloc)
        return Buffer(device=device, shape=dims, dtype=dt, offset=0, alloc=alloc)

    def wrap(
        self,
        device: str,
        source: Any,
        *,
        nbytes: int | None = None,
        dtype: Any = np.uint8,
        shape: int | tuple[int, ...] | None = None,
    ) -> Buffer:
        """A Buffer over host memory actorgraph did not allocate, on a CPU device.

        `source` is an address (with `nbytes=`), or an object exporting host memory through
        `__dlpack__` or the buffer protocol (kept alive by the Buffer). Buffers made by
        wrap on one device compare by address: two wrappers of overlapping memory alias,
        so the planner orders items that use them. Memory wrapped on another device, or
        an rt.alloc buffer's, is refused (see HostMemory). `rt.free(buf)` forgets the
        wrapper and makes later use of it a BufferFreedError; the memory stays its
        owner's: an exporter is kept alive until the work submitted before the free is
        done, memory given by address must be kept alive by the caller that long.

        Returns the Buffer (`shape` defaults to all the memory as one dimension of
        `dtype`). Raises UsageError for memory that is not host memory, read-only, not
        contiguous, too small for `shape`, wrapped on another device, or an rt.alloc
        buffer's.
        """
        self.check_open()
        if isinstance(source, Buffer):
            self.check_own(source, "wrap: ")
            raise UsageError(
                f"wrap: {source!r} is a Buffer of this runtime already; wrap takes memory "
                f"that actorgraph did not allocate: use the buffer, or a view of it "
                f"(buf.view(...)), instead of a wrapper of its memory"
            )
        dev = self.device(device)
        uid = self._foreign_spaces.get(device)
        if uid is None:
            uid = self._foreign_spaces[device] = space_uid()
        return wrap_memory(dev, uid, source, nbytes, dtype, shape, self, self._host_memory)

    def free(self, buffer: Buffer) -> None:
        """Release a base buffer's memory; later use of it or its views is an error."""
        if not isinstance(buffer, Buffer):
            raise UsageError(f"free() takes a Buffer, got {described(buffer)}")
        if buffer.is_view:
            raise UsageError(f"free() takes a base buffer; {buffer!r} is a view")
        self.check_own(buffer, "free: ")
        buffer.check_live("free: ")
        # A wrapper's memory is its owner's (rt.wrap): nothing goes back to the device,
        # but the wrapper's exporter is kept alive as long as its memory may be used.
        device = None if buffer.foreign else buffer.device_object
        memory = buffer.release_memory()
        self.frees += 1
        self.epoch += 1  # graphs re-check their buffers' liveness when it moves
        # Work submitted before may still use the memory (no later work can): the device
        # gets it back (an exporter is let go of) once that work is done. Never wait for
        # it here, on the trio thread that the work itself may need.
        waiting = {sub for sub in self._pending if not sub.done.is_set()}
        if waiting:
            self._deferred_frees.append((waiting, device, memory))
        else:
            self._release(device, memory)

    @staticmethod
    def _release(device: Device | None, memory: Any) -> None:
        if device is None:
            return  # a wrapper's exporter: dropping it is all there is to do
        try:
            device.free(memory)
        except Exception as error:  # e.g. a GPU whose context is already lost
            _log.warning("%s could not free a buffer: %s", device.name, error)

    @property
    def frees_pending(self) -> int:
        """Buffers freed while submitted work might still use them, not yet released."""
        return len(self._deferred_frees)

    # -- submitting work --

    # -- in-flight submissions: back-pressure, completion, deadlock watch --

    async def admit(self) -> None:
        """Wait for room in the in-flight window (submissions posted, not yet complete,
        and places reserved for replays waiting to be posted); the caller posts its
        submission before its next checkpoint, taking that room."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self.check_open()
        while not self.has_room():
            await self._space.park()
            self.check_open()

    def has_room(self) -> bool:
        """Whether a submission posted now fits in the in-flight window."""
        return len(self._pending) + self._reserved < self.max_in_flight

    async def reserve(self) -> None:
        """`admit`, keeping the room taken until `unreserve`: for a replay that waits for
        something else (an external timeline) before it is posted, so the replays waiting
        so never pass the window when what they wait for comes."""
        await self.admit()
        self._reserved += 1

    async def wait_timeline(self, timeline: ExternalTimeline, value: int) -> None:
        """Return once `timeline` reached `value` (for a replay that waits for it, its
        place in the window reserved): the runtime's watcher wakes it, no thread is held
        for it, and cancelling it ends it at once. Raises TimeoutError after the
        timeline's `timeout` (one without `wait`), what its `read` or `wait` raised, or
        ClosedError if the runtime closes meanwhile."""
        await self._timeline_waits.wait_for(timeline, value)

    def unreserve(self) -> None:
        """Give back a place `reserve` took (its replay is posted now, or never will be)."""
        self._reserved -= 1
        if self._space:
            self._space.unpark()

    def track(self, sub: Submission, then: Callable[[Submission], None] | None = None) -> None:
        """Keep a posted submission in flight until it completes (back-pressure, deferred
        frees, the deadlock watch); `then` is told when it does (a replay's graph)."""
        if sub.done.is_set():
            return  # nothing to run (an empty plan)
        self._pending[sub] = then
        sub.on_done = self._untrack
        if not self._activity.is_set():
            self._activity.set()

    def count_done(self, sub: Submission, then: Callable[[Submission], None] | None = None) -> None:
        """A submission completed where it was submitted: never in flight, so nothing
        waited for it (no window, no frees, no deadlock watch); `then` is told."""
        if then is not None:  # a replay
            then(sub)

    def _untrack(self, sub: Submission) -> None:
        if sub in self._pending:
            then = self._pending.pop(sub)
            if then is not None:  # a replay: its graph counts it, once, when it ends
                then(sub)
        if self._deferred_frees:
            still = []
            for waiting, device, memory in self._deferred_frees:
                waiting.discard(sub)
                if waiting:
                    still.append((waiting, device, memory))
                else:
                    self._release(device, memory)
            self._deferred_frees = still
        if self._space:
            self._space.unpark()

    async def _await(self, program: Program, sub: Submission) -> None:
        await sub.done.wait()
        raise_failure(program, sub)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def _break(self, error: BaseException) -> None:
        """A sticky fault: fail everything in flight and every later call with `error`."""
        if self._broken is None:
            self._broken = error
            self.usable = False
            self.epoch += 1
            _log.error("runtime broken: %s", error)
        for sub in list(self._pending):
            sub.fail(-1, "", error)
            sub.done.set()
            self._untrack(sub)
            if sub.interrupt is not None:
                sub.interrupt(error)
        self._space.unpark_all()

    def _fingerprint(self) -> tuple[int, ...]:
        out: list[int] = []
        for device in self._devices.values():
            out.append(device.timeline.value)
            for actor in device.queues.values():
                out += (actor.jobs_done, actor.signal.value, actor.parks)
        return tuple(out)

    async def _monitor(self) -> None:
        """Watch in-flight work: diagnose deadlocks, report replays that stop progressing."""
        actors = [a for d in self._devices.values() for a in d.queues.values()]
        last: tuple[int, ...] | None = None
        still_since = 0.0
        reported = False
        while True:
            if not self._pending:
                self._activity = trio.Event()
                await self._activity.wait()
                last = None
            await trio.sleep(self.deadlock_check)
            if not self._pending:
                continue
            now = trio.current_time()
            fingerprint = self._fingerprint()
            if fingerprint != last:
                last, still_since, reported = fingerprint, now, False
                continue
            blocked = find_deadlock(actors)
            if blocked:
                cycle = "; ".join(
                    f"{b.actor} waits for {b.signal} >= {b.value} (now {b.current})"
                    for b in blocked
                )
                self._break(
                    DeadlockError(
                        f"deadlock: every actor with work waits on a signal no pending work can "
                        f"set: {cycle}. The runtime cannot continue; open a new one",
                        blocked=tuple(blocked),
                    )
                )
                continue
            if self.watchdog is not None and not reported and now - still_since >= self.watchdog:
                reported = True
                stall = StallReport(
                    at=now,
                    stalled_for=now - still_since,
                    in_flight=len(self._pending),
                    actors=tuple(a.name for a in actors if a.busy),
                )
                self.stalls.append(stall)
                _log.warning(
                    "no progress for %.3f s with %d submissions in flight (busy: %s)",
                    stall.stalled_for,
                    stall.in_flight,
                    ", ".join(stall.actors),
                )

    async def copyin(self, buffer: Buffer, array: Any) -> None:
        """Copy a host array into `buffer` (after all earlier work on its device)."""
        self.check_open()
        _capture.check_host_transfer("copyin")
        data = self._host_array(buffer, array)
        program = host_program(self, self.caps, buffer, write=True)
        queue = program.plan.queues[0]
        op = self.device(buffer.device).lower_host_write(buffer, data, queue.kind)
        await self._run_host(program, op)

    async def copyout(self, buffer: Buffer) -> np.ndarray[Any, Any]:
        """A host copy of `buffer`'s contents (after all earlier work on its device)."""
        self.check_open()
        _capture.check_host_transfer("copyout")
        if not isinstance(buffer, Buffer):
            raise UsageError(f"copyout takes a Buffer, got {described(buffer)}")
        self.check_own(buffer, "copyout: ")
        buffer.check_live("copyout: ")
        out = np.empty(buffer.shape, dtype=buffer.dtype)
        program = host_program(self, self.caps, buffer, write=False)
        queue = program.plan.queues[0]
        op = self.device(buffer.device).lower_host_read(buffer, out, queue.kind)
        await self._run_host(program, op)
        return out

    async def submit_copyin(self, buffer: Buffer, array: Any) -> HostCopy:
        """`copyin` without waiting for it to be done: it is submitted (after all earlier
        work on its device) when this returns, and the HostCopy says when it is done.
        On a remote device the bytes go with the request, in one message."""
        self.check_open()
        _capture.check_host_transfer("copyin")
        data = self._host_array(buffer, array)
        program = host_program(self, self.caps, buffer, write=True)
        op = self.device(buffer.device).lower_host_write(buffer, data, program.plan.queues[0].kind)
        return await self._submit_host(program, op, None)

    async def submit_copyout(self, buffer: Buffer) -> HostCopy:
        """`copyout` without waiting for it: once the HostCopy is done (`await
        copy.wait()`), `copy.array` holds the bytes of `buffer` as of that point."""
        self.check_open()
        _capture.check_host_transfer("copyout")
        if not isinstance(buffer, Buffer):
            raise UsageError(f"submit_copyout takes a Buffer, got {described(buffer)}")
        self.check_own(buffer, "submit_copyout: ")
        buffer.check_live("submit_copyout: ")
        out = np.empty(buffer.shape, dtype=buffer.dtype)
        program = host_program(self, self.caps, buffer, write=False)
        op = self.device(buffer.device).lower_host_read(buffer, out, program.plan.queues[0].kind)
        return await self._submit_host(program, op, out)

    async def _submit_host(
        self, program: Program, op: Op, out: np.ndarray[Any, Any] | None
    ) -> HostCopy:
        await self.admit()
        bound = program.bind_host(op)
        linear = bound.linear
        failure = NOT_RUN if linear is None else linear.run()
        if failure is NOT_RUN:
            return HostCopy(program, program.submit(bound), out)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return HostCopy(program, program.done_submission(failure), out)

    async def _run_host(self, program: Program, op: Op) -> None:
        # The host op fills the one Run placeholder of a single-item host program.
        await self._run_now_or_submit(program, program.bind_host(op))

    async def _run_now_or_submit(self, program: Program, bound: Bound) -> None:
        """An eager item or a host copy, as `await graph(...)` runs a replay: once there
        is room in the in-flight window, run here and now as one run of calls if it can
        be (then a cancel-shielded scheduler pass), else submitted and waited for."""
        await self.admit()
        linear = bound.linear
        failure = NOT_RUN if linear is None else linear.run()
        if failure is NOT_RUN:
            await self._await(program, program.submit(bound))
            return
        await trio.lowlevel.cancel_shielded_checkpoint()
        if failure is not None:
            raise_item_failure(program, failure)

    def _host_array(self, buffer: Buffer, array: Any) -> np.ndarray[Any, Any]:
        if not isinstance(buffer, Buffer):
            raise UsageError(f"copyin takes a Buffer, got {described(buffer)}")
        self.check_own(buffer, "copyin: ")
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
                f"copyin: array dtype {dtype_text(data.dtype)} does not match {buffer!r}; "
                f"convert with array.astype({_dtype_code(buffer.dtype)})"
            )
        if data.size != buffer.size:
            raise UsageError(
                f"copyin: array has {data.size} elements but {buffer!r} holds {buffer.size}"
            )
        # Own the data: the caller may change its array while the copy waits its turn.
        return np.array(data.reshape(buffer.shape), copy=True)

    async def run(self, items: Sequence[Item], var_vals: Mapping[Any, int] | None = None) -> None:
        """Run items eagerly, one after another: the reference semantics for graphs."""
        self.check_open()
        checked = self._checked_items(items, "rt.run")
        scope = _capture.current_scope()
        if scope is not None:
            # Inside an @ag.jit function: the scope records the items and supplies the
            # call's var values; it skips running them when it only traces.
            if not scope.issue(self, checked, var_vals):
                return
            var_vals = scope.values_for(checked)
        # var_vals covers the whole list: check it once, then give each item its own vars.
        needed: frozenset[Any] = frozenset().union(*(item.free_vars() for item in checked))
        values = check_var_vals(needed, var_vals, "run()")
        await self._build_kernels(checked)
        for index, item in enumerate(checked):
            plan = build_plan([plan_item(item)], self.caps)
            program = Program(self, (item,), (), plan, index_offset=index)
            own = {var: values[var] for var in program.free_vars}
            await self._run_now_or_submit(program, program.bind((), own))

    def _checked_items(self, items: Sequence[Item], call: str) -> list[Item]:
        """The items of a run or compile, each a Launch or Copy of live buffers that
        this runtime made."""
        checked = []
        takes = f"{call}(items) takes a list of items (ag.Launch, ag.Copy)"
        for i, item in enumerate(listed(items, takes, f"`{call}([item, ...])`")):
            if isinstance(item, (Launch, Copy)):
                for buf in item.bufs:
                    if buf.runtime is not self:  # the message is made only for the error
                        self.check_own(buf, f"item {i} ({item.label}): buffer ")
            checked.append(check_item(item, i))
        return checked

    async def launch(
        self,
        kernel: Kernel,
        bufs: Sequence[Buffer],
        *,
        vars: Sequence[Any] = (),
        fixedvars: Mapping[Any, int] | None = None,
        global_size: Any = None,
        local_size: Any = None,
        var_vals: Mapping[Any, int] | None = None,
    ) -> None:
        """Launch one kernel now: `rt.run([Launch(...)])`; recorded inside an @ag.jit function."""
        item = Launch(
            kernel,
            bufs,
            vars=vars,
            fixedvars=fixedvars or {},
            global_size=global_size,
            local_size=local_size,
        )
        await self.run([item], var_vals)

    async def copy(self, dst: Buffer, src: Buffer) -> None:
        """Copy `src` into `dst` now: `rt.run([Copy(dst, src)])`; recorded inside @ag.jit."""
        await self.run([Copy(dst=dst, src=src)])

    async def _build_kernels(self, items: Sequence[Item]) -> None:
        """Compile the kernels that would compile slowly on first lowering (NVRTC for
        CUDA) on a worker thread, so the runtime's other work goes on meanwhile."""
        await self._build_slow(self._slow_builds(items))

    @staticmethod
    def _slow_builds(items: Sequence[Item]) -> list[tuple[Device, list[Any]]]:
        """Per device, the kernels of `items` that would compile slowly on first lowering."""
        wanted: dict[Device, set[Kernel]] = {}
        for item in items:
            if isinstance(item, Launch) and item.bufs:
                device = item.bufs[0].device_object
                if not device.builds_kernels:
                    continue
                kernels = wanted.get(device)
                if kernels is None:
                    kernels = wanted[device] = set()
                kernels.add(item.kernel)
        builds = [(device, device.slow_builds(kernels)) for device, kernels in wanted.items()]
        return [(device, slow) for device, slow in builds if slow]

    @staticmethod
    async def _build_slow(builds: Sequence[tuple[Device, list[Any]]]) -> None:
        for device, slow in builds:
            await trio.to_thread.run_sync(device.build_kernels, slow)

    def compile(
        self,
        items: Sequence[Item],
        inputs: Sequence[Buffer] = (),
        *,
        verify: bool | None = None,
        aliasing: str = "refuse",
        order: str = "jit",
        var_vals: Mapping[Any, int] | None = None,
        max_sizes: Sequence[int | None] | None = None,
    ) -> Pending[Graph]:
        """`graph = await rt.compile(items, inputs)`: plan `items` once.

        Returns an awaitable; any other use of it (`async with`, `.plan`, a call) raises
        a UsageError saying to await it. See _compile for the options.
        """
        options = {
            "verify": verify,
            "aliasing": aliasing,
            "order": order,
            "var_vals": var_vals,
            "max_sizes": max_sizes,
        }
        return Pending(self._compile, (items, inputs), options, "rt.compile(...)", "graph")

    async def _compile(
        self,
        items: Sequence[Item],
        inputs: Sequence[Buffer] = (),
        *,
        verify: bool | None = None,
        aliasing: str = "refuse",
        order: str = "jit",
        var_vals: Mapping[Any, int] | None = None,
        max_sizes: Sequence[int | None] | None = None,
    ) -> Graph:
        """Plan `items` once; the Graph replays them with new inputs and var values.

        order="jit" keeps each queue's items in list order. order="cost" lets a list
        scheduler order them by the devices' cost estimates (SIM devices' cost model;
        items elsewhere count as 0 s), so no queue waits behind an item whose data comes
        late while later work of its own is ready. Items that touch the same bytes keep
        their order, so results are the same; errors still name items by their place in
        `items`. Graphs with Vars need `var_vals=` to estimate costs.

        max_sizes=[n0, None, ...] (one per input) lets input i be any buffer of its dtype
        and device with at most n_i elements on each call (None: the captured shape only);
        the plan orders the items that use it as if it always held n_i elements.
        """
        self.check_open()
        if order not in ("jit", "cost"):
            raise UsageError(f"compile(order=...) is 'jit' or 'cost', got {order!r}")
        # One pause of the collector for all the synchronous work: kernels that compile
        # slowly (CUDA's) are built between two, with the collector on.
        with collector_paused():
            checked, inputs, limits, widen, plan = self._plan(items, inputs, verify, max_sizes)
            builds = self._slow_builds(checked)
            if not builds:
                return self._graph(
                    checked, inputs, plan, verify, aliasing, order, var_vals, limits, widen
                )
        await self._build_slow(builds)
        with collector_paused():
            return self._graph(
                checked, inputs, plan, verify, aliasing, order, var_vals, limits, widen
            )

    def _plan(
        self,
        items: Sequence[Item],
        inputs: Sequence[Buffer],
        verify: bool | None,
        max_sizes: Sequence[int | None] | None,
    ) -> tuple[list[Item], list[Buffer], dict[int, int], dict[Buffer, int], Plan]:
        """The checked items and inputs, the inputs' size limits (and in bytes), the plan."""
        checked = self._checked_items(items, "rt.compile")
        if not checked:
            raise UsageError("compile() got no items; a graph needs at least one Launch or Copy")
        for device in {buf.device_object for item in checked for buf in item.bufs}:
            try:
                device.check_reachable()
            except RemoteConnectionError as exc:
                raise ClosedError(f"compile for {device.name}: {exc}") from exc
        takes = "compile(..., inputs=...) takes a list of Buffers"
        inputs = list(listed(inputs, takes, "`rt.compile(items, inputs=[x, ...])`"))
        for i, buf in enumerate(inputs):
            if not isinstance(buf, Buffer):
                raise UsageError(f"input {i} must be a Buffer, got {described(buf)}")
            self.check_own(buf, f"input {i}: ")
            buf.check_live(f"input {i}: ")
            for j, other in enumerate(inputs[:i]):
                if buf.overlaps(other):
                    raise InputError(
                        f"inputs {j} and {i} share memory ({other!r} and {buf!r}); the plan "
                        f"assumes distinct inputs: pass separate buffers"
                    )
        limits = check_max_sizes(inputs, max_sizes)
        widen = {inputs[i]: n * inputs[i].dtype.itemsize for i, n in limits.items()}
        plan = build_plan(plan_items(checked, widen), self.caps)
        if self.verify_plans if verify is None else verify:
            plan.verify()
        return checked, inputs, limits, widen, plan

    def _graph(
        self,
        checked: list[Item],
        inputs: list[Buffer],
        plan: Plan,
        verify: bool | None,
        aliasing: str,
        order: str,
        var_vals: Mapping[Any, int] | None,
        limits: dict[int, int],
        widen: dict[Buffer, int],
    ) -> Graph:
        """The plan lowered onto the actors (list-scheduled first for order="cost")."""
        program = Program(self, checked, inputs, plan)
        if order == "cost":
            program = self._cost_ordered(program, var_vals, widen)
            if self.verify_plans if verify is None else verify:
                program.plan.verify()
        if _log.isEnabledFor(logging.DEBUG):  # counting the waits walks the whole plan
            _log.debug(
                "compiled %d items onto %d queues with %d cross-queue waits",
                len(checked),
                len(program.plan.queues),
                program.plan.wait_count,
            )
        program.max_sizes = limits
        if self.check_replays:
            return CheckedGraph(self, program, aliasing=aliasing, checks=self.check_replays)
        return Graph(self, program, aliasing=aliasing)

    def _cost_ordered(
        self, program: Program, var_vals: Mapping[Any, int] | None, widen: Mapping[Buffer, int]
    ) -> Program:
        values = check_var_vals(program.free_vars, var_vals, "compile(order='cost')")
        ops = program.bind(program.inputs, values).ops
        durations = []
        for j in range(len(program.items)):
            qi, pos = program.where[j]
            durations.append(
                self.device(program.plan.queues[qi].device).estimate_seconds(ops[qi][pos])
            )
        order = list_schedule_order(program.plan, durations)
        items = [program.items[j] for j in order]
        plan = build_plan(plan_items(items, widen), self.caps)
        return Program(self, items, program.inputs, plan, item_numbers=order)


@contextlib.asynccontextmanager
async def open_runtime(devices: Sequence[str], **options: Any) -> AsyncIterator[Runtime]:
    """Open devices and run their queue actors for the duration of the block.

    Options: timeline_start (int, initial device/queue timeline value, < 2**64),
    cpu_thread_bytes (kernels touching at least this many bytes run on the device's
    worker thread), verify_plans (check every compiled plan for deadlocks and races),
    max_in_flight (submissions posted but not complete before submit blocks; 256),
    deadlock_check (seconds between checks of in-flight work; 0.25),
    watchdog (seconds without progress before a stall is logged and recorded; off),
    profile (record item times of every graph replay; read them with `rt.profile()`),
    check_replays (N: the first N replays of every graph also run its items eagerly on
    shadow copies of its memory and compare; a difference raises ReplayMismatchError),
    sim_preset (the cost model of SIM devices: "nvlink8", "pcie8" or an ag.CostModel),
    remote_token / remote_token_file (the token of the workers of remote devices; with
    neither, the file the environment variable ACTORGRAPH_TOKEN_FILE names, if set),
    remote_tls_ca (the CA file the certificates of workers that speak TLS are checked
    against: connections to workers go over TLS), remote_timeout (seconds to connect to
    a worker, default 10).
    """
    runtime = Runtime(devices, **options)
    single: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            try:
                await runtime._start(nursery)
                _log.debug("runtime open on %s", ", ".join(runtime.devices))
                yield runtime
            finally:
                runtime._close()
                _log.debug("runtime on %s closed", ", ".join(runtime.devices))
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # One error (the block's own, or one actor's) comes out as itself; several stay a
        # group. Raised below, outside this handler, so its context stays its own.
        single = sole_exception(group)
        if single is None:
            raise
    if single is not None:
        try:
            raise single
        finally:
            single = None  # no reference cycle through this frame
