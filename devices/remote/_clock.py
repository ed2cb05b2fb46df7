"""A worker's clock against the client's: the offset between them, and how far off it can be.

A profiled replay's items on a worker are timed there, with the worker's clock (its
`time.perf_counter`); a profile shows them on the client's clock (the clock of the
client's CPU queues, `time.perf_counter` here). The offset between the two is measured
as NTP measures it, from round trips on the connection. The client notes when a message
left (t0) and when the answer came (t3), on its clock; the worker notes when the message
came (t1) and when it answered (t2), on its own. Whatever the network did, the message
arrived after it left and the answer after it was sent, so if the worker's clock reads
the client's plus `offset`, then t1 >= t0 + offset and t3 >= t2 - offset:

    t2 - t3  <=  offset  <=  t1 - t0

The estimate is the middle of that range, ((t1 - t0) + (t2 - t3)) / 2, and it is off by
at most half its width: half the round trip, ((t3 - t0) - (t2 - t1)) / 2 (time the
worker spent between t1 and t2 is not part of it). Of many round trips the one with
the least round trip bounds the offset most tightly, so that is the one kept.

Two hosts' clocks also drift apart: a sample is taken to grow worse by `DRIFT` seconds
per second away from when it was taken (NTP's own allowance for a clock's frequency
error, 15 ppm), so the estimate for a moment is the sample that is best *then*, and a
connection measures again (`due`) once its best sample has aged. On one host the two
processes read one clock and the offset is 0, within the bound.

Round trips come from `Ping`/`Pong` (a burst of `PINGS` when a connection first sends a
profiled batch, and again `REMEASURE` seconds later at the next), and from every
profiled batch itself: the batch leaves at t0, the worker's `JobTimes` say when it came
(t1) and when they were sent (t2), and they arrive at t3.
"""

from __future__ import annotations

import attrs

DRIFT = 15e-6  # seconds per second two hosts' clocks may drift apart
PINGS = 4  # round trips in one burst of pings
REMEASURE = 30.0  # seconds after a burst that a profiled batch starts another
_KEPT = 16  # samples kept at most (those that may still be the best)


@attrs.frozen
class ClockSample:
    """One round trip: t0 and t3 on the client's clock, t1 and t2 on the worker's."""

    sent: float  # t0: the message left the client
    received: float  # t1: it came to the worker
    answered: float  # t2: the worker answered
    back: float  # t3: the answer came to the client

    @property
    def round_trip(self) -> float:
        """Time on the way there and back, the worker's own time taken out."""
        return max(0.0, (self.back - self.sent) - (self.answered - self.received))

    @property
    def offset(self) -> float:
        """The worker's clock minus the client's: the middle of what is possible."""
        return ((self.received - self.sent) + (self.answered - self.back)) / 2

    @property
    def at(self) -> float:
        """When it was taken, on the client's clock."""
        return (self.sent + self.back) / 2

    def error_at(self, when: float) -> float:
        """How far off its offset can be for a moment `when` (client's clock)."""
        return self.round_trip / 2 + DRIFT * abs(when - self.at)


@attrs.frozen
class ClockEstimate:
    """The worker's clock minus the client's (`offset`, seconds), off by at most `error`."""

    offset: float
    error: float


class PeerClock:
    """What a connection knows of its worker's clock: the samples that may still be the
    best for a moment from now on, and when it last measured on purpose.

    Invariants: `_samples` is in the order they were taken, and each is better, for any
    moment from the newest on, than every sample after it.
    """

    def __init__(self) -> None:
        self._samples: list[ClockSample] = []
        self._measured: float | None = None  # when the last burst of pings started

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: ClockSample) -> None:
        """Keep `sample`, and forget those it is at least as good as from now on."""
        now = sample.at
        error = sample.error_at(now)
        kept = [s for s in self._samples if s.error_at(now) < error]
        kept.append(sample)
        if len(kept) > _KEPT:
            # The one that is worst now goes (the newest is kept: it is the latest word).
            worst = max(kept[:-1], key=lambda s: s.error_at(now))
            kept.remove(worst)
        self._samples = kept

    def estimate(self, when: float) -> ClockEstimate | None:
        """The offset for a moment `when` (client's clock), from the sample that bounds it
        most tightly then; None before any round trip."""
        if not self._samples:
            return None
        best = min(self._samples, key=lambda s: s.error_at(when))
        return ClockEstimate(best.offset, best.error_at(when))

    def offset_at(self, when: float) -> tuple[float, float]:
        """(offset, how far off it can be) for a moment `when`, as `estimate` says; once
        a round trip was measured (as it was for any job timed on the worker)."""
        estimate = self.estimate(when)
        if estimate is None:
            raise RuntimeError("no round trip to this worker was measured yet")
        return estimate.offset, estimate.error

    def due(self, now: float) -> bool:
        """Whether a burst of pings is due at `now`: none yet, or the last one was
        `REMEASURE` seconds ago or more (and it is counted as started now)."""
        if self._measured is not None and now - self._measured < REMEASURE:
            return False
        self._measured = now
        return True
