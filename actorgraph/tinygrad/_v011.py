"""The adapter for tinygrad 0.11: a jit cache of ExecItems, in actorgraph's terms.

tinygrad 0.11's TinyJit captures a list of ExecItems (a CompiledRunner, a BufferCopy or
BufferXfer, a ViewOp, each over Buffers) and hands each batch of it to the device's
graph class once (`GraphRunner(jit_cache, input_rawbuffers, var_vals)`, falling back to
running the batch itself when building raises GraphException). The runner is then
called with that call's input buffers and var values (keyed by Variable).

Its CPU devices queue their work on a thread of their own and order it with a
timeline signal per device: queued work waits for the value before it and writes its
own. A replay joins that order (`Timelines`): it takes the device's next value, waits
until tinygrad's work before it has written the one before, runs, and writes its value,
so tinygrad's later work and synchronize() (before every copyout) wait for it.
"""

from __future__ import annotations

import ctypes
import platform
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tinygrad.device import Buffer as TinyBuffer
from tinygrad.device import Device
from tinygrad.engine.jit import GraphException, MultiGraphRunner
from tinygrad.engine.realize import BufferCopy, BufferXfer, CompiledRunner, ExecItem, ViewOp
from tinygrad.tensor import Tensor
from tinygrad.uop.ops import Ops, UOp

from .._errors import InputError, UsageError
from .._foreign import ExternalTimeline
from .._vars import Var
from ._batch import Batch
from ._check import TinyCall
from ._convert import (
    Call,
    CopyCall,
    KernelCall,
    Layouts,
    Region,
    Root,
    Wrapper,
    check_arguments,
    check_live,
    cpu_kernel,
    device_name,
    jit_name,
    layout_key,
)
from ._install import current
from ._private import (
    buffer_address,
    buffer_base,
    compiled_function,
    cpu_device_class,
    prepare_jit_inputs,
    timeline_pending,
    timeline_read,
    timeline_take,
    timeline_write,
)

VERSION = "0.11.0"

# tinygrad 0.11 passes a kernel's int values as 32-bit on x86, 64-bit on arm64.
_VALUE_TYPE = ctypes.c_int64 if platform.machine() in ("arm64", "aarch64") else ctypes.c_int32


class Timelines:
    """tinygrad's device timelines, as install()'s Ordering and the trio path's points."""

    queues = True

    def __init__(self) -> None:
        self._timelines: dict[str, ExternalTimeline] = {}
        self._lock = threading.Lock()

    def of(self, tiny_device: str) -> ExternalTimeline:
        found = self._timelines.get(tiny_device)
        if found is None:
            dev = Device[tiny_device]
            # Waiting polls the word: tinygrad's own signal wait joins the device's whole
            # task queue, which may hold work that waits for this very replay.

            def read(dev: Any = dev) -> int:
                return timeline_read(dev)

            def write(value: int, dev: Any = dev) -> None:
                timeline_write(dev, value)

            found = ExternalTimeline(f"tinygrad {tiny_device}", read, write)
            self._timelines[tiny_device] = found
        return found

    def take(
        self, tiny_devices: Iterable[str]
    ) -> tuple[list[tuple[ExternalTimeline, int]], list[tuple[ExternalTimeline, int]]]:
        """(after, then) for one replay on these devices: it starts once the value just
        before its own is written, and writes its own when done.

        The value waited for comes from the value taken, never from a look at the device
        before taking: tinygrad's own work on another thread may take a value in
        between, and a replay that did not wait for it could write its value first
        (tinygrad's then writes an earlier one, and the timeline goes back)."""
        after, then = [], []
        with self._lock:
            for name in tiny_devices:
                timeline = self.of(name)
                value = timeline_take(Device[name])
                after.append((timeline, value - 1))
                then.append((timeline, value))
        return after, then

    def replay(self, devices: Sequence[str], run: Callable[[], None]) -> None:
        after, then = self.take(devices)
        try:
            for timeline, value in after:
                if not timeline.reached(value):
                    timeline.wait_for(value)
            run()
        finally:
            for timeline, value in then:  # failed or not: tinygrad must never wait forever
                timeline.advance(value)


ORDERING = Timelines()


def _refusal(devs: Sequence[Any], ei: Any, ndevices: int | None) -> str | None:
    cpu = cpu_device_class()
    if not all(isinstance(d, cpu) for d in devs):
        return "a batch on other devices than CPU ones"
    prg = ei.prg
    if isinstance(prg, CompiledRunner):
        names = [prg.device]
    elif isinstance(prg, (BufferCopy, BufferXfer)):
        names = [b.device for b in ei.bufs if b is not None]
    elif isinstance(prg, ViewOp):
        return None
    else:
        return (
            f"a {type(prg).__name__} ({getattr(prg, 'display_name', prg)}); actorgraph runs "
            f"compiled CPU kernels, BufferCopy, BufferXfer and ViewOp items only"
        )
    for name in names:
        if not isinstance(Device[name], cpu):
            return f"an item on {name} (actorgraph runs tinygrad's CPU devices only)"
        if ndevices is not None and int(device_name(name).split(":")[1]) >= ndevices:
            return (
                f"an item on {name}, past the {ndevices} CPU devices actorgraph.tinygrad "
                f"opened (install(devices=N) with a larger N)"
            )
    return None


def _var(tiny: Any) -> Var:
    return Var(str(tiny.expr), int(tiny.vmin), int(tiny.vmax))


def describe(
    jit_cache: Sequence[Any],
    inputs: Sequence[TinyBuffer],
    input_replace: dict[tuple[int, int], int],
) -> tuple[list[Call], list[Root], list[int], dict[str, Var]]:
    """The cache's items as calls; the roots (with the input each is, by its number in
    `inputs`) and the variables. An input that is a view of another input is a region
    of that one's root."""
    reader = _Reader(inputs, input_replace)
    for j, ei in enumerate(jit_cache):
        prg = ei.prg
        if isinstance(prg, CompiledRunner):
            reader.calls.append(reader.kernel_call(j, ei))
        elif isinstance(prg, (BufferCopy, BufferXfer)):
            reader.calls.append(reader.copy_call(j, ei))
        elif not isinstance(prg, ViewOp):
            raise UsageError(
                f"jit cache item {j} is a {type(prg).__name__} "
                f"({getattr(prg, 'display_name', prg)}); actorgraph runs compiled CPU kernels, "
                f"BufferCopy, BufferXfer and ViewOp items only"
            )
    return reader.calls, reader.roots, reader.sources, reader.variables


class _Reader:
    """Reads a jit cache's items against one call's input buffers (tinygrad Buffers hash
    by identity: an input is found by the Buffer itself)."""

    def __init__(
        self, inputs: Sequence[TinyBuffer], input_replace: dict[tuple[int, int], int]
    ) -> None:
        self.inputs = inputs
        self.input_replace = input_replace
        self.number: dict[TinyBuffer, int] = {b: k for k, b in enumerate(inputs)}
        self.calls: list[Call] = []
        self.roots: list[Root] = []
        self.sources: list[int] = []  # per root: its input's number
        self.variables: dict[str, Var] = {}
        self._root_of: dict[int, int] = {}  # input number -> root
        self._kernels: dict[CompiledRunner, Any] = {}

    def kernel_call(self, j: int, ei: Any) -> KernelCall:
        prg = ei.prg
        kernel = self._kernels.get(prg)
        if kernel is None:
            kernel = self._kernels[prg] = _kernel(prg)
        fixed = {v.expr: int(value) for v, value in ei.fixedvars.items()}
        values: list[Var | int] = []
        for var in prg.p.vars:
            if var.expr in fixed:
                values.append(fixed[var.expr])
            else:
                values.append(self.variables.setdefault(var.expr, _var(var)))
        args = tuple(self.region(j, i, b, True) for i, b in enumerate(ei.bufs))
        return KernelCall(kernel, args, tuple(values))

    def copy_call(self, j: int, ei: Any) -> CopyCall:
        dst, src = (self.region(j, i, b, False) for i, b in enumerate(ei.bufs[:2]))
        return CopyCall(
            dst, Region(src.device, src.root, src.offset, dst.nbytes, src.address, src.base_nbytes)
        )

    def region(self, j: int, i: int, buf: TinyBuffer | None, whole: bool) -> Region:
        """Where buffer `i` of item `j` lies: in an input's root, or in the jit's own
        memory. `whole`: an argument that is a whole input covers all of it on every call
        (a copy moves a fixed number of bytes instead)."""
        k = self.input_replace.get((j, i))
        if k is not None:
            given = self.inputs[k]
            base = buffer_base(given)
            if base is not None and base in self.number:  # a view of another input
                root = self._root(self.number[base])
                return Region(device_name(given.device), root, given.offset, given.nbytes)
            return Region(
                device_name(given.device), self._root(k), 0, -1 if whole else given.nbytes
            )
        if buf is None:
            raise InputError(f"jit cache item {j} buffer {i} is missing (freed?)")
        # Memory the jit holds, allocated as tinygrad's first run of a jit allocates it
        # (after free_intermediates(), say).
        buf.ensure_allocated()
        base = buffer_base(buf)
        held = buf if base is None else base
        offset = 0 if base is None else buf.offset
        return Region(
            device_name(buf.device), -1, offset, buf.nbytes, buffer_address(held), held.nbytes
        )

    def _root(self, k: int) -> int:
        """The root of input `k`, made the first time it is met."""
        found = self._root_of.get(k)
        if found is None:
            found = self._root_of[k] = len(self.roots)
            self.roots.append(Root(device_name(self.inputs[k].device), self.inputs[k].nbytes))
            self.sources.append(k)
        return found


def _kernel(runner: Any) -> Any:
    program = runner.p
    loaded = compiled_function(runner)
    fxn = getattr(loaded, "fxn", None)
    if fxn is None:
        raise UsageError(
            f"kernel {program.name!r} has no compiled CPU function (a {type(loaded).__name__}); "
            f"actorgraph runs tinygrad CPU kernels only"
        )
    nbufs = len(program.globals)
    return cpu_kernel(
        program.function_name,
        int(ctypes.cast(fxn, ctypes.c_void_p).value or 0),
        nbufs,
        len(program.vars),
        _VALUE_TYPE,
        program.outs,
        program.ins,
        keep=loaded,
    )


def _places(sources: Sequence[int], inputs: Sequence[TinyBuffer]) -> list[tuple[int, int]]:
    out = []
    for k in sources:
        buf = inputs[k]
        if not buf.is_allocated():
            raise InputError(
                f"jit input {k}: its tinygrad buffer {buf!r} was freed; pass a realized tensor"
            )
        out.append((buffer_address(buf), buf.nbytes))
    return out


class ActorGraph(MultiGraphRunner):  # type: ignore[misc]
    """tinygrad's graph runner for CPU devices, replaying through actorgraph (named like
    tinygrad's own graph classes, HCQGraph, CUDAGraph, which tools recognise by the name).

    Takes compiled kernels and copies between CPU devices (tinygrad's own CPU graph
    splits at copies; this one does not), on any number of CPU devices in one batch.
    """

    def __init__(
        self, jit_cache: list[Any], input_rawbuffers: list[TinyBuffer], var_vals: dict[Any, int]
    ) -> None:
        state = current()
        if state is None:
            raise GraphException("actorgraph.tinygrad is not installed")
        super().__init__(jit_cache, input_rawbuffers, var_vals)
        self._state = state
        for ei in jit_cache:
            refusal = _refusal([], ei, state.ndevices)
            if refusal is not None:
                raise GraphException(refusal)
        calls, roots, sources, variables = describe(jit_cache, input_rawbuffers, self.input_replace)
        self._sources = sources
        self._batch = Batch(calls, roots, variables, state.wrapper, sizes_known=False)
        names = {b.device for ei in jit_cache for b in ei.bufs if b is not None}
        names.update(input_rawbuffers[k].device for k in sources)
        self._tiny_devices = sorted(names)
        state.graph_made()

    @staticmethod
    def supports_exec_item(devs: list[Any], ei: Any) -> bool:
        state = current()
        return state is not None and _refusal(devs, ei, state.ndevices) is None

    def __call__(
        self, rawbufs: list[TinyBuffer], var_vals: dict[Any, int], wait: bool = False
    ) -> float | None:
        given = {v.expr: value for v, value in var_vals.items()}
        return self._state.replay(
            self._batch, _places(self._sources, rawbufs), given, self._tiny_devices, wait
        )


class Reference:
    """One replay's batch as tinygrad 0.11 runs it, for install(check_replays=N): its
    ExecItems with the replay's input buffers in their places, as its jit puts them."""

    def __init__(
        self,
        jit_cache: Sequence[Any],
        input_replace: dict[tuple[int, int], int],
        rawbufs: Sequence[TinyBuffer],
        var_vals: dict[Any, int],
    ) -> None:
        self._var_vals = dict(var_vals)
        self._items: list[tuple[TinyCall, Any]] = []
        for j, ei in enumerate(jit_cache):
            prg = ei.prg
            if isinstance(prg, ViewOp):
                continue  # makes a view: nothing runs, no byte changes
            bufs = [
                rawbufs[input_replace[(j, i)]] if (j, i) in input_replace else b
                for i, b in enumerate(ei.bufs)
            ]
            if isinstance(prg, CompiledRunner):
                name, outs = prg.p.function_name, tuple(prg.p.outs)
            else:
                name, outs = "copy", (0,)
            self._items.append((TinyCall(j, name, bufs, outs), ei))

    def calls(self) -> list[TinyCall]:
        return [tiny for tiny, _ in self._items]

    def run(self, shadow: Any) -> None:
        """Each ExecItem run as tinygrad's jit runs it, on the shadows; then every
        device it used synchronized (tinygrad queues the work on a thread per device)."""
        devices: set[str] = set()
        for tiny, ei in self._items:
            bufs = [shadow(b) for b in tiny.bufs]
            ExecItem(ei.prg, bufs, ei.metadata, ei.fixedvars).run(self._var_vals, jit=True)
            devices.update(b.device for b in bufs)
        for name in sorted(devices):
            Device[name].synchronize()


class CheckedActorGraph(ActorGraph):
    """The runner while install(check_replays=N) is on: a replay also hands install() the
    batch as tinygrad runs it, for the check."""

    def __call__(
        self, rawbufs: list[TinyBuffer], var_vals: dict[Any, int], wait: bool = False
    ) -> float | None:
        given = {v.expr: value for v, value in var_vals.items()}
        cache, replace = self.jit_cache, self.input_replace
        return self._state.replay_checked(
            self._batch,
            _places(self._sources, rawbufs),
            given,
            self._tiny_devices,
            wait,
            lambda: Reference(cache, replace, rawbufs, var_vals),
        )


def synchronize(name: str) -> None:
    Device[name].synchronize()


def _largest(layout: Any, itemsize: int) -> int:
    """Bytes the largest input of this captured layout (a ShapeTracker over Variables)
    may hold: its shape with every variable at its maximum."""
    total = itemsize
    for dim in layout.shape:
        total *= int(dim.vmax) if hasattr(dim, "vmax") else int(dim)
    return total


class JitSource:
    """A captured TinyJit as the trio path reads it: its cache, and per call its roots
    from the jit's own arguments, checked as TinyJit checks them."""

    def __init__(self, jit: Any, wrapper: Wrapper) -> None:
        self.name = jit_name(jit)
        captured = getattr(jit, "captured", None)
        if captured is None:
            raise UsageError(
                f"{self.name} has not captured its work yet; call it twice first (tinygrad's "
                f"TinyJit captures on its second call)"
            )
        self._captured = captured
        self._cache = list(captured.jit_cache)
        for j, ei in enumerate(self._cache):
            refusal = _refusal([], ei, None)
            if refusal is not None:
                raise UsageError(f"jit cache item {j} of {self.name} is {refusal}")
        self._wrapper = wrapper
        self.size = len(self._cache)
        self.ret = captured.ret
        self.batch: Batch | None = None
        self._sources: list[int] = []
        self._timelines = ORDERING
        self._layouts = Layouts()
        self._devices: list[tuple[str, Any]] | None = None

    def _layout_of(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, int], tuple[Any, ...]] | None:
        """(input buffers, var values by name, layout) as TinyJit's check would give
        them for a call whose tensor arguments are realized, each on one device; None
        for any other call (tinygrad's own check handles those)."""
        if kwargs:
            return None
        inputs: list[Any] = []
        var_vals: dict[str, int] = {}
        keys: list[Any] = []
        for value in args:
            if value.__class__ is Tensor:
                uop = value.uop
                base = uop.base
                if base.op is not Ops.BUFFER or uop.op is Ops.MULTI:
                    return None
                buf = base.buffer
                if not buf.is_allocated():
                    return None
                key = layout_key(uop, base, (base.dtype, base.arg, base.device))
                if key is None:
                    return None
                inputs.append(buf)
                keys.append(key)
            elif isinstance(value, UOp):
                if value.op is not Ops.BIND:
                    return None
                var, bound = value.unbind()
                var_vals[var.expr] = bound
            elif isinstance(value, (tuple, list, dict)):
                return None
        if len(set(map(id, inputs))) != len(inputs):
            return None  # tinygrad refuses it: let its check say so
        return inputs, var_vals, tuple(keys)

    def _inputs(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, int]]:
        """This call's input buffers (in TinyJit's order) and var values by name."""
        found = self._layout_of(args, kwargs)
        known = self._layouts.answer(found)
        if known is not None:
            return known
        named = [*enumerate(args), *sorted(kwargs.items())]
        check_live(
            self.name,
            (
                (n, part.base.buffer)
                for n, v in named
                if isinstance(v, Tensor)
                for part in (v.uop.src if v.uop.op is Ops.MULTI else (v.uop,))
                if part.base.op is Ops.BUFFER
            ),
        )
        buffers, tiny_vals, names, layouts = prepare_jit_inputs(args, kwargs)
        captured = self._captured
        check_arguments(
            self.name,
            names,
            captured.expected_names,
            layouts,
            captured.expected_st_vars_dtype_device,
        )
        var_vals = {v.expr: value for v, value in tiny_vals.items()}
        self._layouts.accept(found, var_vals)
        return list(buffers), var_vals

    async def prepare(
        self, runtime: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Batch, list[Any], dict[str, int]]:
        inputs, var_vals = self._inputs(args, kwargs)
        if self.batch is not None and self.batch.stale():
            self.batch = None  # tinygrad let go of memory the jit held: read it again
        if self.batch is None:
            captured = self._captured
            every = list(inputs)  # with the views of inputs the jit reads, for reading it
            for base, offset, device, size, dtype in captured.extra_view_inputs:
                every.append(TinyBuffer(device, size, dtype, base=every[base], offset=offset))
            calls, roots, sources, variables = describe(
                self._cache, every, dict(captured.input_replace)
            )
            layouts = captured.expected_st_vars_dtype_device
            largest = [
                max(root.nbytes, _largest(layouts[k][0], layouts[k][2].itemsize))
                if k < len(layouts)
                else root.nbytes
                for root, k in zip(roots, sources)
            ]
            roots = [Root(r.device, n) for r, n in zip(roots, largest)]
            self._sources = sources
            self.batch = Batch(
                calls, roots, variables, self._wrapper, sizes_known=False, keep=captured
            )
        return self.batch, self.batch.wrap_roots(_places(self._sources, inputs)), var_vals

    def points(self, batch: Batch) -> tuple[list[Any], list[Any]]:
        """Timeline points for this call's replay: none while tinygrad has nothing queued
        on the jit's devices (the replay is done before the call returns, so tinygrad's
        later work comes after it on this thread); else the devices' next values, so
        the replay waits for the queued work and tinygrad's later work for the replay."""
        devices = self._devices
        if devices is None:
            names = {b.device for ei in self._cache for b in ei.bufs if b is not None}
            names.update(Device.canonicalize(root.device) for root in batch.roots)
            devices = self._devices = [(name, Device[name]) for name in sorted(names)]
        if all(timeline_read(dev) >= timeline_pending(dev) for _, dev in devices):
            return [], []
        return self._timelines.take([name for name, _ in devices])
