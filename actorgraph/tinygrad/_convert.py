"""A tinygrad jit cache as actorgraph items: kernels, copies and buffers.

tinygrad's CPU devices (`CPU`, `CPU:1`, ...) map to actorgraph's `CPU:0`, `CPU:1`, ...
Their memory is host memory that tinygrad allocated, so it becomes `rt.wrap` buffers
(views of a wrapped base for tinygrad's views, which its memory planner makes of one
arena); a compiled kernel becomes an address kernel that calls tinygrad's compiled
function directly through ctypes with the buffers' addresses and the var values.
"""

from __future__ import annotations

import ctypes
import platform
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from tinygrad.device import Buffer as TinyBuffer
from tinygrad.device import Device
from tinygrad.dtype import DType, _to_np_dtype
from tinygrad.engine.realize import BufferCopy, BufferXfer, CompiledRunner, ExecItem, ViewOp

from .._buffer import Buffer
from .._errors import InputError, UsageError
from .._foreign import ExternalTimeline
from .._kernel import Copy, Item, Kernel, Launch
from .._runtime import Runtime
from .._vars import Var

# Plans kept per jit, one per set of input sizes (symbolic shapes): the latest ones.
PLANS_KEPT = 16

# On arm64 tinygrad's CPU kernels take their int args as 64-bit.
_VAL_TYPE = ctypes.c_int64 if platform.machine() in ("arm64", "aarch64") else ctypes.c_int32


def device_name(tiny_device: str) -> str:
    """actorgraph's name for a tinygrad CPU device ("CPU" -> "CPU:0", "CPU:2" -> "CPU:2")."""
    kind, _, index = tiny_device.partition(":")
    if kind != "CPU":
        raise UsageError(
            f"tinygrad device {tiny_device!r} is not a CPU device; actorgraph runs tinygrad "
            f"work on CPU devices only (CPU, CPU:1, ...)"
        )
    return f"CPU:{index or 0}"


def numpy_dtype(dtype: DType) -> np.dtype[Any]:
    """The numpy dtype with the same bytes: tinygrad's own, or an unsigned int of its
    size for dtypes numpy lacks (bfloat16, fp8): kernels get addresses, copies bytes."""
    found = _to_np_dtype(dtype) if dtype.fmt is not None else None
    if found is not None:
        return np.dtype(found)
    if dtype.itemsize in (1, 2, 4, 8):
        return np.dtype(f"u{dtype.itemsize}")
    return np.dtype(f"V{dtype.itemsize}")


def check_allocated(buf: TinyBuffer, what: str) -> None:
    if not buf.is_allocated():
        raise InputError(
            f"{what}: tinygrad buffer {buf!r} (on {buf.device}, {buf.size} x {buf.dtype}) is "
            f"not allocated (freed, or never realized); realize the tensor before the call"
        )


def tiny_var(var: Any) -> Var:
    name, lo, hi = var.arg
    return Var(str(name), int(lo), int(hi))


class Wrapper:
    """tinygrad buffers -> actorgraph buffers of one runtime.

    Base buffers are wrapped by address (cached by address, size and dtype, so a buffer
    tinygrad hands out again at the same place maps to the same Buffer); views become
    views of their wrapped base.
    """

    def __init__(self, runtime: Runtime, limit: int = 256) -> None:
        self.runtime = runtime
        self._bases: dict[tuple[str, int, int, str], Buffer] = {}
        self._limit = limit

    def base(self, buf: TinyBuffer, what: str) -> Buffer:
        check_allocated(buf, what)
        device = device_name(buf.device)
        address = int(buf._buf.va_addr)
        key = (device, address, buf.nbytes, buf.dtype.name)
        found = self._bases.get(key)
        if found is not None and not found.freed:
            return found
        wrapped = self.runtime.wrap(
            device, address, nbytes=buf.nbytes, dtype=numpy_dtype(buf.dtype), shape=(buf.size,)
        )
        if len(self._bases) >= self._limit:
            self._bases.pop(next(iter(self._bases)))
        self._bases[key] = wrapped
        return wrapped

    def buffer(self, buf: TinyBuffer, what: str, root: Buffer | None = None) -> Buffer:
        """`buf` as an actorgraph buffer; a view of `root` (its base's wrapper) if given."""
        if buf._base is None:
            return root if root is not None else self.base(buf, what)
        base = root if root is not None else self.base(buf._base, what)
        check_allocated(buf, what)
        dtype = numpy_dtype(buf.dtype)
        if buf.offset % dtype.itemsize:
            raise UsageError(
                f"{what}: tinygrad view {buf!r} starts {buf.offset} bytes into its base, not "
                f"a multiple of its {dtype.itemsize}-byte items; actorgraph cannot view it"
            )
        return base.view(byte_offset=buf.offset, dtype=dtype, shape=(buf.size,))


def _kernel_for(runner: CompiledRunner) -> Kernel:
    program = runner.p
    nbufs = len(program.globals)
    nvals = len(program.vars)
    raw = runner._prg
    fxn = getattr(raw, "fxn", None)
    if fxn is None:
        raise UsageError(
            f"kernel {program.name!r} has no compiled CPU function (a {type(raw).__name__}); "
            f"actorgraph runs tinygrad CPU kernels only"
        )
    address = int(ctypes.cast(fxn, ctypes.c_void_p).value or 0)
    typed = ctypes.CFUNCTYPE(None, *([ctypes.c_uint64] * nbufs + [_VAL_TYPE] * nvals))(address)

    def call(*args: int, _fn: Any = typed, _keep: Any = raw) -> None:
        _fn(*args)  # the program object (_keep) owns the code's memory

    outs = sorted(set(program.outs))
    ins = sorted(set(program.ins) | (set(range(nbufs)) - set(outs)))
    if not outs:
        raise UsageError(f"tinygrad kernel {program.function_name!r} writes no buffer")
    name = program.function_name if program.function_name.isidentifier() else "tinygrad_kernel"
    return Kernel(name, cpu=call, cpu_args="addresses", outs=outs, ins=ins)


class Converter:
    """Turns jit-cache items into actorgraph items, one Kernel per tinygrad program."""

    def __init__(self, wrapper: Wrapper) -> None:
        self.wrapper = wrapper
        self._kernels: dict[int, tuple[CompiledRunner, Kernel]] = {}
        self.vars: dict[Any, Var] = {}

    def kernel(self, runner: CompiledRunner) -> Kernel:
        hit = self._kernels.get(id(runner))
        if hit is None or hit[0] is not runner:
            hit = (runner, _kernel_for(runner))
            self._kernels[id(runner)] = hit
        return hit[1]

    def var(self, tiny: Any) -> Var:
        found = self.vars.get(tiny)
        if found is None:
            found = self.vars[tiny] = tiny_var(tiny)
        return found

    def check(
        self, jit_cache: Sequence[ExecItem], input_slots: Mapping[tuple[int, int], int]
    ) -> None:
        """Refuse item kinds actorgraph cannot run and captured buffers that are gone;
        build the kernels."""
        for j, ei in enumerate(jit_cache):
            prg = ei.prg
            if isinstance(prg, CompiledRunner):
                self.kernel(prg)
            elif not isinstance(prg, (BufferCopy, BufferXfer, ViewOp)):
                self._refuse(j, prg)
            for i, buf in enumerate(ei.bufs):
                if buf is not None and (j, i) not in input_slots:
                    self.wrapper.buffer(buf, f"jit cache item {j} buffer {i}")

    @staticmethod
    def _refuse(j: int, prg: Any) -> None:
        raise UsageError(
            f"jit cache item {j} is a {type(prg).__name__} "
            f"({getattr(prg, 'display_name', prg)}); actorgraph runs compiled CPU kernels, "
            f"BufferCopy, BufferXfer and ViewOp items only"
        )

    def convert(
        self,
        jit_cache: Sequence[ExecItem],
        slot_buffers: Callable[[int, int, TinyBuffer | None], Buffer],
    ) -> list[Item]:
        """Items for `jit_cache`; slot_buffers(j, i, tinygrad buffer) gives item j's
        buffer i (inputs bound to the graph's input buffers)."""
        items: list[Item] = []
        for j, ei in enumerate(jit_cache):
            prg = ei.prg
            if isinstance(prg, CompiledRunner):
                bufs = [slot_buffers(j, i, b) for i, b in enumerate(ei.bufs)]
                program = prg.p
                fixed = {self.var(v): int(val) for v, val in ei.fixedvars.items()}
                kernel = self.kernel(prg)
                kernel_vars = tuple(self.var(v) for v in program.vars)
                items.append(Launch(kernel, bufs, vars=kernel_vars, fixedvars=fixed))
            elif isinstance(prg, (BufferCopy, BufferXfer)):
                dst, src = (slot_buffers(j, i, b) for i, b in enumerate(ei.bufs[:2]))
                if dst.dtype != src.dtype or dst.size != src.size:
                    dst = dst.view(dtype=np.uint8)
                    src = src.view(dtype=np.uint8)
                items.append(Copy(dst=dst, src=src))
            elif isinstance(prg, ViewOp):
                continue  # a view is a layout, not work: its buffers are views already
            else:
                self._refuse(j, prg)
        return items

    def var_values(self, var_vals: Mapping[Any, int], needed: Iterable[Var]) -> dict[Var, int]:
        wanted = set(needed)
        out: dict[Var, int] = {}
        for tiny, value in var_vals.items():
            var = self.vars.get(tiny)
            if var is not None and var in wanted:
                out[var] = int(value)
        return out


class Timelines:
    """tinygrad's device timelines as ag.ExternalTimelines: a replay waits for the work
    tinygrad queued before it and takes its own timeline value, so tinygrad's later work
    and its synchronize() wait for the replay, with no synchronize before it.

    One per runtime (`Timelines.of_runtime`): when the value a replay would wait for is
    the one this runtime's previous replay on that device took, the runtime's own device
    timeline already orders the two, and the replay does not wait for it.
    """

    def __init__(self) -> None:
        self._timelines: dict[str, ExternalTimeline] = {}
        self._taken: dict[str, int] = {}

    @staticmethod
    def of_runtime(runtime: Runtime) -> Timelines:
        found = _BY_RUNTIME.get(runtime)
        if found is None:
            found = _BY_RUNTIME[runtime] = Timelines()
        return found

    def of(self, tiny_device: str) -> ExternalTimeline:
        found = self._timelines.get(tiny_device)
        if found is None:
            dev = Device[tiny_device]

            def read(dev: Any = dev) -> int:
                return int(dev.timeline_signal.value)

            def write(value: int, dev: Any = dev) -> None:
                dev.timeline_signal.value = value

            # Waiting polls the word: tinygrad's own signal wait joins the device's whole
            # task queue, which may hold work that waits for this very replay.
            found = ExternalTimeline(f"tinygrad {tiny_device}", read, write)
            self._timelines[tiny_device] = found
        return found

    def points(
        self, tiny_devices: Iterable[str]
    ) -> tuple[list[tuple[ExternalTimeline, int]], list[tuple[ExternalTimeline, int]]]:
        """(after, then) for one replay on these devices; takes their next values."""
        after, then = [], []
        taken = self._taken
        for name in tiny_devices:
            dev: Any = Device[name]
            timeline = self.of(name)
            before = dev.timeline_value - 1
            if taken.get(name) != before:
                after.append((timeline, before))
            value = dev.next_timeline()
            taken[name] = value
            then.append((timeline, value))
        return after, then


_BY_RUNTIME: weakref.WeakKeyDictionary[Runtime, Timelines] = weakref.WeakKeyDictionary()


def devices_of(jit_cache: Sequence[ExecItem], inputs: Sequence[TinyBuffer]) -> list[str]:
    names = {b.device for ei in jit_cache for b in ei.bufs if b is not None}
    names.update(b.device for b in inputs)
    return sorted(names)
