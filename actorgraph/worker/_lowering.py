"""How a worker lowers a client's program: each entry decoded and checked against the
worker's limits and the client's ids, then made the ops its queue actor runs.

A `Session` (_session.py) hands each Prog's entries to `lower`; the result is a `Program`
(_lowered.py) that the session's batches post. The entries are messages of wire.py
(KernelEntry, CopyEntry, ...), decoded one by one here, so a refusal names its item.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

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
    OpCodeError,
    OpWalker,
    QueueActor,
    RunOp,
    SignalOp,
    WorkOp,
    run_op,
    signal_op,
    wait_op,
)
from actorgraph.devices.remote.wire import (
    CodeEntry,
    CopyEntry,
    HostReadEntry,
    HostWriteEntry,
    ItemEntry,
    KernelEntry,
    LocalWaitEntry,
    PullEntry,
    SignalEntry,
    WaitEntry,
    WireError,
    decode_entry,
    kind_of,
    want_list,
)
from actorgraph.scheduler import QueueKind

from .._buffer import Buffer
from ._lowered import EarlyPull, Program, Refused, Watched
from ._lowered import queue_key as _queue_key
from ._lowered import queue_kind as _queue_kind
from ._placement import AdaptiveKernel
from ._staging import Taken, bytes_of, land

if TYPE_CHECKING:
    from ._session import Session


EARLY_PULL_BYTES = 1 << 20  # larger copies between workers are read when they run

# A lowered entry: an op, a kernel placed by its times, or (a GPU's host write or read)
# a host step and the device's op.
Lowered = Op | AdaptiveKernel | list[Op]


async def _read_from_gpu(job: Job, device: Any, out: np.ndarray[Any, Any], src: Buffer) -> None:
    """A copy from a worker's GPU into host memory, run by a host queue (`device` is the
    GPU's CUDADevice: its `read_into`)."""
    if job.submission.error is None:
        await device.read_into(out, src)


def lower(
    session: Session, device_name: str, entries: object, kind: QueueKind, store: bool
) -> Program:
    """A client's program (its Prog's `entries`) lowered onto `session`'s queue of `kind`
    on `device_name`, kept for later batches if `store`. Raises Refused (naming the
    client's item where one is at fault) or WireError for a program that breaks a
    rule, and what a device raises when it cannot lower an item."""
    runtime = session.worker.runtime
    if device_name not in runtime.devices:
        raise Refused(f"this worker has no device {device_name!r} ({runtime.devices})")
    device = runtime.device(device_name)
    actor = session.queue(device_name, kind)
    entries = want_list(entries, "program", session.worker.limits.max_program_ops)
    with device.lowering_for(actor):  # a CUDA item's host work reports to this actor
        return _Lowering(session, device, actor, kind, device_name).lower(entries, store)


class _Lowering:
    """One program's entries, lowered in order, and what they tell of the program."""

    def __init__(
        self, session: Session, device: Device, actor: QueueActor, kind: QueueKind, name: str
    ) -> None:
        self.session = session
        self.device = device
        self.actor = actor
        self.kind = kind
        # The queue's name in reports of progress (what PWhen reads name): DEVICE for a
        # compute queue, DEVICE/copy for a copy queue.
        self.queue_name = _queue_key(name, kind)
        # Ops, with None where the report of the signal before it goes.
        self.ops: list[Op | AdaptiveKernel | None] = []
        self.signals: list[tuple[int, int]] = []
        self.quiet: set[int] = set()  # reports of signals nobody off the worker needs
        self.count = 0  # items
        self.slot = 0  # the base slot its signals are on, once known (_finish)
        self.max_slot = 0
        self.local_waits: list[tuple[int, str, QueueKind]] = []
        self.early: list[EarlyPull] = []
        self.watches: list[Watched] = []
        self.wait_entries: list[int] = []
        self.item_entries: dict[int, int] = {}
        self.reads = 0  # host reads
        self.blobs = 0  # the blobs its host writes land
        self.values = 0  # the var values its calls of shipped code take from each batch
        # Where a job of it puts its batch's var values as it starts, for those calls
        # (a queue runs one job at a time: a job's calls read its own values).
        self.cell: list[list[int]] = [[]]

    def lower(self, entries: list[Any], store: bool) -> Program:
        for index, raw in enumerate(entries):
            try:
                self._entry(decode_entry(raw), index)
            except (Refused, WireError) as exc:
                item = _item_of(raw)
                if item is not None:
                    raise Refused(str(exc), item) from None
                raise
        self._finish()
        if self.values:
            self.ops.insert(0, run_op(AWAIT, self.session.values_op, (self.cell,), -1))
        program = Program(
            store=store,
            slot=self.slot,
            actor=self.actor,
            device=self.queue_name,
            kind=self.kind,
            ops=self._with_reports(),
            times=self.session.worker.times,
            count=self.count,
            max_slot=self.max_slot,
            local_waits=self.local_waits,
            early=self.early,
            watches=self.watches,
            wait_entries=self.wait_entries,
            item_entries=self.item_entries,
            reads=self.reads,
            blobs=self.blobs,
            values=self.values,
        )
        try:
            _Runnable(self.actor).walk(program.ops)
        except OpCodeError as exc:  # the device lowered an entry to what its queue cannot run
            raise Refused(str(exc)) from None
        return program

    def _entry(self, entry: Any, index: int) -> None:
        if isinstance(entry, ItemEntry):
            self.count += 1
            if entry.item >= 0:
                self.item_entries[entry.item] = index
            lowered = _ITEMS[type(entry)](self, entry)
            if isinstance(lowered, list):  # a host step and a CUDA item
                self.ops.extend(lowered)
            else:
                self.ops.append(lowered)
        elif type(entry) is WaitEntry:
            self.wait_entries.append(index)
            self._wait(entry)
        elif type(entry) is LocalWaitEntry:
            self.wait_entries.append(index)
            self._local_wait(entry)
        else:
            assert type(entry) is SignalEntry
            self.signals.append((entry.slot, entry.rel))
            self.ops.append(signal_op(self.actor.signal, entry.slot, entry.rel))
            if not entry.report:
                self.quiet.add(len(self.ops))
            self.ops.append(None)  # the report of this signal, filled in by _finish

    def _wait(self, entry: WaitEntry) -> None:
        """A wait on a mirror; one on another worker's queue is told by that worker."""
        self.max_slot = max(self.max_slot, entry.slot)
        self.ops.append(wait_op(self.session.mirror(entry.mirror), entry.slot, entry.rel))
        if entry.source is not None:
            self.watches.append((entry.slot, entry.rel, entry.mirror, entry.source))

    def _local_wait(self, entry: LocalWaitEntry) -> None:
        """A wait on a queue of this worker in the same batch."""
        if entry.device not in self.session.worker.runtime.devices:
            raise Refused(f"wait on unknown device {entry.device!r}")
        self.max_slot = max(self.max_slot, entry.slot)
        kind = _queue_kind(entry.kind)
        self.local_waits.append((entry.slot, entry.device, kind))
        signal = self.session.queue(entry.device, kind).signal
        self.ops.append(wait_op(signal, entry.slot, entry.rel))

    def _finish(self) -> None:
        signals = self.signals
        if not signals:
            raise Refused("a program ends with its queue's signal")
        slots = {slot for slot, _ in signals}
        values = [value for _, value in signals]
        if len(slots) != 1 or values != sorted(values) or values[-1] != self.count:
            # Signals set a shared actor's timeline: they must stay inside this job's range.
            raise Refused("a program's signals must rise to its item count, on one slot")
        self.slot = slots.pop()
        if self.slot < FIRST_QUEUE_SLOT:
            raise Refused(
                f"a program signals on base slot {self.slot}, which is KICK or BATCH; "
                f"a queue's own slot is {FIRST_QUEUE_SLOT} or above"
            )
        self.max_slot = max(self.max_slot, self.slot)

    def _with_reports(self) -> list[Op | AdaptiveKernel]:
        """The ops, each signal a client-side queue waits on reported just before it: the
        report sends what the new value makes due for the client (the bytes it asked for
        ahead) and the report in one send, and nothing can run between the two ops (the
        report never yields). The job's end is reported where it ends
        (Batches.job_done), so a job with no other report runs inline, whole."""
        ops = self.ops
        last_report = len(ops) - 1 - ops[::-1].index(None)
        lowered: list[Op | AdaptiveKernel] = []
        for i, op in enumerate(ops):
            if op is not None:
                lowered.append(op)
                continue
            if i in self.quiet or i == last_report:
                continue
            reported = ops[i - 1]
            assert isinstance(reported, SignalOp)  # each report follows its signal
            args = (self.slot, reported.rel, self.queue_name)
            lowered.insert(len(lowered) - 1, run_op(AWAIT, self.session.report_op, args, -1))
        return lowered

    # -- items --

    def _kernel(self, entry: KernelEntry) -> Lowered:
        session = self.session
        name = entry.kernel
        kernel = session.worker.kernels.get(name)
        if kernel is None:
            raise Refused(
                f"unknown kernel {name!r}: this worker loaded {sorted(session.worker.kernels)}; "
                f"start it with --kernels MODULE, where MODULE.KERNELS lists it"
            )
        takes = len(set(kernel.outs) | set(kernel.ins))
        return self._launch(entry, kernel, name, takes, entry.vars)

    def _code(self, entry: CodeEntry) -> Lowered:
        """A call of a program this client shipped (--allow-programs), with the var values
        each batch sends for it: lowered with stand-ins, called with the job's own."""
        code = self.session.codes.get(entry.code)
        if not self.device.runs_host_kernels:
            raise Refused(
                f"program {code.name!r} is CPU machine code and {self.device.name} is a "
                f"{self.device.kind} device, which does not run host kernels; call it on a "
                f"CPU device of this worker"
            )
        values = code.values - (code.core_id is not None)
        # Kernels are told apart by code id and name, for the kernel times.
        name = f"{code.name}#{entry.code}"
        lowered = self._launch(entry, code.kernel, name, code.buffers, [0] * values)
        if not values:
            return lowered
        start = self.values
        self.values += values
        op = lowered.inline_op if isinstance(lowered, AdaptiveKernel) else lowered
        if type(op) is not RunOp or (op.code != EXEC and op.code != EXEC_THREAD):
            raise Refused(f"program {code.name!r}: {self.device.name} did not lower it to a call")
        # A host kernel's call is fn(*its buffers' args, *its var values) (devices/_cpu.py).
        args = (op.fn, op.args[: code.buffers], self.cell, start, self.values)
        valued = run_op(op.code, _call_with_values, args, op.item)
        if isinstance(lowered, AdaptiveKernel):
            return AdaptiveKernel(self.session.worker.times, lowered.key, valued)
        return valued

    def _launch(
        self,
        entry: KernelEntry | CodeEntry,
        kernel: Any,
        name: str,
        takes: int,
        values: list[int],
    ) -> Lowered:
        session = self.session
        device = self.device
        bufs = [session.buffer(r, f"kernel {kernel.name!r} buffer") for r in entry.buffers]
        owners = {b.device for b in bufs}
        if owners != {device.name}:
            raise Refused(
                f"kernel {kernel.name!r} on {device.name} got buffers of {sorted(owners)}"
            )
        if len(bufs) != takes:
            raise Refused(f"kernel {kernel.name!r} takes {takes} buffers, got {len(bufs)}")
        dims = (tuple(entry.global_size), tuple(entry.local_size))
        request = LaunchRequest(entry.item, kernel, bufs, values, dims[0], dims[1], self.kind)
        try:
            op = device.lower_launch(request)
        except Exception as exc:
            raise Refused(f"kernel {kernel.name!r}: {exc}") from None
        if op.code == EXEC and device.runs_host_kernels:
            # Under --thread-bytes: on the event loop only once seen to be quick. Var
            # values are a call's data, as its buffers' contents are: not its shape.
            shape = (name, tuple([b.nbytes for b in bufs]), *dims)
            return AdaptiveKernel(session.worker.times, shape, op)
        return op

    def _copy(self, entry: CopyEntry) -> Lowered:
        session, device = self.session, self.device
        dst = session.buffer(entry.dst, "copy dst")
        src = session.buffer(entry.src, "copy src")
        if dst.nbytes != src.nbytes or dst.dtype != src.dtype:
            raise Refused(f"copy between {dst!r} and {src!r}: sizes or dtypes differ")
        runtime = session.worker.runtime
        src_device = runtime.device(src.device)
        if device.host_visible and dst.device == device.name and not src_device.host_visible:
            # From this worker's GPU into host memory, on a host queue: the GPU device
            # copies it out when the queue gets here (after its wait on the GPU queue).
            return run_op(AWAIT, _read_from_gpu, (src_device, dst.host_view(), src), entry.item)
        for end in (dst, src):
            if device.host_visible and not runtime.device(end.device).host_visible:
                raise Refused(
                    f"a copy {src.device}->{dst.device} on this worker runs on {device.name}'s "
                    f"queue, which cannot reach {end.device}'s memory; copy it to the "
                    f"client instead (copyout)"
                )
        return device.lower_copy(entry.item, dst, src, self.kind)

    def _pull(self, entry: PullEntry) -> Lowered:
        session = self.session
        dst = session.buffer(entry.dst, "pull dst")
        if not self.device.host_visible:
            raise Refused(
                f"a copy from another worker into {self.device.name} is not supported (its "
                f"memory is not host memory); copy into a CPU device of this worker"
            )
        if entry.follows is not None and dst.nbytes <= EARLY_PULL_BYTES:
            # The wait on the source's queue this copy follows: ask for the bytes as the
            # batch arrives, sent by the source the moment its queue gets there.
            slot, rel, mirror = entry.follows
            early = EarlyPull(
                entry.item,
                entry.host,
                entry.port,
                entry.session,
                entry.src,
                entry.ticket,
                entry.queue,
                slot,
                rel,
                mirror,
                dst.nbytes,
            )
            self.early.append(early)
            self.max_slot = max(self.max_slot, slot)
            session.mirror(mirror)  # refused here if there are too many
        source = (entry.host, entry.port, entry.session, entry.src, entry.ticket)
        return run_op(
            AWAIT, session.batches.pull_op, (entry.item, bytes_of(dst), *source), entry.item
        )

    def _host_write(self, entry: HostWriteEntry) -> Lowered:
        """Each batch's blobs for it (Batch.blobs, from `first` on), taken by an op of their
        own, then landed: a large write would hold the event loop (every client) for its
        memcpy, so that goes to the queue's thread."""
        session, device = self.session, self.device
        dst = session.buffer(entry.dst, "host write dst")
        first = self.blobs
        self.blobs += entry.chunks
        code: Literal[2, 3] = (
            EXEC_THREAD if dst.nbytes >= getattr(device, "thread_bytes", 1 << 20) else EXEC
        )
        taken = Taken()
        take = run_op(AWAIT, session.take_op, (first, entry.chunks, dst.nbytes, taken), -1)
        staging = session.worker.staging
        if device.host_visible:
            return [take, run_op(code, land, (dst.host_view(), taken, staging), -1)]
        # GPU memory: gather the chunks in host memory, then upload them in order (each
        # a host step, run once the stream got there: a batch after lands there again).
        staged = np.empty(dst.shape, dst.dtype)
        return [
            take,
            run_op(code, land, (staged, taken, staging), -1),
            device.lower_host_write(dst, staged, QueueKind.COMPUTE),
        ]

    def _host_read(self, entry: HostReadEntry) -> Lowered:
        session, device = self.session, self.device
        src = session.buffer(entry.src, "host read src")
        index = self.reads
        if entry.read != index:
            raise Refused(
                f"host read number {entry.read}: a program numbers its host reads 0, 1, ... "
                f"in order (this one is its number {index})"
            )
        self.reads += 1
        if device.host_visible:
            return run_op(AWAIT, session.read_op, (index, bytes_of(src)), -1)
        # GPU memory: download it, then send it once the stream got there.
        out = np.empty(src.shape, src.dtype)
        return [
            device.lower_host_read(src, out, QueueKind.COMPUTE),
            run_op(AWAIT, session.read_op, (index, out.reshape(-1).view(np.uint8).data), -1),
        ]


def _call_with_values(
    fn: Any, args: tuple[Any, ...], cell: list[list[int]], start: int, stop: int
) -> None:
    """A call of shipped code with its var values: those its job's batch sent (put in
    `cell` as the job started), from `start` to `stop`."""
    fn(*args, *cell[0][start:stop])


class _Runnable(OpWalker):
    """A program's ops, each checked to be one its queue actor runs."""

    taker = "its queue"

    def __init__(self, actor: QueueActor) -> None:
        super().__init__(f"the program lowered for {actor.name}")
        self.codes = actor.op_codes

    def work(self, op: WorkOp, index: int) -> bool:
        if op.code not in self.codes:
            raise self.refuse(op, index, self.codes)
        return True


def _item_of(entry: object) -> int | None:
    """The item index an entry names, if it is an item's and names one (for refusals)."""
    if isinstance(entry, list) and len(entry) > 1 and entry[0] in _ITEM_KINDS:
        item = entry[1]
        if type(item) is int:
            return item
    return None


_ITEM_KINDS = frozenset(kind_of(cls) for cls in get_args(ItemEntry))
_ITEMS: dict[type, Any] = {
    KernelEntry: _Lowering._kernel,
    CodeEntry: _Lowering._code,
    CopyEntry: _Lowering._copy,
    PullEntry: _Lowering._pull,
    HostWriteEntry: _Lowering._host_write,
    HostReadEntry: _Lowering._host_read,
}
