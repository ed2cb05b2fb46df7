"""A CUDA driver without a GPU: host memory, one thread per stream, CPU kernel bodies.

It keeps the properties the CUDA device relies on, so the device's code runs unchanged:
- a stream runs its commands in order on its own thread, asynchronously to the caller;
- a 64-bit wait blocks only its stream, until the word reaches the value (the driver's
  cyclic >= comparison), and a write makes the word visible to every waiting stream;
- an event wait waits for the most recent record of that event at the time of the call;
- a graph is a chain of nodes; an instantiated graph keeps its own copy of the node
  parameters, which updates change, and a launch runs the nodes in order on the stream;
- device pointers are real host addresses, so copies between "devices" (even between two
  FakeDriver instances) are plain memmoves.
It also counts what it was asked to do (`statistics()`), so tests can see which path ran.
"""

from __future__ import annotations

import ctypes
import hashlib
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from ._driver import CopyKind, CudaError

_MASK64 = (1 << 64) - 1

# One condition for every fake word in the process: a write wakes every waiting stream,
# which then re-reads its own word. Shared so that streams of two FakeDriver instances
# (two runtimes' devices, or a test's own driver) see each other's writes.
_WORDS_CHANGED = threading.Condition()
# A stream waiting on a word that only the host writes (not through a stream) re-checks
# at this period; stream writes wake waiters at once.
_POLL_S = 0.002


def _read64(pointer: int) -> int:
    return ctypes.c_uint64.from_address(pointer).value


def reached(word: int, value: int) -> bool:
    """CU_STREAM_WAIT_VALUE_GEQ: (int64_t)(*addr - value) >= 0, a cyclic comparison."""
    return ((word - value) & _MASK64) < (1 << 63)


class _Stream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False
        self.handle = id(self)  # what int() of a real CUstream gives: its address
        self._commands: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def __int__(self) -> int:
        return self.handle

    def put(self, command: Callable[[], None]) -> None:
        if self.closed:
            raise RuntimeError(f"fake stream {self.name} was destroyed")
        self._commands.put(command)

    def _main(self) -> None:
        while True:
            command = self._commands.get()
            if command is None or self.closed:
                return
            command()

    def wait_word(self, pointer: int, value: int) -> None:
        with _WORDS_CHANGED:
            while not reached(_read64(pointer), value) and not self.closed:
                _WORDS_CHANGED.wait(_POLL_S)

    def close(self) -> None:
        self.closed = True
        self._commands.put(None)
        with _WORDS_CHANGED:
            _WORDS_CHANGED.notify_all()


class _Event:
    def __init__(self) -> None:
        self.current = threading.Event()
        self.current.set()  # never recorded: waiting on it does not block (as in CUDA)

    def recorded(self) -> Callable[[], None]:
        """It is recorded on a stream: it is reached once the returned function is
        called (by the stream, when it gets there)."""
        self.current = threading.Event()
        return self.current.set


@attrs.define
class _Graph:
    nodes: list[list[Any]] = attrs.field(factory=list)


@attrs.define
class _GraphExec:
    nodes: list[list[Any]]


@attrs.frozen
class FakeStatistics:
    live_allocations: int
    compiles: int
    kernel_launches: int
    graph_launches: int
    graph_instantiations: int
    node_updates: int
    waits: int
    event_waits: int


class FakeDriver:
    """A stand-in for `cuda.bindings.driver` + NVRTC with `devices` pretend GPUs.

    `stream_mem_ops=False` pretends CAN_USE_64_BIT_STREAM_MEM_OPS is missing, so the
    device falls back to events; `peer=False` pretends peer access is impossible, so
    device-to-device copies go through the host.
    """

    name = "fake"

    def __init__(
        self,
        devices: int = 8,
        *,
        stream_mem_ops: bool = True,
        peer: bool = True,
        arch: tuple[int, int] = (9, 0),
    ) -> None:
        self.devices = devices
        self.stream_mem_ops = stream_mem_ops
        self.peer = peer
        self.arch = arch
        self._memory: dict[int, np.ndarray[Any, Any]] = {}
        self._retired: list[np.ndarray[Any, Any]] = []
        self._lock = threading.Lock()
        self._images: dict[tuple[str, str, str], bytes] = {}
        self._peers_enabled: set[tuple[int, int]] = set()
        self._streams: dict[int, _Stream] = {}  # by handle, for wrap_stream
        self.compiles = 0
        self.kernel_launches = 0
        self.graph_launches = 0
        self.graph_instantiations = 0
        self.node_updates = 0
        self.waits = 0
        self.event_waits = 0
        # Set to a CUresult name (e.g. "CUDA_ERROR_ILLEGAL_ADDRESS") to make every launch
        # from now on fail with it, as a real context does after a sticky error.
        self.fault: str | None = None

    def __repr__(self) -> str:
        return f"<FakeDriver {self.devices} devices>"

    def allocated(self, pointer: int) -> bool:
        """Whether `pointer` is a live allocation (for tests of when memory goes back)."""
        return pointer in self._memory

    def statistics(self) -> FakeStatistics:
        return FakeStatistics(
            live_allocations=len(self._memory),
            compiles=self.compiles,
            kernel_launches=self.kernel_launches,
            graph_launches=self.graph_launches,
            graph_instantiations=self.graph_instantiations,
            node_updates=self.node_updates,
            waits=self.waits,
            event_waits=self.event_waits,
        )

    # -- set-up --

    def init(self) -> None:
        pass

    def device_count(self) -> int:
        return self.devices

    def open_context(self, ordinal: int) -> Any:
        if not 0 <= ordinal < self.devices:
            raise CudaError("CUDA_ERROR_INVALID_DEVICE", f"fake driver has {self.devices} devices")
        return ("ctx", ordinal)

    def set_context(self, context: Any) -> None:
        pass

    def close_context(self, ordinal: int) -> None:
        pass

    def device_attribute(self, ordinal: int, attribute: str) -> int:
        values = {
            "CAN_USE_64_BIT_STREAM_MEM_OPS": int(self.stream_mem_ops),
            "CAN_USE_STREAM_MEM_OPS_V1": int(self.stream_mem_ops),
            "COMPUTE_CAPABILITY_MAJOR": self.arch[0],
            "COMPUTE_CAPABILITY_MINOR": self.arch[1],
            "CAN_FLUSH_REMOTE_WRITES": 0,
            "UNIFIED_ADDRESSING": 1,
        }
        return values[attribute]

    def can_access_peer(self, ordinal: int, peer: int) -> bool:
        return self.peer and ordinal != peer

    def enable_peer_access(self, context: Any, peer_context: Any) -> None:
        if not self.peer:
            raise CudaError("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED")
        self._peers_enabled.add((context[1], peer_context[1]))

    # -- memory --

    def _alloc(self, nbytes: int) -> int:
        array = np.zeros(max(nbytes, 8) + 8, dtype=np.uint8)
        pointer = array.ctypes.data
        aligned = (pointer + 7) & ~7  # 64-bit words must be 8-byte aligned
        with self._lock:
            self._memory[aligned] = array[aligned - pointer : aligned - pointer + max(nbytes, 8)]
        return aligned

    def mem_alloc(self, nbytes: int) -> int:
        return self._alloc(nbytes)

    def mem_free(self, pointer: int) -> None:
        with self._lock:
            array = self._memory.pop(pointer, None)
            if array is None:
                raise CudaError("CUDA_ERROR_INVALID_VALUE", f"{pointer:#x} is not allocated")
            if array.nbytes <= 64:
                # Signal words: a stream being torn down may still read one; keep the
                # bytes (a real driver's unmapped page would fault instead).
                self._retired.append(array)

    def host_alloc_mapped(self, nbytes: int) -> tuple[int, int]:
        pointer = self._alloc(nbytes)
        return pointer, pointer  # one address space, as with unified addressing

    def host_free(self, host_pointer: int) -> None:
        self.mem_free(host_pointer)

    def host_write64(self, host_pointer: int, value: int) -> None:
        _write_word(host_pointer, value)

    def host_view(self, pointer: int, nbytes: int) -> np.ndarray[Any, Any] | None:
        array = self._memory.get(pointer)
        if array is None:
            raise RuntimeError(f"fake driver: {pointer:#x} is not an allocation")
        return array[:nbytes]

    # -- streams --

    def stream_create(self) -> Any:
        stream = _Stream("fake-cuda-stream")
        self._streams[int(stream)] = stream
        return stream

    def stream_destroy(self, stream: Any) -> None:
        self._streams.pop(int(stream), None)
        stream.close()

    def stream_synchronize(self, stream: Any) -> None:
        done = threading.Event()
        stream.put(done.set)
        done.wait()

    def stream_wait_value64(self, stream: Any, pointer: int, value: int) -> None:
        self.waits += 1
        stream.put(lambda: stream.wait_word(pointer, value))

    def stream_write_value64(self, stream: Any, pointer: int, value: int) -> None:
        stream.put(lambda: _write_word(pointer, value))

    def launch_host_func(self, stream: Any, fn: Callable[[], None]) -> None:
        stream.put(fn)

    # -- events --

    def event_create(self) -> Any:
        return _Event()

    def event_destroy(self, event: Any) -> None:
        pass

    def event_record(self, event: Any, stream: Any) -> None:
        stream.put(event.recorded())

    def wrap_stream(self, handle: int) -> Any:
        stream = self._streams.get(handle)
        if stream is None:  # the default streams included: the fake driver has none
            raise CudaError("CUDA_ERROR_INVALID_HANDLE", f"no fake stream has handle {handle:#x}")
        return stream

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        self.event_waits += 1
        epoch = event.current  # the most recent record at the time of this call
        stream.put(lambda: _wait_epoch(stream, epoch))

    # -- kernels --

    def compile(self, source: str, name: str, arch: str) -> bytes:
        key = (hashlib.sha256(source.encode()).hexdigest(), name, arch)
        image = self._images.get(key)
        if image is None:
            if name not in source:
                raise RuntimeError(
                    f"NVRTC_ERROR_COMPILATION: entry point {name!r} not found in the source"
                )
            self.compiles += 1
            image = f"fake-cubin {arch} {name} {key[0]}".encode()
            self._images[key] = image
        return image

    def module_load(self, image: bytes) -> Any:
        if not image.startswith(b"fake-cubin"):
            raise CudaError("CUDA_ERROR_INVALID_IMAGE", "not an image of the fake driver")
        return ("module", image)

    def module_function(self, module: Any, name: str) -> Any:
        return ("function", name, module[1])

    def launch_kernel(
        self,
        stream: Any,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        pointers: Sequence[int],
        ints: Sequence[int],
        host_body: Callable[[], None] | None = None,
    ) -> None:
        self._check_fault()
        _check_launch(function, grid, block, host_body)
        self.kernel_launches += 1
        stream.put(host_body)

    # -- copies --

    def memcpy(
        self,
        stream: Any,
        kind: CopyKind,
        dst: int,
        src: int,
        nbytes: int,
        dst_context: Any = None,
        src_context: Any = None,
    ) -> None:
        if kind is CopyKind.PEER and (dst_context[1], src_context[1]) not in self._peers_enabled:
            raise CudaError("CUDA_ERROR_PEER_ACCESS_NOT_ENABLED")
        _check_no_overlap(dst, src, nbytes)
        stream.put(lambda: ctypes.memmove(dst, src, nbytes))

    def memset_zero(self, stream: Any, pointer: int, nbytes: int) -> None:
        if not self.allocated(pointer):
            raise CudaError("CUDA_ERROR_INVALID_VALUE", f"{pointer:#x} is not allocated")
        stream.put(lambda: ctypes.memset(pointer, 0, nbytes))

    # -- graphs --

    def graph_create(self) -> Any:
        return _Graph()

    def _add(self, graph: Any, node: list[Any]) -> Any:
        graph.nodes.append(node)
        return len(graph.nodes) - 1

    def graph_add_kernel(
        self,
        graph: Any,
        after: Any,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        pointers: Sequence[int],
        ints: Sequence[int],
        host_body: Callable[[], None] | None = None,
    ) -> Any:
        _check_launch(function, grid, block, host_body)
        return self._add(graph, ["kernel", host_body])

    def graph_add_memcpy(
        self, graph: Any, after: Any, context: Any, kind: CopyKind, dst: int, src: int, nbytes: int
    ) -> Any:
        _check_copy_node(nbytes)
        _check_no_overlap(dst, src, nbytes)
        return self._add(graph, ["memcpy", dst, src, nbytes])

    def graph_add_wait_value64(
        self, graph: Any, after: Any, context: Any, pointer: int, value: int
    ) -> Any:
        return self._add(graph, ["wait", pointer, value])

    def graph_add_write_value64(
        self, graph: Any, after: Any, context: Any, pointer: int, value: int
    ) -> Any:
        return self._add(graph, ["write", pointer, value])

    def graph_add_host(self, graph: Any, after: Any, fn: Callable[[], None]) -> Any:
        return self._add(graph, ["host", fn])

    def graph_instantiate(self, graph: Any) -> Any:
        self.graph_instantiations += 1
        return _GraphExec([list(node) for node in graph.nodes])

    def graph_exec_kernel_update(
        self,
        graph_exec: Any,
        node: Any,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        pointers: Sequence[int],
        ints: Sequence[int],
        host_body: Callable[[], None] | None = None,
    ) -> None:
        _check_launch(function, grid, block, host_body)
        self.node_updates += 1
        graph_exec.nodes[node] = ["kernel", host_body]

    def graph_exec_memcpy_update(
        self,
        graph_exec: Any,
        node: Any,
        context: Any,
        kind: CopyKind,
        dst: int,
        src: int,
        nbytes: int,
    ) -> None:
        _check_copy_node(nbytes)
        _check_no_overlap(dst, src, nbytes)
        self.node_updates += 1
        graph_exec.nodes[node] = ["memcpy", dst, src, nbytes]

    def graph_exec_value_update(
        self, graph_exec: Any, node: Any, context: Any, pointer: int, value: int, wait: bool
    ) -> None:
        self.node_updates += 1
        graph_exec.nodes[node] = ["wait" if wait else "write", pointer, value]

    def _check_fault(self) -> None:
        if self.fault is not None:
            raise CudaError(self.fault, "injected by the fake driver")

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        self._check_fault()
        self.graph_launches += 1
        nodes = [tuple(node) for node in graph_exec.nodes]  # a launch uses the params of now
        self.kernel_launches += sum(1 for n in nodes if n[0] == "kernel")
        stream.put(lambda: _run_nodes(stream, nodes))

    def graph_destroy(self, graph: Any, graph_exec: Any) -> None:
        pass


def _check_no_overlap(dst: int, src: int, nbytes: int) -> None:
    # A real GPU leaves overlapping copies undefined; the fake refuses them, so code that
    # would rely on them fails here rather than on a GPU.
    if abs(dst - src) < nbytes:
        raise CudaError(
            "CUDA_ERROR_INVALID_VALUE",
            f"copy of {nbytes} bytes from {src:#x} to {dst:#x}: the ranges overlap, which CUDA "
            f"leaves undefined",
        )


def _check_copy_node(nbytes: int) -> None:
    if nbytes < 1:
        raise CudaError("CUDA_ERROR_INVALID_VALUE", "a memcpy node copies at least one byte")


def _check_launch(
    function: Any,
    grid: tuple[int, ...],
    block: tuple[int, ...],
    host_body: Callable[[], None] | None,
) -> None:
    if host_body is None:
        raise RuntimeError(
            f"the fake CUDA driver runs kernels with their CPU bodies, and {function[1]!r} "
            f"has none: give Kernel(..., cpu=fn) too"
        )
    if any(d < 1 for d in grid) or any(d < 1 for d in block):
        raise CudaError("CUDA_ERROR_INVALID_VALUE", f"launch dims {grid} x {block}")


def _write_word(pointer: int, value: int) -> None:
    with _WORDS_CHANGED:
        ctypes.c_uint64.from_address(pointer).value = value & _MASK64
        _WORDS_CHANGED.notify_all()


def _wait_epoch(stream: _Stream, epoch: threading.Event) -> None:
    while not epoch.wait(_POLL_S * 10):
        if stream.closed:
            return


def _run_nodes(stream: _Stream, nodes: list[tuple[Any, ...]]) -> None:
    for node in nodes:
        kind = node[0]
        if kind == "kernel" or kind == "host":
            node[1]()
        elif kind == "memcpy":
            ctypes.memmove(node[1], node[2], node[3])
        elif kind == "wait":
            stream.wait_word(node[1], node[2])
        elif kind == "write":
            _write_word(node[1], node[2])
