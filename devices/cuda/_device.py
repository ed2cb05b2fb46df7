"""CUDA:N devices: a compute and a copy queue per GPU, kernels from NVRTC, pinned staging.

Which driver: `open_runtime([...], cuda_driver="fake")` (or a FakeDriver instance, or the
environment variable ACTORGRAPH_CUDA_DRIVER=fake) runs every CUDA code path on host
memory with kernels' CPU bodies; the default, "real", uses cuda-python and needs an
NVIDIA GPU and driver. Other options: cuda_graphs=False keeps every job on the streams
(no CUDA graphs); cuda_graph_min_items=N sets how many items a job needs to become a
graph; cuda_mem_ops=False forces the event fallback.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import queue
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import trio
from actorgraph.scheduler import DeviceCaps, QueueKind

from .._actor import QueueActor
from .._device import Device, DeviceBuffer, DeviceError, LaunchRequest, MakeSignal
from .._ops import Op, cuda_item
from .._signal import Signal
from . import _commands as C
from ._driver import CopyKind, CudaDriver, DriverUnavailable, open_driver
from ._queue import CudaQueueActor

ENV_DRIVER = "ACTORGRAPH_CUDA_DRIVER"
_INT32 = (-(1 << 31), (1 << 31) - 1)
_U64_MAX = (1 << 64) - 1
_log = logging.getLogger("actorgraph.devices.cuda")  # under the library's quiet logger
_MAX_BLOCK = 1024  # threads a block, on every GPU CUDA 12 and 13 support


@attrs.define(eq=False)
class CudaMemory:
    """A device allocation: its device pointer, size, and (fake driver only) host bytes."""

    device: CUDADevice
    pointer: int
    nbytes: int
    host: np.ndarray[Any, Any] | None
    exported: bool = False  # viewed through DLPack: it may outlive the runtime
    released: bool = False  # given back when the runtime closed

    def export(self) -> None:
        """It is viewed through DLPack from now on: it may outlive the runtime."""
        self.exported = True

    def release(self) -> None:
        """It was given back (its runtime closed): DLPack may not view it any more."""
        self.released = True


class _Staging:
    """Pinned, mapped host memory for one copy between host memory and a GPU.

    Held by the lowered copy (so a graph's copy keeps it across replays) and returned to
    the device's pool when that lowering is dropped.
    """

    def __init__(self, device: CUDADevice, nbytes: int) -> None:
        self.host_pointer, self.nbytes, self.array = device._take_staging(nbytes)
        weakref.finalize(self, device._give_staging, self.host_pointer, self.nbytes, self.array)


class _Reaper:
    """A thread that frees device memory for a GPU with work in flight (see free)."""

    def __init__(self, device: CUDADevice) -> None:
        self.device = device
        self.pointers: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._main, name=f"{device.name}/free", daemon=True)
        self.thread.start()

    def put(self, pointer: int | None) -> None:
        self.pointers.put(pointer)

    def _main(self) -> None:
        while (pointer := self.pointers.get()) is not None:
            self.device._free_now(pointer)


class CUDADevice(Device):
    kind = "CUDA"
    options_taken = frozenset(
        ["cuda_driver", "cuda_graphs", "cuda_graph_min_items", "cuda_mem_ops", "cuda_no_peer"]
    )
    host_visible = False
    builds_kernels = True  # NVRTC: see slow_builds
    host_backed = False
    native_byte_order = True

    def __init__(self, name: str, index: int, *, timeline_start: int = 0, **options: Any) -> None:
        super().__init__(name, index, timeline_start=timeline_start, **options)
        choice = options.get("cuda_driver") or os.environ.get(ENV_DRIVER) or "real"
        try:
            self.driver: CudaDriver = open_driver(choice, index)
            self.driver.init()
            count = self.driver.device_count()
        except DriverUnavailable as exc:
            raise DeviceError(
                f"cannot open {name}: {exc}. CUDA devices need an NVIDIA GPU and its driver. "
                f"Without one, run the CUDA code paths on the fake driver with "
                f"open_runtime([...], cuda_driver='fake') (or {ENV_DRIVER}=fake), or use "
                f"CPU:N (or SIM:N simulated GPUs) devices instead"
            ) from exc
        except ValueError as exc:
            raise DeviceError(f"cannot open {name}: {exc}") from exc
        if not 0 <= index < count:
            raise DeviceError(
                f"cannot open {name}: this machine has {count} CUDA device(s)"
                + (f" (CUDA:0 to CUDA:{count - 1})" if count else "")
            )
        driver = self.driver
        self.context = driver.open_context(index)
        driver.set_context(self.context)
        major = driver.device_attribute(index, "COMPUTE_CAPABILITY_MAJOR")
        minor = driver.device_attribute(index, "COMPUTE_CAPABILITY_MINOR")
        self.arch = f"sm_{major}{minor}"
        self.mem_ops = bool(
            driver.device_attribute(index, "CAN_USE_64_BIT_STREAM_MEM_OPS")
        ) and bool(options.get("cuda_mem_ops", True))
        self._functions: dict[tuple[str, str], Any] = {}
        self._peers: dict[int, bool] = {}
        # Reentrant: a staging buffer's finalizer takes it, and the collector may run one
        # on a thread that holds it already (at any allocation under it).
        self._staging_lock = threading.RLock()
        self._staging_free: dict[int, list[tuple[int, np.ndarray[Any, Any]]]] = {}
        self._staging_all: list[int] = []
        # Mapped words that follow trio-side signals, so streams can wait on them.
        self._mirrors: dict[Signal, tuple[Signal, int, int, trio.CancelScope]] = {}
        # Mapped words no longer following a signal: (host, device) pointers no stream
        # waits on any more, for the next mirror; and host pointers of words a stream may
        # still read, kept until the device closes.
        self._spare_words: list[tuple[int, int]] = []
        self._kept_words: list[int] = []
        self._nursery: trio.Nursery | None = None
        self._closed = False
        self._reaper: _Reaper | None = None
        self._reaper_lock = threading.Lock()
        self._closed_busy = False  # closed with work still on the GPU
        self._live: dict[int, CudaMemory] = {}  # allocations not freed yet, by pointer
        self._zero_stream: Any = None  # zeroes new allocations (made on first use)
        self._read_stream: Any = None  # `read_into`'s copies (made on first use)
        self._reads = 0  # `read_into` copies under way
        self.lost: DeviceError | None = None  # set by a sticky CUDA error: the context is gone
        self._cuda_queues = {
            QueueKind.COMPUTE: CudaQueueActor(f"{name}/compute", self, timeline_start),
            QueueKind.COPY: CudaQueueActor(f"{name}/copy", self, timeline_start),
        }
        # Queues made by new_queue (a worker's, one per client), each with its own stream,
        # until dropped; and the queue lowering binds host work to while it is not a
        # device queue (`lowering_for`).
        self._more_queues: set[CudaQueueActor] = set()
        self._lowering: CudaQueueActor | None = None
        self._dropped_busy = False  # a queue was dropped with work on its stream

    @property
    def queues(self) -> Mapping[QueueKind, CudaQueueActor]:
        return self._cuda_queues

    @property
    def caps(self) -> DeviceCaps:
        return attrs.evolve(super().caps, peer_group=f"cuda:{self.driver.name}")

    def all_queues(self) -> list[CudaQueueActor]:
        """The device's two queues and every queue made by new_queue and not dropped."""
        return [*self.queues.values(), *self._more_queues]

    def new_queue(
        self, kind: QueueKind, name: str, make_signal: MakeSignal | None = None
    ) -> CudaQueueActor | None:
        """A queue with a stream of its own beside the device's two: work on it waits for
        nothing queued on theirs (or on another such queue's)."""
        if self._closed:
            return None
        actor = CudaQueueActor(name, self)
        self._more_queues.add(actor)
        return actor

    def drop_queue(self, actor: QueueActor) -> bool:
        if not isinstance(actor, CudaQueueActor) or actor not in self._more_queues:
            return False
        self._more_queues.discard(actor)
        busy = actor.gpu_busy
        if busy:
            # Its stream may still run (waiting on a word about to be written): from now
            # on, frees go through the reaper, whose cuMemFree may wait for it.
            self._dropped_busy = True
        if not self._closed:
            actor.close()
        return busy

    @contextlib.contextmanager
    def lowering_for(self, actor: QueueActor) -> Iterator[None]:
        was = self._lowering
        self._lowering = actor if isinstance(actor, CudaQueueActor) else None
        try:
            yield
        finally:
            self._lowering = was

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        await super().start(nursery)

    def close(self) -> None:
        """Stop the device's queues and give back what it holds: its memory, streams
        and context, except what the GPU may still use (work left on it) or a DLPack
        consumer still views."""
        if self._closed:
            return
        self._closed = True
        busy = self._dropped_busy or any(q.gpu_busy for q in self.all_queues())
        self._closed_busy = busy
        for actor in self.all_queues():
            actor.close()
        self._more_queues.clear()
        self._stop_reaper(busy)
        if busy or self.lost is not None:
            return  # the GPU may still use all of it (or the context is gone): leave it be
        self.driver.set_context(self.context)
        self._free_host_memory()
        self._free_streams()
        if not self._free_buffers():
            self.driver.close_context(self.index)

    def _stop_reaper(self, busy: bool) -> None:
        with self._reaper_lock:
            reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.put(None)
            if not busy:  # else its last free may wait on the GPU for good: leave it be
                reaper.thread.join()

    def _free_host_memory(self) -> None:
        """Its staging buffers and mapped words."""
        with self._staging_lock:
            pointers = self._staging_all + [entry[1] for entry in self._mirrors.values()]
            pointers += [host for host, _ in self._spare_words] + self._kept_words
            self._spare_words.clear()
            self._kept_words.clear()
            for pointer in pointers:
                self.driver.host_free(pointer)
            self._staging_all.clear()
            self._staging_free.clear()
            self._mirrors.clear()

    def _free_streams(self) -> None:
        driver = self.driver
        if self._zero_stream is not None:
            driver.stream_destroy(self._zero_stream)  # idle: every memset was waited for
            self._zero_stream = None
        if self._read_stream is not None and not self._reads:
            driver.stream_destroy(self._read_stream)
            self._read_stream = None

    def _free_buffers(self) -> bool:
        """The buffers go with the runtime, except those viewed through DLPack (a tensor
        may outlive the runtime): they go when their last viewer does, and the context
        stays for them. Return whether any such is left."""
        exported = False
        for pointer, memory in list(self._live.items()):
            if memory.exported:
                exported = True
                self._free_when_unused(memory)
            else:
                self.driver.mem_free(pointer)
                memory.release()
            del self._live[pointer]
        return exported

    def lose(self, error: BaseException) -> None:
        """A sticky CUDA error: fail the work on the GPU, and every later job, clearly."""
        if self.lost is None:
            self.lost = DeviceError(
                f"{self.name} hit {error} earlier; its CUDA context is lost and every later "
                f"call on it fails: open a new runtime"
            )
            self.lost.__cause__ = error
        for actor in self.all_queues():
            actor.fail_in_flight(self.lost)

    # -- trio-side signals as words the GPU can wait on --

    def mirror(self, signal: Signal) -> int | None:
        """The device pointer of a mapped word that follows `signal`, a signal only the
        trio side sets (a CPU queue, a device timeline): a stream waits on the word as on
        any GPU queue's. None before the device's actors started."""
        entry = self._mirrors.get(signal)
        if entry is not None:
            return entry[2]
        if self._nursery is None:
            return None
        if self._spare_words:
            host, device = self._spare_words.pop()
        else:
            host, device = self.driver.host_alloc_mapped(8)
        self.driver.host_write64(host, signal.value)
        scope = trio.CancelScope()
        self._mirrors[signal] = (signal, host, device, scope)
        self._nursery.start_soon(
            self._follow, signal, host, scope, name=f"{self.name} mirror {signal.name}"
        )
        return device

    async def _follow(self, signal: Signal, host: int, scope: trio.CancelScope) -> None:
        # Wakes once per advance of the signal (not per waiter): copy it into the word.
        write = self.driver.host_write64
        with scope:
            while not self._closed:  # closed: the word may be freed already
                seen = signal.value
                write(host, seen)
                if seen >= _U64_MAX:
                    return
                await signal.wait_value(seen + 1)

    def forget_signals(self, signals: Iterable[Signal], idle: bool) -> None:
        """`signals` will not move again, and no new work will wait on them (a worker's
        client has gone): stop following them, with their last values in their words.
        The words go back for reuse if no stream can still be waiting on them (`idle`),
        else they stay until the device closes."""
        for signal in signals:
            entry = self._mirrors.pop(signal, None)
            if entry is None:
                continue
            _, host, device, scope = entry
            scope.cancel()
            self.driver.host_write64(host, signal.value)  # what a waiting stream needs
            if idle:
                self._spare_words.append((host, device))
            else:
                self._kept_words.append(host)

    async def read_into(self, out: np.ndarray[Any, Any], src: DeviceBuffer) -> None:
        """Copy `src`, in this GPU's memory, into the host array `out` now, for a host
        queue (a worker's CPU device copying from its GPU): through pinned staging on a
        stream of its own, awaited without blocking the event loop. The caller orders
        it after the work that writes `src` (the plan's wait on the GPU queue)."""
        if self.lost is not None:
            raise self.lost
        if self._closed:
            raise DeviceError(f"{self.name} is closed")
        nbytes = src.nbytes
        if not nbytes:
            return
        keep = _Staging(self, nbytes)
        driver = self.driver
        driver.set_context(self.context)
        if self._read_stream is None:
            self._read_stream = driver.stream_create()
        token = trio.lowlevel.current_trio_token()
        landed = trio.Event()
        src_context = src.memory.device.context
        copy = (C.COPY, CopyKind.DTOH, keep.host_pointer, _pointer(src), nbytes, None, src_context)
        self._reads += 1
        try:
            C.enqueue(driver, self._read_stream, copy)
            driver.launch_host_func(
                self._read_stream, functools.partial(token.run_sync_soon, landed.set)
            )
            with trio.CancelScope(shield=True):  # the staging must outlive the copy
                await landed.wait()
        finally:
            self._reads -= 1
        staged = keep.array[:nbytes].view(src.dtype).reshape(out.shape)
        np.copyto(out, staged, casting="no")

    # -- memory --

    def allocate(self, nelems: int, dtype: np.dtype[Any]) -> Any:
        if not dtype.isnative:
            raise DeviceError(
                f"{self.name}: dtype {dtype} is not in this machine's byte order, and a "
                f"GPU's kernels read memory in theirs: allocate {dtype.newbyteorder('=')} and "
                f"convert on the host (array.astype(np.{dtype.name}))"
            )
        nbytes = nelems * dtype.itemsize
        self.driver.set_context(self.context)
        pointer = self.driver.mem_alloc(max(nbytes, 1))
        if nbytes:
            # New memory reads as zeros on every device kind. The memset runs on a stream
            # of its own that nothing else uses, so waiting for it waits for it alone;
            # work on the queues' streams is submitted after this returns.
            if self._zero_stream is None:
                self._zero_stream = self.driver.stream_create()
            try:
                self.driver.memset_zero(self._zero_stream, pointer, nbytes)
                self.driver.stream_synchronize(self._zero_stream)
            except BaseException:
                self.driver.mem_free(pointer)
                raise
        memory = CudaMemory(self, pointer, nbytes, self.driver.host_view(pointer, nbytes))
        self._live[pointer] = memory
        return memory

    def free(self, memory: Any) -> None:
        """The runtime frees memory once no submitted work uses it. cuMemFree may still
        wait for all work on the GPU, and that work may wait on signals that only the
        trio thread moves: with work on the GPU, a helper thread frees instead."""
        self._live.pop(memory.pointer, None)
        if memory.exported:
            self._free_when_unused(memory)
            return
        if self._dropped_busy or any(q.gpu_busy for q in self.all_queues()):
            self._reap(memory.pointer)
        else:
            self._free_now(memory.pointer)

    def _free_now(self, pointer: int) -> None:
        """cuMemFree on the calling thread (its current context set first: they are per
        thread); a failure, as with a lost context, is logged: nothing more to give back."""
        try:
            self.driver.set_context(self.context)
            self.driver.mem_free(pointer)
        except Exception as error:
            _log.warning("%s could not free %#x: %s", self.name, pointer, error)

    def _reap(self, pointer: int) -> None:
        """Free `pointer` on the helper thread; once the device is closed with nothing
        left on its GPU (nothing there to wait for), on a thread of its own at once. Never
        on this thread: a finalizer the collector runs calls this on whatever thread it
        interrupts, a stream's host function's among them, where the driver may not be
        called (even before that function's own first line)."""
        if self._closed and not self._closed_busy:
            threading.Thread(
                target=self._free_now, args=(pointer,), name=f"{self.name}/free", daemon=True
            ).start()
            return
        with self._reaper_lock:
            reaper = self._reaper
            if reaper is not None:
                reaper.put(pointer)
                return
        # Made outside the lock: making it allocates, so the collector may run another
        # finalizer right there, on this thread, which reaps too (it would wait on the
        # lock for good). Whichever is made first is kept; another ends its thread.
        made = _Reaper(self)
        with self._reaper_lock:
            if self._reaper is None:
                self._reaper = made
            reaper = self._reaper
            reaper.put(pointer)
        if reaper is not made:
            made.put(None)

    def _free_when_unused(self, memory: CudaMemory) -> None:
        # A DLPack consumer (a torch tensor, say) may still view it: free it once the
        # last reference to the allocation, the capsule's included, is gone.
        weakref.finalize(memory, self._reap, memory.pointer)

    def _take_staging(self, nbytes: int) -> tuple[int, int, np.ndarray[Any, Any]]:
        size = 64 if nbytes <= 64 else 1 << (nbytes - 1).bit_length()
        with self._staging_lock:
            free = self._staging_free.get(size)
            if free:
                pointer, array = free.pop()
                return pointer, size, array
        self.driver.set_context(self.context)
        pointer, _ = self.driver.host_alloc_mapped(size)
        with self._staging_lock:
            self._staging_all.append(pointer)
        array = np.ctypeslib.as_array((_u8 * size).from_address(pointer))
        return pointer, size, array

    def _give_staging(self, pointer: int, size: int, array: np.ndarray[Any, Any]) -> None:
        with self._staging_lock:
            if not self._closed:
                self._staging_free.setdefault(size, []).append((pointer, array))

    # -- kernels --

    def function(self, kernel: Any) -> Any:
        """The loaded entry point of a kernel's CUDA source: compiled once per arch (the
        driver caches images by source hash), loaded once per device."""
        source = kernel.cuda
        if source is None:
            raise DeviceError(
                f"kernel {kernel.name!r} has no CUDA source, so it cannot run on {self.name}; "
                f'give Kernel(..., cuda=SOURCE) with an extern "C" __global__ {kernel.name}(...)'
            )
        key = (_source_key(source), kernel.name)
        function = self._functions.get(key)
        if function is None:
            self.driver.set_context(self.context)
            try:
                image = self.driver.compile(source, kernel.name, self.arch)
                module = self.driver.module_load(image)
                function = self.driver.module_function(module, kernel.name)
            except DriverUnavailable:
                raise
            except Exception as exc:
                raise DeviceError(
                    f"kernel {kernel.name!r} did not build for {self.name} ({self.arch}): {exc}"
                ) from exc
            self._functions[key] = function
        return function

    def slow_builds(self, kernels: Iterable[Any]) -> list[Any]:
        # NVRTC takes a good part of a second; the fake driver compiles nothing.
        if self.driver.name == "fake":
            return []
        return [
            k
            for k in kernels
            if k.cuda is not None and (_source_key(k.cuda), k.name) not in self._functions
        ]

    def build_kernels(self, kernels: Sequence[Any]) -> None:
        for kernel in kernels:
            try:  # NVRTC only: loading needs this device's context, on the trio thread
                self.driver.compile(kernel.cuda, kernel.name, self.arch)
            except Exception:
                pass  # lowering compiles it again and reports the error with its kernel

    def _actor(self, queue: QueueKind) -> CudaQueueActor:
        return self._lowering or self.queues[queue]

    def lower_launch(self, launch: LaunchRequest) -> Op:
        item, kernel, buffers, var_values, global_size, local_size, queue = launch
        function = self.function(kernel)
        for value in var_values:
            if not _INT32[0] <= value <= _INT32[1]:
                raise DeviceError(
                    f"kernel {kernel.name!r} on {self.name}: var value {value} does not fit "
                    f"the 32-bit int a CUDA kernel takes"
                )
        pointers = tuple(_pointer(b) for b in buffers)
        ints = tuple(int(v) for v in var_values)
        body = None
        if buffers and buffers[0].memory.host is not None:  # a driver without a GPU
            if kernel.cpu is None:
                raise DeviceError(
                    f"kernel {kernel.name!r} has no CPU body, and the fake CUDA driver runs "
                    f"kernels with their CPU bodies: give Kernel(..., cpu=fn) too"
                )
            fn = kernel.cpu
            if kernel.pass_dims:
                fn = functools.partial(fn, global_size=global_size, local_size=local_size)
            args = tuple(_host_array(b) for b in buffers) + ints
            body = functools.partial(self._actor(queue).run_body, item, fn, args)
        grid = (global_size + (1, 1))[:3]
        block = (local_size + (1, 1))[:3]
        if block[0] * block[1] * block[2] > _MAX_BLOCK:
            raise DeviceError(
                f"kernel {kernel.name!r} on {self.name}: local_size={block} is "
                f"{block[0] * block[1] * block[2]} threads a block, and CUDA allows at most "
                f"{_MAX_BLOCK}; use a smaller local_size and a larger global_size"
            )
        return cuda_item(((C.KERNEL, function, grid, block, pointers, ints, body),), item)

    # -- copies --

    def peer_ok(self, other: CUDADevice) -> bool:
        """Enable peer access both ways once; False where the hardware cannot."""
        known = self._peers.get(other.index)
        if known is not None:
            return known
        ok = (
            other.driver is self.driver
            and self.driver.can_access_peer(self.index, other.index)
            and self.driver.can_access_peer(other.index, self.index)
            and not self.options.get("cuda_no_peer", False)
        )
        if ok:
            try:
                self.driver.set_context(self.context)
                self.driver.enable_peer_access(self.context, other.context)
                self.driver.set_context(other.context)
                self.driver.enable_peer_access(other.context, self.context)
            except Exception:
                ok = False
            self.driver.set_context(self.context)
        self._peers[other.index] = ok
        other.peer_known(self.index, ok)
        return ok

    def peer_known(self, index: int, ok: bool) -> None:
        """Whether peer access with device `index` is on, both ways, is known now (it set
        it up, or found it cannot be)."""
        self._peers[index] = ok

    def lower_copy(self, item: int, dst: DeviceBuffer, src: DeviceBuffer, queue: QueueKind) -> Op:
        actor = self._actor(queue)
        dst_mem, src_mem = dst.memory, src.memory
        nbytes = dst.nbytes
        dst_gpu, src_gpu = isinstance(dst_mem, CudaMemory), isinstance(src_mem, CudaMemory)
        cmds: tuple[C.Command, ...]
        keep: Any = None
        if nbytes == 0 and (dst_gpu or src_gpu):
            return cuda_item((), item)  # nothing to move; the driver takes no empty copies
        if dst_gpu and src_gpu:
            dst_dev, src_dev = dst_mem.device, src_mem.device
            if dst_mem is src_mem and _pointer(dst) == _pointer(src):
                return cuda_item((), item)  # an exact self-copy moves nothing
            overlapping = dst_mem is src_mem and abs(_pointer(dst) - _pointer(src)) < nbytes
            if overlapping or not (dst_dev is src_dev or dst_dev.peer_ok(src_dev)):
                # Through pinned host memory, on this one stream: CUDA leaves overlapping
                # copies undefined (staged, they copy as if through a temporary, like
                # memmove), and GPUs without peer access cannot reach each other.
                keep = _Staging(self, nbytes)
                cmds = (
                    (
                        C.COPY,
                        CopyKind.DTOH,
                        keep.host_pointer,
                        _pointer(src),
                        nbytes,
                        None,
                        src_dev.context,
                    ),
                    (
                        C.COPY,
                        CopyKind.HTOD,
                        _pointer(dst),
                        keep.host_pointer,
                        nbytes,
                        dst_dev.context,
                        None,
                    ),
                )
            else:
                kind = CopyKind.DTOD if dst_dev is src_dev else CopyKind.PEER
                cmds = (
                    (
                        C.COPY,
                        kind,
                        _pointer(dst),
                        _pointer(src),
                        nbytes,
                        dst_dev.context,
                        src_dev.context,
                    ),
                )
        elif dst_gpu:
            cmds, keep = self._upload(item, actor, dst, src.host_view())
        elif src_gpu:
            cmds, keep = self._download(item, actor, dst.host_view(), src)
        else:
            raise DeviceError(
                f"{self.name} cannot copy between {dst!r} and {src!r}: neither is on it"
            )
        return cuda_item(cmds, item, keep)

    def _upload(
        self, item: int, actor: CudaQueueActor, dst: DeviceBuffer, array: np.ndarray[Any, Any]
    ) -> tuple[tuple[C.Command, ...], Any]:
        nbytes = dst.nbytes
        keep = _Staging(self, nbytes)
        staged = keep.array[:nbytes].view(dst.dtype).reshape(dst.shape)
        fill = functools.partial(actor.copy_on_host, item, staged, array.reshape(dst.shape))
        cmds = (
            (C.HOST, fill),
            (
                C.COPY,
                CopyKind.HTOD,
                _pointer(dst),
                keep.host_pointer,
                nbytes,
                dst.memory.device.context,
                None,
            ),
        )
        return cmds, (keep, fill)

    def _download(
        self, item: int, actor: CudaQueueActor, out: np.ndarray[Any, Any], src: DeviceBuffer
    ) -> tuple[tuple[C.Command, ...], Any]:
        nbytes = src.nbytes
        keep = _Staging(self, nbytes)
        staged = keep.array[:nbytes].view(src.dtype).reshape(out.shape)
        drain = functools.partial(actor.copy_on_host, item, out, staged)
        cmds = (
            (
                C.COPY,
                CopyKind.DTOH,
                keep.host_pointer,
                _pointer(src),
                nbytes,
                None,
                src.memory.device.context,
            ),
            (C.HOST, drain),
        )
        return cmds, (keep, drain)

    def lower_host_write(
        self, buffer: DeviceBuffer, array: np.ndarray[Any, Any], queue: QueueKind
    ) -> Op:
        cmds, keep = self._upload(-1, self._actor(queue), buffer, array)
        return cuda_item(cmds, -1, keep)

    def lower_host_read(
        self, buffer: DeviceBuffer, out: np.ndarray[Any, Any], queue: QueueKind
    ) -> Op:
        cmds, keep = self._download(-1, self._actor(queue), out, buffer)
        return cuda_item(cmds, -1, keep)

    # -- DLPack --

    def dlpack(self, buffer: DeviceBuffer, stream: Any = None, max_version: Any = None) -> Any:
        """A DLPack capsule that views `buffer`'s device memory without a copy.

        On a GPU the consumer's `stream` (DLPack's convention: None or 1 the legacy
        default stream, 2 the per-thread one, else a CUstream handle, -1 none) is made to
        wait on the GPU for all work submitted to this device so far: the host never
        blocks, as that work may wait on signals this very thread moves. Fake-driver
        memory is host memory that the consumer reads at once: there the streams drain."""
        from ._dlpack import make_capsule

        if buffer.memory.released:
            raise BufferError(
                f"{buffer!r}: its runtime has closed and its GPU memory is gone; export "
                f"buffers while their runtime is open (an exported one then stays)"
            )
        buffer.memory.export()
        if self.driver.name == "fake":
            self.sync()
        elif stream != -1:
            self._order_before(1 if stream is None else int(stream))
        return make_capsule(
            _pointer(buffer),
            buffer.shape,
            buffer.dtype,
            self.dlpack_device(),
            owner=buffer.memory,
            max_version=max_version,
        )

    def _order_before(self, handle: int) -> None:
        """Make the stream `handle` wait for all work submitted to this device so far.

        A queue's word reaches `next_value` once all of it is done, including jobs still
        in the actor's inbox: the consumer waits on the words. Without stream memory
        operations only events can order it, and they cover only what is on the streams."""
        driver = self.driver
        driver.set_context(self.context)
        consumer = driver.wrap_stream(handle)
        for actor in self.queues.values():
            target = actor.next_value
            if actor.signal.value >= target:
                continue  # all done
            if self.mem_ops:
                driver.stream_wait_value64(consumer, actor.signal.device_pointer, target)
            elif not actor.busy:  # all of it is on the stream already
                event = driver.event_create()
                driver.event_record(event, actor.stream)
                driver.stream_wait_event(consumer, event)
                driver.event_destroy(event)  # the driver keeps it until the wait is done
            else:
                raise BufferError(
                    f"cannot export from {self.name}: work submitted to {actor.name} is not on its stream "
                    f"yet, and without 64-bit stream memory operations an export cannot "
                    f"wait for it; await that work, then export"
                )

    def dlpack_device(self) -> tuple[int, int]:
        # Device memory of the fake driver is host memory: report it as such, so numpy
        # (and torch on the CPU) can view it; a real GPU's is kDLCUDA (2).
        return (1, 0) if self.driver.name == "fake" else (2, self.index)

    def sync(self) -> None:
        """Wait (blocking) until both streams have run everything queued on them."""
        self.driver.set_context(self.context)
        for actor in self.queues.values():
            self.driver.stream_synchronize(actor.stream)


_u8 = ctypes.c_uint8


@functools.lru_cache(maxsize=1024)
def _source_key(source: str) -> str:
    """A kernel source's hash, computed once per source (lowering asks on every rebind)."""
    return hashlib.sha256(source.encode()).hexdigest()


def _pointer(buffer: DeviceBuffer) -> int:
    return int(buffer.memory.pointer) + int(buffer.offset) * int(buffer.dtype.itemsize)


def _host_array(buffer: DeviceBuffer) -> np.ndarray[Any, Any]:
    start = buffer.offset * buffer.dtype.itemsize
    raw: np.ndarray[Any, Any] = buffer.memory.host[start : start + buffer.nbytes]
    out: np.ndarray[Any, Any] = raw.view(buffer.dtype).reshape(buffer.shape)
    return out
