"""Profiles: when every item of a replay started and ended, on which actor, after which waits.

Recording is split in two so that replays stay fast: while a replay runs, each job's
observer (devices._ops.JobProfile) only gets (op index, start, end) tuples appended.
Turning those into `ProfileEvent`s, with labels, buffers and the waits that gated each
item, happens later and only when asked for (`rt.profile()`, `graph.last_profile`).

A worker's queues are timed on the worker, and their times come back put on this host's
clock (devices/remote/_clock.py): each of their events says how far off that clock they
can be (`ProfileEvent.clock_error`), and so do the summary and the trace.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from actorgraph.devices import JobProfile
from actorgraph.scheduler import Run, SyncDevice, Wait, WaitKick

from ._buffer import Buffer
from ._kernel import Copy

if TYPE_CHECKING:
    from ._program import Program


class EventKind(enum.Enum):
    KERNEL = "kernel"
    COPY = "copy"


class WaitKind(enum.Enum):
    QUEUE = "queue"  # another queue's signal: the item it waited for is known
    DEVICE = "device"  # a device timeline: everything earlier on that device
    KICK = "kick"  # the replay's admission


@attrs.frozen
class WaitRecord:
    """One plan wait that gated an item: what it waited for, and whether the actor parked.

    `on` names the queue actor (QUEUE), the device timeline (DEVICE) or "KICK". For a
    QUEUE wait, `item` is the index of the item on that queue it waited for.
    `start`/`end` bound the time parked; both are None when the wait was already met.
    """

    kind: WaitKind
    on: str
    value: int
    item: int | None
    start: float | None
    end: float | None

    @property
    def parked(self) -> bool:
        return self.start is not None

    @property
    def blocked(self) -> float:
        if self.start is None or self.end is None:
            return 0.0
        return self.end - self.start


@attrs.frozen
class ProfileEvent:
    """One item of one replay as it ran: times are seconds on the actor's clock.

    A worker's queue is timed on the worker, and its times are put on this host's clock
    (`time.perf_counter`, the clock of its CPU queues) with an offset measured over the
    connection: `clock_error` is how far off they can be (seconds; 0 on this host).
    """

    actor: str
    device: str
    item: int
    label: str
    kind: EventKind
    graph: int
    replay: int
    start: float
    end: float
    buffers: tuple[str, ...]
    writes: tuple[bool, ...]
    waits: tuple[WaitRecord, ...]
    clock_error: float = 0.0

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def name(self) -> str:
        """The item as a trace names it: kernel or copy label, then written <- read buffers."""
        outs = [b for b, w in zip(self.buffers, self.writes) if w]
        ins = [b for b, w in zip(self.buffers, self.writes) if not w]
        return f"{self.label} {', '.join(outs)} <- {', '.join(ins)}"


@attrs.frozen
class ReplaySpan:
    """One profiled replay: when it was submitted and when its last queue finished."""

    graph: int
    replay: int
    submitted: float
    done: float


@attrs.frozen
class Profile:
    """What profiled replays did, item by item. Build one with `rt.profile()`.

    `actors` lists every actor of the runtime, in device order, whether or not it ran
    anything, so a timeline has a row per actor.
    """

    actors: tuple[str, ...]
    events: tuple[ProfileEvent, ...]
    replays: tuple[ReplaySpan, ...]

    @property
    def start(self) -> float:
        times = [r.submitted for r in self.replays] + [e.start for e in self.events]
        return min(times, default=0.0)

    @property
    def end(self) -> float:
        times = [r.done for r in self.replays] + [e.end for e in self.events]
        return max(times, default=0.0)

    def __len__(self) -> int:
        return len(self.events)

    def clock_errors(self) -> dict[str, float]:
        """Per actor timed on another host (a worker's queue), how far its times can be
        off this host's clock (the largest of its events' `clock_error`, seconds)."""
        errors: dict[str, float] = {}
        for event in self.events:
            if event.clock_error > errors.get(event.actor, 0.0):
                errors[event.actor] = event.clock_error
        return errors

    def events_of(self, graph: int, replay: int) -> tuple[ProfileEvent, ...]:
        return tuple(e for e in self.events if e.graph == graph and e.replay == replay)

    def critical_path(self) -> tuple[ProfileEvent, ...]:
        """Per replay, the chain of items that decided when it finished.

        Start from the item that ended last; its predecessor is whichever finished last
        of what it had to follow: the previous item on its queue, or an item on another
        queue it waited for. Repeat until an item followed nothing of its replay.
        """
        by_replay: dict[tuple[int, int], list[ProfileEvent]] = {}
        for event in self.events:
            by_replay.setdefault((event.graph, event.replay), []).append(event)
        path: list[ProfileEvent] = []
        for key in sorted(by_replay):
            path.extend(_critical_path(by_replay[key]))
        return tuple(path)

    def to_chrome_trace(self, path: Any = None) -> dict[str, Any]:
        """The Chrome trace-event JSON (Perfetto, chrome://tracing); written to `path` if given."""
        from ._trace import chrome_trace, write_trace

        if path is not None:
            return write_trace(self, path)
        return chrome_trace(self)

    def summary(self) -> str:
        """Busy time and parked waits per actor, as text; for a worker's queue, how far
        its times can be off this host's clock."""
        lines = [f"{len(self.replays)} replays, {len(self.events)} items"]
        width = max((len(a) for a in self.actors), default=0)
        errors = self.clock_errors()
        for actor in self.actors:
            mine = [e for e in self.events if e.actor == actor]
            busy = sum(e.duration for e in mine)
            parked = [w for e in mine for w in e.waits if w.parked]
            blocked = sum(w.blocked for w in parked)
            line = (
                f"{actor.ljust(width)}  {len(mine):6d} items  {busy * 1e3:9.3f} ms busy  "
                f"{len(parked):5d} waits parked  {blocked * 1e3:9.3f} ms blocked"
            )
            if actor in errors:
                line += f"  clock +-{errors[actor] * 1e6:.1f} us"
            lines.append(line)
        if errors:
            lines.append(
                "(a worker's queues are timed there and put on this host's clock: "
                "'clock +-' is how far off they can be)"
            )
        return "\n".join(lines)


def _critical_path(events: list[ProfileEvent]) -> list[ProfileEvent]:
    by_item = {e.item: e for e in events}
    previous: dict[int, ProfileEvent] = {}
    by_actor: dict[str, list[ProfileEvent]] = {}
    for event in sorted(events, key=lambda e: (e.start, e.item)):
        queue = by_actor.setdefault(event.actor, [])
        if queue:
            previous[event.item] = queue[-1]
        queue.append(event)
    current = max(events, key=lambda e: (e.end, e.item))
    chain = [current]
    while True:
        options = [previous[current.item]] if current.item in previous else []
        for wait in current.waits:
            if wait.item is not None and wait.item in by_item:
                options.append(by_item[wait.item])
        if not options:
            break
        current = max(options, key=lambda e: (e.end, e.item))
        chain.append(current)
    chain.reverse()
    return chain


def _allocation_name(root: Buffer) -> str:
    """A base buffer's name in a trace: its allocation number, and for a wrapper (which
    shares its device's number with every other one) the address it wraps."""
    if root.foreign:
        return f"#{root.alloc_id}@{root.byte_range[0]:#x}"
    return f"#{root.alloc_id}"


def buffer_name(buf: Buffer) -> str:
    """A short name for a buffer in a trace: its allocation's name, and the range of a view."""
    if buf.is_view:
        base = buf.base
        start = buf.offset - base.offset
        return f"{_allocation_name(base)}[{start}:{start + buf.size}]"
    return _allocation_name(buf)


@attrs.frozen
class ReplayRecord:
    """The raw record of one profiled replay, kept until someone asks for a Profile."""

    program: Program
    graph: int
    replay: int
    inputs: tuple[Buffer, ...]
    jobs: tuple[JobProfile, ...]
    submitted: float


def new_records(program: Program) -> tuple[JobProfile, ...]:
    return tuple(JobProfile() for _ in program.actors)


def build_profile(actors: Sequence[str], records: Iterable[ReplayRecord]) -> Profile:
    events: list[ProfileEvent] = []
    spans: list[ReplaySpan] = []
    layouts: dict[Program, _Layout] = {}  # per program, shared by its replays
    for record in records:
        for job in record.jobs:
            job.settle()  # a worker's job: on this host's clock, with what is known now
        layout = layouts.get(record.program)
        if layout is None:
            layout = layouts[record.program] = _Layout(record.program)
        events.extend(layout.events(record))
        ends = [job.end for job in record.jobs if job.end is not None]
        spans.append(
            ReplaySpan(
                record.graph, record.replay, record.submitted, max(ends, default=record.submitted)
            )
        )
    events.sort(key=lambda e: (e.start, e.actor))
    return Profile(actors=tuple(actors), events=tuple(events), replays=tuple(spans))


class _Layout:
    """What a program's replays share, worked out once: per queue, what each message means
    (a wait that did not park is the same record in every replay), per item its names."""

    def __init__(self, program: Program) -> None:
        self.program = program
        plan = program.plan
        self.actor_names = [a.name for a in program.actors]
        # runs[qi][k]: the item index of the k-th item on queue qi (signal value k+1).
        runs = [[m.item for m in prog if isinstance(m, Run)] for prog in plan.programs]
        # messages[qi][index]: an item index (Run), a met WaitRecord (waits), or None.
        self.messages: list[list[int | WaitRecord | None]] = []
        for program_msgs in plan.programs:
            meanings: list[int | WaitRecord | None] = []
            for msg in program_msgs:
                if isinstance(msg, Run):
                    meanings.append(msg.item if msg.item < len(program.items) else None)
                elif isinstance(msg, Wait):
                    src = plan.queues.index(msg.queue)
                    item = runs[src][msg.value - 1] if 0 < msg.value <= len(runs[src]) else None
                    meanings.append(
                        WaitRecord(
                            WaitKind.QUEUE, self.actor_names[src], msg.value, item, None, None
                        )
                    )
                elif isinstance(msg, SyncDevice):
                    on = f"{msg.device}/timeline"
                    meanings.append(WaitRecord(WaitKind.DEVICE, on, 0, None, None, None))
                elif isinstance(msg, WaitKick):
                    meanings.append(WaitRecord(WaitKind.KICK, "KICK", 0, None, None, None))
                else:
                    meanings.append(None)
            self.messages.append(meanings)
        self.items: list[tuple[str, EventKind, tuple[bool, ...], list[str]]] = [
            (
                item.label,
                EventKind.COPY if isinstance(item, Copy) else EventKind.KERNEL,
                tuple(w for _, w in item.reads_writes()),
                [buffer_name(b) for b in item.bufs],
            )
            for item in program.items
        ]

    def events(self, record: ReplayRecord) -> list[ProfileEvent]:
        out: list[ProfileEvent] = []
        inputs = self.program.inputs
        rebound = len(record.inputs) == len(inputs) and any(
            new is not old for new, old in zip(record.inputs, inputs)
        )
        for qi, job in enumerate(record.jobs):
            actor = self.actor_names[qi]
            device = actor.split("/")[0]
            times = {index: (start, end) for index, start, end in job.spans}
            pending: list[WaitRecord] = []
            for index, meaning in enumerate(self.messages[qi]):
                if meaning is None:
                    continue
                got = times.get(index)
                if isinstance(meaning, WaitRecord):
                    if got is not None:  # it parked: this replay's own record
                        meaning = attrs.evolve(meaning, start=got[0], end=got[1])
                    pending.append(meaning)
                    continue
                if got is not None:
                    out.append(
                        self._event(record, rebound, actor, device, meaning, got, pending, job)
                    )
                pending = []
        return out

    def _event(
        self,
        record: ReplayRecord,
        rebound: bool,
        actor: str,
        device: str,
        j: int,
        times: tuple[float, float],
        waits: list[WaitRecord],
        job: JobProfile,
    ) -> ProfileEvent:
        program = self.program
        label, kind, writes, names = self.items[j]
        if rebound and program.item_inputs[j]:
            names = list(names)
            item = program.items[j]
            for slot, source in program.item_inputs[j]:
                # Name the buffer this call passed, not the one the graph was compiled with.
                old_root, new_root = program.inputs[source], record.inputs[source]
                buf = item.bufs[slot]
                if buf is old_root:
                    names[slot] = buffer_name(new_root)
                else:
                    start = buf.offset - old_root.offset + new_root.offset - new_root.base.offset
                    where = _allocation_name(new_root.base)
                    names[slot] = f"{where}[{start}:{start + buf.size}]"
        return ProfileEvent(
            actor=actor,
            device=device,
            item=j,
            label=label,
            kind=kind,
            graph=record.graph,
            replay=record.replay,
            start=times[0],
            end=times[1],
            buffers=tuple(names),
            writes=writes,
            waits=tuple(waits),
            clock_error=job.clock_error,
        )
