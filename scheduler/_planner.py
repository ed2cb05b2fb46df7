"""Jit cache -> Plan: queue assignment, dependencies, signals, pruning, kickoff, completion.

The planner is pure: it reads PlanItems and DeviceCaps and returns a Plan. It knows
nothing of trio, buffers' memory, or how a device runs an item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Any, TypeAlias

import numpy as np

from ._errors import PlanError
from ._messages import Message, Run, Signal, SyncDevice, Wait, WaitKick
from ._plan import Plan
from ._ranges import RangeTracker
from ._records import Access, DeviceCaps, ItemKind, PlanItem, QueueId, QueueKind

# What one queue knows is complete (see _Walk).
Clock: TypeAlias = np.ndarray[Any, np.dtype[np.int64]]
# The dependencies whose waits a copy keeps although known complete: none, for most items.
_NO_ITEMS: frozenset[int] = frozenset()


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
    dst = caps[item.device]
    src = caps[item.src_device] if item.src_device is not None else None
    if src is not None:
        elsewhere = _not_the_destination(src, dst)
        if elsewhere is not None:
            return elsewhere
    if dst.has_copy_queue:
        return QueueId(item.device, QueueKind.COPY)
    if src is not None and src.has_copy_queue:
        return QueueId(src.name, QueueKind.COPY)
    return QueueId(item.device, QueueKind.COMPUTE)


def _not_the_destination(src: DeviceCaps, dst: DeviceCaps) -> QueueId | None:
    """The queue of a copy from `src` to `dst` that the destination's engine must not
    run (see assign_queue), or None."""
    if src.host_io != dst.host_io:
        host = dst if src.host_io else src
        return QueueId(host.name, QueueKind.COPY if host.has_copy_queue else QueueKind.COMPUTE)
    if dst.is_cpu and not src.host_visible and src.has_copy_queue:
        return QueueId(src.name, QueueKind.COPY)
    if not src.host_backed and src.kind != dst.kind and src.has_copy_queue:
        # Another kind's engine cannot reach this memory (a SIM device's, say, from a
        # CUDA GPU): the source's own engine moves the data.
        return QueueId(src.name, QueueKind.COPY)
    return None


def _queue_order(queue: QueueId, device_order: Mapping[str, int]) -> tuple[int, int]:
    return (device_order[queue.device], 0 if queue.kind is QueueKind.COMPUTE else 1)


def build_plan(items: Sequence[PlanItem], caps: Mapping[str, DeviceCaps]) -> Plan:
    device_order = {name: i for i, name in enumerate(caps)}
    queues, item_queue = _assign_queues(items, caps, device_order)
    walk = _Walk(queues, item_queue, _sync_slots(items, caps, len(queues)))
    walk.place(items, caps)
    programs = walk.signalled_programs()
    devices = sorted(
        {d for t in walk.touched for d in t}, key=lambda d: device_order.get(d, 1 << 30)
    )
    device_queues = tuple(
        tuple(qi for qi, seen in enumerate(walk.touched) if device in seen) for device in devices
    )
    return Plan(
        items=tuple(items),
        queues=tuple(queues),
        programs=programs,
        item_queue=tuple(item_queue),
        devices=tuple(devices),
        device_queues=device_queues,
    )


def _assign_queues(
    items: Sequence[PlanItem], caps: Mapping[str, DeviceCaps], device_order: Mapping[str, int]
) -> tuple[list[QueueId], list[int]]:
    """The plan's queues, in device order (compute before copy), and each item's queue
    number among them."""
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
    return queues, [key_queue[key] for key in keys]


def _sync_slots(
    items: Sequence[PlanItem], caps: Mapping[str, DeviceCaps], nqueues: int
) -> dict[str, int]:
    """Each device's entry in the vector clocks (after the `nqueues` queue entries): the
    runtime's devices first, then any other device an item touches."""
    sync_slot: dict[str, int] = {}
    for device in caps:
        sync_slot[device] = nqueues + len(sync_slot)
    for item in items:
        for access in item.accesses:
            if access.device not in sync_slot:
                sync_slot[access.device] = nqueues + len(sync_slot)
    return sync_slot


class _Walk:
    """The items in jit order, each placed at the end of its queue's program behind the
    device syncs and waits it needs; then the signals those waits ask for.

    Vector clocks: what one queue knows is complete. Entry q < nqueues: how many of
    queue q's items are done; entry `sync_slot[d]`: 1 once the queue has synchronised
    with device d's timeline (every device an item touches gets a slot). Numpy arrays: a
    graph over many devices has clocks of a few hundred entries, merged per wait.
    """

    def __init__(
        self, queues: list[QueueId], item_queue: list[int], sync_slot: dict[str, int]
    ) -> None:
        self.queues = queues
        self.item_queue = item_queue
        self.sync_slot = sync_slot
        width = len(queues) + len(sync_slot)
        # known[q]: what queue q knows of *other* queues (and device syncs) so far; its own
        # progress is implied by position. An entry a queue holds of itself (learned
        # through others) is never read, and never more than what a queue waiting on it
        # sets directly, so merges take every entry's maximum.
        self.known: list[Clock] = []
        for q in queues:
            clock = np.zeros(width, np.int64)
            clock[sync_slot[q.device]] = 1
            self.known.append(clock)
        # clock_after[j]: what item j's queue knew once j was placed. It shares the array
        # with known[q] until the queue next learns something (copy on write), so runs
        # of items without new waits cost no copies.
        self.clock_after: list[Clock] = []
        # (queue, value): some item waits until that queue has run `value` items.
        self.waited_on: set[tuple[int, int]] = set()
        # touched[q]: the devices queue q has synchronised with or knew complete.
        self.touched: list[set[str]] = [{q.device} for q in queues]
        self.counts = [0] * len(queues)
        self.programs: list[list[Message]] = [[WaitKick(), SyncDevice(q.device)] for q in queues]
        # run_end[q][p]: the length of queue q's program just after its item at position p
        # runs, where a Signal goes if a later item waits for it.
        self.run_end: list[list[int]] = [[] for _ in queues]

    def place(self, items: Sequence[PlanItem], caps: Mapping[str, DeviceCaps]) -> None:
        """Place every item, in jit order (a topological order: an item only depends on
        earlier ones), after the waits that its dependencies not yet known complete need."""
        item_queue, known, clock_after = self.item_queue, self.known, self.clock_after
        waited_on, touched, counts = self.waited_on, self.touched, self.counts
        programs, run_end, queues = self.programs, self.run_end, self.queues
        position = [0] * len(items)
        tracker = RangeTracker()
        io_devices = _io_devices(caps)
        for j, item in enumerate(items):
            qi = item_queue[j]
            position[j] = counts[qi]
            counts[qi] += 1
            accesses = item.accesses
            # Until the item first changes it, `clock` is the array its queue's previous
            # item holds in clock_after: it is copied before the first change.
            private = not position[j]
            if item.src_device in io_devices:
                deps, source_deps = _io_copy_deps(tracker, item, j)
            else:
                deps, source_deps = tracker.item(accesses, j), _NO_ITEMS
            waits: list[tuple[int, int]] = []
            clock = known[qi]
            # Latest dependency first: its clock often covers the earlier ones (pruning).
            for dep in sorted(deps, reverse=True) if len(deps) > 1 else deps:
                dq = item_queue[dep]
                if dq == qi:
                    continue  # queues run in order
                value = position[dep] + 1
                if clock[dq] >= value:
                    # Already known complete, directly or through another wait: waited on
                    # all the same where it wrote a copy's source sent ahead on its wait.
                    if dep in source_deps and not any(q == dq and v >= value for q, v in waits):
                        waits.append((dq, value))
                        waited_on.add((dq, value))
                    continue
                waits.append((dq, value))
                waited_on.add((dq, value))
                if not private:
                    clock = known[qi] = clock.copy()
                    private = True
                clock[dq] = value
                np.maximum(clock, clock_after[dep], out=clock)
            program = programs[qi]
            seen = touched[qi]
            for access in accesses:
                if access.device not in seen:
                    clock = known[qi] = self._sync_new_devices(
                        accesses, seen, clock, private, program
                    )
                    break
            for dq, value in waits:
                program.append(Wait(queues[dq], value))
            program.append(Run(j))
            run_end[qi].append(len(program))
            clock_after.append(clock)

    def _sync_new_devices(
        self,
        accesses: Sequence[Access],
        seen: set[str],
        clock: Clock,
        private: bool,
        program: list[Message],
    ) -> Clock:
        """Synchronise a queue with the devices of `accesses` it meets for the first time
        and does not know complete yet (sorted, ahead of the item's waits); returns its
        clock, copied first if `clock` is not `private` and changes."""
        syncs: list[str] = []
        for access in accesses:
            device = access.device
            if device in seen:
                continue  # the queue synchronised with it, or knew it complete, before
            seen.add(device)
            slot = self.sync_slot[device]
            if not clock[slot]:
                syncs.append(device)
                if not private:
                    clock = clock.copy()
                    private = True
                clock[slot] = 1
        program.extend(SyncDevice(device) for device in sorted(syncs))
        return clock

    def signalled_programs(self) -> tuple[tuple[Message, ...], ...]:
        """Each queue's program with its signals: after an item only where a later item
        waits for it, and at its end."""
        signalled: list[list[int]] = [[] for _ in self.queues]
        for dq, value in self.waited_on:
            if value < self.counts[dq]:
                signalled[dq].append(value)
        out = []
        for program, run_end, values, count in zip(
            self.programs, self.run_end, signalled, self.counts
        ):
            spliced: list[Message] = []
            cut = 0
            for value in sorted(values):
                end = run_end[value - 1]
                spliced.extend(program[cut:end])
                spliced.append(Signal(value))
                cut = end
            spliced.extend(program[cut:])
            spliced.append(Signal(count))
            out.append(tuple(spliced))
        return tuple(out)


def _io_devices(caps: Mapping[str, DeviceCaps]) -> set[str | None]:
    """The devices reached by I/O (a worker's), by name."""
    return {name for name, device in caps.items() if device.host_io}


def _io_copy_deps(tracker: RangeTracker, item: PlanItem, j: int) -> tuple[set[int], Set[int]]:
    """What a copy from a device reached by I/O (a worker's) depends on, and which of
    those wrote its source.

    Its bytes may be sent ahead, on the wait that says they are ready: the waits on what
    wrote them are kept even where known complete through another queue, so that its own
    waits say it. Reads first, so that a read of the source finds what wrote it even
    where the copy writes those bytes too (onto itself).
    """
    deps: set[int] = set()
    source_deps: set[int] = set()
    for access in sorted(item.accesses, key=lambda a: a.write):
        found = tracker.access(access.alloc, access.start, access.stop, access.write, j)
        deps |= found
        if not access.write and access.device == item.src_device:
            source_deps |= found
    return deps, source_deps
