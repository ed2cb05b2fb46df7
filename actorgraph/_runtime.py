"""The runtime: its devices and their actors, alive in a nursery, and its parts.

`Runtime` is what a user holds. It opens the devices, starts their actors, says whether
it can take work (open, not broken), and answers for its buffers (only its own are
taken). Its work is done by its parts, each an object with its own state:

- `Memory` (_memory.py): buffers allocated, wrapped and freed;
- `Window` and `Watch` (_window.py): the submissions in flight and room for more, and
  the deadlock and stall watch over them;
- `Graphs` (_compile.py): graphs compiled, and every graph's replay counts;
- `Eager` (_eager.py): items run now, host copies;
- `Profiles` (_profile.py): the profiled replays, until asked for.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from actorgraph.devices import Device, Signal, join_sim_devices, open_devices
from actorgraph.scheduler import DeviceCaps

from ._await import Pending
from ._buffer import Buffer
from ._compile import Graphs
from ._eager import Eager, HostCopy
from ._errors import ClosedError, UsageError
from ._graph import Graph
from ._groups import sole_exception
from ._kernel import Copy, Item, Kernel, Launch
from ._log import logger as _log
from ._memory import Memory
from ._options import check_options
from ._profile import Profile, Profiles
from ._window import StallReport, Watch, Window

# Numbers runtimes in messages that name two of them (a buffer of one passed to another).
_runtime_numbers = itertools.count(1)


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


def _check_names(device_names: Sequence[str]) -> None:
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


class Runtime:
    """Devices and their actors, alive inside `async with open_runtime(...)`."""

    def __init__(self, device_names: Sequence[str], **options: Any) -> None:
        """Open the devices `device_names` with `options` (see open_runtime). Raises
        UsageError for a bad list of names or an option nothing takes."""
        _check_names(device_names)
        check_options(device_names, options)
        timeline_start = int(options.pop("timeline_start", 0))
        self.verify_plans = bool(options.pop("verify_plans", False))
        # How many replays of each graph are checked against eager (0: none, no cost).
        self.check_replays = int(options.pop("check_replays", 0))
        self.deadlock_check = float(options.pop("deadlock_check", 0.25))
        watchdog = options.pop("watchdog", None)
        max_in_flight = int(options.pop("max_in_flight", 256))
        profile = bool(options.pop("profile", False))
        self._open = False
        self._closed = False
        self._broken: BaseException | None = None
        # Invariant: usable == (open and not broken), so a hot path tests one attribute
        # and calls check_open() for the error only when it is False.
        self.usable = False
        # Moves whenever a binding a graph keeps may no longer be used as it is: a buffer
        # was freed, or the runtime became unusable (broken, closed). See Graph.__call__.
        self.epoch = 0
        self.number = next(_runtime_numbers)
        self._devices: dict[str, Device] = open_devices(
            device_names, timeline_start=timeline_start, **options
        )
        # Its SIM devices are one simulated machine: their copies share its links.
        join_sim_devices(self._devices.values())
        self.caps: dict[str, DeviceCaps] = {name: dev.caps for name, dev in self._devices.items()}
        # KICK: a submission's queues start once the runtime admits it.
        self.kick = Signal("KICK", 0)
        self.window = Window(max_in_flight, self.check_open)
        self._watch = Watch(
            self.window,
            list(self._devices.values()),
            self.deadlock_check,
            None if watchdog is None else float(watchdog),
            self._break,
        )
        self.profiles = Profiles(profile, self.actor_names)
        self.graphs = Graphs(self, self.check_replays)
        self._memory = Memory(self, self.device, self.window)
        self._eager = Eager(self)

    # -- lifecycle --

    async def _start(self, nursery: trio.Nursery) -> None:
        for device in self._devices.values():
            await device.start(nursery)
        nursery.start_soon(self._watch.run)
        self.window.start(nursery)
        self._open = True
        self.usable = self._broken is None

    def _close(self) -> None:
        self._open = False
        self.usable = False
        self.epoch += 1
        self._closed = True
        for device in self._devices.values():
            device.close()

    def _break(self, error: BaseException) -> None:
        """A sticky fault: fail everything in flight and every later call with `error`."""
        if self._broken is None:
            self._broken = error
            self.usable = False
            self.epoch += 1
            _log.error("runtime broken: %s", error)
        self.window.fail_all(error)

    def check_open(self) -> None:
        """Raise ClosedError, saying why, unless the runtime can take work: started, not
        exited, not broken by an earlier fault."""
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
    def closed(self) -> bool:
        """Whether the runtime's `async with` block has exited."""
        return self._closed

    def __repr__(self) -> str:
        state = " (closed)" if self._closed else ""
        return f"<Runtime {self.number} on {', '.join(self._devices)}{state}>"

    # -- its devices --

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self._devices)

    def device(self, name: str) -> Device:
        """The open device `name`; raises UsageError naming the open ones otherwise."""
        try:
            return self._devices[name]
        except KeyError:
            raise UsageError(
                f"device {name!r} is not open in this runtime (open: {list(self._devices)}); "
                f"add it to open_runtime([...])"
            ) from None

    def actor_names(self) -> tuple[str, ...]:
        return tuple(a.name for d in self._devices.values() for a in d.queues.values())

    # -- its buffers --

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

    def alloc(self, device: str, shape: int | tuple[int, ...], dtype: Any = np.float32) -> Buffer:
        """A new buffer on `device`, filled with zeros.

        `shape` (an int or a tuple) counts elements of `dtype`, never bytes:
        `rt.alloc("CPU:0", 1024, np.float32)` holds 1024 floats, 4096 bytes (`buf.nbytes`).
        Memory starts as zeros on every device kind (a CUDA device sets it with a memset).
        """
        self.check_open()
        return self._memory.alloc(device, shape, dtype)

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
        return self._memory.wrap(device, source, nbytes, dtype, shape)

    def free(self, buffer: Buffer) -> None:
        """Release a base buffer's memory; later use of it or its views is an error.
        Work submitted before may still use the memory (no later work can): its device
        gets it back, or a wrapper's exporter is let go of, once that work is done
        (`frees_pending` counts those waiting)."""
        self._memory.free(buffer)
        # Graphs re-check their buffers' liveness when the epoch moves.
        self.epoch += 1

    @property
    def frees(self) -> int:
        """Buffers freed."""
        return self._memory.frees

    @property
    def frees_pending(self) -> int:
        """Buffers freed while submitted work might still use them, not yet released."""
        return self._memory.pending

    # -- its work --

    async def copyin(self, buffer: Buffer, array: Any) -> None:
        """Copy a host array into `buffer` (after all earlier work on its device)."""
        self.check_open()
        await self._eager.copyin(buffer, array)

    async def copyout(self, buffer: Buffer) -> np.ndarray[Any, Any]:
        """A host copy of `buffer`'s contents (after all earlier work on its device)."""
        self.check_open()
        return await self._eager.copyout(buffer)

    async def submit_copyin(self, buffer: Buffer, array: Any) -> HostCopy:
        """`copyin` without waiting for it to be done: it is submitted (after all earlier
        work on its device) when this returns, and the HostCopy says when it is done
        (`await copy.wait()` raises its failure). On a remote device the bytes go with
        the request, in one message. Raises what `copyin` raises."""
        self.check_open()
        return await self._eager.submit_copyin(buffer, array)

    async def submit_copyout(self, buffer: Buffer) -> HostCopy:
        """`copyout` without waiting for it: once the HostCopy is done (`await
        copy.wait()`), `copy.array` holds the bytes of `buffer` as of that point. Raises
        what `copyout` raises."""
        self.check_open()
        return await self._eager.submit_copyout(buffer)

    async def run(self, items: Sequence[Item], var_vals: Mapping[Any, int] | None = None) -> None:
        """Run items eagerly, one after another: the reference semantics for graphs."""
        self.check_open()
        await self._eager.run(items, var_vals)

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
        """`graph = await rt.compile(items, inputs)`: plan `items` once; the Graph
        replays them with new inputs and var values.

        Returns an awaitable; any other use of it (`async with`, `.plan`, a call) raises
        a UsageError saying to await it.

        verify (None: as open_runtime's verify_plans) checks the plan for deadlocks and
        races. aliasing="replan" plans again for inputs that share memory (else such a
        call is refused). order="jit" keeps each queue's items in list order.
        order="cost" lets a list scheduler order them by the devices' cost estimates
        (SIM devices' cost model; items elsewhere count as 0 s), so no queue waits
        behind an item whose data comes late while later work of its own is ready.
        Items that touch the same bytes keep their order, so results are the same;
        errors still name items by their place in `items`. Graphs with Vars need
        `var_vals=` to estimate costs.

        max_sizes=[n0, None, ...] (one per input) lets input i be any buffer of its dtype
        and device with at most n_i elements on each call (None: the captured shape only);
        the plan orders the items that use it as if it always held n_i elements.
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
        self.check_open()
        return await self.graphs.compile(
            items, inputs, verify, aliasing, order, var_vals, max_sizes
        )

    # -- what it has done --

    @property
    def submissions(self) -> int:
        """Submissions made (replays, eager items, host copies): each moves the KICK by one
        as it is made, posted or run where it was made."""
        return self.kick.value

    @property
    def replays(self) -> int:
        """Graph replays submitted: those finished and those in flight, over every graph."""
        return self.graphs.replays

    @property
    def replays_done(self) -> int:
        """Graph replays finished, over every graph."""
        return self.graphs.replays_done

    @property
    def graphs_compiled(self) -> int:
        return self.graphs.compiled

    @property
    def in_flight(self) -> int:
        return self.window.in_flight

    @property
    def max_in_flight(self) -> int:
        return self.window.max_in_flight

    @property
    def profiling(self) -> bool:
        """Whether every graph replay is profiled (`open_runtime(..., profile=True)`)."""
        return self.profiles.every

    @property
    def watchdog(self) -> float | None:
        return self._watch.watchdog

    @property
    def stalls(self) -> list[StallReport]:
        """What the watchdog reported: a StallReport per stretch without progress."""
        return self._watch.stalls

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
            waiting_for_room=self.window.waiting,
            reserved=self.window.reserved,
        )

    def profile(self, *, clear: bool = False) -> Profile:
        """Every profiled replay so far, as one Profile (`clear=True` starts afresh after).

        Replays are profiled with `open_runtime(..., profile=True)` or `graph(..., profile=True)`.
        """
        return self.profiles.profile(clear)


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
