"""A runtime's in-flight window, and the watch over the work in it.

`Window`: the submissions posted to the actors and not yet complete. A caller waits for
room in it before it posts (`admit`), which is the back-pressure of `max_in_flight`; a
replay that waits for external timelines before it is posted holds its place meanwhile
(`reserve`), and the window's one watcher task wakes it (`wait_timeline`). Work run where
it was made (`_submitted.run_here`) is never in flight and takes no room.

`Watch`: a task that looks at the work in flight every `deadlock_check` seconds while
there is some: a deadlock (every actor with work waits on a signal no pending work can
set) breaks the runtime with a DeadlockError; no progress for `watchdog` seconds is
logged and recorded as a StallReport.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import trio

from actorgraph.devices import Device, Submission, find_deadlock

from ._errors import DeadlockError
from ._foreign import ExternalTimeline, TimelineWaits
from ._log import logger as _log


class Window:
    """The submissions in flight (posted, not yet complete) and the places reserved for
    replays not posted yet.

    Invariant: in_flight + reserved <= max_in_flight, except for work posted without
    waiting for room (eager work past a full window never waits twice).
    """

    def __init__(self, max_in_flight: int, check_open: Callable[[], None]) -> None:
        """`check_open()` raises the runtime's ClosedError once it cannot take work: a
        caller waiting for room is told so."""
        self.max_in_flight = max_in_flight
        self._check_open = check_open
        self._pending: set[Submission] = set()
        self._reserved = 0
        self._space = trio.lowlevel.ParkingLot()
        # Set once something is posted after the watch found nothing in flight (`active`).
        self._active = trio.Event()
        # Replays waiting for external timelines (graph.submit(after=...)): one watcher.
        self._timeline_waits = TimelineWaits()

    def start(self, nursery: trio.Nursery) -> None:
        """Start the task that watches external timelines for the replays waiting on them."""
        self._timeline_waits.start(nursery)

    @property
    def in_flight(self) -> int:
        """Submissions posted and not yet complete."""
        return len(self._pending)

    @property
    def reserved(self) -> int:
        """Places held for replays that wait for an external timeline before they are posted."""
        return self._reserved

    @property
    def waiting(self) -> int:
        """Tasks waiting for room."""
        return self._space.statistics().tasks_waiting

    async def admit(self) -> None:
        """Wait for room in the window (submissions posted, not yet complete, and places
        reserved for replays waiting to be posted); the caller posts its submission
        before its next checkpoint, taking that room. A cancel point first; raises the
        runtime's ClosedError if it cannot take work (now, or while waiting)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        while not self.has_room():
            await self._space.park()
            self._check_open()

    def has_room(self) -> bool:
        """Whether a submission posted now fits in the window."""
        return len(self._pending) + self._reserved < self.max_in_flight

    async def reserve(self) -> None:
        """`admit`, keeping the room taken until `unreserve`: for a replay that waits for
        something else (an external timeline) before it is posted, so the replays waiting
        so never pass the window when what they wait for comes."""
        await self.admit()
        self._reserved += 1

    def unreserve(self) -> None:
        """Give back a place `reserve` took (its replay is posted now, or never will be)."""
        self._reserved -= 1
        if self._space:
            self._space.unpark()

    async def wait_timeline(self, timeline: ExternalTimeline, value: int) -> None:
        """Return once `timeline` reached `value` (for a replay that waits for it, its
        place in the window reserved): the window's watcher wakes it, no thread is held
        for it, and cancelling it ends it at once. Raises TimeoutError after the
        timeline's `timeout` (one without `wait`), what its `read` or `wait` raised, or
        ClosedError if the runtime closes meanwhile."""
        await self._timeline_waits.wait_for(timeline, value)

    def track(self, sub: Submission) -> None:
        """Keep a posted submission in flight until it completes (nothing to keep if it
        already has: an empty plan, or one run to its end where it was posted)."""
        if sub.done.is_set():
            return
        self._pending.add(sub)
        sub.when_done(self._done)
        if not self._active.is_set():
            self._active.set()

    def _done(self, sub: Submission) -> None:
        self._pending.discard(sub)
        if self._space:
            self._space.unpark()

    def unfinished(self) -> set[Submission]:
        """The submissions in flight now (a buffer freed now waits for them)."""
        return set(self._pending)

    def fail_all(self, error: BaseException) -> None:
        """The runtime broke: fail every submission in flight with `error` (their
        callbacks run, and whoever reads one's end is stopped), and wake every task
        waiting for room (it finds the runtime broken)."""
        for sub in list(self._pending):
            sub.break_off(error)
        self._space.unpark_all()

    async def active(self) -> None:
        """Return once something is in flight (at once if something is)."""
        if not self._pending:
            self._active = trio.Event()  # set by the next `track`
            await self._active.wait()


@attrs.frozen
class StallReport:
    """The watchdog saw no progress for `stalled_for` seconds (trio clock) at time `at`."""

    at: float
    stalled_for: float
    in_flight: int
    actors: tuple[str, ...]


class Watch:
    """The watch over a window's work in flight (see the module): deadlocks and stalls."""

    def __init__(
        self,
        window: Window,
        devices: Sequence[Device],
        every: float,
        watchdog: float | None,
        broke: Callable[[BaseException], None],
    ) -> None:
        """Look at `window`'s work on `devices` every `every` seconds while there is some;
        call `broke(error)` on a deadlock; report no progress for `watchdog` seconds
        (None: never)."""
        self._window = window
        self._devices = tuple(devices)
        self._actors = [a for d in self._devices for a in d.queues.values()]
        self._every = every
        self.watchdog = watchdog
        self._broke = broke
        self.stalls: list[StallReport] = []
        # What the last look saw, since when it has not changed, whether that was reported.
        self._last: tuple[int, ...] | None = None
        self._still_since = 0.0
        self._reported = False

    async def run(self) -> None:
        """The watch's task: it runs until cancelled."""
        window = self._window
        while True:
            if not window.in_flight:
                await window.active()
                self._last = None
            await trio.sleep(self._every)
            if window.in_flight:
                self._look(trio.current_time())

    def _fingerprint(self) -> tuple[int, ...]:
        out: list[int] = []
        for device in self._devices:
            out.append(device.timeline.value)
            for actor in device.queues.values():
                out += (actor.jobs_done, actor.signal.value, actor.parks)
        return tuple(out)

    def _look(self, now: float) -> None:
        """One look at the work in flight: nothing moved since the last one, and every
        actor with work waits on a signal no pending work can set, is a deadlock."""
        fingerprint = self._fingerprint()
        if fingerprint != self._last:
            self._last, self._still_since, self._reported = fingerprint, now, False
            return
        blocked = find_deadlock(self._actors)
        if blocked:
            cycle = "; ".join(
                f"{b.actor} waits for {b.signal} >= {b.value} (now {b.current})" for b in blocked
            )
            self._broke(
                DeadlockError(
                    f"deadlock: every actor with work waits on a signal no pending work can "
                    f"set: {cycle}. The runtime cannot continue; open a new one",
                    blocked=tuple(blocked),
                )
            )
            return
        if self.watchdog is not None and not self._reported:
            if now - self._still_since >= self.watchdog:
                self._report(now)

    def _report(self, now: float) -> None:
        self._reported = True
        stall = StallReport(
            at=now,
            stalled_for=now - self._still_since,
            in_flight=self._window.in_flight,
            actors=tuple(a.name for a in self._actors if a.busy),
        )
        self.stalls.append(stall)
        _log.warning(
            "no progress for %.3f s with %d submissions in flight (busy: %s)",
            stall.stalled_for,
            stall.in_flight,
            ", ".join(stall.actors),
        )
