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

from actorgraph.devices import Device, Resumer, Signal, join_sim_devices, open_devices
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
    """Devices and their queue actors, alive inside `async with open_runtime(...)`.

    Open one with `open_runtime`; every call below is ordered with all other work on the
    devices it touches (each device keeps a timeline that every submission advances).
    """

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
        # Runs on the jobs held on its queues' signals, in the task that moves them: one
        # for all its devices (and, on a worker, its sessions), so held jobs never run
        # one inside another (devices/_inline.py).
        self.resumer = Resumer()
        self._devices: dict[str, Device] = open_devices(
            device_names, timeline_start=timeline_start, resumer=self.resumer, **options
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
        """The names of the devices this runtime opened, in the order given."""
        return tuple(self._devices)

    def device(self, name: str) -> Device:
        """The open device of this name (its queues, its statistics, a worker's connection).

        Args:
            name: a device name given to open_runtime, say "CPU:0".

        Returns:
            The device object.

        Raises:
            UsageError: no device of that name is open in this runtime.
        """
        try:
            return self._devices[name]
        except KeyError:
            raise UsageError(
                f"device {name!r} is not open in this runtime (open: {list(self._devices)}); "
                f"add it to open_runtime([...])"
            ) from None

    def actor_names(self) -> tuple[str, ...]:
        """The names of the queue actors, in device order: "CPU:0/compute", "CPU:0/copy", ...

        Returns:
            One name per queue actor of every device, as profiles and timelines name rows.
        """
        return tuple(a.name for d in self._devices.values() for a in d.queues.values())

    # -- its buffers --

    def owns(self, buffer: Buffer) -> bool:
        """Whether this runtime made `buffer`.

        Args:
            buffer: a Buffer, of this runtime or another (which may have a device of the same
                name).

        Returns:
            True when this runtime allocated or wrapped it.
        """
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

        Memory starts as zeros on every device kind (a CUDA device sets it with a memset that
        finishes before alloc returns).

        Args:
            device: the name of an open device, say "CPU:0".
            shape: an int or a tuple of ints >= 0 (numpy ints too): how many elements of
                `dtype`, never bytes. `rt.alloc("CPU:0", 1024, np.float32)` holds 1024 floats,
                4096 bytes (`buf.nbytes`).
            dtype: a numpy dtype of fixed-size numbers (bool, int, uint, float, complex) or raw
                bytes ("V8").

        Returns:
            The Buffer, owned by this runtime.

        Raises:
            UsageError: the device is not open, the shape is not one of ints >= 0 or holds more
                than 2**63 - 1 bytes, or the dtype is an object, string, structured, sub-array
                or date dtype.
            ClosedError: the runtime has closed (or an earlier fault broke it), or the device
                is a worker's whose connection is lost.
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

        Buffers made by wrap on one device compare by address: two wrappers of overlapping
        memory alias, so the planner orders items that use them. `rt.free(buf)` forgets the
        wrapper and makes later use of it a BufferFreedError; the memory stays its owner's:
        an exporter is kept alive until the work submitted before the free is done, and
        memory given by address must be kept alive by the caller that long.

        Args:
            device: the CPU device whose work the memory joins, say "CPU:0".
            source: an address (an int, with `nbytes=`), or an object exporting host memory
                through `__dlpack__` or the buffer protocol (a numpy array, say), which the
                Buffer keeps alive. Read-only memory is refused.
            nbytes: the size in bytes of the memory at an address.
            dtype: the numpy dtype of the Buffer's elements.
            shape: the Buffer's shape in elements (default: all of the memory, flat).

        Returns:
            The Buffer.

        Raises:
            UsageError: `source` is a Buffer of this runtime (use it, or a view of it), memory
                already wrapped on another device or allocated by `rt.alloc`, memory that is
                not host memory, read-only or not contiguous, or a size, dtype or shape that
                does not fit it.
            ClosedError: the runtime has closed, or an earlier fault broke it.
        """
        self.check_open()
        return self._memory.wrap(device, source, nbytes, dtype, shape)

    def free(self, buffer: Buffer) -> None:
        """Release a base buffer's memory; later use of it or of its views is an error.

        It returns at once: work submitted before it (a `graph.submit()` not yet awaited, say)
        still finishes with the memory, which goes back to the device when that work is done
        (`rt.frees_pending` counts the wait). A wrapped buffer's memory stays its owner's.

        Args:
            buffer: a base Buffer (not a view) of this runtime.

        Raises:
            UsageError: `buffer` is no Buffer, is a view, belongs to another runtime, or was
                freed already (BufferFreedError).
        """
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
        """Copy a host array into `buffer`, after all earlier work on its device.

        Args:
            buffer: the Buffer to write, of this runtime.
            array: host data of the buffer's dtype and size (a numpy array, or anything numpy
                turns into one); another dtype is refused, naming the astype that fixes it.

        Raises:
            UsageError: `buffer` is no live Buffer of this runtime, or `array` is no host data
                of its size; or an @ag.jit function being captured calls it (a replay cannot
                repeat it).
            ClosedError: the runtime has closed, or the buffer's worker is lost.
        """
        self.check_open()
        await self._eager.copyin(buffer, array)

    async def copyout(
        self, buffer: Buffer, out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        """A host copy of `buffer`'s contents, after all earlier work on its device.

        Args:
            buffer: the Buffer to read, of this runtime.
            out: a numpy array to copy into (writable, C-contiguous, of the buffer's
                shape and dtype), instead of a new one.

        Returns:
            `out`, or a new numpy array of the buffer's shape and dtype.

        Raises:
            UsageError: `buffer` is no live Buffer of this runtime; `out` cannot hold it;
                or an @ag.jit function being captured calls it.
            ClosedError: the runtime has closed, or the buffer's worker is lost.
        """
        self.check_open()
        return await self._eager.copyout(buffer, out)

    async def submit_copyin(self, buffer: Buffer, array: Any) -> HostCopy:
        """`copyin` without waiting for it to be done: it is submitted (after all earlier
        work on its device) when this returns, and the HostCopy says when it is done.
        On a remote device the bytes go with the request, in one message.

        Args:
            buffer: the Buffer to write, of this runtime.
            array: host data of the buffer's dtype and size (copied now: the caller may
                change it at once).

        Returns:
            The HostCopy: `await copy.wait()` waits for it.

        Raises:
            UsageError: as `copyin`.
            ClosedError: the runtime has closed, or the buffer's worker is lost.
        """
        self.check_open()
        return await self._eager.submit_copyin(buffer, array)

    async def submit_copyout(
        self, buffer: Buffer, out: np.ndarray[Any, Any] | None = None
    ) -> HostCopy:
        """`copyout` without waiting for it: once the HostCopy is done (`await
        copy.wait()`), `copy.array` holds the bytes of `buffer` as of that point.

        Args:
            buffer: the Buffer to read, of this runtime.
            out: a numpy array to copy into (as for `copyout`): then `copy.array`.

        Returns:
            The HostCopy.

        Raises:
            UsageError: `buffer` is no live Buffer of this runtime, or an @ag.jit function
                being captured calls it.
            ClosedError: the runtime has closed, or the buffer's worker is lost.
        """
        self.check_open()
        return await self._eager.submit_copyout(buffer, out)

    async def run(self, items: Sequence[Item], var_vals: Mapping[Any, int] | None = None) -> None:
        """Run items eagerly, one after another: the reference semantics for graphs.

        Inside an @ag.jit function the items are recorded into the capture too.

        Args:
            items: a list of Launch and Copy items on this runtime's buffers.
            var_vals: the value of every Var the items' launches read, `{n: 1000}`.

        Raises:
            UsageError: an item is no Launch or Copy, or uses a buffer of another runtime.
            VarError: a Var the items need has no value, or one outside its bounds.
            ItemError: an item raised while it ran; the original error is its `__cause__`.
        """
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
        """Launch one kernel now: `rt.run([Launch(...)])`, recorded inside an @ag.jit function.

        Args:
            kernel: the Kernel to run.
            bufs: its buffers, in the kernel's slot order.
            vars: the Vars the kernel body takes after the buffers.
            fixedvars: Var values fixed for this launch, `{n: 4096}`.
            global_size: the launch's grid (an int, a tuple, or expressions of Vars).
            local_size: the launch's block (likewise).
            var_vals: the call's values of the Vars that are not fixed.

        Raises:
            UsageError: see `run` and `Launch`.
            VarError: a Var has no value, or one outside its bounds.
            ItemError: the kernel raised.
        """
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
        """Copy `src` into `dst` now: `rt.run([Copy(dst, src)])`, recorded inside @ag.jit.

        Args:
            dst: the Buffer written.
            src: the Buffer read: the same dtype and size, on any device of this runtime.

        Raises:
            UsageError: see `run` and `Copy`.
            ItemError: the copy failed.
        """
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
        """Plan `items` once: `graph = await rt.compile(items, inputs=[...])`.

        The Graph replays the items with new input buffers and Var values on every call.

        Args:
            items: a list of Launch and Copy items on this runtime's buffers.
            inputs: the buffers a call may replace, in the order calls pass them.
            verify: prove the plan deadlock-free and race-free (default: the runtime's
                `verify_plans`).
            aliasing: "refuse" (inputs sharing memory with each other or with a buffer the
                graph uses internally are an error) or "replan" (plan again for that aliasing,
                cached per set of input buffers).
            order: "jit" keeps each queue's items in list order; "cost" lets a list scheduler
                order them by the devices' cost estimates (SIM's cost model; items elsewhere
                count as 0 s), keeping the order of items that touch the same bytes, so
                results are the same.
            var_vals: Var values for the cost estimates of `order="cost"`.
            max_sizes: one entry per input: `n` lets that input be any buffer of its dtype and
                device with at most `n` elements per call (the plan treats it as holding `n`);
                None keeps the compiled shape.

        Returns:
            An awaitable of the Graph; any other use of it (`async with`, `.plan`, a call)
            raises a UsageError saying to await it.

        Raises:
            UsageError: no items, an item or input that is no Buffer of this runtime, inputs
                that overlap, or a bad option (checked when awaited).
            PlanError: the plan fails its verification (`verify=True`).
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
        return await self.graphs.compile(
            items, inputs, verify, aliasing, order, var_vals, max_sizes
        )

    # -- what it has done --

    @property
    def submissions(self) -> int:
        """How many submissions were made (replays, eager items and host copies).

        Each moves the runtime's KICK timeline by one as it is made, posted or run where it
        was made.
        """
        return self.kick.value

    @property
    def replays(self) -> int:
        """Graph replays submitted over every graph, finished or still in flight."""
        return self.graphs.replays

    @property
    def replays_done(self) -> int:
        """Graph replays finished, over every graph."""
        return self.graphs.replays_done

    @property
    def graphs_compiled(self) -> int:
        """How many graphs this runtime has compiled."""
        return self.graphs.compiled

    @property
    def in_flight(self) -> int:
        """Submissions posted to the actors and not complete yet."""
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
        """A frozen snapshot of the runtime's counts.

        Returns:
            Replays submitted and done, submissions in flight, waits parked and the seconds
            blocked on them, bytes copied, and each actor's own statistics (`.actors`).
        """
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
        """Every profiled replay so far, as one Profile.

        Replays are profiled with `open_runtime(..., profile=True)` (every replay) or
        `graph(..., profile=True)` (that replay).

        Args:
            clear: forget the records after reading them, so the next profile starts afresh.

        Returns:
            The Profile: an event per item per profiled replay.
        """
        return self.profiles.profile(clear)


@contextlib.asynccontextmanager
async def open_runtime(devices: Sequence[str], **options: Any) -> AsyncIterator[Runtime]:
    """Open devices and run their queue actors for the duration of the block.

    `async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:` gives the Runtime; leaving the
    block cancels and joins every actor (work they never ran fails with ClosedError). An
    error raised in the block comes out as itself; several at once as an ExceptionGroup.

    Args:
        devices: device names: "CPU:N", "SIM:N", "CUDA:N", or "KIND:N@HOST:PORT" for a
            device of a worker.
        **options: the runtime's and the device kinds' options (an option of a kind not
            opened is no error):
            `timeline_start` (the first timeline value, below 2**64),
            `verify_plans` (prove every compiled plan deadlock- and race-free),
            `profile` (record the item times of every replay; read them with
            `rt.profile()`),
            `check_replays` (N: the first N replays of every graph also run its items
            eagerly on shadow copies of its memory and compare every byte written; a
            difference raises ReplayMismatchError),
            `max_in_flight` (submissions posted and not complete before submitting
            blocks; 256),
            `deadlock_check` (seconds between checks of in-flight work; 0.25),
            `watchdog` (seconds without progress before a stall is logged and recorded
            in `rt.stalls`; off),
            `cpu_thread_bytes` (CPU kernels touching at least this many bytes run on the
            device's worker thread; 1 MiB),
            `sim_preset` (SIM devices' cost model: "nvlink8", "pcie8", "nvlink8x8",
            "pcie4x4" or an ag.CostModel),
            `cuda_driver` ("fake" runs CUDA devices without a GPU), `cuda_graphs`,
            `cuda_graph_min_items`, `cuda_mem_ops`, `cuda_no_peer`,
            `remote_token` / `remote_token_file` (the workers' token; with neither, the
            file the environment variable ACTORGRAPH_TOKEN_FILE names, if set),
            `remote_tls_ca` (the CA file workers' certificates are checked against: the
            connections speak TLS; with none, the file the environment variable
            ACTORGRAPH_TLS_CA names, if set), `remote_timeout` (seconds to connect and pass the
            handshake; 10).

    Yields:
        The open Runtime.

    Raises:
        UsageError: no devices, a device listed twice, an option that nothing takes (the
            message names the closest one), or a bad option value.
        DeviceError: a device name of no known kind, or a device that cannot open here.
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
