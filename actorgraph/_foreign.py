"""Memory actorgraph did not allocate, wrapped as Buffers (`rt.wrap`), and timelines of
other runtimes that replays order against (`ExternalTimeline`)."""

from __future__ import annotations

import ctypes
import math
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from ._buffer import Allocation, Buffer, Home, _shape_of, buffer_dtype, check_count, new_alloc_id
from ._errors import UsageError

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
    if not device.host_visible or device.kind != "CPU":
        raise UsageError(
            f"wrap: {device.name} is not a CPU device; rt.wrap(...) takes host memory, on "
            f"a CPU device (copy it elsewhere with a Copy item)"
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
    """A monotonic counter another runtime owns (say, a tinygrad device's timeline
    signal), that replays can wait for and advance: `graph.submit(inputs,
    after=[(timeline, v)], then=[(timeline, w)])` starts the replay once `read() >= v`
    and calls `write(w)` when the replay is complete (failed or not, so the other side
    never hangs), never moving the counter backwards.

    `wait(value)`, if given, blocks the calling (worker) thread until `read() >= value`;
    by default `read()` is polled, backing off to 1 ms, for at most `timeout` seconds.
    """

    name: str
    read: Callable[[], int]
    write: Callable[[int], None]
    wait: Callable[[int], None] | None = None
    timeout: float = 60.0

    def reached(self, value: int) -> bool:
        return self.read() >= value

    def wait_for(self, value: int) -> None:
        if self.wait is not None:
            self.wait(value)
        else:
            _poll(self.read, value, self.timeout, self.name)

    def advance(self, value: int) -> None:
        if self.read() < value:
            self.write(value)


TimelinePoints = Sequence[tuple[ExternalTimeline, int]]


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
