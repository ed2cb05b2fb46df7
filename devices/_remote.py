"""REMOTE devices: devices of a worker process, reached through one connection actor.

A remote device is named `KIND:N@HOST:PORT` (`CPU:0@127.0.0.1:7000`: device CPU:0 of the
worker listening on 127.0.0.1:7000). All remote devices of one worker in a runtime share
one `Connection` (devices/_connection.py): one TCP connection and one actor task that
stands, in the plan, for every queue of that worker. This module holds the device side:
names, `RemoteDevice` and its lowering to wire entries, `RemoteQueue`.

How a replay runs
-----------------
The planner sees a remote device as an ordinary device with one compute queue (a
`RemoteQueue`). Its message list is lowered as for any device: waits, signals and items,
where an item is a *wire entry* (kernel by name, buffers by handle) instead of a call.
`RemoteQueue.post` does not run the job: it hands it to the connection actor. Because a
submission posts all of its jobs synchronously, the connection actor wakes to find every
job of the submission for its worker side by side, and sends them as ONE batch frame:

    ["batch", batch id, bases, [program ids], [[signal id, value], ...]]

The worker keeps each queue's lowered program (defined by a "prog" frame the first time a
job's op list is seen, then referred to by id), so a replay of a graph that lives on one
worker costs one frame out and one "done" frame back per queue: one round trip. Items
whose input buffers are rebound produce new op lists, which are sent again.

How order crosses hosts
-----------------------
A plan orders queues with `Wait(queue, value)` messages on timeline signals. On the worker
each wait becomes one of:

- a *local* wait, when the signal is another queue of the same worker in the same batch:
  the worker waits on its own actor's signal, with the base it reserved for this batch;
- a *mirror* wait, for every other signal (a client-local queue, a queue of another
  worker, a device timeline, the runtime's KICK): the worker waits on a mirror of that
  signal that holds the client's absolute value. The batch carries the current value of
  every mirror it uses; for a wait not yet satisfied, the connection starts a forwarder
  that sends ["ext", [[id, value]]] once the client's signal gets there.

The other way, the worker reports its queues' signals ("sig" frames, "done" at the end),
and the connection sets the `RemoteQueue`'s signal on the client, so client-local queues
and other workers wait on remote queues as on local ones. A wait between two workers thus
goes through the client; the data does not: a copy between two workers runs on the
destination's worker, which pulls the bytes from the source worker over a direct peer
connection, authorised by a read ticket (an HMAC under the source session's key) that the
client puts in the program. Copies between a client-local device and a remote one run on
the local device's copy queue as an AWAIT op that pushes or pulls the bytes.

A lost connection fails every job in flight with `RemoteConnectionError` and advances the
remote queues' signals, so client-local queues waiting on them finish (skipping their
items) and other devices go on working.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import trio
from actorgraph.scheduler import QueueKind

from ._actor import QueueActor
from ._connection import Connection, RemoteMemory, flat_bytes
from ._device import Device, DeviceBuffer, DeviceError, LaunchRequest
from ._ops import AWAIT, SIGNAL, WAIT, WIRE, Job, Op, run_op, wire_op

REMOTE_NAME = re.compile(r"^([A-Z]+):(\d+)@(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+):(\d{1,5})$")


def parse_remote_name(name: str) -> tuple[str, int, str, int] | None:
    """'CPU:0@127.0.0.1:7000' -> ('CPU', 0, '127.0.0.1', 7000); None if not a remote name."""
    match = REMOTE_NAME.match(name) if isinstance(name, str) else None
    if match is None:
        return None
    host = match.group(3).strip("[]")
    port = int(match.group(4))
    if not 0 < port < 65536:
        return None
    return match.group(1), int(match.group(2)), host, port


class RemoteQueue(QueueActor):
    """A worker's queue as the plan sees it. Its jobs go to the connection actor; its
    signal mirrors the worker queue's progress, as reported back by the worker."""

    op_codes = frozenset([WAIT, SIGNAL, WIRE])

    def __init__(self, name: str, device: RemoteDevice, timeline_start: int = 0) -> None:
        super().__init__(name, timeline_start)
        self.device = device

    def post(self, job: Job) -> None:
        self.device.connection.post(job, self)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()  # the connection actor runs this queue's jobs


class RemoteDevice(Device):
    """`KIND:N@HOST:PORT`: device KIND:N of a worker, driven over its connection."""

    kind = "REMOTE"
    host_visible = False
    host_backed = False
    lowers_foreign_copies = True

    def __init__(
        self,
        name: str,
        index: int,
        *,
        connection: Connection,
        inner: str,
        timeline_start: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(name, index, timeline_start=timeline_start, **options)
        self.connection = connection
        self.inner = inner
        self._remote_queues = {
            QueueKind.COMPUTE: RemoteQueue(f"{name}/compute", self, timeline_start)
        }
        connection.devices.append(self)

    @property
    def queues(self) -> Mapping[QueueKind, RemoteQueue]:
        return self._remote_queues

    async def start(self, nursery: trio.Nursery) -> None:
        await self.connection.start(nursery)

    def close(self) -> None:
        self.connection.close()

    # -- memory --

    def allocate(self, nelems: int, dtype: np.dtype[Any]) -> Any:
        return self.connection.allocate(self, nelems, np.dtype(dtype))

    def free(self, memory: Any) -> None:
        if isinstance(memory, RemoteMemory):
            memory.connection.free(memory)

    # -- lowering --

    def _ref(self, buffer: DeviceBuffer) -> list[Any]:
        memory = buffer.memory
        if not isinstance(memory, RemoteMemory):
            raise DeviceError(f"{buffer!r} is not memory of a remote device")
        return [memory.handle, buffer.offset, list(buffer.shape)]

    def lower_launch(self, launch: LaunchRequest) -> Op:
        item, kernel, buffers, var_values, global_size, local_size, queue = launch
        entry = [
            "k",
            item,
            kernel.name,
            [self._ref(b) for b in buffers],
            [int(v) for v in var_values],
            list(global_size),
            list(local_size),
        ]
        return wire_op(entry, item)

    def lower_copy(self, item: int, dst: DeviceBuffer, src: DeviceBuffer, queue: QueueKind) -> Op:
        """Every copy that touches a remote buffer, wherever the planner put it."""
        dst_dev, src_dev = dst.device_object, src.device_object
        if isinstance(dst_dev, RemoteDevice) and isinstance(src_dev, RemoteDevice):
            # Neither side has a copy queue: this runs on the destination's worker.
            if dst_dev.connection is src_dev.connection:
                return wire_op(["c", item, self._ref(dst), self._ref(src)], item)
            source = src_dev.connection
            entry = [
                "p",
                item,
                self._ref(dst),
                source.host,
                source.port,
                source.session_id,
                self._ref(src),
                source.ticket(src.memory.handle),
            ]
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

    def lower_host_write(self, buffer: DeviceBuffer, array: np.ndarray[Any, Any], queue: QueueKind) -> Op:
        data = flat_bytes(array)
        step = self.connection.chunk
        chunks = [data[i : i + step] for i in range(0, len(data), step)] or [data]
        blob_ids = [self.connection.next_blob() for _ in chunks]
        return wire_op(["hw", -1, self._ref(buffer), blob_ids], -1, list(zip(blob_ids, chunks)))

    def lower_host_read(self, buffer: DeviceBuffer, out: np.ndarray[Any, Any], queue: QueueKind) -> Op:
        read_id = self.connection.expect_read(flat_bytes(out), staged=True)
        return wire_op(["hr", -1, self._ref(buffer), read_id], -1)


def open_remote_devices(
    names: Sequence[str], timeline_start: int = 0, **options: Any
) -> dict[str, Device]:
    """Remote devices for `names`, one Connection per worker address."""
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
            timeline_start=timeline_start,
            **options,
        )
    return out
