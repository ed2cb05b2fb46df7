"""Work for tinygrad's AG devices that tinygrad has asked for and not yet needed.

tinygrad runs a device's kernels and copies one call at a time, and reads results with a
copy out (`.numpy()`) or `synchronize()`. On a worker, each call sent as it comes would
cost a message, and waiting for it a round trip. So an AG device's calls (kernels,
copies in, copies between AG devices, frees, replays of a jit's batches) are recorded
here in the order tinygrad makes them, and go when tinygrad needs a result: all the
records since the last time, planned as one graph and submitted once (one batch per
worker), with the read that needs them in the same submission (`flush`). A call whose
result is never read costs no round trip: nothing waits for it, and it goes with the
next read, or when `limit` records have piled up. The replays of one jit call (tinygrad
cuts a long jit into batches, each replayed on its own) are submitted together, as one
graph where they can be (`ReplayRecord.joins`, Installed._submit_remote).

Everything here runs on the caller's thread except `_submit`, which runs on the
background runtime's thread (a `Call`), in the order the flushes were made: the runtime
orders each submission after the ones before it on the same devices. The memory of an AG
device (`AGMemory`) is allocated on its worker when work first uses it, on that thread,
and freed after the work submitted before its free.

Failures are never lost: a submission nobody waits for that fails raises its error at
the next flush (the next read, `synchronize()`), or from the next call on the runtime.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import trio

from .._background import BackgroundRuntime
from .._buffer import Buffer
from .._eager import HostCopy
from .._errors import ClosedError, UsageError
from .._graph import Replay
from .._kernel import Copy, Item, Kernel, Launch
from .._runtime import Runtime
from .._submitted import Submitted
from .._vars import Var

U8 = np.dtype(np.uint8)
# A host read to go with the replays submitted last: a worker's buffer, and the array
# (tinygrad's memory, as uint8) its bytes land in.
Reading = tuple[Buffer, np.ndarray[Any, Any]]


class AGMemory:
    """Bytes on an AG device: an allocation on a worker device (`base` None), or `nbytes`
    from `offset` into one. Allocated on the worker the first time work uses it
    (`buffer`, on the runtime's thread); its Buffer is kept, so a graph that is given
    the same memory again binds it as before.

    `releases` counts the times tinygrad let go of it (its buffer deallocated: the memory
    then waits in tinygrad's cache for the next buffer of its size, or is freed): a jit
    that held it when it was read holds it no more once that count moved."""

    __slots__ = ("_buffer", "base", "device", "nbytes", "offset", "owner", "releases")

    def __init__(
        self,
        device: str,
        nbytes: int,
        base: AGMemory | None = None,
        offset: int = 0,
        owner: Any = None,
    ) -> None:
        self.device = device  # actorgraph's name: KIND:N@HOST:PORT
        self.nbytes = nbytes
        self.base = base
        self.offset = offset
        # The work queue (Pending) of the install() it was made under: memory outlives
        # an uninstall in tinygrad's tensors and caches, but not on its worker.
        self.owner: Any = owner if base is None else base.owner
        self._buffer: Buffer | None = None
        self.releases = 0

    def __repr__(self) -> str:
        where = f" at {self.offset} of {self.base!r}" if self.base is not None else ""
        return f"<AGMemory {self.nbytes}B on {self.device}{where}>"

    def root(self) -> AGMemory:
        return self if self.base is None else self.base

    def view(self, nbytes: int, offset: int) -> AGMemory:
        """`nbytes` from `offset` into this memory, as a view of its allocation."""
        root = self.root()
        return AGMemory(self.device, nbytes, root, self.offset + offset)

    def release(self) -> None:
        """tinygrad let go of this allocation (see `releases`); any thread."""
        self.releases += 1

    def buffer(self, runtime: Runtime) -> Buffer:
        """Its Buffer (uint8), allocated on the worker on first use. Only on the runtime's
        own thread: there, making it and keeping it are one step, so work recorded
        earlier and a replay resolving the same memory share one allocation.

        Raises:
            ClosedError: the memory was made under an earlier install(), whose runtime
                (and the memory on its workers) is gone.
        """
        found = self._buffer
        if found is not None:
            if found.runtime is not runtime:
                raise ClosedError(
                    f"tinygrad memory on {self.device} was made while actorgraph.tinygrad was "
                    f"installed before; it went with that installation (uninstall() closed "
                    f"its runtime): make the tensor again"
                )
            return found
        if self.base is None:
            found = runtime.alloc(self.device, max(self.nbytes, 1), U8)
        else:
            found = self.base.buffer(runtime).view(self.offset, self.nbytes)
        self._buffer = found
        return found

    def allocated(self) -> Buffer | None:
        """Its Buffer if work ever used it (else there is nothing to free)."""
        return self._buffer


# -- what is recorded --


class LaunchRecord:
    """A kernel call on an AG device; `values` its var values (fixed for this call)."""

    __slots__ = ("global_size", "kernel", "memory", "values")

    def __init__(
        self,
        kernel: Kernel,
        memory: Sequence[AGMemory],
        values: Sequence[int],
        global_size: tuple[int, ...],
    ) -> None:
        self.kernel = kernel
        self.memory = tuple(memory)
        self.values = tuple(values)
        self.global_size = global_size

    def item(self, runtime: Runtime) -> Item:
        variables = [Var(f"value_{k}", value, value) for k, value in enumerate(self.values)]
        return Launch(
            self.kernel,
            [m.buffer(runtime) for m in self.memory],
            vars=variables,
            fixedvars=dict(zip(variables, self.values)),
            global_size=self.global_size,
        )


class WriteRecord:
    """Host bytes into AG memory (taken when tinygrad gave them: it may reuse its own)."""

    __slots__ = ("data", "memory")

    def __init__(self, memory: AGMemory, data: np.ndarray[Any, Any]) -> None:
        self.memory = memory
        self.data = data

    async def submit(self, runtime: Runtime) -> HostCopy:
        return await runtime.submit_copyin(self.memory.buffer(runtime), self.data)


class CopyRecord:
    """A copy between two AG memories (worker to worker when they differ)."""

    __slots__ = ("dst", "src")

    def __init__(self, dst: AGMemory, src: AGMemory) -> None:
        self.dst = dst
        self.src = src

    def item(self, runtime: Runtime) -> Item:
        return Copy(dst=self.dst.buffer(runtime), src=self.src.buffer(runtime))


class FreeRecord:
    """AG memory tinygrad let go of: freed once the work recorded before it is done."""

    __slots__ = ("memory",)

    def __init__(self, memory: AGMemory) -> None:
        self.memory = memory


class ReplayRecord:
    """A replay of a jit's batch over AG devices: its batch, its roots as far as this
    thread resolves them, the host memory the jit holds, its var values, and `call`, the
    jit call it is part of (tinygrad's own object for that call, compared by identity:
    a record keeps it alive until it is submitted). `start` submits a run of replays
    recorded one after another on the runtime's thread, returning a Replay for each
    graph it submitted (one, where it could plan the run as one graph), and whether the
    host read it was given (`Reading`: a buffer and the array its bytes go to) went with
    the last one (Graph.submit_reading); if not, the caller reads it after them."""

    __slots__ = ("batch", "call", "held", "roots", "start", "values")

    def __init__(
        self,
        batch: Any,
        roots: Sequence[Any],
        held: Any,
        values: dict[Var, int] | None,
        call: object,
        start: Callable[
            [Sequence[ReplayRecord], Runtime, Reading | None], Awaitable[tuple[list[Replay], bool]]
        ],
    ) -> None:
        self.batch = batch
        self.roots = roots
        self.held = held
        self.values = values
        self.call = call
        self.start = start

    def joins(self, run: Sequence[ReplayRecord]) -> bool:
        """Whether this replay goes with `run`, the replays recorded just before it: the
        next part of the same jit call (tinygrad cuts a jit's work into batches of 32,
        64, ... calls, each replayed on its own) whose batch the run does not have yet."""
        first = run[0]
        return (
            self.call is not None
            and self.call is first.call
            and self.start == first.start
            and all(self.batch is not other.batch for other in run)
        )


Record = LaunchRecord | WriteRecord | CopyRecord | FreeRecord | ReplayRecord
_ITEM_RECORDS = (LaunchRecord, CopyRecord)


class Pending:
    """The AG work recorded and not yet submitted, and the submissions in flight.

    Invariant: records are submitted in the order they were added, each flush after
    the ones before (one runtime Call each, which the runtime runs in order).
    """

    def __init__(
        self, runtime: BackgroundRuntime, remote: Sequence[str], limit: int = 1024
    ) -> None:
        self._runtime = runtime
        self._remote = tuple(remote)
        self._lock = threading.Lock()
        self._records: list[Record] = []
        self._limit = limit
        # On the runtime's thread only: what was submitted and is not known done.
        self._in_flight: list[Submitted] = []
        self.flushes = 0  # flushes with something to submit

    def add(self, record: Record) -> None:
        with self._lock:
            self._records.append(record)
            full = len(self._records) >= self._limit
        if full:
            self.flush()

    def flush(self, wait: bool = False, here: bool = False) -> None:
        """Submit what is recorded, in order; with `wait`, return once every submission
        made so far is done, raising the first failure; with `here`, once what this flush
        submits is done on this host's devices (Submitted.wait_here)."""
        with self._lock:
            records, self._records = self._records, []
        if not records and not wait:
            return
        call = self._runtime.call(self._submit, records, wait, None, here)
        if wait or here:
            call.result()

    def read(self, dest: memoryview, src: AGMemory) -> None:
        """Copy `src` into host memory `dest` after everything recorded: submitted with
        the rest (one message per worker), then waited for."""
        with self._lock:
            records, self._records = self._records, []
        self._runtime.call(self._submit, records, True, (dest, src)).result()

    # -- on the runtime's thread --

    def _connections(self, runtime: Runtime) -> list[Any]:
        found: dict[int, Any] = {}
        for name in self._remote:
            connection = runtime.device(name).connection  # type: ignore[attr-defined]
            found[id(connection)] = connection
        return list(found.values())

    async def _submit(
        self,
        records: list[Record],
        wait: bool,
        read: tuple[memoryview, AGMemory] | None,
        here: bool = False,
    ) -> None:
        runtime = self._runtime.runtime
        self._reap()
        connections = self._connections(runtime)
        submitted = len(self._in_flight)
        held = _HeldSends(connections)  # what follows goes in one message per worker
        try:
            await self._submit_records(runtime, records, read, held)
        finally:
            held.let_go()
        if records:
            self.flushes += 1
        if wait:
            await self._wait_all()
        elif here:
            for entry in self._in_flight[submitted:]:
                await entry.wait_here()

    async def _submit_records(
        self,
        runtime: Runtime,
        records: list[Record],
        read: tuple[memoryview, AGMemory] | None,
        held: _HeldSends,
    ) -> None:
        items: list[Item] = []
        frees: list[AGMemory] = []
        runs: list[ReplayRecord] = []  # replays of one jit call, submitted together
        for record in records:
            if runs and not (isinstance(record, ReplayRecord) and record.joins(runs)):
                await self._submit_replays(runtime, runs, held, None)
                runs = []
            if isinstance(record, _ITEM_RECORDS):
                items.append(record.item(runtime))
            elif isinstance(record, FreeRecord):
                frees.append(record.memory)
            else:
                await self._submit_items(runtime, items, held)
                items = []
                if isinstance(record, ReplayRecord):
                    runs.append(record)
                    continue
                held.let_go_if_full(runtime)
                self._in_flight.append(await record.submit(runtime))
        # Straight into tinygrad's memory: its bytes, of the buffer's (uint8) shape.
        reading = None if read is None else (read[1].buffer(runtime), np.frombuffer(read[0], U8))
        if await self._submit_replays(runtime, runs, held, reading):
            reading = None  # it went with the replay of the jit call just before it
        await self._submit_items(runtime, items, held)
        if reading is not None:
            held.let_go_if_full(runtime)
            copy = await runtime.submit_copyout(reading[0], out=reading[1])
            self._in_flight.append(copy)
        for memory in frees:
            buf = memory.allocated()
            if buf is not None:
                runtime.free(buf)  # given back once the work submitted before is done

    async def _submit_items(self, runtime: Runtime, items: list[Item], held: _HeldSends) -> None:
        if items:
            graph = await runtime.compile(items)
            held.let_go_if_full(runtime)
            self._in_flight.append(await graph.submit())

    async def _submit_replays(
        self,
        runtime: Runtime,
        runs: list[ReplayRecord],
        held: _HeldSends,
        reading: Reading | None,
    ) -> bool:
        """Submit the replays of one jit call (`runs`), with `reading` if the last of
        them can take it: whether it did."""
        if not runs:
            return False
        held.let_go_if_full(runtime)
        replays, read = await runs[0].start(runs, runtime, reading)
        self._in_flight += replays
        return read

    def _reap(self) -> None:
        """Forget the submissions that are done, raising the first failure of one."""
        done = [entry for entry in self._in_flight if entry.done]
        if done:
            self._in_flight = [entry for entry in self._in_flight if not entry.done]
            for entry in done:
                entry.finish()

    async def _wait_all(self) -> None:
        """Wait for every submission in flight (all of them, even past a failure), then
        raise the first failure."""
        in_flight, self._in_flight = self._in_flight, []
        failure: BaseException | None = None
        waited = False
        for entry in in_flight:
            try:
                # One done already is finished here: each wait is a pass of the run's
                # scheduler, and those that end together (a replay and the read after
                # it, told of in one message) need none each.
                if entry.done:
                    entry.finish()
                else:
                    waited = True
                    await entry.wait()
            except Exception as error:  # noqa: BLE001 - raised below, once all are done
                failure = failure or error
        if not waited:
            await trio.lowlevel.checkpoint()
        if failure is not None:
            raise failure


def check_remote_names(names: Sequence[str]) -> list[str]:
    """The worker devices `install(remote=...)` was given, each `KIND:N@HOST:PORT`."""
    from actorgraph.devices import parse_remote_name

    out = []
    for name in names:
        if not isinstance(name, str) or parse_remote_name(name) is None:
            raise UsageError(
                f"install(remote=...) takes worker device names like 'CPU:0@10.0.0.5:7000', "
                f"got {name!r}; name each worker device as KIND:N@HOST:PORT"
            )
        if name in out:
            raise UsageError(f"install(remote=...) names {name!r} twice; name each device once")
        out.append(name)
    return out


class _HeldSends:
    """A flush's hold on what its connections send (its submissions go in one message per
    worker), let go of once: at its end, or before a submission that waits for room in
    the runtime's in-flight window. That room is made by submissions completing, and
    those of this flush cannot while their messages are held: from there on, they go
    as they come."""

    __slots__ = ("_connections",)

    def __init__(self, connections: list[Any]) -> None:
        self._connections = connections
        for connection in connections:
            connection.hold_sends()

    def let_go(self) -> None:
        connections, self._connections = self._connections, []
        for connection in connections:
            connection.release_sends()

    def let_go_if_full(self, runtime: Runtime) -> None:
        if self._connections and not runtime.window.has_room():
            self.let_go()
