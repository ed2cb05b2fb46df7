"""Captured tinygrad work in actorgraph's terms, whatever the tinygrad release.

Each adapter (`_v011`, `_v014`) reads its release's captured batch into the neutral form
here: `KernelCall`s and `CopyCall`s over `Region`s. A region is bytes of host memory:
either part of an input root (a buffer passed anew on every call, numbered in the batch)
or part of memory the jit holds (its weights, its arena of intermediates), known by
address. Everything is bytes (uint8 views): kernels take addresses and copies move
bytes, so no dtype has to survive the trip, and the planner orders items by the bytes
they touch.

tinygrad's CPU devices (`CPU`, `CPU:1`, ...) map to actorgraph's `CPU:0`, `CPU:1`, ...
This module imports no tinygrad.
"""

from __future__ import annotations

import collections
import ctypes
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from .._background import BackgroundRuntime
from .._buffer import Buffer
from .._errors import InputError, UsageError
from .._kernel import Copy, Item, Kernel, Launch
from .._runtime import Runtime
from .._vars import Var

U8 = np.dtype(np.uint8)


def device_name(tiny_device: str, remote: Sequence[str] = ()) -> str:
    """actorgraph's name for a tinygrad CPU device ("CPU" -> "CPU:0", "CPU:2" -> "CPU:2"),
    or for an AG device the worker device install() made it ("AG:1" -> remote[1])."""
    kind, _, index = tiny_device.partition(":")
    if kind == "AG" and (index == "" or index.isdigit()) and int(index or 0) < len(remote):
        return remote[int(index or 0)]
    if kind != "CPU" or not (index == "" or index.isdigit()):
        raise UsageError(
            f"tinygrad device {tiny_device!r} is not a CPU device (nor an AG device of the "
            f"workers install(remote=...) opened); actorgraph runs tinygrad work on CPU "
            f"devices (CPU, CPU:1, ...) and AG devices"
        )
    return f"CPU:{int(index or 0)}"


def device_index(tiny_device: str) -> int:
    return int(device_name(tiny_device).split(":")[1])


@attrs.frozen
class Region:
    """Bytes one argument of a call touches: `nbytes` from `offset` into input root
    `root` (>= 0; nbytes -1: the whole root, however large it is on a call), or, with
    root -1, into the memory the jit holds at `address` (a base of `base_nbytes` bytes,
    which stays the jit's)."""

    device: str  # actorgraph's name
    root: int
    offset: int
    nbytes: int
    address: int = 0
    base_nbytes: int = 0
    memory: Any = None  # on an AG device: the allocation (an AGMemory), for root -1


@attrs.frozen
class KernelCall:
    """A compiled kernel over regions. `values` are its value arguments in order: an
    ag.Var bound per call, or a fixed int (a lane's device number); `dims` its launch's
    global size where the kernel reads it (machine code on a worker, called once per
    core), else None."""

    kernel: Kernel
    args: tuple[Region, ...]
    values: tuple[Var | int, ...]
    dims: tuple[int, ...] | None = None


@attrs.frozen
class CopyCall:
    dst: Region
    src: Region


Call = KernelCall | CopyCall


@attrs.frozen
class Root:
    """An input root of a batch: a buffer of `nbytes` on `device` passed on every call
    (`remote`: a worker's device, its memory an AGMemory, not a host address)."""

    device: str
    nbytes: int
    remote: bool = False


Key = tuple[str, int, int]  # (actorgraph device, address, nbytes) of a tinygrad base buffer


class Wrapper:
    """Host memory tinygrad owns, as actorgraph buffers of one runtime (`rt.wrap`).

    Bases are wrapped as bytes by (device, address, size), cached, so a buffer tinygrad
    hands out again at the same place maps to the same Buffer, whose bound replays a
    graph keeps: the memory of a call's inputs (`root`, the latest `limit` kept) and the
    memory a jit holds (`held`: its weights, its arena; kept while tinygrad keeps it).

    A wrapper lives no longer than tinygrad's hold on its memory: tinygrad's frees are
    recorded as they happen (`deallocated`, `released`, from any thread) and the
    wrappers of that memory let go of (`forget_freed`, by whoever uses the Wrapper, at
    the start of a call: `free` them, the runtime's `free` by default), so memory that
    tinygrad hands out again, on another device say, is wrapped anew, and a graph over a
    jit's memory that tinygrad let go of is never run again on it. Used by one thread at
    a time (install's lock, or the trio program's thread).
    """

    def __init__(
        self,
        runtime: Runtime | BackgroundRuntime,
        free: Callable[[Buffer], None] | None = None,
        limit: int = 256,
    ) -> None:
        self.runtime = runtime  # a Runtime, or a BackgroundRuntime (the trio path's)
        self._free = runtime.free if free is None else free
        self._roots: dict[Key, Buffer] = {}
        self._held: dict[Key, Buffer] = {}
        self._limit = limit
        self._freed: collections.deque[Key] = collections.deque()
        # Wrappers of a jit's memory let go of so far (a graph that used one is stale).
        self.held_freed = 0

    def root(self, device: str, address: int, nbytes: int) -> Buffer:
        """A wrapper of an input's memory."""
        key = (device, address, nbytes)
        found = self._roots.get(key)
        if found is not None:
            return found
        wrapped = self.runtime.wrap(device, address, nbytes=nbytes, dtype=U8)
        roots = self._roots
        if len(roots) >= self._limit:
            oldest = next(iter(roots))
            self._let_go(roots.pop(oldest))  # wrapped again if seen again
        roots[key] = wrapped
        return wrapped

    def held(self, device: str, address: int, nbytes: int) -> Buffer:
        """A wrapper of memory the jit holds."""
        key = (device, address, nbytes)
        found = self._held.get(key)
        if found is None:
            found = self._held[key] = self.runtime.wrap(device, address, nbytes=nbytes, dtype=U8)
        return found

    def deallocated(self, key: Key) -> None:
        """tinygrad deallocated the base buffer at `key`: memory a jit held is not the
        jit's any more (its allocator may hand it to the next buffer of that size).
        Records only (any thread, garbage collection included)."""
        if key in self._held:
            self._freed.append(key)

    def released(self, key: Key) -> None:
        """The memory at `key` is not tinygrad's any more: the next buffer there may be
        another device's. Records only (any thread, garbage collection included)."""
        if key in self._roots or key in self._held:
            self._freed.append(key)

    def forget_freed(self) -> None:
        """Let go of the wrappers of memory tinygrad freed since the last call."""
        freed = self._freed
        while freed:
            key = freed.popleft()
            root = self._roots.pop(key, None)
            if root is not None:
                self._let_go(root)
            held = self._held.pop(key, None)
            if held is not None:
                self.held_freed += 1
                self._let_go(held)

    def _let_go(self, buf: Buffer) -> None:
        if not buf.freed and not self.runtime.closed:
            self._free(buf)


def placeholder(runtime: Runtime | BackgroundRuntime, device: str, nbytes: int) -> Buffer:
    """A buffer of `nbytes` on host device `device` in memory of its own, which nothing
    else uses: what a graph is planned with for an input that must not be taken for
    memory the jit holds (see Batch.plan). Its pages are mapped only if written."""
    buf: Buffer = runtime.wrap(device, np.zeros(nbytes, np.uint8), dtype=U8)
    return buf


def held_lookup(
    held: Mapping[Key, Buffer], runtime: Runtime | None = None
) -> Callable[[Region], Buffer]:
    """How build_items finds the memory the jit holds: on this host, its wrapper in `held`
    (Batch.hold); on a worker (an AG device), its allocation's Buffer on `runtime`, made
    there on first use (so only on the runtime's thread; None for a batch on this host
    only)."""

    def find(region: Region) -> Buffer:
        if region.memory is not None:
            assert runtime is not None  # a batch on workers is planned with its runtime
            buf: Buffer = region.memory.buffer(runtime)
            return buf
        return held[(region.device, region.address, region.base_nbytes)]

    return find


def region_buffer(
    region: Region, roots: Sequence[Buffer], held: Callable[[Region], Buffer]
) -> Buffer:
    if region.root >= 0:
        base = roots[region.root]
        if region.nbytes < 0:
            return base
    else:
        base = held(region)
    if region.offset == 0 and region.nbytes == base.nbytes:
        return base
    return base.view(region.offset, region.nbytes)


def build_items(
    calls: Sequence[Call], roots: Sequence[Buffer], held: Callable[[Region], Buffer]
) -> list[Item]:
    """The batch's calls as actorgraph items over these roots and the jit's own memory,
    which `held` finds (held_lookup)."""
    items: list[Item] = []
    for call in calls:
        if isinstance(call, KernelCall):
            bufs = [region_buffer(r, roots, held) for r in call.args]
            variables = tuple(_value_var(v, k) for k, v in enumerate(call.values))
            fixed = {
                var: value
                for var, value in zip(variables, call.values)
                if not isinstance(value, Var)
            }
            items.append(
                Launch(call.kernel, bufs, vars=variables, fixedvars=fixed, global_size=call.dims)
            )
        else:
            dst = region_buffer(call.dst, roots, held)
            src = region_buffer(call.src, roots, held)
            items.append(Copy(dst=dst, src=src))
    return items


def _value_var(value: Var | int, position: int) -> Var:
    """The Var a kernel's value argument is passed as: its own, or for a fixed value a
    Var of its position bound through the launch's fixedvars (Vars compare by value)."""
    if isinstance(value, Var):
        return value
    return Var(f"fixed_{position}", value, value)


def cpu_kernel(
    name: str,
    address: int,
    nbufs: int,
    nvalues: int,
    value_type: Any,
    outs: Sequence[int],
    ins: Sequence[int],
    *,
    keep: Any,
    core_id: int | None = None,
    cores: int = 1,
) -> Kernel:
    """A Kernel that calls tinygrad's compiled CPU function at `address` with the buffers'
    addresses (uint64) and the values (`value_type` each). `keep` owns the code's memory
    (tinygrad's program object); the function holds it. A kernel with a `core_id` value
    (position `core_id` among the values) is called once per core, core_id 0..cores-1,
    one after another, as tinygrad calls it; the Kernel's callers pass every value but
    that one."""
    signature = ctypes.CFUNCTYPE(None, *([ctypes.c_uint64] * nbufs + [value_type] * nvalues))
    function = signature(address)
    function.keep = keep  # type: ignore[attr-defined]  # the code lives as long as its caller
    body: Callable[..., Any]
    if core_id is None:
        body = function  # called straight from the replay loop: no Python frame between
    else:
        slot = nbufs + core_id

        def body(*args: int, _fn: Any = function, _cores: int = cores, _slot: int = slot) -> None:
            values = list(args)
            values.insert(_slot, 0)
            for core in range(_cores):
                values[_slot] = core
                _fn(*values)

    outs_set = sorted(set(outs))
    ins_set = sorted(set(ins) | (set(range(nbufs)) - set(outs_set)))
    if not outs_set:
        raise UsageError(f"tinygrad kernel {name!r} writes no buffer; actorgraph cannot order it")
    kernel_name = name if name.isidentifier() else "tinygrad_kernel"
    return Kernel(kernel_name, cpu=body, cpu_args="addresses", outs=outs_set, ins=ins_set)


def regions_of(call: Call) -> tuple[Region, ...]:
    return call.args if isinstance(call, KernelCall) else (call.dst, call.src)


def jit_name(jit: Any) -> str:
    """How a message names a TinyJit: by the function it jits (its repr names only its
    class and address)."""
    name = getattr(getattr(jit, "fxn", None), "__name__", None)
    return f"jit {name!r}" if isinstance(name, str) else "this jit"


def layout_key(uop: Any, base: Any, base_key: Any) -> tuple[Any, ...] | None:
    """A tensor argument's layout: its view chain from `uop` down to its buffer `base`
    (each view's op, arg, dtype and other operands) and `base_key` (the buffer's dtype,
    size and device), never the buffer's identity; None for a chain too long to bother."""
    parts = [base_key]
    node = uop
    for _ in range(32):
        if node is base:
            return tuple(parts)
        parts.append((node.op, node.arg, node.dtype, node.src[1:]))
        node = node.src[0]
    return None


class Layouts:
    """Argument layouts a jit's own check accepted, so a call whose tensor arguments all
    have known layouts needs no second check. tinygrad walks every tensor argument's
    views on every call of a jit (about 17 us a call on 0.11, 66 us on 0.14); a new
    tensor of a layout seen before gets the same answer, so it is checked once per
    layout. A symbolic layout carries its bound values (checked once per value), and
    the var values tinygrad read from it are kept with it. The latest `limit` are kept.

    A call's layout, as an adapter reads it: (inputs, var values from its non-tensor
    arguments, layout key), or None for a call it cannot read so."""

    def __init__(self, limit: int = 64) -> None:
        self._known: dict[tuple[Any, ...], dict[str, int]] = {}
        self._limit = limit

    def answer(self, found: Found | None) -> tuple[list[Any], dict[str, int]] | None:
        """(inputs, var values) for a call of a known layout, else None."""
        if found is None:
            return None
        bound = self._known.get(found[2])
        if bound is None:
            return None
        return found[0], {**bound, **found[1]}

    def accept(self, found: Found | None, var_vals: dict[str, int]) -> None:
        """tinygrad's check accepted this call: the next of its layout skips the check,
        taking the values of the variables its layouts bind from here."""
        if found is None:
            return
        known = self._known
        if len(known) >= self._limit:
            del known[next(iter(known))]
        known[found[2]] = {k: v for k, v in var_vals.items() if k not in found[1]}


Found = tuple[list[Any], dict[str, int], tuple[Any, ...]]


def check_live(jit: str, named: Iterable[tuple[Any, Any]]) -> None:
    """Refuse a tensor argument whose tinygrad buffer was freed ((name, buffer) pairs)."""
    for name, buf in named:
        if not buf.is_allocated():
            raise InputError(
                f"tensor argument {name!r} of {jit}: its tinygrad buffer {buf!r} was freed; "
                f"pass a realized tensor"
            )


def check_arguments(jit: str, names: Any, expected_names: Any, layouts: Any, expected: Any) -> None:
    """Refuse arguments TinyJit would refuse: other tensor arguments than it captured, or
    one of another layout ((view, vars, dtype, device) as tinygrad describes it)."""
    if names != expected_names:
        raise InputError(
            f"{jit} was captured with tensor arguments {expected_names} but got {names}; "
            f"pass the same arguments"
        )
    for name, got, want in zip(names, layouts, expected):
        if got != want:
            raise InputError(
                f"tensor argument {name!r} of {jit} has shape {got[0].shape} {got[2]} on "
                f"{got[3]} but the jit was captured for {want[0].shape} {want[2]} on "
                f"{want[3]}; pass a tensor of the captured layout (symbolic dims may vary)"
            )
