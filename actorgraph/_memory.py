"""A runtime's memory: buffers allocated on its devices, host memory of other owners
wrapped, and memory given back once no work that may use it is left.

`Runtime.alloc`, `wrap` and `free` are the public calls (their docstrings say what a
user sees); this is what they do, for the runtime that owns the buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from actorgraph.devices import Device, RemoteConnectionError, Submission

from ._await import described
from ._buffer import Allocation, Buffer, Home, _shape_of, buffer_dtype, check_buffer_size
from ._errors import ClosedError, UsageError
from ._foreign import HostMemory, space_uid, wrap_memory
from ._log import logger as _log


class Owner(Home, Protocol):
    """The runtime whose buffers these are: it refuses another runtime's."""

    def check_own(
        self, buffer: Buffer, what: str = "", error: type[UsageError] = UsageError
    ) -> None: ...


class Unfinished(Protocol):
    """What a free waits for: the submissions in flight (a runtime's Window)."""

    def unfinished(self) -> set[Submission]: ...


class Memory:
    """The memory of one runtime's buffers, on its devices.

    `frees` counts the buffers freed; `pending` those freed while work posted before
    might still use them, given back to their device when that work is done.
    """

    def __init__(self, owner: Owner, device: Callable[[str], Device], window: Unfinished):
        """Buffers of `owner` (the runtime), on the devices `device(name)` finds, freed
        after the submissions `window` has in flight."""
        self._owner = owner
        self._device = device
        self._window = window
        self.frees = 0
        self.pending = 0
        # Per device: the address space every wrapped buffer on it shares.
        self._foreign_spaces: dict[str, int] = {}
        self._host_memory = HostMemory()

    def alloc(self, device: str, shape: int | tuple[int, ...], dtype: Any) -> Buffer:
        """A new buffer of `shape` elements of `dtype` on `device`, filled with zeros.
        Raises UsageError for a bad shape or dtype, ClosedError if a worker is gone."""
        dev = self._device(device)
        dims = _shape_of(shape)
        dt = buffer_dtype("alloc", dtype)
        nelems = check_buffer_size("alloc", dims, dt)
        try:
            memory = dev.allocate(nelems, dt)
        except RemoteConnectionError as exc:
            # Its worker is gone: as for every other later use of its devices, ClosedError.
            raise ClosedError(f"alloc on {device}: {exc}") from exc
        alloc = Allocation(device=dev, nelems=nelems, dtype=dt, memory=memory, runtime=self._owner)
        self._host_memory.add(alloc)
        return Buffer(device=device, shape=dims, dtype=dt, offset=0, alloc=alloc)

    def wrap(
        self,
        device: str,
        source: Any,
        nbytes: int | None,
        dtype: Any,
        shape: int | tuple[int, ...] | None,
    ) -> Buffer:
        """A Buffer over host memory of another owner (`source`), on a CPU device. Raises
        UsageError for a Buffer (already the runtime's), or memory another device's
        wrapper or an allocation of the runtime holds."""
        if isinstance(source, Buffer):
            self._owner.check_own(source, "wrap: ")
            raise UsageError(
                f"wrap: {source!r} is a Buffer of this runtime already; wrap takes memory "
                f"that actorgraph did not allocate: use the buffer, or a view of it "
                f"(buf.view(...)), instead of a wrapper of its memory"
            )
        dev = self._device(device)
        uid = self._foreign_spaces.get(device)
        if uid is None:
            uid = self._foreign_spaces[device] = space_uid()
        return wrap_memory(dev, uid, source, nbytes, dtype, shape, self._owner, self._host_memory)

    def free(self, buffer: Buffer) -> None:
        """Let go of a base buffer's memory once the work in flight now is done (work
        posted later cannot use it): its device takes it back, or a wrapper's exporter
        is let go of. Raises UsageError for anything but a live base buffer of the
        owner."""
        if not isinstance(buffer, Buffer):
            raise UsageError(f"free() takes a Buffer, got {described(buffer)}")
        if buffer.is_view:
            raise UsageError(f"free() takes a base buffer; {buffer!r} is a view")
        self._owner.check_own(buffer, "free: ")
        buffer.check_live("free: ")
        # A wrapper's memory is its owner's (rt.wrap): nothing goes back to the device,
        # but the wrapper's exporter is kept alive as long as its memory may be used.
        device = None if buffer.foreign else buffer.device_object
        memory = buffer.release_memory()
        self.frees += 1
        # Never wait for the work here, on the trio thread that the work itself may need.
        waiting = self._window.unfinished()
        if waiting:
            self._release_after(waiting, device, memory)
        else:
            _release(device, memory)

    def _release_after(self, waiting: set[Submission], device: Device | None, memory: Any) -> None:
        """Give `memory` back to `device` (None: let go of a wrapper's exporter) once
        every submission of `waiting` is done."""
        left = len(waiting)
        self.pending += 1

        def one_done(_: Submission) -> None:
            nonlocal left
            left -= 1
            if not left:
                self.pending -= 1
                _release(device, memory)

        for sub in waiting:
            sub.when_done(one_done)


def _release(device: Device | None, memory: Any) -> None:
    if device is None:
        return  # a wrapper's exporter: dropping it is all there is to do
    try:
        device.free(memory)
    except Exception as error:  # e.g. a GPU whose context is already lost
        _log.warning("%s could not free a buffer: %s", device.name, error)
