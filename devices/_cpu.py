"""CPU:N devices: host memory, kernels run as numpy calls.

Small kernels run inline in the actor (no hop at all). Large ones, by bytes touched,
run on the actor's own worker thread, so two CPU devices really compute in parallel
(numpy releases the GIL) while the trio thread keeps scheduling.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np
from actorgraph.scheduler import QueueKind

from ._actor import QueueActor
from ._device import (
    Device,
    DeviceBuffer,
    DeviceError,
    LaunchRequest,
    MakeSignal,
    nothing,
    same_bytes,
)
from ._ops import EXEC, EXEC_THREAD, Op, run_op

DEFAULT_THREAD_BYTES = 1 << 20


def host_launch_call(device: Device, launch: LaunchRequest) -> tuple[Any, tuple[Any, ...]]:
    """The (function, args) that run a kernel's CPU body on host-visible buffers."""
    _, kernel, buffers, var_values, global_size, local_size, _ = launch  # one unpack: hot path
    fn = kernel.cpu
    if fn is None and getattr(kernel, "code", None) is not None:
        raise DeviceError(
            f"kernel {kernel.name!r} is machine code for workers (Kernel(code=...)) with no "
            f"CPU body, so it cannot run on {device.name}; launch it on a CPU device of a "
            f"worker started with --allow-programs (KIND:N@HOST:PORT), or give cpu=fn"
        )
    if fn is None:
        raise DeviceError(
            f"kernel {kernel.name!r} has no CPU body, so it cannot run on {device.name}; "
            f"give Kernel(..., cpu=fn) or launch it on a device it has a body for"
        )
    if kernel.pass_dims:
        fn = functools.partial(fn, global_size=global_size, local_size=local_size)
    args: tuple[Any, ...]
    if getattr(kernel, "cpu_args", "arrays") == "addresses":
        args = tuple([b.address for b in buffers])
    else:
        args = tuple([b.host_view() for b in buffers])
    return fn, (args + tuple(var_values) if var_values else args)


def copy_args(
    dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Arguments for np.copyto(dst, src), shaped once at lowering rather than per call.

    Items and host copies have equal dtypes and sizes (checked when they are made).
    """
    if src.dtype != dst.dtype or src.size != dst.size:
        raise DeviceError(f"cannot copy {src.size} {src.dtype} into {dst.size} {dst.dtype}")
    return dst, src if src.shape == dst.shape else src.reshape(dst.shape)


class CPUDevice(Device):
    kind = "CPU"
    options_taken = frozenset(["cpu_thread_bytes"])
    host_memory = True
    runs_host_kernels = True

    def __init__(self, name: str, index: int, *, timeline_start: int = 0, **options: Any) -> None:
        super().__init__(name, index, timeline_start=timeline_start, **options)
        self.thread_bytes = int(options.get("cpu_thread_bytes", DEFAULT_THREAD_BYTES))
        # Jobs may be held on its queues' signals (a step of a chain with a worker runs
        # on in the task that takes the worker's report: devices/_inline.py).
        self._queues = {
            kind: QueueActor(
                f"{name}/{kind.value}",
                timeline_start,
                self.holding_signal(f"{name}/{kind.value}", timeline_start),
            )
            for kind in (QueueKind.COMPUTE, QueueKind.COPY)
        }

    def new_queue(
        self, kind: QueueKind, name: str, make_signal: MakeSignal | None = None
    ) -> QueueActor | None:
        # CPU ops carry their arrays: any actor runs them.
        return QueueActor(name, signal=None if make_signal is None else make_signal(name, 0))

    def allocate(self, nelems: int, dtype: np.dtype[Any]) -> Any:
        return np.zeros(nelems, dtype=dtype)

    def _code(self, nbytes: int) -> Literal[2, 3]:
        """EXEC_THREAD for ops on `nbytes` or more (the `cpu_thread_bytes` option), else EXEC."""
        return EXEC_THREAD if nbytes >= self.thread_bytes else EXEC

    def lower_launch(self, launch: LaunchRequest) -> Op:
        fn, args = host_launch_call(self, launch)
        return run_op(self._code(sum([b.nbytes for b in launch[2]])), fn, args, launch[0])

    def lower_values(self, op: Op, launch: LaunchRequest) -> Op:
        # The op's call is (body, buffer args + var values) with its code chosen by the
        # buffers' bytes: only the values change, unless the body takes the dims.
        if launch[1].pass_dims:
            return self.lower_launch(launch)
        values = launch[3]
        if op.code != EXEC and op.code != EXEC_THREAD:
            return self.lower_launch(launch)  # not an op this device lowered a launch to
        args = op.args[: len(launch[2])]
        return run_op(op.code, op.fn, args + tuple(values) if values else args, launch[0])

    def lower_copy(self, item: int, dst: DeviceBuffer, src: DeviceBuffer, queue: QueueKind) -> Op:
        # np.copyto copies overlapping views as if through a temporary (memmove).
        if same_bytes(dst, src):
            return run_op(EXEC, nothing, (), item)
        return run_op(
            self._code(dst.nbytes), np.copyto, copy_args(dst.host_view(), src.host_view()), item
        )

    def lower_host_write(
        self, buffer: DeviceBuffer, array: np.ndarray[Any, Any], queue: QueueKind
    ) -> Op:
        return run_op(
            self._code(buffer.nbytes), np.copyto, copy_args(buffer.host_view(), array), -1
        )

    def lower_host_read(
        self, buffer: DeviceBuffer, out: np.ndarray[Any, Any], queue: QueueKind
    ) -> Op:
        return run_op(self._code(buffer.nbytes), np.copyto, copy_args(out, buffer.host_view()), -1)
