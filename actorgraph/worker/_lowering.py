"""How a worker lowers a client's program: each entry checked against the worker's
limits and the client's ids, then made the ops its queue actor runs.

A `Session` (_session.py) hands each "prog" request's entries to `lower`; the result is a
`Program` (_lowered.py) that the session's batches post.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from actorgraph.devices import (
    AWAIT,
    EXEC,
    EXEC_THREAD,
    FIRST_QUEUE_SLOT,
    Device,
    Job,
    LaunchRequest,
    Op,
    QueueActor,
    SignalOp,
    run_op,
    signal_op,
    wait_op,
)
from actorgraph.devices.remote.wire import (
    WireError,
    want_bytes,
    want_fields,
    want_int,
    want_list,
    want_str,
)
from actorgraph.scheduler import QueueKind

from .._buffer import Buffer
from ._lowered import REL_MAX, Program, Refused
from ._lowered import queue_key as _queue_key
from ._lowered import queue_kind as _queue_kind
from ._placement import AdaptiveKernel
from ._staging import bytes_of, chunks_into

if TYPE_CHECKING:
    from ._session import Session


_ITEM_ENTRIES = frozenset(["k", "c", "p", "hw", "hr"])
EARLY_PULL_BYTES = 1 << 20  # larger copies between workers are read when they run


async def _read_from_gpu(job: Job, device: Any, out: np.ndarray[Any, Any], src: Buffer) -> None:
    """A copy from a worker's GPU into host memory, run by a host queue (`device` is the
    GPU's CUDADevice: its `read_into`)."""
    if job.submission.error is None:
        await device.read_into(out, src)


def lower(
    session: Session, program: Program, device_name: str, entries: object, kind: QueueKind
) -> None:
    runtime = session.worker.runtime
    if device_name not in runtime.devices:
        raise Refused(f"this worker has no device {device_name!r} ({runtime.devices})")
    device = runtime.device(device_name)
    actor = session.queue(device_name, kind)
    program.actor = actor
    program.kind = kind
    # The queue's name in reports of progress (what "pwhen" reads name): DEVICE for a
    # compute queue, DEVICE/copy for a copy queue.
    program.device = _queue_key(device_name, kind)
    entries = want_list(entries, "program", session.worker.limits.max_program_ops)
    with device.lowering_for(actor):  # a CUDA item's host work reports to this actor
        _lower_entries(session, program, device, actor, entries)


def _lower_entries(
    session: Session, program: Program, device: Device, actor: QueueActor, entries: list[Any]
) -> None:
    runtime = session.worker.runtime
    ops: list[Op | AdaptiveKernel | None] = []
    signals: list[tuple[int, int]] = []
    quiet: set[int] = set()  # where the report of a signal nobody off the worker needs goes
    for entry in entries:
        entry = want_list(entry, "program entry", 16)
        if not entry or not isinstance(entry[0], str):
            raise Refused("a program entry is a list starting with its kind")
        kind = entry[0]
        try:
            if kind in _ITEM_ENTRIES:
                program.count += 1
                lowered_item = _lower_item(session, device, entry, program)
                if isinstance(lowered_item, list):  # a host step and a CUDA item
                    ops.extend(lowered_item)
                else:
                    ops.append(lowered_item)
            elif kind == "w":
                slot = want_int(entry[2], "wait slot", 0, 1 << 16)
                program.max_slot = max(program.max_slot, slot)
                rel = want_int(entry[3], "wait value", 0, REL_MAX)
                ops.append(wait_op(session.mirror(entry[1]), slot, rel))
                if len(entry) > 4:
                    # A queue of another worker, which tells this one as it gets there.
                    host, port, sid, queue, ticket = want_list(entry[4], "wait source", 5, 5)
                    source = (
                        want_str(host, "peer host"),
                        want_int(port, "peer port", 1, 65535),
                        want_int(sid, "peer session"),
                        want_str(queue, "peer queue"),
                        want_bytes(ticket, "watch ticket", 32),
                    )
                    program.watches.append((slot, rel, want_int(entry[1], "signal id"), source))
            elif kind == "l":
                other = want_str(entry[1], "wait device")
                if other not in runtime.devices:
                    raise Refused(f"wait on unknown device {other!r}")
                slot = want_int(entry[2], "wait slot", 0, 1 << 16)
                program.max_slot = max(program.max_slot, slot)
                other_kind = _queue_kind(entry[4] if len(entry) > 4 else "compute")
                program.local_waits.append((slot, other, other_kind))
                signal = session.queue(other, other_kind).signal
                ops.append(wait_op(signal, slot, want_int(entry[3], "wait value", 0, REL_MAX)))
            elif kind == "s":
                signals.append(
                    (
                        want_int(entry[1], "signal slot", 0, 1 << 16),
                        want_int(entry[2], "signal value", 0, REL_MAX),
                    )
                )
                ops.append(signal_op(actor.signal, *signals[-1]))
                if len(entry) > 3 and entry[3] == 0:
                    quiet.add(len(ops))
                ops.append(None)  # the report of this signal, filled in below
            else:
                raise Refused(f"unknown program entry {kind!r}")
        except (Refused, WireError) as exc:
            if kind in _ITEM_ENTRIES and isinstance(entry[1], int):
                raise Refused(str(exc), entry[1]) from None
            raise
        except IndexError:
            raise Refused(f"program entry {kind!r} has too few fields") from None
    if not signals:
        raise Refused("a program ends with its queue's signal")
    slots = {slot for slot, _ in signals}
    values = [value for _, value in signals]
    if len(slots) != 1 or values != sorted(values) or values[-1] != program.count:
        # Signals set a shared actor's timeline: they must stay inside this job's range.
        raise Refused("a program's signals must rise to its item count, on one slot")
    program.slot = slots.pop()
    if program.slot < FIRST_QUEUE_SLOT:
        raise Refused(
            f"a program signals on base slot {program.slot}, which is KICK or BATCH; "
            f"a queue's own slot is {FIRST_QUEUE_SLOT} or above"
        )
    program.max_slot = max(program.max_slot, program.slot)
    # The job's end is reported where it ends (_BatchSubmission.job_done), so a job
    # with no other report runs inline, whole (see _batch).
    last_report = len(ops) - 1 - ops[::-1].index(None)
    lowered: list[Op | AdaptiveKernel] = []
    for i, op in enumerate(ops):
        if op is None:
            if i in quiet or i == last_report:
                continue
            reported = ops[i - 1]
            assert isinstance(reported, SignalOp)  # each report follows its signal
            # The report goes just before its signal: it sends what the new value makes
            # due for the client (the bytes it asked for ahead) and the report in one
            # send, and nothing can run between the two ops (the report never yields).
            lowered.insert(
                len(lowered) - 1,
                run_op(AWAIT, session.report_op, (program.slot, reported.rel, program.device), -1),
            )
            continue
        lowered.append(op)
    if any(isinstance(op, AdaptiveKernel) for op in lowered):
        times = session.worker.times
        program.template = lowered
        program.ops, program.version = times.code(lowered)
    else:
        program.ops = tuple(lowered)  # type: ignore[arg-type]


def _lower_item(
    session: Session, device: Device, entry: list[Any], program: Program
) -> Op | AdaptiveKernel | list[Op]:
    kind = entry[0]
    item = want_int(entry[1], "item index", -1, 1 << 40)
    if kind == "k":
        want_fields(["k"] + entry[1:], 7)
        name = want_str(entry[2], "kernel name")
        kernel = session.worker.kernels.get(name)
        if kernel is None:
            raise Refused(
                f"unknown kernel {name!r}: this worker loaded {sorted(session.worker.kernels)}; "
                f"start it with --kernels MODULE, where MODULE.KERNELS lists it"
            )
        bufs = [
            session.buffer(r, f"kernel {name!r} buffer") for r in want_list(entry[3], "buffers", 64)
        ]
        owners = {b.device for b in bufs}
        if owners != {device.name}:
            raise Refused(f"kernel {name!r} on {device.name} got buffers of {sorted(owners)}")
        if len(bufs) != len(set(kernel.outs) | set(kernel.ins)):
            raise Refused(
                f"kernel {name!r} takes {len(set(kernel.outs) | set(kernel.ins))} "
                f"buffers, got {len(bufs)}"
            )
        var_values = [
            want_int(v, "var value", -(1 << 62), 1 << 62) for v in want_list(entry[4], "vars", 64)
        ]
        dims = [
            tuple(want_int(d, "launch dim", 1, 1 << 40) for d in want_list(e, "dims", 3, size=3))
            for e in entry[5:7]
        ]
        try:
            op = device.lower_launch(
                LaunchRequest(item, kernel, bufs, var_values, dims[0], dims[1], program.kind)
            )
        except Exception as exc:
            raise Refused(f"kernel {name!r}: {exc}") from None
        if op[0] == EXEC and device.kind == "CPU":
            # Under --thread-bytes: on the event loop only once seen to be quick.
            shape = (name, tuple([b.nbytes for b in bufs]), tuple(var_values), *dims)
            return AdaptiveKernel(session.worker.times, shape, op)
        return op
    if kind == "c":
        dst = session.buffer(entry[2], "copy dst")
        src = session.buffer(entry[3], "copy src")
        if dst.nbytes != src.nbytes or dst.dtype != src.dtype:
            raise Refused(f"copy between {dst!r} and {src!r}: sizes or dtypes differ")
        src_device = session.worker.runtime.device(src.device)
        if device.host_visible and dst.device == device.name and not src_device.host_visible:
            # From this worker's GPU into host memory, on a host queue: the GPU device
            # copies it out when the queue gets here (after its wait on the GPU queue).
            args = (src_device, dst.host_view(), src)
            return run_op(AWAIT, _read_from_gpu, args, item)
        for end in (dst, src):
            if device.host_visible and not session.worker.runtime.device(end.device).host_visible:
                raise Refused(
                    f"a copy {src.device}->{dst.device} on this worker runs on {device.name}'s "
                    f"queue, which cannot reach {end.device}'s memory; copy it to the "
                    f"client instead (copyout)"
                )
        return device.lower_copy(item, dst, src, program.kind)
    if kind == "p":
        dst = session.buffer(entry[2], "pull dst")
        if not device.host_visible:
            raise Refused(
                f"a copy from another worker into {device.name} is not supported (its "
                f"memory is not host memory); copy into a CPU device of this worker"
            )
        host = want_str(entry[3], "peer host")
        port = want_int(entry[4], "peer port", 1, 65535)
        sid = want_int(entry[5], "peer session")
        ref = want_list(entry[6], "peer buffer", 3, size=3)
        ticket = want_bytes(entry[7], "read ticket", 32)
        source = (host, port, sid, ref, ticket)
        if len(entry) > 9 and dst.nbytes <= EARLY_PULL_BYTES:
            # The wait on the source's queue this copy follows: ask for the bytes as
            # the batch arrives, sent by the source the moment its queue gets there.
            _, _, _, _, inner, slot, rel, ext_id = want_fields(["p"] + entry[5:], 8)
            program.early.append(
                (
                    item,
                    source,
                    want_str(inner, "peer device"),
                    want_int(slot, "wait slot", 0, 1 << 16),
                    want_int(rel, "wait value", 0, REL_MAX),
                    want_int(ext_id, "signal id"),
                    dst.nbytes,
                )
            )
            program.max_slot = max(program.max_slot, program.early[-1][3])
            session.mirror(ext_id)  # refused here if there are too many
        return run_op(AWAIT, session.pull_op, (item, bytes_of(dst), *source), item)
    if kind == "hw":
        dst = session.buffer(entry[2], "host write dst")
        chunks = []
        for blob_id in want_list(entry[3], "blob ids", 1 << 12):
            blob = session.blobs.pop(want_int(blob_id, "blob id"), None)
            if blob is None:
                raise Refused(f"unknown blob id {blob_id}")
            session.blob_bytes -= blob[1]
            chunks.append(blob)
        total = sum(size for _, size in chunks)
        if total != dst.nbytes:
            raise Refused(f"host write of {total} bytes into {dst.nbytes}")
        # A large write would hold the event loop (every client) for its memcpy.
        code = EXEC_THREAD if total >= getattr(device, "thread_bytes", 1 << 20) else EXEC
        if device.host_visible:
            args = (dst.host_view(), chunks, session.worker.staging)
            return run_op(code, chunks_into, args, -1)
        # GPU memory: gather the chunks in host memory, then upload them in order.
        staged = np.empty(dst.shape, dst.dtype)
        return [
            run_op(code, chunks_into, (staged, chunks, session.worker.staging), -1),
            device.lower_host_write(dst, staged, QueueKind.COMPUTE),
        ]
    if kind == "hr":
        src = session.buffer(entry[2], "host read src")
        read_id = want_int(entry[3], "read id")
        if device.host_visible:
            return run_op(AWAIT, session._send_read, (read_id, bytes_of(src)), -1)
        # GPU memory: download it, then send it once the stream got there.
        out = np.empty(src.shape, src.dtype)
        return [
            device.lower_host_read(src, out, QueueKind.COMPUTE),
            run_op(AWAIT, session._send_read, (read_id, out.reshape(-1).view(np.uint8).data), -1),
        ]
    raise Refused(f"unknown item entry {kind!r}")
