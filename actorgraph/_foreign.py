"""Memory actorgraph did not allocate, wrapped as Buffers (`rt.wrap`), and timelines of
other runtimes that replays order against (`ExternalTimeline`, and the replays of a
runtime waiting for them: `TimelineWaits`)."""

from __future__ import annotations

import ctypes
import math
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import trio

from ._buffer import Allocation, Buffer, Home, _shape_of, buffer_dtype, check_count, new_alloc_id
from ._errors import ClosedError, UsageError

if TYPE_CHECKING:
    from actorgraph.devices import Device


_VALUE_MAX = (1 << 64) - 1  # timelines are 64-bit


def _host_bytes(source: Any, nbytes: int | None) -> tuple[int, int, Any]:
    """(address, nbytes, owner) of `source`: an address, or an object exporting host
    memory through DLPack or the buffer protocol."""
    if nbytes is not None:
        nbytes = check_count("wrap: nbytes", nbytes)
    if isinstance(source, (int, np.integer)):
        return _address_bytes(source, nbytes)
    if hasattr(source, "__dlpack__"):
        array = _dlpack_array(source)
    else:
        array = _buffer_array(source)
    if not array.flags.c_contiguous:
        raise UsageError(f"wrap: the memory of {type(source).__name__} is not contiguous")
    size = array.nbytes
    if nbytes is not None and nbytes != size:
        raise UsageError(f"wrap: nbytes={nbytes} but {type(source).__name__} holds {size} bytes")
    return int(array.ctypes.data) if size else 0, size, (source, array)


def _address_bytes(address: int | np.integer[Any], nbytes: int | None) -> tuple[int, int, None]:
    """(address, nbytes, no owner) of a raw address given to wrap, checked: positive, and
    with its size."""
    if isinstance(address, bool) or address <= 0:
        raise UsageError(f"wrap: address must be a positive int, got {address!r}")
    if nbytes is None:
        raise UsageError(
            f"wrap: an address needs its size in bytes: rt.wrap(device, address, "
            f"nbytes=N) with N >= 0, got nbytes={nbytes!r}"
        )
    return int(address), nbytes, None


def _dlpack_array(source: Any) -> np.ndarray[Any, Any]:
    """A writable numpy view of the host memory `source` exports through DLPack."""
    try:
        array = np.from_dlpack(source)
    except Exception as exc:  # e.g. GPU memory, which numpy cannot view
        raise UsageError(
            f"wrap: {type(source).__name__} exports DLPack memory numpy cannot view "
            f"({exc}); wrap takes host memory"
        ) from None
    if not array.flags.writeable:
        raise UsageError(f"wrap: the DLPack memory of {type(source).__name__} is read-only")
    return array


def _buffer_array(source: Any) -> np.ndarray[Any, Any]:
    """A numpy view of the writable memory `source` exports through the buffer protocol."""
    try:
        view = memoryview(source)
    except TypeError:
        raise UsageError(
            f"wrap takes an address (with nbytes=), or an object with the buffer "
            f"protocol or __dlpack__; got {type(source).__name__}"
        ) from None
    if view.readonly:
        raise UsageError(
            f"wrap: the memory of {type(source).__name__} is read-only; kernels write "
            f"their buffers, so pass writable memory (a bytearray, a numpy array, ...)"
        )
    return np.asarray(view)


def _host_range(alloc: Allocation) -> tuple[int, int] | None:
    """The host addresses an allocation's memory spans, or None (freed, empty, or not
    host memory: a GPU's, a worker's)."""
    memory = alloc.memory
    if alloc.freed or not isinstance(memory, np.ndarray) or memory.nbytes == 0:
        return None
    start = alloc.address if alloc.foreign else int(memory.ctypes.data)
    return start, start + memory.nbytes


class HostMemory:
    """The host memory a runtime's buffers live in, to keep wrappers honest.

    Host memory is one address space, but a runtime orders work by device: its plans
    order items by the bytes they touch, and one submission after another on the same
    device. Wrappers on one device share that device's address space (byte ranges are
    addresses), so they alias as they should. A wrapper on another device of memory
    already wrapped, or of an `rt.alloc` buffer's memory (CPU and SIM memory is host
    memory), would alias nothing: its work would race with the other buffer's. `wrap`
    refuses those. Allocations are held weakly: one nobody holds any more (no buffer,
    no graph) takes no part.
    """

    def __init__(self) -> None:
        self._allocations: weakref.WeakSet[Allocation] = weakref.WeakSet()

    def add(self, alloc: Allocation) -> None:
        if isinstance(alloc.memory, np.ndarray):
            self._allocations.add(alloc)

    def add_wrapper(self, alloc: Allocation) -> None:
        """Add a new wrapper's memory, or refuse it if that memory is another device's
        wrapper's or an rt.alloc buffer's."""
        self._check_wrapper(alloc)
        self._allocations.add(alloc)

    def _check_wrapper(self, alloc: Allocation) -> None:
        span = _host_range(alloc)
        if span is None:
            return
        start, stop = span
        for other in self._allocations:
            found = _host_range(other)
            if found is None or found[1] <= start or stop <= found[0]:
                continue
            where = f"bytes {max(start, found[0]):#x}..{min(stop, found[1]):#x}"
            if not other.foreign:
                raise UsageError(
                    f"wrap: that memory ({where}) belongs to buffer #{other.uid} on "
                    f"{other.device.name}, which rt.alloc made: use that buffer, or a view "
                    f"of it (buf.view(...)), whose work the runtime orders; a wrapper of its "
                    f"memory would alias nothing and read stale data"
                )
            if other.device is not alloc.device:
                raise UsageError(
                    f"wrap: that memory ({where}) is wrapped on {other.device.name} already "
                    f"(by the wrapper of {found[0]:#x}..{found[1]:#x}); host memory is one "
                    f"address space, but a runtime orders "
                    f"work on wrapped memory per device, so wrappers on {other.device.name} "
                    f"and {alloc.device.name} would race: wrap it on one device and move the "
                    f"data with Copy items, or rt.free the other wrapper first"
                )


def wrap_memory(
    device: Device,
    space_uid: int,
    source: Any,
    nbytes: int | None,
    dtype: Any,
    shape: Any,
    runtime: Home,
    host_memory: HostMemory,
) -> Buffer:
    if not device.host_visible or not device.host_memory:
        raise UsageError(
            f"wrap: {device.name} does not hold host memory ({device.kind} devices do "
            f"not); rt.wrap(...) takes host memory, on a CPU device (copy it elsewhere "
            f"with a Copy item)"
        )
    dt = buffer_dtype("wrap", dtype)
    address, size, owner = _host_bytes(source, nbytes)
    if shape is None:
        if size % dt.itemsize:
            raise UsageError(
                f"wrap: {size} bytes is not a whole number of {dt.name} ({dt.itemsize} "
                f"bytes each); give shape= or another dtype"
            )
        dims: tuple[int, ...] = (size // dt.itemsize,)
    else:
        dims = _shape_of(shape)
        if math.prod(dims) * dt.itemsize > size:
            raise UsageError(
                f"wrap: shape {dims} of {dt.name} needs {math.prod(dims) * dt.itemsize} bytes "
                f"but the memory holds {size}"
            )
    if size:
        memory = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))
    else:
        memory = np.zeros(0, np.uint8)
    alloc = Allocation(
        device=device,
        nelems=size,
        dtype=np.dtype(np.uint8),
        memory=memory,
        uid=space_uid,
        address=address,
        foreign=True,
        owner=owner,
        runtime=runtime,
    )
    host_memory.add_wrapper(alloc)
    return Buffer(device=device.name, shape=dims, dtype=dt, offset=0, alloc=alloc)


def _poll(read: Callable[[], int], value: int, timeout: float, name: str) -> None:
    deadline = time.monotonic() + timeout
    pause = 1e-6
    while read() < value:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timeline {name} did not reach {value} within {timeout} s (it is at {read()})"
            )
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


@attrs.frozen(eq=False)
class ExternalTimeline:
    """A counter that only grows, owned by another runtime (say, a tinygrad device's
    timeline signal), that replays can wait for and advance.

    `graph.submit(inputs, after=[(timeline, v)], then=[(timeline, w)])` starts the replay
    once `read() >= v` and calls `write(w)` when the replay is complete (failed or not,
    so the other side never hangs), never moving the counter backwards. A runtime's
    replays waiting so are watched by one task of the runtime, which polls `read()`
    (cheap, on the runtime's thread), backing off to 1 ms; a timeline with a `wait` has
    one helper thread at a time blocked in it, whose return wakes its waits at once.
    `wait_for` is the same wait for code off the runtime's loop.

    Args:
        name: what messages call it.
        read: returns the counter's value now.
        write: sets the counter to a value.
        wait: blocks the calling thread until `read() >= value`; if None, `read()` is
            polled.
        timeout: the most seconds a polled wait lasts before it fails with TimeoutError
            (on trio's clock); a wait through `wait` has none.
    """

    name: str
    read: Callable[[], int]
    write: Callable[[int], None]
    wait: Callable[[int], None] | None = None
    timeout: float = 60.0

    def reached(self, value: int) -> bool:
        """Whether the counter has reached `value`.

        Args:
            value: the value waited for.

        Returns:
            True when `read() >= value`.
        """
        return self.read() >= value

    def wait_for(self, value: int) -> None:
        """Block the calling thread until the counter reaches `value` (with `wait`, or polling).

        Args:
            value: the value waited for.

        Raises:
            TimeoutError: polling gave up after `timeout` seconds.
        """
        if self.wait is not None:
            self.wait(value)
        else:
            _poll(self.read, value, self.timeout, self.name)

    def advance(self, value: int) -> None:
        """Move the counter up to `value`, never backwards.

        Args:
            value: the value to write, if the counter is below it.
        """
        if self.read() < value:
            self.write(value)


TimelinePoints = Sequence[tuple[ExternalTimeline, int]]

_POLL_S = (50e-6, 1e-3)  # the watcher's first pause between reads of timelines, and its longest


class _Waiter:
    """One replay waiting for a timeline to reach `value`: woken by `done`, failed with
    `error` (a timeout, the timeline's own `read` or `wait` raising, the runtime closing)."""

    __slots__ = ("deadline", "done", "error", "value")

    def __init__(self, value: int, deadline: float) -> None:
        self.value = value
        self.deadline = deadline
        self.done = trio.Event()
        self.error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class TimelineWaits:
    """A runtime's replays waiting for external timelines (`graph.submit(after=...)`):
    one watcher task reads every timeline waited on and wakes the waits it reached, so
    a wait holds no thread of its own, and a cancelled one is gone at once. A timeline
    with a `wait` function has, besides, one helper thread at a time blocked in it (on
    a limiter of its own: never one of trio's threads that `to_thread` callers wait for),
    whose return wakes the waits at once.

    Invariants: `_waiting` holds only timelines with waits; `_helpers` the timelines
    whose helper thread runs, with the value it waits for."""

    def __init__(self) -> None:
        self._waiting: dict[ExternalTimeline, set[_Waiter]] = {}
        self._helpers: dict[ExternalTimeline, int] = {}
        self._changed = trio.Event()
        self._limiter = trio.CapacityLimiter(math.inf)
        self._nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        """Start the watcher (and later helpers) in the runtime's `nursery`."""
        self._nursery = nursery
        nursery.start_soon(self._watch)

    @property
    def waiting(self) -> int:
        """How many waits are pending."""
        return sum(len(waits) for waits in self._waiting.values())

    async def wait_for(self, timeline: ExternalTimeline, value: int) -> None:
        """Return once `timeline` reached `value`. Raises TimeoutError after its
        `timeout` (a timeline without `wait`), what its `read` or `wait` raised, or
        ClosedError if the runtime closes meanwhile. Cancelling it ends the wait at once."""
        if self._nursery is None:
            raise ClosedError(
                "this runtime is not started; use `async with open_runtime(...) as rt`"
            )
        no_wait = timeline.wait is None
        waiter = _Waiter(value, trio.current_time() + timeline.timeout if no_wait else math.inf)
        self._waiting.setdefault(timeline, set()).add(waiter)
        self._changed.set()
        if not no_wait and timeline not in self._helpers:
            self._helpers[timeline] = value
            self._nursery.start_soon(self._help, timeline, value)
        try:
            await waiter.done.wait()
        finally:
            self._forget(timeline, waiter)
        if waiter.error is not None:
            raise waiter.error

    def _forget(self, timeline: ExternalTimeline, waiter: _Waiter) -> None:
        waits = self._waiting.get(timeline)
        if waits is not None:
            waits.discard(waiter)
            if not waits:
                del self._waiting[timeline]

    async def _watch(self) -> None:
        pause = _POLL_S[0]
        try:
            while True:
                changed = self._changed
                if not self._waiting:
                    await changed.wait()
                elif self._check():
                    pause = _POLL_S[0]
                    continue
                else:
                    with trio.move_on_after(pause):
                        await changed.wait()
                    pause = min(2 * pause, _POLL_S[1])
                if changed.is_set():  # a new wait: read at once, then soon again
                    self._changed = trio.Event()
                    pause = _POLL_S[0]
        finally:
            closed = ClosedError(
                "the runtime closed while a replay waited for an external timeline"
            )
            for waits in list(self._waiting.values()):
                for waiter in waits:
                    waiter.fail(closed)

    def _check(self) -> bool:
        """Read each timeline waited on once: wake the waits it reached and fail those
        past their deadline. Whether any wait ended."""
        now = trio.current_time()
        ended = False
        for timeline, waits in list(self._waiting.items()):
            error: Exception | None = None
            try:
                reached = timeline.read()
            except Exception as exc:  # the other side's read broke: its waits fail with it
                reached, error = -1, exc
            for waiter in list(waits):
                if waiter.done.is_set():
                    continue
                if error is not None:
                    waiter.fail(error)
                elif reached >= waiter.value:
                    waiter.done.set()
                elif now >= waiter.deadline:
                    waiter.fail(
                        TimeoutError(
                            f"timeline {timeline.name} did not reach {waiter.value} within "
                            f"{timeline.timeout} s (it is at {reached})"
                        )
                    )
                else:
                    continue
                ended = True
        return ended

    async def _help(self, timeline: ExternalTimeline, value: int) -> None:
        """A helper thread blocked in `timeline.wait(value)`: its return wakes the waits
        for `value` or less (and the next helper waits for the lowest of the rest)."""
        wait = timeline.wait
        assert wait is not None
        try:
            await trio.to_thread.run_sync(
                wait, value, abandon_on_cancel=True, limiter=self._limiter
            )
        except Exception as exc:  # the other side's wait broke: its waits fail with it
            error: Exception | None = exc
        else:
            error = None
        finally:
            del self._helpers[timeline]
        for waiter in list(self._waiting.get(timeline, ())):
            if error is not None:
                waiter.fail(error)
            elif waiter.value <= value:
                waiter.done.set()
        rest = [w.value for w in self._waiting.get(timeline, ()) if not w.done.is_set()]
        if rest and self._nursery is not None:
            self._helpers[timeline] = min(rest)
            self._nursery.start_soon(self._help, timeline, min(rest))


def check_points(points: Any, what: str) -> tuple[tuple[ExternalTimeline, int], ...]:
    out = tuple(points)
    for entry in out:
        if (
            not isinstance(entry, tuple)
            or len(entry) != 2
            or not isinstance(entry[0], ExternalTimeline)
            or isinstance(entry[1], bool)
            or not isinstance(entry[1], int)
        ):
            raise UsageError(f"{what}= takes (ag.ExternalTimeline, int) pairs, got {entry!r}")
        if not 0 <= entry[1] <= _VALUE_MAX:
            raise UsageError(
                f"{what}=({entry[0].name}, {entry[1]}): timeline values are 64-bit, 0 to "
                f"2**64-1; give a value in that range"
            )
    return out


def space_uid() -> int:
    return new_alloc_id()
