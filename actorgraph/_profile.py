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
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from actorgraph.devices import JobProfile
from actorgraph.scheduler import Message, Run, SyncDevice, Wait, WaitKick

from ._buffer import Buffer
from ._kernel import Copy

if TYPE_CHECKING:
    from ._program import Program


class EventKind(enum.Enum):
    """What a ProfileEvent's item was: a kernel launch or a copy."""

    KERNEL = "kernel"
    COPY = "copy"


class WaitKind(enum.Enum):
    """What a WaitRecord's wait was for: another queue's signal (QUEUE, the item it waited
    for is known), a device's timeline (DEVICE: everything earlier on that device), or the
    replay's admission (KICK).
    """

    QUEUE = "queue"  # another queue's signal: the item it waited for is known
    DEVICE = "device"  # a device timeline: everything earlier on that device
    KICK = "kick"  # the replay's admission


@attrs.frozen
class WaitRecord:
    """One wait of the plan that gated an item: what it waited for, and whether the actor
    parked.

    Attributes:
        kind: a WaitKind (QUEUE, DEVICE or KICK).
        on: the queue actor (QUEUE), the device timeline (DEVICE) or "KICK" waited on.
        value: the timeline value waited for.
        item: for a QUEUE wait, the index of the item on that queue it waited for; else
            None.
        start: when the actor parked on it (None when the wait was already met).
        end: when it woke (None when the wait was already met).
    """

    kind: WaitKind
    on: str
    value: int
    item: int | None
    start: float | None
    end: float | None

    @property
    def parked(self) -> bool:
        """Whether the actor parked on this wait (it was not met when reached)."""
        return self.start is not None

    @property
    def blocked(self) -> float:
        """The seconds the actor was parked on this wait (0 when it was met at once)."""
        if self.start is None or self.end is None:
            return 0.0
        return self.end - self.start


@attrs.frozen
class ProfileEvent:
    """One item of one replay as it ran; times are seconds on the actor's clock.

    A worker's queue is timed on the worker, and its times are put on this host's clock
    (`time.perf_counter`, the clock of its CPU queues) with an offset measured over the
    connection. SIM queues keep trio's clock, so their times are simulated time.

    Attributes:
        actor: the queue actor that ran it, "CPU:0/compute".
        device: its device.
        item: its index in the graph's items.
        label: the kernel's name, or "copy SRC->DST".
        kind: an EventKind (KERNEL or COPY).
        graph: the graph's number in its runtime (0, 1, ...).
        replay: the replay's number (1, 2, ..., as Replay.number).
        start: when it started, in seconds.
        end: when it ended, in seconds.
        buffers: its buffers as a trace names them: `#N` an allocation, `#N[a:b]` a view.
        writes: per buffer, whether the item writes it.
        waits: the waits of the plan that gated it (WaitRecords).
        clock_error: how far off this host's clock its times can be, in seconds (0 on this
            host's queues).
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
        """How long the item ran, in seconds."""
        return self.end - self.start

    @property
    def name(self) -> str:
        """The item as a trace names it (its label, then written <- read buffers)."""
        outs = [b for b, w in zip(self.buffers, self.writes) if w]
        ins = [b for b, w in zip(self.buffers, self.writes) if not w]
        return f"{self.label} {', '.join(outs)} <- {', '.join(ins)}"


@attrs.frozen
class ReplaySpan:
    """One profiled replay, from its submission to the end of its last queue.

    Attributes:
        graph: the graph's number in its runtime.
        replay: the replay's number (as Replay.number).
        submitted: when it was submitted, in seconds.
        done: when its last queue finished, in seconds.
    """

    graph: int
    replay: int
    submitted: float
    done: float


@attrs.frozen
class Profile:
    """What profiled replays did, item by item; `rt.profile()` or `graph.last_profile` makes
    one.

    Attributes:
        actors: every queue actor of the runtime, in device order, whether or not it ran
            anything (a timeline has a row for each).
        events: a ProfileEvent per item per replay.
        replays: a ReplaySpan per replay.
    """

    actors: tuple[str, ...]
    events: tuple[ProfileEvent, ...]
    replays: tuple[ReplaySpan, ...]

    @property
    def start(self) -> float:
        """The earliest submission or item start in the profile, in seconds (0 if empty)."""
        times = [r.submitted for r in self.replays] + [e.start for e in self.events]
        return min(times, default=0.0)

    @property
    def end(self) -> float:
        """The latest replay end or item end in the profile, in seconds (0 if empty)."""
        times = [r.done for r in self.replays] + [e.end for e in self.events]
        return max(times, default=0.0)

    def __len__(self) -> int:
        return len(self.events)

    def clock_errors(self) -> dict[str, float]:
        """How far the times of each actor timed on another host (a worker's queue) can be off
        this host's clock.

        Returns:
            Per such actor, the largest `clock_error` of its events, in seconds.
        """
        errors: dict[str, float] = {}
        for event in self.events:
            if event.clock_error > errors.get(event.actor, 0.0):
                errors[event.actor] = event.clock_error
        return errors

    def events_of(self, graph: int, replay: int) -> tuple[ProfileEvent, ...]:
        """The events of one replay.

        Args:
            graph: the graph's number (ProfileEvent.graph).
            replay: the replay's number (ProfileEvent.replay).

        Returns:
            Its events, in profile order.
        """
        return tuple(e for e in self.events if e.graph == graph and e.replay == replay)

    def critical_path(self) -> tuple[ProfileEvent, ...]:
        """Per replay, the chain of items that decided when it finished.

        From the item that ended last, each step goes to whichever finished last of what the
        item had to follow (the previous item on its queue, or an item on another queue it
        waited for), until an item followed nothing of its replay.

        Returns:
            The chains' events, replay after replay, each chain in time order.
        """
        by_replay: dict[tuple[int, int], list[ProfileEvent]] = {}
        for event in self.events:
            by_replay.setdefault((event.graph, event.replay), []).append(event)
        path: list[ProfileEvent] = []
        for key in sorted(by_replay):
            path.extend(_critical_path(by_replay[key]))
        return tuple(path)

    def to_chrome_trace(self, path: Any = None) -> dict[str, Any]:
        """The profile as Chrome trace-event JSON, for https://ui.perfetto.dev or chrome://tracing.

        A process per device, a track per queue actor, a slice per item, grey slices where
        an actor parked, flow arrows from each item to the items that waited for it, and a
        counter of replays in flight.

        Args:
            path: where to write the JSON too, if given.

        Returns:
            The trace, as a dict.
        """
        from ._trace import chrome_trace, write_trace

        if path is not None:
            return write_trace(self, path)
        return chrome_trace(self)

    def summary(self) -> str:
        """Busy time and parked waits per actor, as text; for a worker's queue, how far its times
        can be off this host's clock.

        Returns:
            A table, a line per actor.
        """
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


class Profiles:
    """The profiled replays of a runtime, kept as they are made until someone asks for
    them as one Profile. `every`: whether every replay is profiled
    (`open_runtime(profile=True)`); a call can ask for one too (`profile=True`)."""

    def __init__(self, every: bool, actor_names: Callable[[], Sequence[str]]) -> None:
        """`actor_names()`: the runtime's actors, in the order profiles list them."""
        self.every = every
        self._actor_names = actor_names
        self._records: list[ReplayRecord] = []

    def keep(self, record: ReplayRecord) -> None:
        """Keep a profiled replay's record."""
        self._records.append(record)

    def profile(self, clear: bool = False) -> Profile:
        """Every replay kept so far, as one Profile (`clear`: start afresh after)."""
        profile = build_profile(self._actor_names(), self._records)
        if clear:
            self._records = []
        return profile


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
        self.messages: list[list[int | WaitRecord | None]] = [
            [self._meaning(msg, runs) for msg in program_msgs] for program_msgs in plan.programs
        ]
        self.items: list[tuple[str, EventKind, tuple[bool, ...], list[str]]] = [
            (
                item.label,
                EventKind.COPY if isinstance(item, Copy) else EventKind.KERNEL,
                tuple(w for _, w in item.reads_writes()),
                [buffer_name(b) for b in item.bufs],
            )
            for item in program.items
        ]

    def _meaning(self, msg: Message, runs: list[list[int]]) -> int | WaitRecord | None:
        """What a plan message means in every replay: the item a Run runs (None: a host
        copy's placeholder), a wait as it is when met, or None (a signal)."""
        program = self.program
        if isinstance(msg, Run):
            return msg.item if msg.item < len(program.items) else None
        if isinstance(msg, Wait):
            src = program.plan.queues.index(msg.queue)
            item = runs[src][msg.value - 1] if 0 < msg.value <= len(runs[src]) else None
            return WaitRecord(WaitKind.QUEUE, self.actor_names[src], msg.value, item, None, None)
        if isinstance(msg, SyncDevice):
            on = f"{msg.device}/timeline"
            return WaitRecord(WaitKind.DEVICE, on, 0, None, None, None)
        if isinstance(msg, WaitKick):
            return WaitRecord(WaitKind.KICK, "KICK", 0, None, None, None)
        return None

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
