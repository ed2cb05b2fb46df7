"""Every private part of tinygrad that actorgraph.tinygrad touches, and nothing else.

tinygrad offers no public way for another library to be a device's graph runner, to
read a buffer's host address, or to prepare a jit's inputs as its own call does. What
actorgraph needs of that is here, one small function per need, so a tinygrad release
that changes one of them breaks here, by name, and tests/test_tinygrad_private.py says
which (it checks each against the installed tinygrad). Public tinygrad names (Tensor,
TinyJit, GraphRunner, engine.realize's helpers) are used where they are needed.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

from tinygrad.device import Buffer, Device
from tinygrad.runtime import ops_cpu

# -- memory --


def buffer_address(buf: Any) -> int:
    """The host address of an allocated tinygrad CPU buffer's first byte."""
    return int(buf._buf.va_addr)


def buffer_memory(buf: Any) -> Any:
    """What a tinygrad Buffer's allocator handed out for it (an AG device's AGMemory)."""
    return buf._buf


def buffer_base(buf: Any) -> Any:
    """The base buffer a tinygrad Buffer views, or None when it is a base."""
    return buf._base


def watch_cpu_memory(
    deallocated: Callable[[str, int, int], None], released: Callable[[str, int, int], None]
) -> None:
    """Tell what tinygrad does with the host memory of its CPU devices, as (tinygrad
    device, address, nbytes) of a base buffer: `deallocated` when a buffer is
    deallocated (tinygrad stops using its memory, which its allocator may keep for the
    next buffer of that size on that device: LRU), `released` when the memory stops
    being tinygrad's at all (the allocator frees it, or a buffer over memory it does
    not own, `Tensor.from_blob`, is deallocated). Called on whichever thread frees the
    buffer (garbage collection included), so both must only record. For good: call once.
    """
    allocator = ops_cpu.CPUAllocator
    inherited_free = allocator._free
    deallocate = Buffer.deallocate

    def free(self: Any, buf: Any, *args: Any, **kwargs: Any) -> Any:
        released(self.dev.device, int(buf.va_addr), int(buf.size))
        return inherited_free(self, buf, *args, **kwargs)

    def deallocate_base(self: Any) -> None:
        if self._base is None and self.device.partition(":")[0] == "CPU" and self.is_allocated():
            address, nbytes = buffer_address(self), self.nbytes
            deallocate(self)
            deallocated(self.device, address, nbytes)
            options = self.options
            if options is not None and options.external_ptr is not None:
                released(self.device, address, nbytes)
        else:
            deallocate(self)

    allocator._free = free
    Buffer.deallocate = deallocate_base


# -- devices --


def cpu_device_class() -> type:
    return ops_cpu.CPUDevice  # type: ignore[no-any-return]


def patch_cpu_devices(graph: Callable[..., Any]) -> Callable[[], None]:
    """Make `graph` the graph runner of every tinygrad CPU device, open now or opened
    later; return the function that gives each its own back."""
    cls = ops_cpu.CPUDevice
    own: dict[str, Any] = {}

    def patch(dev: Any) -> None:
        if dev.device not in own:
            own[dev.device] = dev.graph
        dev.graph = graph

    for name in list(Device._opened_devices):
        dev = Device[name]
        if isinstance(dev, cls):
            patch(dev)
    original = cls.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        patch(self)

    cls.__init__ = init

    def restore() -> None:
        cls.__init__ = original
        for name, graph_class in own.items():
            Device[name].graph = graph_class

    restore.devices = own  # type: ignore[attr-defined]
    return restore


def patched_devices(restore: Callable[[], None]) -> list[str]:
    return sorted(getattr(restore, "devices", {}))


def opened_devices() -> list[str]:
    """The names of the tinygrad devices opened so far (tinygrad keeps them open)."""
    return sorted(Device._opened_devices)


def register_device(kind: str, device_class: type) -> Callable[[], None]:
    """Make `Device["KIND"]`, `Device["KIND:1"]`, ... open `device_class` through tinygrad's
    own lookup (it imports `tinygrad.runtime.ops_<kind>` and takes its `<KIND>Device`),
    with the CPU's limit on a kernel's buffers; return the function that undoes it
    (devices tinygrad opened stay open: it caches them)."""
    module_name = f"tinygrad.runtime.ops_{kind.lower()}"
    module = types.ModuleType(module_name, f"actorgraph's {kind} devices (actorgraph.tinygrad)")
    setattr(module, f"{kind}Device", device_class)
    sys.modules[module_name] = module
    from tinygrad.schedule import rangeify

    limits = rangeify.DEVICE_MAX_BUFS
    had = kind in limits
    limits.setdefault(kind, limits["CPU"])

    def restore() -> None:
        if sys.modules.get(module_name) is module:
            del sys.modules[module_name]
        if not had:
            limits.pop(kind, None)

    return restore


# -- the jit --


def prepare_jit_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What TinyJit's own call makes of its arguments: (input buffers or buffer UOps,
    var values, argument names, expected layout per input)."""
    from tinygrad.engine.jit import _prepare_jit_inputs

    return tuple(_prepare_jit_inputs(args, kwargs))


def written_inputs(captured: Any) -> set[Any]:
    """tinygrad 0.14: the input buffer UOps a captured jit writes, which its call copies
    into fresh buffers first (so a caller's tensor is never changed)."""
    return set(captured._written_uops)


# -- tinygrad 0.11's device timelines --


def timeline_read(dev: Any) -> int:
    return int(dev.timeline_signal.value)


def timeline_write(dev: Any, value: int) -> None:
    dev.timeline_signal.value = value


def timeline_pending(dev: Any) -> int:
    """The last timeline value tinygrad's queued work on `dev` will write."""
    return int(dev.timeline_value) - 1


def timeline_take(dev: Any) -> int:
    """Take the device's next timeline value: tinygrad's later work waits for it."""
    return int(dev.next_timeline())


def compiled_function(runner: Any) -> Any:
    """tinygrad 0.11: a CompiledRunner's loaded program (its `.fxn` is the C function)."""
    return runner._prg
