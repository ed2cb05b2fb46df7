"""tinygrad's frees of its CPU devices' memory, told to every Wrapper that wrapped it.

tinygrad frees memory whenever it likes (a tensor going away, `free_intermediates()`,
its allocator's cache emptied), on any thread, garbage collection included. The hooks
(`_private.watch_cpu_memory`, set once, by the first Wrapper made) only record what was
freed with each live Wrapper; each lets go of its wrappers of that memory at the start
of its next call (`Wrapper.forget_freed`).
"""

from __future__ import annotations

import threading
import weakref

from ._convert import Wrapper, device_name
from ._private import watch_cpu_memory

# The live Wrappers, replaced whole (never changed in place): the hooks read it from
# any thread.
_wrappers: tuple[weakref.ref[Wrapper], ...] = ()
_lock = threading.Lock()
_watching = False


# tinygrad's device names as actorgraph's: every free of a buffer asks.
_names: dict[str, str] = {}


def _name(tiny_device: str) -> str:
    name = _names.get(tiny_device)
    if name is None:
        name = _names[tiny_device] = device_name(tiny_device)
    return name


def _deallocated(tiny_device: str, address: int, nbytes: int) -> None:
    key = (_name(tiny_device), address, nbytes)
    for ref in _wrappers:
        wrapper = ref()
        if wrapper is not None:
            wrapper.deallocated(key)


def _released(tiny_device: str, address: int, nbytes: int) -> None:
    key = (_name(tiny_device), address, nbytes)
    for ref in _wrappers:
        wrapper = ref()
        if wrapper is not None:
            wrapper.released(key)


def watched(wrapper: Wrapper) -> Wrapper:
    """`wrapper`, told from now on of the memory tinygrad frees; returns it."""
    global _wrappers, _watching
    with _lock:
        if not _watching:
            watch_cpu_memory(_deallocated, _released)
            _watching = True
        live = tuple(ref for ref in _wrappers if ref() is not None)
        _wrappers = (*live, weakref.ref(wrapper))
    return wrapper
