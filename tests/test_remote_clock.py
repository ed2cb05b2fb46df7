"""A worker's clock against the client's (devices/remote/_clock.py): the NTP-style offset,
its error bound, which round trip is kept, and when a connection measures again."""

from __future__ import annotations

import pytest
from actorgraph.devices.remote._clock import (
    DRIFT,
    REMEASURE,
    ClockSample,
    PeerClock,
)
from hypothesis import given
from hypothesis import strategies as st


def _trip(offset: float, leave: float, there: float, work: float, back: float) -> ClockSample:
    """A round trip that left the client at `leave` (its clock), took `there` seconds to
    the worker, `work` there and `back` seconds back, the worker's clock reading the
    client's plus `offset`."""
    received = leave + there + offset
    answered = received + work
    return ClockSample(leave, received, answered, leave + there + work + back)


def test_a_sample_bounds_the_offset_by_half_its_round_trip() -> None:
    sample = _trip(offset=5.0, leave=100.0, there=0.001, work=0.5, back=0.003)
    assert sample.round_trip == pytest.approx(0.004)  # the work on the worker left out
    # Asymmetric delays put the estimate off by half their difference: within the bound.
    assert sample.offset == pytest.approx(5.0 - 0.001)
    assert abs(sample.offset - 5.0) <= sample.error_at(sample.at)
    assert sample.error_at(sample.at) == pytest.approx(0.002)
    assert sample.error_at(sample.at + 100) == pytest.approx(0.002 + 100 * DRIFT)


@given(
    offset=st.floats(-1e6, 1e6),
    there=st.floats(0, 1.0),
    work=st.floats(0, 10.0),
    back=st.floats(0, 1.0),
)
def test_the_true_offset_is_always_within_the_bound(
    offset: float, there: float, work: float, back: float
) -> None:
    sample = _trip(offset, 1000.0, there, work, back)
    # A little slack for floating point on clocks far apart.
    assert abs(sample.offset - offset) <= sample.error_at(sample.at) + 1e-9 * (1 + abs(offset))


def test_the_round_trip_with_least_delay_is_kept() -> None:
    clock = PeerClock()
    assert clock.estimate(0.0) is None
    clock.add(_trip(2.0, 10.0, 0.004, 0.0, 0.004))
    clock.add(_trip(2.0, 10.1, 0.0001, 0.0, 0.0003))  # the tightest
    clock.add(_trip(2.0, 10.2, 0.002, 0.0, 0.001))
    estimate = clock.estimate(10.2)
    assert estimate is not None
    assert estimate.error == pytest.approx(0.0002 + DRIFT * 0.1, rel=1e-3)
    assert abs(estimate.offset - 2.0) <= estimate.error
    assert clock.offset_at(10.2) == (estimate.offset, estimate.error)


def test_an_old_sample_gives_way_to_a_newer_one_as_the_clocks_may_drift() -> None:
    clock = PeerClock()
    clock.add(_trip(2.0, 0.0, 0.0001, 0.0, 0.0001))  # tight, but long ago
    clock.add(_trip(2.0, 3600.0, 0.002, 0.0, 0.002))  # looser, but now
    now = clock.estimate(3600.0)
    then = clock.estimate(0.0)
    assert now is not None and then is not None
    # The old one has grown worse (0.0001 + 54 ms of drift): the newer one is kept alone,
    # and bounds even the old moment, as loosely as the drift since says.
    assert now.error == pytest.approx(0.002, rel=1e-3)
    assert then.error == pytest.approx(0.002 + DRIFT * 3600, rel=1e-3)
    assert len(clock) == 1
    # A sample as good as an older one replaces it.
    clock = PeerClock()
    clock.add(_trip(2.0, 0.0, 0.001, 0.0, 0.001))
    clock.add(_trip(2.0, 1.0, 0.001, 0.0, 0.001))
    assert len(clock) == 1


def test_a_burst_of_pings_is_due_first_and_again_once_the_last_is_old() -> None:
    clock = PeerClock()
    assert clock.due(5.0)
    assert not clock.due(5.0 + REMEASURE / 2)
    assert clock.due(5.0 + REMEASURE)
    assert not clock.due(5.0 + REMEASURE + 1)


def test_offset_at_says_when_nothing_was_measured() -> None:
    with pytest.raises(RuntimeError, match="no round trip to this worker was measured yet"):
        PeerClock().offset_at(0.0)
