"""The CUDA driver interface on cuda-python (`cuda.bindings.driver`, `cuda.bindings.nvrtc`).

Imported only when a CUDA device is opened with the real driver. Written against the
cuda-python 12.x / 13.x bindings, whose calls return (CUresult, *values).
Checked on a real GPU by the `gpu`-marked tests (scripts/gpu_check.sh); without one,
tests/test_cuda_real.py checks that every call gets through the bindings' argument
conversion and that NVRTC builds the kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._extras import install_hint
from ._driver import CopyKind, CudaError, DriverUnavailable

_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@functools.cache
def real_driver() -> RealDriver:
    """One per process: the CUDA driver's own state (cuInit, primary contexts) is too."""
    try:
        from cuda.bindings import driver as cu  # type: ignore[import-untyped]
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise DriverUnavailable(
            f"cuda-python is not installed ({exc}); install the cuda extra: {install_hint('cuda')}"
        ) from exc
    try:
        result = cu.cuInit(0)
    except Exception as exc:  # the driver library itself is missing
        raise DriverUnavailable(f"no NVIDIA driver library was found ({exc})") from exc
    err = result[0] if isinstance(result, tuple) else result
    if _code(err) != 0:
        raise DriverUnavailable(f"cuInit failed with {_name(cu, err)} (no usable GPU)")
    return RealDriver(cu, nvrtc)


class RealDriver:
    """The driver calls on the `cuda.bindings.driver` and `cuda.bindings.nvrtc` modules
    given; building one makes no call (`real_driver()` checks cuInit first)."""

    name = "real"

    def __init__(self, cu: Any, nvrtc: Any) -> None:
        self.cu = cu
        self.nvrtc = nvrtc
        self._devices: dict[int, Any] = {}
        self._images: dict[tuple[str, str, str], bytes] = {}
        # Host functions: the driver calls one C trampoline with a token; the token
        # names the Python callable. One-shot tokens are dropped after their call.
        self._host_fns: dict[int, tuple[Callable[[], None], bool]] = {}
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self._trampoline = _HOST_FN(self._call_host)
        address = ctypes.cast(self._trampoline, ctypes.c_void_p).value
        self._host_fn = cu.CUhostFn(address)

    def _check(self, result: Any) -> Any:
        if isinstance(result, tuple):
            err, values = result[0], result[1:]
        else:
            err, values = result, ()
        if _code(err) != 0:
            raise CudaError(_name(self.cu, err))
        if not values:
            return None
        return values[0] if len(values) == 1 else values

    def _call_host(self, user_data: int | None) -> None:
        with self._lock:
            entry = self._host_fns.get(user_data or 0)
            if entry is not None and entry[1]:
                del self._host_fns[user_data or 0]
        if entry is not None:
            entry[0]()

    def _token(self, fn: Callable[[], None], once: bool) -> int:
        token = next(self._tokens)
        with self._lock:
            self._host_fns[token] = (fn, once)
        return token

    # -- set-up --

    def init(self) -> None:
        self._check(self.cu.cuInit(0))

    def device_count(self) -> int:
        return int(self._check(self.cu.cuDeviceGetCount()))

    def _device(self, ordinal: int) -> Any:
        device = self._devices.get(ordinal)
        if device is None:
            device = self._check(self.cu.cuDeviceGet(ordinal))
            self._devices[ordinal] = device
        return device

    def open_context(self, ordinal: int) -> Any:
        context = self._check(self.cu.cuDevicePrimaryCtxRetain(self._device(ordinal)))
        self._check(self.cu.cuCtxSetCurrent(context))
        return context

    def set_context(self, context: Any) -> None:
        self._check(self.cu.cuCtxSetCurrent(context))

    def close_context(self, ordinal: int) -> None:
        self._check(self.cu.cuDevicePrimaryCtxRelease(self._device(ordinal)))

    def device_attribute(self, ordinal: int, attribute: str) -> int:
        attr = getattr(self.cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{attribute}")
        return int(self._check(self.cu.cuDeviceGetAttribute(attr, self._device(ordinal))))

    def can_access_peer(self, ordinal: int, peer: int) -> bool:
        return bool(
            self._check(self.cu.cuDeviceCanAccessPeer(self._device(ordinal), self._device(peer)))
        )

    def enable_peer_access(self, context: Any, peer_context: Any) -> None:
        err = self.cu.cuCtxEnablePeerAccess(peer_context, 0)
        err = err[0] if isinstance(err, tuple) else err
        if _code(err) not in (0, _code(self.cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)):
            raise CudaError(_name(self.cu, err))

    # -- memory --

    def mem_alloc(self, nbytes: int) -> int:
        return int(self._check(self.cu.cuMemAlloc(nbytes)))

    def mem_free(self, pointer: int) -> None:
        self._check(self.cu.cuMemFree(self.cu.CUdeviceptr(pointer)))

    def host_alloc_mapped(self, nbytes: int) -> tuple[int, int]:
        cu = self.cu
        flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
        host = int(self._check(cu.cuMemHostAlloc(nbytes, flags)))
        ctypes.memset(host, 0, nbytes)
        device = int(self._check(cu.cuMemHostGetDevicePointer(host, 0)))
        return host, device

    def host_free(self, host_pointer: int) -> None:
        self._check(self.cu.cuMemFreeHost(host_pointer))

    def host_write64(self, host_pointer: int, value: int) -> None:
        # An aligned 8-byte store: the GPU never sees half of it.
        ctypes.c_uint64.from_address(host_pointer).value = value

    def host_view(self, pointer: int, nbytes: int) -> np.ndarray[Any, Any] | None:
        return None

    # -- streams --

    def stream_create(self) -> Any:
        flags = int(self.cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value)
        return self._check(self.cu.cuStreamCreate(flags))

    def stream_destroy(self, stream: Any) -> None:
        self._check(self.cu.cuStreamDestroy(stream))

    def stream_synchronize(self, stream: Any) -> None:
        # Polled, not cuStreamSynchronize: the stream may be waiting for a host function
        # of ours, which needs the GIL that a blocking call might hold.
        not_ready = _code(self.cu.CUresult.CUDA_ERROR_NOT_READY)
        while True:
            result = self.cu.cuStreamQuery(stream)
            err = result[0] if isinstance(result, tuple) else result
            code = _code(err)
            if code == 0:
                return
            if code != not_ready:
                raise CudaError(_name(self.cu, err))
            time.sleep(0)  # let the host function's thread take the GIL

    def stream_wait_value64(self, stream: Any, pointer: int, value: int) -> None:
        cu = self.cu
        geq = int(cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ.value)
        self._check(
            cu.cuStreamWaitValue64(stream, cu.CUdeviceptr(pointer), cu.cuuint64_t(value), geq)
        )

    def stream_write_value64(self, stream: Any, pointer: int, value: int) -> None:
        cu = self.cu
        self._check(
            cu.cuStreamWriteValue64(stream, cu.CUdeviceptr(pointer), cu.cuuint64_t(value), 0)
        )

    def launch_host_func(self, stream: Any, fn: Callable[[], None]) -> None:
        self._check(self.cu.cuLaunchHostFunc(stream, self._host_fn, self._token(fn, once=True)))

    # -- events --

    def event_create(self) -> Any:
        flags = int(self.cu.CUevent_flags.CU_EVENT_DISABLE_TIMING.value)
        return self._check(self.cu.cuEventCreate(flags))

    def event_destroy(self, event: Any) -> None:
        self._check(self.cu.cuEventDestroy(event))

    def event_record(self, event: Any, stream: Any) -> None:
        self._check(self.cu.cuEventRecord(event, stream))

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        self._check(self.cu.cuStreamWaitEvent(stream, event, 0))

    def wrap_stream(self, handle: int) -> Any:
        return self.cu.CUstream(handle)

    # -- kernels --

    def compile(self, source: str, name: str, arch: str) -> bytes:
        """A loadable image of `source` for `arch` ("sm_90"): a cubin where this NVRTC
        knows the arch, else PTX for the newest arch it knows below it (the driver
        finishes that at load time). Cached by source hash."""
        key = (hashlib.sha256(source.encode()).hexdigest(), name, arch)
        cached = self._images.get(key)
        if cached is not None:
            return cached
        nv = self.nvrtc
        target, ptx = self._target(arch)
        program = self._nv(nv.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []))
        try:
            options = [f"--gpu-architecture={target}".encode()]
            result = nv.nvrtcCompileProgram(program, len(options), options)
            err = result[0] if isinstance(result, tuple) else result
            if _code(err) != 0:
                size = self._nv(nv.nvrtcGetProgramLogSize(program))
                log = b" " * size
                self._nv(nv.nvrtcGetProgramLog(program, log))
                raise CudaError("NVRTC_ERROR_COMPILATION", _text(log))
            if ptx:  # PTX is text: the driver wants its trailing NUL kept
                size = self._nv(nv.nvrtcGetPTXSize(program))
                image: bytes = b" " * size
                self._nv(nv.nvrtcGetPTX(program, image))
            else:
                size = self._nv(nv.nvrtcGetCUBINSize(program))
                image = b" " * size
                self._nv(nv.nvrtcGetCUBIN(program, image))
        finally:
            nv.nvrtcDestroyProgram(program)
        self._images[key] = image
        return image

    def _target(self, arch: str) -> tuple[str, bool]:
        """The --gpu-architecture to compile `arch` with, and whether that gives PTX."""
        try:
            known = [int(a) for a in self._nv(self.nvrtc.nvrtcGetSupportedArchs())]
        except CudaError:
            raise
        except Exception as exc:  # the NVRTC library itself is missing
            raise CudaError(
                "NVRTC_NOT_FOUND",
                f"CUDA kernels are compiled with NVRTC, and its library was not found ({exc}); "
                f"install the cuda extra: {install_hint('cuda')} (or pip install nvidia-cuda-nvrtc)",
            ) from exc
        wanted = int(arch.removeprefix("sm_"))
        if wanted in known:
            return arch, False
        below = [a for a in known if a < wanted]
        if not below:
            raise CudaError(
                "NVRTC_ERROR_INVALID_OPTION",
                f"this NVRTC builds for sm_{known[0]} to sm_{known[-1]}, not {arch}; "
                f"install an NVRTC that supports {arch}",
            )
        return f"compute_{max(below)}", True

    def _nv(self, result: Any) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if _code(err) != 0:
            raise CudaError(f"NVRTC error {err!r}")
        values = result[1:] if isinstance(result, tuple) else ()
        return values[0] if len(values) == 1 else (values or None)

    def module_load(self, image: bytes) -> Any:
        return self._check(self.cu.cuModuleLoadData(image))

    def module_function(self, module: Any, name: str) -> Any:
        return self._check(self.cu.cuModuleGetFunction(module, name.encode()))

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
        keep, address = _kernel_params(pointers, ints)
        self._check(
            self.cu.cuLaunchKernel(
                function,
                *grid,
                *block,
                0,
                stream,
                address,
                0,
            )
        )
        del keep  # the driver copied the parameters at launch

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
        cu = self.cu
        if kind is CopyKind.HTOD:
            self._check(cu.cuMemcpyHtoDAsync(cu.CUdeviceptr(dst), src, nbytes, stream))
        elif kind is CopyKind.DTOH:
            self._check(cu.cuMemcpyDtoHAsync(dst, cu.CUdeviceptr(src), nbytes, stream))
        elif kind is CopyKind.DTOD:
            self._check(
                cu.cuMemcpyDtoDAsync(cu.CUdeviceptr(dst), cu.CUdeviceptr(src), nbytes, stream)
            )
        else:
            self._check(
                cu.cuMemcpyPeerAsync(
                    cu.CUdeviceptr(dst),
                    dst_context,
                    cu.CUdeviceptr(src),
                    src_context,
                    nbytes,
                    stream,
                )
            )

    def memset_zero(self, stream: Any, pointer: int, nbytes: int) -> None:
        self._check(self.cu.cuMemsetD8Async(self.cu.CUdeviceptr(pointer), 0, nbytes, stream))

    # -- graphs --

    def graph_create(self) -> Any:
        return self._check(self.cu.cuGraphCreate(0))

    @staticmethod
    def _deps(after: Any) -> list[Any]:
        return [] if after is None else [after]

    def _kernel_node(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], address: int
    ) -> Any:
        params = self.cu.CUDA_KERNEL_NODE_PARAMS()
        params.func = function
        params.gridDimX, params.gridDimY, params.gridDimZ = grid
        params.blockDimX, params.blockDimY, params.blockDimZ = block
        params.sharedMemBytes = 0
        params.kernelParams = address
        return params

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
        keep, address = _kernel_params(pointers, ints)
        deps = self._deps(after)
        node = self._check(
            self.cu.cuGraphAddKernelNode(
                graph, deps, len(deps), self._kernel_node(function, grid, block, address)
            )
        )
        del keep
        return node

    def _memcpy_params(self, kind: CopyKind, dst: int, src: int, nbytes: int) -> Any:
        cu = self.cu
        params = cu.CUDA_MEMCPY3D()
        host, device = cu.CUmemorytype.CU_MEMORYTYPE_HOST, cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
        if kind is CopyKind.HTOD:
            params.srcMemoryType, params.srcHost = host, src
        else:
            params.srcMemoryType, params.srcDevice = device, cu.CUdeviceptr(src)
        if kind is CopyKind.DTOH:
            params.dstMemoryType, params.dstHost = host, dst
        else:
            params.dstMemoryType, params.dstDevice = device, cu.CUdeviceptr(dst)
        # One row of one slice: pitches of the whole width, as cuMemcpy3D wants them.
        params.WidthInBytes = params.srcPitch = params.dstPitch = nbytes
        params.Height = params.srcHeight = params.dstHeight = 1
        params.Depth = 1
        return params

    def graph_add_memcpy(
        self, graph: Any, after: Any, context: Any, kind: CopyKind, dst: int, src: int, nbytes: int
    ) -> Any:
        deps = self._deps(after)
        params = self._memcpy_params(kind, dst, src, nbytes)
        return self._check(self.cu.cuGraphAddMemcpyNode(graph, deps, len(deps), params, context))

    def _value_params(self, context: Any, pointer: int, value: int, wait: bool) -> Any:
        cu = self.cu
        op = cu.CUstreamBatchMemOpParams()
        if wait:
            op.operation = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_64
            op.waitValue.address = cu.CUdeviceptr(pointer)
            op.waitValue.value64 = cu.cuuint64_t(value)
            op.waitValue.flags = int(cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ.value)
        else:
            op.operation = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_64
            op.writeValue.address = cu.CUdeviceptr(pointer)
            op.writeValue.value64 = cu.cuuint64_t(value)
            op.writeValue.flags = 0
        params = cu.CUDA_BATCH_MEM_OP_NODE_PARAMS()
        params.ctx = context
        params.count = 1
        params.paramArray = [op]
        params.flags = 0
        return params

    def graph_add_wait_value64(
        self, graph: Any, after: Any, context: Any, pointer: int, value: int
    ) -> Any:
        deps = self._deps(after)
        params = self._value_params(context, pointer, value, wait=True)
        return self._check(self.cu.cuGraphAddBatchMemOpNode(graph, deps, len(deps), params))

    def graph_add_write_value64(
        self, graph: Any, after: Any, context: Any, pointer: int, value: int
    ) -> Any:
        deps = self._deps(after)
        params = self._value_params(context, pointer, value, wait=False)
        return self._check(self.cu.cuGraphAddBatchMemOpNode(graph, deps, len(deps), params))

    def graph_add_host(self, graph: Any, after: Any, fn: Callable[[], None]) -> Any:
        params = self.cu.CUDA_HOST_NODE_PARAMS()
        params.fn = self._host_fn
        params.userData = self._token(fn, once=False)
        deps = self._deps(after)
        return self._check(self.cu.cuGraphAddHostNode(graph, deps, len(deps), params))

    def graph_instantiate(self, graph: Any) -> Any:
        return self._check(self.cu.cuGraphInstantiate(graph, 0))

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
        keep, address = _kernel_params(pointers, ints)
        self._check(
            self.cu.cuGraphExecKernelNodeSetParams(
                graph_exec, node, self._kernel_node(function, grid, block, address)
            )
        )
        del keep

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
        params = self._memcpy_params(kind, dst, src, nbytes)
        self._check(self.cu.cuGraphExecMemcpyNodeSetParams(graph_exec, node, params, context))

    def graph_exec_value_update(
        self, graph_exec: Any, node: Any, context: Any, pointer: int, value: int, wait: bool
    ) -> None:
        params = self._value_params(context, pointer, value, wait)
        self._check(self.cu.cuGraphExecBatchMemOpNodeSetParams(graph_exec, node, params))

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        self._check(self.cu.cuGraphLaunch(graph_exec, stream))

    def graph_destroy(self, graph: Any, graph_exec: Any) -> None:
        if graph_exec is not None:
            self._check(self.cu.cuGraphExecDestroy(graph_exec))
        self._check(self.cu.cuGraphDestroy(graph))


def _kernel_params(pointers: Sequence[int], ints: Sequence[int]) -> tuple[Any, int]:
    """A void** array of kernel parameters: the pointers as 64-bit values, then the ints
    as 32-bit values. Returns what must stay alive until the call returns, and its address."""
    values: list[Any] = [ctypes.c_uint64(p) for p in pointers]
    values += [ctypes.c_int32(i) for i in ints]
    array = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
    return (values, array), ctypes.addressof(array)


def _text(log: bytes) -> str:
    """A C string from NVRTC as text, without its trailing NUL."""
    return log.split(b"\0", 1)[0].decode(errors="replace").strip()


def _code(err: Any) -> int:
    return int(getattr(err, "value", err))


def _name(cu: Any, err: Any) -> str:
    try:
        result = cu.cuGetErrorName(err)
        name = result[1] if isinstance(result, tuple) else result
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return repr(err)
