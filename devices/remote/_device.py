"""REMOTE devices: devices of a worker, driven through its connection actor.

Names, `RemoteDevice` and its lowering to program entries (wire.py), `RemoteQueue`. How a
replay runs and how order crosses hosts: see the package's docstring
(actorgraph/devices/remote/__init__.py).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import trio
from actorgraph.scheduler import QueueKind

from .._actor import QueueActor
from .._device import Device, DeviceBuffer, DeviceError, LaunchRequest
from .._inline import Resumer
from .._kinds import DEVICE_KINDS
from .._names import parse_remote_name
from .._ops import AWAIT, SIGNAL, WAIT, WIRE, Job, Op, WireOp, own_signal, run_op, wire_op
from ._connection import Connection, RemoteMemory, flat_bytes
from ._programs import RemoteSignal
from .machine import MachineCode
from .wire import (
    CodeEntry,
    CopyEntry,
    HostReadEntry,
    HostWriteEntry,
    KernelEntry,
    PullEntry,
    Ref,
)


class RemoteQueue(QueueActor):
    """A worker's queue as the plan sees it. Its jobs go to the connection actor; its
    signal mirrors the worker queue's progress, as reported back by the worker.

    The jobs it posted and the worker has not reported done are its pending work, for the
    deadlock monitor: work in flight on a worker is progress the client cannot see (a
    slow kernel changes nothing here until it ends). The monitor runs those jobs
    abstractly from their first op, which is sound as signals only rise: a deadlock is
    declared only if they could not finish however long their kernels take.

    Invariants: `in_flight` holds, in posting order, the jobs posted and not yet ended
    (by a "done" report or by the connection failing them).
    """

    op_codes = frozenset([WAIT, SIGNAL, WIRE])
    runs_inline = False  # its jobs go to the connection actor
    flushes = True  # a submission's jobs for one worker go as one batch
    signal: RemoteSignal

    def __init__(
        self, device: RemoteDevice, kind: QueueKind = QueueKind.COMPUTE, timeline_start: int = 0
    ) -> None:
        super().__init__(f"{device.name}/{kind.value}", timeline_start)
        self.device = device
        self.kind = kind
        # The worker's name of this queue: what its reports of progress are keyed by.
        self.key = device.inner if kind is QueueKind.COMPUTE else f"{device.inner}/{kind.value}"
        self.in_flight: collections.deque[Job] = collections.deque()
        self.signal: RemoteSignal = RemoteSignal(self.name, timeline_start, self, device.resumer)

    @property
    def end_reader(self) -> Connection:
        # A replay living on one worker: its caller reads the worker's reports itself.
        return self.device.connection

    def post(self, job: Job) -> None:
        self.in_flight.append(job)
        self.device.connection.post(job, self)

    def flush(self) -> None:
        # The submission is whole: its jobs for this worker go as one batch.
        self.device.connection.transport.flush()

    def ended(self, job: Job) -> None:
        """The worker finished `job`, or the connection failed it."""
        in_flight = self.in_flight
        if in_flight and in_flight[0] is job:
            in_flight.popleft()  # jobs of one queue end in order: the usual case
        else:
            with contextlib.suppress(ValueError):
                in_flight.remove(job)

    def lost_job(self, job: Job, error: BaseException) -> None:
        """End a job its worker will never report (the connection is lost): the signal
        moves to where the job would have left it (so what waits on it goes on), and the
        submission fails."""
        self.ended(job)
        own = own_signal(job.ops)
        if own is not None:
            self.signal.set(own.value(job.bases))
        job.fail(self.name, error, item=-1)

    def pending(self) -> list[tuple[Job, int]]:
        return [(job, 0) for job in self.in_flight]

    def waits_without_host(self, other: QueueActor) -> bool:
        # A queue of the same worker: its value is waited on there, never reported here.
        # A queue of another worker that tells peers itself: that worker tells this one.
        return isinstance(other, RemoteQueue) and (
            other.device.connection is self.device.connection or other.tells_peers
        )

    @property
    def tells_peers(self) -> bool:
        """Whether its worker tells other workers how far it has got, at any signal (not
        only those reported to the client): a CPU device's queue, whose actor on the
        worker is the client's own (see _progress.py, TrackedSignal). A wait on it from
        another worker then travels between the two workers."""
        return self.device.inner_kind.runs_host_kernels

    @property
    def busy(self) -> bool:
        return bool(self.in_flight)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()  # the connection actor runs this queue's jobs


class RemoteDevice(Device):
    """`KIND:N@HOST:PORT`: device KIND:N of a worker, driven over its connection.

    It has a compute and a copy queue, as a local device has: kernels run on the first,
    copies within its worker and from other workers, `copyin` and `copyout` on the second,
    each on its own queue actor of this client's session on the worker, so copies overlap
    compute there. A copy between it and a client-local device runs on the local device's
    copy queue (`host_io`), which moves the bytes over the connection.
    """

    kind = "REMOTE"
    options_taken = frozenset(
        ["remote_token", "remote_token_file", "remote_timeout", "remote_tls_ca"]
    )
    host_visible = False
    host_backed = False
    lowers_foreign_copies = True
    host_io = True

    def __init__(
        self,
        name: str,
        index: int,
        *,
        connection: Connection,
        inner: str,
        inner_kind: type[Device] = Device,
        timeline_start: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(name, index, timeline_start=timeline_start, **options)
        self.connection = connection
        self.inner = inner
        # The kind of the worker's device, whose capabilities it has (Device: none of a
        # kind this process does not know).
        self.inner_kind = inner_kind
        self._remote_queues = {
            kind: RemoteQueue(self, kind, timeline_start)
            for kind in (QueueKind.COMPUTE, QueueKind.COPY)
        }
        connection.add_device(self)

    @property
    def queues(self) -> Mapping[QueueKind, RemoteQueue]:
        return self._remote_queues

    async def start(self, nursery: trio.Nursery) -> None:
        await self.connection.start(nursery)

    def close(self) -> None:
        self.connection.close()

    def check_reachable(self) -> None:
        self.connection.probe()
        if self.connection.error is not None:
            raise self.connection.error

    # -- memory --

    def allocate(self, nelems: int, dtype: np.dtype[Any]) -> Any:
        return self.connection.allocate(self, nelems, np.dtype(dtype))

    def free(self, memory: Any) -> None:
        if isinstance(memory, RemoteMemory):
            memory.connection.free(memory)

    # -- lowering --

    def _ref(self, buffer: DeviceBuffer) -> Ref:
        memory = buffer.memory
        if not isinstance(memory, RemoteMemory):
            raise DeviceError(f"{buffer!r} is not memory of a remote device")
        dtype = buffer.dtype
        if dtype is memory.dtype or dtype == memory.dtype:
            return Ref(memory.handle, buffer.offset, buffer.shape)
        return Ref(memory.handle, buffer.offset, buffer.shape, dtype.str)  # a view's own

    def lower_launch(self, launch: LaunchRequest) -> Op:
        item, kernel, buffers, var_values, global_size, local_size, queue = launch
        code = getattr(kernel, "code", None)
        if code is not None:
            values = [int(v) for v in launch[3]]
            return wire_op(self._code_entry(launch, code), item, values=values or None)
        entry = KernelEntry(
            item,
            kernel.name,
            [self._ref(b) for b in buffers],
            [int(v) for v in var_values],
            list(global_size),
            list(local_size),
        )
        return wire_op(entry, item)

    def lower_values(self, op: Op, launch: LaunchRequest) -> Op:
        # A call of shipped code sends its var values with each batch: bound to other
        # values (and the same dims), it is the same entry, and names the same program.
        entry = op.entry if type(op) is WireOp else None
        if (
            type(entry) is CodeEntry
            and entry.global_size == list(launch[4])
            and entry.local_size == list(launch[5])
        ):
            return wire_op(entry, launch[0], values=[int(v) for v in launch[3]] or None)
        return self.lower_launch(launch)

    def _code_entry(self, launch: LaunchRequest, code: MachineCode) -> CodeEntry:
        """A launch of shipped machine code: shipped first if the worker lacks it."""
        item, kernel, buffers, var_values, global_size, local_size, _ = launch
        if not self.inner_kind.runs_host_kernels:
            raise DeviceError(
                f"kernel {kernel.name!r} is machine code for a CPU, and {self.name} does not "
                f"run host kernels (it is not a CPU device of its worker); launch it on a "
                f"CPU:N device of the worker"
            )
        if len(buffers) != code.buffers or len(var_values) != code.launch_values:
            raise DeviceError(
                f"kernel {kernel.name!r} on {self.name}: its machine code takes {code.buffers} "
                f"buffers and {code.launch_values} var values, the launch gave {len(buffers)} "
                f"and {len(var_values)}; pass one buffer per argument and one var per value"
            )
        return CodeEntry(
            item,
            self.connection.code_id(code, self.name),
            [self._ref(b) for b in buffers],
            list(global_size),
            list(local_size),
        )

    def lower_copy(self, item: int, dst: DeviceBuffer, src: DeviceBuffer, queue: QueueKind) -> Op:
        """Every copy that touches a remote buffer, wherever the planner put it."""
        dst_dev, src_dev = dst.device_object, src.device_object
        for local in (dst_dev, src_dev):
            if not isinstance(local, RemoteDevice) and not local.host_backed:
                raise DeviceError(
                    f"copy {src.device}->{dst.device}: a copy between a remote device and "
                    f"{local.name} is not supported ({local.name}'s memory is not host memory, "
                    f"and the bytes go to the worker from host memory); copy through a CPU "
                    f"device: {local.name} -> CPU:N -> the remote device, or back"
                )
        if isinstance(dst_dev, RemoteDevice) and isinstance(src_dev, RemoteDevice):
            # On a queue of the destination (its copy queue), run by the destination's worker.
            if dst_dev.connection is src_dev.connection:
                return wire_op(CopyEntry(item, self._ref(dst), self._ref(src)), item)
        for far in (dst_dev, src_dev):
            if isinstance(far, RemoteDevice) and not far.inner_kind.host_backed:
                raise DeviceError(
                    f"copy {src.device}->{dst.device}: a copy between {far.name} and a device "
                    f"off its worker is not supported (its memory is GPU memory, and the "
                    f"bytes go over the network from host memory); copy through a CPU "
                    f"device of that worker: {far.inner} <-> CPU:N@{far.connection.address}"
                )
        if isinstance(dst_dev, RemoteDevice) and isinstance(src_dev, RemoteDevice):
            source = src_dev.connection
            dst_dev.connection.reads_from(source)
            entry = PullEntry(
                item,
                self._ref(dst),
                source.host,
                source.port,
                source.session_id,
                self._ref(src),
                source.ticket(src.memory.handle),
                src_dev.inner,
            )
            return wire_op(entry, item)
        if isinstance(src_dev, RemoteDevice):
            # Runs on the client-local destination's queue: pull the bytes over.
            return run_op(AWAIT, src_dev.connection.pull, (dst.host_view(), self._ref(src)), item)
        if not isinstance(dst_dev, RemoteDevice):
            raise DeviceError(
                f"{self.name} was asked to lower copy {src.device}->{dst.device}, and neither "
                f"side is a remote device"
            )
        if QueueKind.COPY not in src_dev.queues:
            raise DeviceError(
                f"copy {src.device}->{dst.device}: a copy from a client-local device to a "
                f"remote one runs on the source's copy queue, and {src.device} has none; "
                f"copy through a device that has one (e.g. a CPU device)"
            )
        return run_op(AWAIT, dst_dev.connection.push, (src.host_view(), self._ref(dst)), item)

    def lower_host_write(
        self, buffer: DeviceBuffer, array: np.ndarray[Any, Any], queue: QueueKind
    ) -> Op:
        data = flat_bytes(array)
        step = self.connection.chunk
        chunks = [data[i : i + step] for i in range(0, len(data), step)] or [data]
        # Sent as blobs ahead of each batch, which names them: its program can be kept.
        return wire_op(HostWriteEntry(-1, self._ref(buffer), len(chunks)), -1, chunks)

    def lower_host_read(
        self, buffer: DeviceBuffer, out: np.ndarray[Any, Any], queue: QueueKind
    ) -> Op:
        # Its read id is asked for per batch (Batch.reads), so its program can be kept.
        return wire_op(HostReadEntry(-1, self._ref(buffer), 0), -1, into=flat_bytes(out))


def open_remote_devices(
    names: Sequence[str],
    timeline_start: int = 0,
    *,
    kinds: Mapping[str, type[Device]] = DEVICE_KINDS,
    resumer: Resumer | None = None,
    **options: Any,
) -> dict[str, Device]:
    """Remote devices for `names`, one Connection per worker address (none connects
    before the runtime starts it).

    Args:
        names: `KIND:N@HOST:PORT` device names.
        timeline_start: the first value of each device's timeline and queues.
        kinds: the device kinds by name (`CPU`, ...), whose capabilities a worker's
            device of that kind has; one not there has none.
        resumer: runs on the jobs held on their queues' signals as the worker's
            reports move them (a runtime's, shared by all its devices; None: one the
            devices opened here share).
        options: the options of open_runtime(...) the connections read
            (`remote_token`, `remote_timeout`, `remote_tls_ca`, ...).

    Returns:
        The devices by name.

    Raises:
        DeviceError: a name that is not a remote device name.
    """
    resumer = Resumer() if resumer is None else resumer
    connections: dict[tuple[str, int], Connection] = {}
    out: dict[str, Device] = {}
    for name in names:
        parsed = parse_remote_name(name)
        if parsed is None:
            raise DeviceError(f"{name!r} is not a remote device name like 'CPU:0@127.0.0.1:7000'")
        kind, index, host, port = parsed
        conn = connections.get((host, port))
        if conn is None:
            conn = connections[(host, port)] = Connection(host, port, dict(options))
        out[name] = RemoteDevice(
            name,
            index,
            connection=conn,
            inner=f"{kind}:{index}",
            inner_kind=kinds.get(kind, Device),
            timeline_start=timeline_start,
            resumer=resumer,
            **options,
        )
    return out
