"""The one small interface every CUDA driver call goes through.

`CudaDriver` lists exactly the driver and NVRTC calls the CUDA device uses, each named
after the C call it stands for. Two implementations exist: `RealDriver` (cuda-python's
`cuda.bindings.driver` / `cuda.bindings.nvrtc`, imported only when a CUDA device is
opened) and `FakeDriver` (host memory, one thread per stream, kernels run with their
CPU bodies), which lets every CUDA code path run and be tested on machines without a GPU.

Handles (contexts, streams, events, modules, functions, graphs, nodes) are opaque to the
device code; device pointers are plain ints.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np


class CopyKind(enum.Enum):
    HTOD = "htod"  # pinned host -> device
    DTOH = "dtoh"  # device -> pinned host
    DTOD = "dtod"  # same device, or across devices through unified addressing
    PEER = "peer"  # across devices with peer access (cuMemcpyPeerAsync)


class DriverUnavailable(Exception):
    """The CUDA driver library or a GPU is missing on this machine."""


# Errors after which the CUDA context is unusable: every later call fails the same way.
STICKY_ERRORS = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "CUDA_ERROR_ECC_UNCORRECTABLE",
    }
)


class CudaError(RuntimeError):
    """A CUDA driver or NVRTC call returned an error; `name` is its CUresult name."""

    def __init__(self, name: str, detail: str = "") -> None:
        super().__init__(f"{name}: {detail}" if detail else name)
        self.name = name

    @property
    def sticky(self) -> bool:
        return self.name in STICKY_ERRORS


class CudaDriver(Protocol):
    """The calls the CUDA device makes. `name` says which implementation this is."""

    name: str

    # -- set-up: cuInit, cuDeviceGetCount, cuDeviceGet + cuDevicePrimaryCtxRetain --
    def init(self) -> None: ...
    def device_count(self) -> int: ...
    def open_context(self, ordinal: int) -> Any: ...
    def set_context(self, context: Any) -> None: ...  # cuCtxSetCurrent
    def close_context(self, ordinal: int) -> None: ...  # cuDevicePrimaryCtxRelease

    def device_attribute(self, ordinal: int, attribute: str) -> int:
        """cuDeviceGetAttribute, `attribute` without its CU_DEVICE_ATTRIBUTE_ prefix."""
        ...

    def can_access_peer(self, ordinal: int, peer: int) -> bool: ...  # cuDeviceCanAccessPeer
    def enable_peer_access(
        self, context: Any, peer_context: Any
    ) -> None: ...  # cuCtxEnablePeerAccess

    # -- memory: cuMemAlloc/cuMemFree, cuMemHostAlloc(DEVICEMAP)/cuMemHostGetDevicePointer --
    def mem_alloc(self, nbytes: int) -> int: ...
    def mem_free(self, pointer: int) -> None: ...

    def host_alloc_mapped(self, nbytes: int) -> tuple[int, int]:
        """Pinned host memory mapped into the device's address space (DEVICEMAP|PORTABLE,
        not write-combined: the host reads it back). Returns (host pointer, device pointer)."""
        ...

    def host_free(self, host_pointer: int) -> None: ...  # cuMemFreeHost

    def host_write64(self, host_pointer: int, value: int) -> None:
        """The host stores a 64-bit word in mapped memory (for streams waiting on it)."""
        ...

    def host_view(self, pointer: int, nbytes: int) -> np.ndarray[Any, Any] | None:
        """The bytes of a device allocation as a host array when device memory is host
        memory (the fake driver), else None (a real GPU)."""
        ...

    # -- streams and stream memory operations --
    def stream_create(self) -> Any: ...  # cuStreamCreate(NON_BLOCKING)
    def stream_destroy(self, stream: Any) -> None: ...
    def stream_synchronize(self, stream: Any) -> None: ...
    def stream_wait_value64(self, stream: Any, pointer: int, value: int) -> None: ...  # GEQ
    def stream_write_value64(self, stream: Any, pointer: int, value: int) -> None: ...
    def launch_host_func(self, stream: Any, fn: Callable[[], None]) -> None: ...  # cuLaunchHostFunc

    # -- events: the fallback where 64-bit stream memory operations are missing --
    def event_create(self) -> Any: ...  # cuEventCreate(DISABLE_TIMING)
    def event_destroy(self, event: Any) -> None: ...
    def event_record(self, event: Any, stream: Any) -> None: ...
    def stream_wait_event(self, stream: Any, event: Any) -> None: ...

    def wrap_stream(self, handle: int) -> Any:
        """Another library's stream, from its CUstream handle as an int (1: the legacy
        default stream, 2: the per-thread default stream), for stream_wait_event."""
        ...

    # -- kernels: NVRTC, cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel --
    def compile(self, source: str, name: str, arch: str) -> bytes: ...
    def module_load(self, image: bytes) -> Any: ...
    def module_function(self, module: Any, name: str) -> Any: ...

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
        """Launch with the buffers' device pointers, then the var values as 32-bit ints.
        `host_body` is what a driver without a GPU runs instead; a real driver ignores it."""
        ...

    # -- copies: cuMemcpyHtoDAsync / DtoHAsync / DtoDAsync / PeerAsync --
    def memcpy(
        self,
        stream: Any,
        kind: CopyKind,
        dst: int,
        src: int,
        nbytes: int,
        dst_context: Any = None,
        src_context: Any = None,
    ) -> None: ...

    def memset_zero(self, stream: Any, pointer: int, nbytes: int) -> None:
        """Zero `nbytes` of device memory in stream order (cuMemsetD8Async)."""
        ...

    # -- graphs: nodes are added in a chain (a queue is in order) --
    def graph_create(self) -> Any: ...
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
    ) -> Any: ...
    def graph_add_memcpy(
        self,
        graph: Any,
        after: Any,
        context: Any,
        kind: CopyKind,
        dst: int,
        src: int,
        nbytes: int,
    ) -> Any: ...
    def graph_add_wait_value64(
        self, graph: Any, after: Any, context: Any, pointer: int, value: int
    ) -> Any: ...
    def graph_add_write_value64(
        self, graph: Any, after: Any, context: Any, pointer: int, value: int
    ) -> Any: ...
    def graph_add_host(self, graph: Any, after: Any, fn: Callable[[], None]) -> Any: ...
    def graph_instantiate(self, graph: Any) -> Any: ...
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
    ) -> None: ...  # cuGraphExecKernelNodeSetParams
    def graph_exec_memcpy_update(
        self,
        graph_exec: Any,
        node: Any,
        context: Any,
        kind: CopyKind,
        dst: int,
        src: int,
        nbytes: int,
    ) -> None: ...  # cuGraphExecMemcpyNodeSetParams
    def graph_exec_value_update(
        self,
        graph_exec: Any,
        node: Any,
        context: Any,
        pointer: int,
        value: int,
        wait: bool,
    ) -> None: ...  # cuGraphExecBatchMemOpNodeSetParams
    def graph_launch(self, graph_exec: Any, stream: Any) -> None: ...
    def graph_destroy(
        self, graph: Any, graph_exec: Any
    ) -> None: ...  # graph_exec None: not instantiated


DRIVER_NAMES = ("real", "fake")


def open_driver(choice: object, ordinal: int) -> CudaDriver:
    """The driver a CUDA device of a runtime uses: "real" (default), "fake", or an instance.

    Without a GPU the real driver raises DriverUnavailable; the device turns that into a
    DeviceError that says how to run without one.
    """
    if choice is None or choice == "real":
        from ._real import real_driver

        return real_driver()
    if choice == "fake":
        from ._fake import FakeDriver

        return FakeDriver()
    if isinstance(choice, str):
        raise ValueError(
            f"cuda_driver={choice!r} is not a CUDA driver: use 'real', 'fake', or a driver "
            f"instance (set ACTORGRAPH_CUDA_DRIVER=fake to pick the fake one everywhere)"
        )
    return choice  # type: ignore[return-value]
