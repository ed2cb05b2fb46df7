"""Jit cache -> Plan: queue assignment, dependencies, signals, pruning, kickoff, completion.

The planner is pure: it reads PlanItems and DeviceCaps and returns a Plan. It knows
nothing of trio, buffers' memory, or how a device runs an item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._errors import PlanError
from ._messages import Message, Run, Signal, SyncDevice, Wait, WaitKick
from ._plan import Plan
from ._ranges import RangeTracker
from ._records import DeviceCaps, ItemKind, PlanItem, QueueId, QueueKind


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
    # Where an item runs depends only on its kind and devices: assign each pair once.
    assigned: dict[tuple[bool, str, str | None], QueueId] = {}
    keys = []
    for item in items:
        key = (item.kind is ItemKind.EXEC, item.device, item.src_device)  # bools hash fast
        if key not in assigned:
            assigned[key] = assign_queue(item, caps)
        keys.append(key)
    queues = sorted(set(assigned.values()), key=lambda q: _queue_order(q, device_order))
    queue_index = {q: i for i, q in enumerate(queues)}
    key_queue = {key: queue_index[q] for key, q in assigned.items()}
    item_queue = [key_queue[key] for key in keys]
    nqueues = len(queues)

    # Vector clocks: what one queue knows is complete. Entry q < nqueues: how many of
    # queue q's items are done; entry nqueues + d: 1 once the queue has synchronised with
    # device d's timeline (every device an item touches gets a slot). Numpy arrays: a
    # graph over many devices has clocks of a few hundred entries, merged per wait.
    sync_slot: dict[str, int] = {}
    for device in caps:
        sync_slot[device] = nqueues + len(sync_slot)
    for item in items:
        for access in item.accesses:
            if access.device not in sync_slot:
                sync_slot[access.device] = nqueues + len(sync_slot)
    width = nqueues + len(sync_slot)
    # known[q]: what queue q knows of *other* queues (and device syncs) so far; its own
    # progress is implied by position. Snapshots share the array until it next changes
    # (copy on write), so runs of items without new waits cost no copies. An entry a
    # queue holds of itself (learned through others) is never read, and never more than
    # what a queue waiting on it sets directly, so merges take every entry's maximum.
    known: list[np.ndarray[Any, np.dtype[np.int64]]] = []
    for q in queues:
        clock = np.zeros(width, np.int64)
        clock[sync_slot[q.device]] = 1
        known.append(clock)
    shared = [False] * nqueues
    clock_after: list[np.ndarray[Any, np.dtype[np.int64]]] = []
    waited_on: set[tuple[int, int]] = set()
    touched: list[set[str]] = [{q.device} for q in queues]
    counts = [0] * nqueues
    position = [0] * len(items)
    programs: list[list[Message]] = [[WaitKick(), SyncDevice(q.device)] for q in queues]
    # run_end[q][p]: the length of queue q's program just after its item at position p
    # runs, where a Signal goes if a later item waits for it.
    run_end: list[list[int]] = [[] for _ in queues]
    tracker = RangeTracker()

    for j, item in enumerate(items):
        qi = item_queue[j]
        position[j] = counts[qi]
        counts[qi] += 1
        accesses = item.accesses
        # A copy from a device reached by I/O (a worker's) may have its bytes sent ahead,
        # on the wait that says they are ready: the waits on what wrote them are kept
        # even where known complete through another queue, so that its own waits say it.
        from_io = item.src_device is not None and caps[item.src_device].host_io
        source_deps: set[int] = set()
        if from_io:
            # Reads first, so that a read of the source finds what wrote it even where the
            # copy writes those bytes too (onto itself).
            deps: set[int] = set()
            for access in sorted(accesses, key=lambda a: a.write):
                found = tracker.access(access.alloc, access.start, access.stop, access.write, j)
                deps |= found
                if not access.write and access.device == item.src_device:
                    source_deps |= found
        else:
            deps = tracker.item(accesses, j)
        waits: list[tuple[int, int]] = []
        clock = known[qi]
        # Latest dependency first: its clock often covers the earlier ones (pruning).
        for dep in sorted(deps, reverse=True) if len(deps) > 1 else deps:
            dq = item_queue[dep]
            if dq == qi:
                continue  # queues run in order
            value = position[dep] + 1
            if clock[dq] >= value:
                # Already known complete, directly or through another wait.
                if dep in source_deps and not any(q == dq and v >= value for q, v in waits):
                    waits.append((dq, value))
                    waited_on.add((dq, value))
                continue
            waits.append((dq, value))
            waited_on.add((dq, value))
            if shared[qi]:
                clock = known[qi] = clock.copy()
                shared[qi] = False
            clock[dq] = value
            np.maximum(clock, clock_after[dep], out=clock)
        program = programs[qi]
        syncs: list[str] = []
        seen = touched[qi]
        for access in accesses:
            device = access.device
            if device in seen:
                continue  # the queue synchronised with it, or knew it complete, before
            seen.add(device)
            slot = sync_slot[device]
            if not clock[slot]:
                syncs.append(device)
                if shared[qi]:
                    clock = known[qi] = clock.copy()
                    shared[qi] = False
                clock[slot] = 1
        if syncs:
            program.extend(SyncDevice(device) for device in sorted(syncs))
        for dq, value in waits:
            program.append(Wait(queues[dq], value))
        program.append(Run(j))
        run_end[qi].append(len(program))
        clock_after.append(clock)
        shared[qi] = True

    # A queue signals after an item only where a later item waits for it (and at its end).
    signalled: list[list[int]] = [[] for _ in queues]
    for dq, value in waited_on:
        if value < counts[dq]:
            signalled[dq].append(value)
    for qi, values in enumerate(signalled):
        program = programs[qi]
        if values:
            values.sort()
            spliced: list[Message] = []
            cut = 0
            for value in values:
                end = run_end[qi][value - 1]
                spliced.extend(program[cut:end])
                spliced.append(Signal(value))
                cut = end
            spliced.extend(program[cut:])
            program = programs[qi] = spliced
        program.append(Signal(counts[qi]))

    devices = sorted({d for t in touched for d in t}, key=lambda d: device_order.get(d, 1 << 30))
    device_queues = tuple(
        tuple(qi for qi in range(nqueues) if device in touched[qi]) for device in devices
    )
    return Plan(
        items=tuple(items),
        queues=tuple(queues),
        programs=tuple(tuple(p) for p in programs),
        item_queue=tuple(item_queue),
        devices=tuple(devices),
        device_queues=device_queues,
    )
