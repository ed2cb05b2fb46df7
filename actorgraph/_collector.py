"""Planning a large graph with CPython's cyclic garbage collector held off.

Compiling a graph makes a few long-lived objects per item (accesses, messages, ops) and
no reference cycles. CPython runs a full collection whenever the objects that survived
its younger passes grow by a quarter of the heap, so while a 10k-item graph is planned
it walks the whole heap several times and frees nothing: about 40% of the compile. The
compile's synchronous steps run with the collector off; it is turned back on after each,
and counts the new objects from then on.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Hold the cyclic collector off for a synchronous burst of allocations.

    Leaves it as it found it: a collector already off (the application's choice, or an
    outer pause) stays off. Reference counting frees memory as usual meanwhile.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
