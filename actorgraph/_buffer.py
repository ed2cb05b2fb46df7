"""Buffers: typed, shaped regions of one device allocation (a base buffer or a view of one)."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

from ._errors import BufferFreedError, UsageError

if TYPE_CHECKING:
    from actorgraph.devices import Device

_alloc_ids = itertools.count(1)


class Home(Protocol):
    """The runtime that made a buffer, as its buffers see it (a `Runtime` is one): it
    orders the work on the buffer's memory, so only it may take the buffer."""

    @property
    def closed(self) -> bool: ...


@attrs.define(eq=False)
class Allocation:
    """The memory behind a base buffer and every view of it."""

    device: Device
    nelems: int
    dtype: np.dtype[Any]
    memory: Any
    uid: int = attrs.field(factory=lambda: next(_alloc_ids))
    freed: bool = False
    # Memory actorgraph did not allocate (rt.wrap): every wrapper on one device shares
    # that device's address-space `uid`, and byte ranges are absolute addresses, so two
    # wrappers of one region are seen to overlap. `owner` keeps the exporter alive.
    address: int = 0
    foreign: bool = False
    owner: Any = None
    # Where host memory of actorgraph's own begins, once asked (`Buffer.address`): a
    # numpy array's memory never moves, and asking numpy costs microseconds a buffer.
    host_base: int = 0
    # The runtime that made it (rt.alloc, rt.wrap); None only for allocations made
    # outside a runtime.
    runtime: Home | None = None

    def release(self) -> Any:
        """Mark the memory freed and let go of it (and of a wrapper's exporter). Returns
        what work submitted before may still use until it is done: the device's memory,
        which then goes back to the device, or a wrapper's exporter (with the view of its
        memory), which is then let go of, since the memory is its owner's."""
        self.freed = True
        memory, self.memory = self.memory, None
        if self.foreign:
            memory, self.owner = (self.owner, memory), None
        return memory


def new_alloc_id() -> int:
    return next(_alloc_ids)


def _dim(value: Any) -> int | None:
    """`value` as a Python int if it is an integer (numpy's too) >= 0, else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    number = int(value)
    return number if number >= 0 else None


def _shape_of(shape: int | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    bad = UsageError(f"a buffer shape is an int or a tuple of ints >= 0, got {shape!r}")
    if isinstance(shape, (tuple, list)):
        dims = tuple(_dim(d) for d in shape)
    else:
        dims = (_dim(shape),)
    if not dims or None in dims:
        raise bad
    return dims  # type: ignore[return-value]


def buffer_dtype(what: str, dtype: Any) -> np.dtype[Any]:
    """`dtype` as the numpy dtype of a buffer: fixed-size numbers or raw bytes only.

    Kernels get a buffer's memory as numpy views or bare addresses, and copies move its
    bytes: an object dtype holds pointers to Python objects (a copy would duplicate them
    without their references), and strings, records and dates are not what kernel
    bodies take, so numpy would only fail inside a kernel, later, with its own words.
    """
    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except TypeError:
        raise UsageError(f"{what}: {dtype!r} is not a numpy dtype") from None
    plain_bytes = dt.kind == "V" and dt.fields is None and dt.subdtype is None
    if (dt.kind in "biufc" or plain_bytes) and dt.itemsize > 0:
        return dt
    if dt.kind == "O":
        kind = "Python objects"
    elif dt.kind in "SU":
        kind = "strings"
    elif dt.fields is not None:
        kind = "structured records"
    elif dt.subdtype is not None:
        kind = "sub-arrays"
    elif dt.kind in "mM":
        kind = "dates and times"
    else:
        kind = "zero-size items"
    raise UsageError(
        f"{what}: dtype {dt!r} holds {kind}; a buffer holds fixed-size numbers (bool, "
        f"int, uint, float or complex dtypes) or raw bytes ('V8'): store the data as "
        f"numbers (say, dates as int64, records as one buffer per field)"
    )


def dtype_text(dtype: np.dtype[Any]) -> str:
    """How messages and reprs print a dtype: its name, and its byte order where it is
    not this machine's ("int32 big-endian"), since a name alone does not tell '>i4'
    from '<i4'."""
    if dtype.isnative:
        return dtype.name
    return f"{dtype.name} {'big' if dtype.byteorder == '>' else 'little'}-endian"


def check_count(what: str, value: Any) -> int:
    """An element or byte count, offset or size: an int (numpy's too) >= 0, never a bool."""
    number = _dim(value)
    if number is None:
        raise UsageError(f"{what} must be an int >= 0, got {value!r}")
    return number


# The most bytes one buffer may span: numpy's (and the C library's) index limit.
MAX_BUFFER_BYTES = (1 << 63) - 1


def check_buffer_size(what: str, dims: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    """The element count of `dims`, computed exactly; refuse more bytes than a buffer holds."""
    count = math.prod(dims)
    if count * dtype.itemsize > MAX_BUFFER_BYTES:
        raise UsageError(
            f"{what}: shape {dims} of {dtype.name} is {count * dtype.itemsize} bytes, more than "
            f"one buffer can hold ({MAX_BUFFER_BYTES}); allocate less or split it"
        )
    return count


@attrs.frozen(eq=False, repr=False)
class Buffer:
    """A typed, shaped region of a device's memory, made by `rt.alloc`, `rt.wrap` or `view`.

    Items, copies and graph inputs take buffers and views of them. Buffers compare by
    identity. `Buffer.__dlpack__` lets `numpy.from_dlpack`, `torch.from_dlpack` and the like
    view a buffer in place.

    Attributes:
        device: the name of the device the memory is on, say "CPU:0".
        shape: the shape in elements.
        dtype: the numpy dtype of the elements.
        offset: where the buffer starts, in elements of its dtype from the start of its
            allocation (0 for a buffer `rt.alloc` made).
        size: how many elements it holds.
        nbytes: how many bytes it spans.
    """

    device: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    offset: int
    _alloc: Allocation
    _base: Buffer | None = None
    # Derived once: lowering reads them for every item of every rebound replay.
    size: int = attrs.field(init=False)
    nbytes: int = attrs.field(init=False)
    _host: Any = attrs.field(init=False, default=None)  # cached host_view()

    def __attrs_post_init__(self) -> None:
        size = math.prod(self.shape)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "nbytes", size * self.dtype.itemsize)

    @property
    def is_view(self) -> bool:
        """Whether this buffer is a view of another (made by `view`), not a base buffer."""
        return self._base is not None

    @property
    def base(self) -> Buffer:
        """The base buffer whose memory this one is part of (itself for a base buffer)."""
        return self if self._base is None else self._base

    @property
    def freed(self) -> bool:
        """Whether `rt.free` released its memory (using it is an error then)."""
        return self._alloc.freed

    @property
    def runtime(self) -> Home | None:
        """The runtime that allocated (or wrapped) this buffer's memory.

        It is the only one whose work may use the buffer.
        """
        return self._alloc.runtime

    @property
    def alloc_id(self) -> int:
        """The address space this buffer's byte ranges are in: its allocation's, or for
        rt.wrap memory its device's, which every wrapper on that device shares."""
        return self._alloc.uid

    @property
    def allocation(self) -> Allocation:
        """The allocation this buffer is (a view) of: what `rt.free` of its base frees.
        Wrappers on one device share an `alloc_id` but each is an allocation of its own,
        freed on its own, so a check of liveness looks at every allocation, not one
        buffer per `alloc_id`."""
        return self._alloc

    @property
    def byte_range(self) -> tuple[int, int]:
        """Bytes from the start of the allocation (absolute addresses for rt.wrap memory)."""
        start = self._alloc.address + self.offset * self.dtype.itemsize
        return start, start + self.nbytes

    @property
    def foreign(self) -> bool:
        """True for memory actorgraph did not allocate (made by rt.wrap)."""
        return self._alloc.foreign

    @property
    def address(self) -> int:
        """The host address of this buffer's first byte, for host-visible devices only.

        For compiled kernel code that takes pointers (`Kernel(..., cpu_args="addresses")`).

        Raises:
            UsageError: the buffer is in memory the host cannot see (a GPU's).
            BufferFreedError: such a buffer was freed.
        """
        alloc = self._alloc
        memory = alloc.memory
        if not isinstance(memory, np.ndarray):
            self.check_live("address: ")
            raise UsageError(f"{self!r} is not in host-visible memory, so it has no host address")
        if alloc.foreign and alloc.address:
            # Wrapped memory says where it is (rt.wrap): no numpy call, which lowering a
            # rebound replay would make for every buffer of every item.
            return alloc.address + self.offset * self.dtype.itemsize
        base = alloc.host_base
        if not base:
            base = alloc.host_base = int(memory.ctypes.data)
        return base + self.offset * self.dtype.itemsize

    def __repr__(self) -> str:
        dims = "x".join(map(str, self.shape))
        where = f" view@{self.offset}" if self.is_view else ""
        if self._alloc.foreign:  # wrappers on a device share its #number: say where
            where += f" wrapping {self.byte_range[0]:#x}"
        gone = " freed" if self.freed else ""
        kind = dtype_text(self.dtype)
        return f"<Buffer {self.device} {dims} {kind}{where}{gone} #{self.alloc_id}>"

    def check_live(self, what: str = "") -> None:
        """Raise BufferFreedError (its message starting with `what`) if `rt.free` freed
        this buffer's allocation."""
        if self._alloc.freed:
            fix = (
                "wrap the memory again with rt.wrap(...)"
                if self._alloc.foreign
                else "allocate a new buffer with rt.alloc(...)"
            )
            raise BufferFreedError(f"{what}{self!r} was freed; {fix} instead")

    def view(
        self,
        offset: int = 0,
        size: int | None = None,
        shape: Any = None,
        *,
        dtype: Any = None,
        byte_offset: int | None = None,
    ) -> Buffer:
        """A view of `size` elements (or `shape`) starting `offset` elements into this buffer.

        Both count elements of this buffer's dtype, never bytes: `buf.view(16, 100)` of an int32
        buffer covers bytes 64 to 464. The view shares this buffer's memory; a graph orders
        its items by the bytes they touch, so items on views that do not overlap do not wait
        for each other.

        Args:
            offset: the first element of the view, in this buffer's elements.
            size: how many elements (default: the rest of the buffer).
            shape: the view's shape instead of `size`.
            dtype: the view's own dtype (the bytes read as another type).
            byte_offset: with `dtype`, where the view starts, in bytes into this buffer (a
                multiple of the view's itemsize from the start of the allocation); instead of
                `offset`.

        Returns:
            The view, a Buffer on the same memory.

        Raises:
            UsageError: the view runs past the buffer's end, `size` and `shape` disagree,
                offset= and byte_offset= are both given, or the byte offset is not a multiple
                of the view's itemsize.
            BufferFreedError: this buffer was freed.
        """
        self.check_live("view(): ")
        offset = check_count("view offset", offset)
        if size is not None:
            size = check_count("view size", size)
        if dtype is not None or byte_offset is not None:
            return self._view_bytes(offset, size, shape, dtype, byte_offset)
        if shape is None:
            shape = (self.size - offset) if size is None else size
        dims = _shape_of(shape)
        if size is not None and math.prod(dims) != size:
            raise UsageError(f"view size={size} does not match shape={dims}")
        count = math.prod(dims)
        if offset + count > self.size:
            raise UsageError(
                f"view(offset={offset}, size={count}) of {self!r} runs past its end "
                f"({offset + count} > {self.size}); shrink the view or its offset"
            )
        return Buffer(
            device=self.device,
            shape=dims,
            dtype=self.dtype,
            offset=self.offset + offset,
            alloc=self._alloc,
            base=self.base,
        )

    def _view_bytes(
        self, offset: int, size: int | None, shape: Any, dtype: Any, byte_offset: int | None
    ) -> Buffer:
        dt = self.dtype if dtype is None else buffer_dtype("view()", dtype)
        if not dt.isnative and self._alloc.device.native_byte_order:
            raise UsageError(
                f"view(dtype={dt.str!r}) of {self!r}: {self.device}'s kernels read memory in "
                f"this machine's byte order, so as {dtype_text(dt)} the view would hold other "
                f"numbers; view it as {dt.newbyteorder('=')} and convert on the host"
            )
        if byte_offset is None:
            byte_offset = offset * self.dtype.itemsize
        elif offset:
            raise UsageError("give a view either offset= (elements) or byte_offset=, not both")
        byte_offset = check_count("view byte_offset", byte_offset)
        itemsize = dt.itemsize
        start = self.offset * self.dtype.itemsize + byte_offset  # from the allocation's start
        if start % itemsize:
            raise UsageError(
                f"a {dt.name} view must start at a multiple of {itemsize} bytes into the "
                f"allocation; byte_offset={byte_offset} into {self!r} starts at byte {start}"
            )
        if shape is None:
            shape = max(self.nbytes - byte_offset, 0) // itemsize if size is None else size
        dims = _shape_of(shape)
        count = math.prod(dims)
        if size is not None and count != size:
            raise UsageError(f"view size={size} does not match shape={dims}")
        if byte_offset + count * itemsize > self.nbytes:
            raise UsageError(
                f"view(byte_offset={byte_offset}, {count} x {dt.name}) of {self!r} runs past "
                f"its end ({byte_offset + count * itemsize} > {self.nbytes} bytes); shrink "
                f"the view or its offset"
            )
        return Buffer(
            device=self.device,
            shape=dims,
            dtype=dt,
            offset=start // itemsize,
            alloc=self._alloc,
            base=self.base,
        )

    def rebased(self, old_root: Buffer, new_root: Buffer) -> Buffer:
        """This buffer's region, moved from `old_root` onto `new_root` (same layout)."""
        if self is old_root:
            return new_root
        if self.dtype == new_root.dtype == old_root.dtype:
            return new_root.view(offset=self.offset - old_root.offset, shape=self.shape)
        delta = self.byte_range[0] - old_root.byte_range[0]
        return new_root.view(byte_offset=delta, dtype=self.dtype, shape=self.shape)

    def overlaps(self, other: Buffer) -> bool:
        """Whether this buffer and `other` share any byte of memory.

        Args:
            other: another Buffer.

        Returns:
            True when their byte ranges in one allocation overlap.
        """
        if self._alloc.uid != other._alloc.uid:
            return False
        a0, a1 = self.byte_range
        b0, b1 = other.byte_range
        return a0 < b1 and b0 < a1 and a0 < a1 and b0 < b1

    def within(self, other: Buffer) -> bool:
        """Whether this buffer's bytes lie inside `other`'s.

        Args:
            other: another Buffer.

        Returns:
            True when both are in one allocation and `other` spans every byte of this one.
        """
        if self._alloc.uid != other._alloc.uid:
            return False
        a0, a1 = self.byte_range
        b0, b1 = other.byte_range
        return b0 <= a0 and a1 <= b1

    def host_view(self) -> np.ndarray[Any, Any]:
        """The numpy view of this buffer's memory, for host-visible devices."""
        if self._host is not None and not self._alloc.freed:
            return self._host  # type: ignore[no-any-return]
        memory = self._alloc.memory
        if not isinstance(memory, np.ndarray):
            self.check_live()
            raise UsageError(f"{self!r} is not in host-visible memory; use rt.copyout()")
        if memory.dtype != self.dtype:  # a view with its own dtype: through the bytes
            start = self.offset * self.dtype.itemsize
            flat = memory.view(np.uint8)[start : start + self.nbytes].view(self.dtype)
        else:
            flat = memory[self.offset : self.offset + self.size]
        view = flat if len(self.shape) == 1 else flat.reshape(self.shape)
        object.__setattr__(self, "_host", view)
        return view

    # -- DLPack: torch.from_dlpack(buffer), numpy.from_dlpack(buffer), ... view it in place --

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Any = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        """Export this buffer without a copy. On a GPU the consumer's `stream` waits for
        the work queued on the device (the host does not block); host memory is exported
        as it is. Await the work that writes the buffer first: work submitted later is
        not waited for."""
        self.check_live("__dlpack__(): ")
        if copy:
            raise BufferError(f"{self!r}: DLPack export never copies; use rt.copyout()")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(
                f"{self!r} lives on DLPack device {self.__dlpack_device__()}, not {dl_device}; "
                f"export it where it is, or copy it with rt.copyout() / a Copy item"
            )
        export = getattr(self._alloc.device, "dlpack", None)
        if export is None:
            return self.host_view().__dlpack__(
                **({} if max_version is None else {"max_version": max_version})
            )
        return export(self, stream, max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        where = getattr(self._alloc.device, "dlpack_device", None)
        return (1, 0) if where is None else tuple(where())

    @property
    def memory(self) -> Any:
        return self._alloc.memory

    def release_memory(self) -> Any:
        """The buffer's part of `rt.free(buffer)` (call that): mark this base buffer's
        memory freed, for it and every view of it, and return the memory. Its cached host
        view goes too: a freed buffer holds none of its memory."""
        object.__setattr__(self, "_host", None)
        return self._alloc.release()

    @property
    def device_object(self) -> Device:
        return self._alloc.device


def check_out(what: str, buffer: Buffer, out: object) -> None:
    """`out` can take `buffer`'s bytes: a writable C-contiguous numpy array of its shape
    and dtype."""
    if not isinstance(out, np.ndarray):
        raise UsageError(
            f"{what}: out= takes a numpy array, got a {type(out).__name__}; pass "
            f"np.empty(buf.shape, buf.dtype), or no out= for a new one"
        )
    if out.shape != tuple(buffer.shape) or out.dtype != buffer.dtype:
        raise UsageError(
            f"{what}: out= is a {out.dtype} array of shape {out.shape}, and {buffer!r} holds "
            f"{buffer.dtype} of shape {tuple(buffer.shape)}; pass an array of the buffer's "
            f"shape and dtype (np.empty(buf.shape, buf.dtype)), or no out= for a new one"
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise UsageError(
            f"{what}: out= must be a writable C-contiguous array (this one is "
            f"{'not C-contiguous' if not out.flags.c_contiguous else 'read-only'}); pass "
            f"np.empty(buf.shape, buf.dtype), or no out= for a new one"
        )
