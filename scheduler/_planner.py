"""Jit cache -> Plan: queue assignment, dependencies, signals, pruning, kickoff, completion.

The planner is pure: it reads PlanItems and DeviceCaps and returns a Plan. It knows
nothing of trio, buffers' memory, or how a device runs an item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Union

from ._errors import PlanError
from ._messages import Message, Run, Signal, SyncDevice, Wait, WaitKick
from ._plan import Plan
from ._ranges import RangeTracker
from ._records import Access, DeviceCaps, ItemKind, PlanItem, QueueId, QueueKind

# What one queue knows is complete, as a vector clock. Keys are queue indices (value:
# how many of that queue's items are done) and ("sync", device) for "this queue has
# synchronised with that device's timeline" (value 1).
_ClockKey = Union[int, tuple[str, str]]
_Clock = dict[_ClockKey, int]


def assign_queue(item: PlanItem, caps: Mapping[str, DeviceCaps]) -> QueueId:
    """Where an item runs.

    A launch goes to its device's compute queue. A copy goes to the copy queue of its
    destination if that device has one, else of its source, else to the destination's
    compute queue: the destination is preferred so that the data lands where it is used.
    The exceptions: a copy from device memory the host cannot see into the host (a CPU
    device), and a copy from memory that is not host RAM underneath (a GPU's) into a
    device of another kind: the source device's copy engine does those, as on a GPU. And
    first of all a copy between a device reached by I/O (`host_io`: a worker's) and one
    that is not runs on the latter's queue, copy queue if it has one: the host moves those
    bytes, from or into its own memory.
    """
    for name in (item.device, item.src_device):
        if name is not None and name not in caps:
            raise PlanError(
                f"item {item.label!r} uses device {name!r}, which this runtime did not open; "
                f"open it with open_runtime([... {name!r} ...])"
            )
    if item.kind is ItemKind.EXEC:
        return QueueId(item.device, QueueKind.COMPUTE)
    src = caps[item.src_device] if item.src_device is not None else None
    if src is not None and src.host_io != caps[item.device].host_io:
        host = caps[item.device] if src.host_io else src
        return QueueId(host.name, QueueKind.COPY if host.has_copy_queue else QueueKind.COMPUTE)
    if src is not None and caps[item.device].is_cpu and not src.host_visible and src.has_copy_queue:
        return QueueId(src.name, QueueKind.COPY)
    if (
        src is not None
        and not src.host_backed
        and src.kind != caps[item.device].kind
        and src.has_copy_queue
    ):
        # Another kind's engine cannot reach this memory (a SIM device's, say, from a
        # CUDA GPU): the source's own engine moves the data.
        return QueueId(src.name, QueueKind.COPY)
    if caps[item.device].has_copy_queue:
        return QueueId(item.device, QueueKind.COPY)
    if item.src_device is not None and caps[item.src_device].has_copy_queue:
        return QueueId(item.src_device, QueueKind.COPY)
    return QueueId(item.device, QueueKind.COMPUTE)


def _queue_order(queue: QueueId, device_order: Mapping[str, int]) -> tuple[int, int]:
    return (device_order[queue.device], 0 if queue.kind is QueueKind.COMPUTE else 1)


def build_plan(items: Sequence[PlanItem], caps: Mapping[str, DeviceCaps]) -> Plan:
    device_order = {name: i for i, name in enumerate(caps)}
    queues, item_queue, position, counts = _queues(items, caps, device_order)
    tracker = RangeTracker()
    # known[q]: what queue q knows of *other* queues (and device syncs) so far; its own
    # progress is implied by position. Snapshots share the dict until it next changes
    # (copy on write), so runs of items without new waits cost no copies.
    known: list[_Clock] = [{("sync", q.device): 1} for q in queues]
    shared = [False] * len(queues)
    clock_after: list[_Clock] = [{}] * len(items)
    item_waits: list[list[tuple[int, int]]] = [[] for _ in items]
    item_syncs: list[list[str]] = [[] for _ in items]
    waited_on: set[tuple[int, int]] = set()
    touched: list[set[str]] = [{q.device} for q in queues]

    def writable(qi: int) -> _Clock:
        if shared[qi]:
            known[qi] = dict(known[qi])
            shared[qi] = False
        return known[qi]

    for j, item in enumerate(items):
        qi = item_queue[j]
        accesses = item.accesses
        # Reads first, so that an item that reads and writes one range depends on the
        # range's earlier readers only through its write.
        if len(accesses) > 1:
            accesses = tuple(sorted(accesses, key=lambda a: a.write))
        deps, source_deps = _dependencies(tracker, j, item, accesses, caps)
        # Latest dependency first: its clock often covers the earlier ones (pruning).
        for dep in sorted(deps, reverse=True) if len(deps) > 1 else deps:
            dq = item_queue[dep]
            if dq == qi:
                continue  # queues run in order
            value = position[dep] + 1
            waits = item_waits[j]
            if known[qi].get(dq, 0) >= value:
                # Already known complete, directly or through another wait; a copy from
                # a device reached by I/O keeps its own wait on what wrote its source.
                if dep in source_deps and not any(q == dq and v >= value for q, v in waits):
                    waits.append((dq, value))
                    waited_on.add((dq, value))
                continue
            waits.append((dq, value))
            waited_on.add((dq, value))
            _merge(writable(qi), qi, dq, value, clock_after[dep])
        for access in accesses:
            device = access.device
            touched[qi].add(device)
            if ("sync", device) not in known[qi]:
                item_syncs[j].append(device)
                writable(qi)[("sync", device)] = 1
        clock_after[j] = known[qi]
        shared[qi] = True

    programs = _programs(queues, item_queue, position, counts, item_syncs, item_waits, waited_on)
    devices = sorted({d for t in touched for d in t}, key=lambda d: device_order.get(d, 1 << 30))
    device_queues = tuple(
        tuple(qi for qi in range(len(queues)) if device in touched[qi]) for device in devices
    )
    return Plan(
        items=tuple(items),
        queues=tuple(queues),
        programs=programs,
        item_queue=tuple(item_queue),
        devices=tuple(devices),
        device_queues=device_queues,
    )


def _queues(
    items: Sequence[PlanItem], caps: Mapping[str, DeviceCaps], device_order: Mapping[str, int]
) -> tuple[list[QueueId], list[int], list[int], list[int]]:
    """The queues the items run on (in device order), each item's queue, its position in
    that queue (item j completing sets its queue to position+1), and each queue's count."""
    item_queue_ids = [assign_queue(item, caps) for item in items]
    queues = sorted(set(item_queue_ids), key=lambda q: _queue_order(q, device_order))
    queue_index = {q: i for i, q in enumerate(queues)}
    item_queue = [queue_index[q] for q in item_queue_ids]
    counts = [0] * len(queues)
    position = [0] * len(items)
    for j, qi in enumerate(item_queue):
        position[j] = counts[qi]
        counts[qi] += 1
    return queues, item_queue, position, counts


def _dependencies(
    tracker: RangeTracker,
    j: int,
    item: PlanItem,
    accesses: Sequence[Access],
    caps: Mapping[str, DeviceCaps],
) -> tuple[set[int], set[int]]:
    """The earlier items item j depends on, and those of them that wrote what it copies
    from a device reached by I/O (a worker's): its bytes may be sent ahead, on the wait
    that says they are ready, so the waits on what wrote them are kept even where known
    complete through another queue (its own waits say it)."""
    src = item.src_device
    from_io = src is not None and caps[src].host_io
    deps: set[int] = set()
    source_deps: set[int] = set()
    for access in accesses:
        found = tracker.access(access.alloc, access.start, access.stop, access.write, j)
        deps |= found
        if from_io and not access.write and access.device == src:
            source_deps |= found
    return deps, source_deps


def _merge(clock: _Clock, qi: int, dq: int, value: int, theirs: _Clock) -> None:
    """Queue qi's clock, waiting for queue dq to reach `value`, learns what dq knew then
    (`theirs`) of the others."""
    clock[dq] = value
    for key, seen in theirs.items():
        if key != qi and clock.get(key, 0) < seen:
            clock[key] = seen


def _programs(
    queues: Sequence[QueueId],
    item_queue: Sequence[int],
    position: Sequence[int],
    counts: Sequence[int],
    item_syncs: Sequence[list[str]],
    item_waits: Sequence[list[tuple[int, int]]],
    waited_on: set[tuple[int, int]],
) -> tuple[tuple[Message, ...], ...]:
    """Each queue's messages: its kickoff, then per item its syncs, waits and run, and a
    signal where another queue waits for it; its completion last."""
    programs: list[list[Message]] = [[WaitKick(), SyncDevice(queue.device)] for queue in queues]
    for j, qi in enumerate(item_queue):
        program = programs[qi]
        program.extend(SyncDevice(device) for device in sorted(item_syncs[j]))
        program.extend(Wait(queues[dq], value) for dq, value in item_waits[j])
        program.append(Run(j))
        done = position[j] + 1
        if (qi, done) in waited_on and done < counts[qi]:
            program.append(Signal(done))
    for qi, program in enumerate(programs):
        program.append(Signal(counts[qi]))
    return tuple(tuple(p) for p in programs)
