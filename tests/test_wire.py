"""The REMOTE frame decoder on its own: valid frames round-trip, anything else is a WireError."""

from __future__ import annotations

import msgpack
import pytest
from actorgraph.devices.remote.frames import HEADER, decode_frame, encode
from actorgraph.devices.remote.wire import (
    VERSION,
    Batch,
    Fence,
    Limits,
    PRead,
    PullEntry,
    Ref,
    SignalEntry,
    WireError,
    as_meta,
    decode,
    want_int,
    want_list,
)
from hypothesis import given
from hypothesis import strategies as st

LIMITS = Limits(max_meta=1 << 12, max_tail=1 << 12)

_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=20,
)


def test_round_trip() -> None:
    frame = encode(["batch", 1, [0, 5], [7], []], 3) + b"xyz"
    assert decode_frame(frame, LIMITS) == (["batch", 1, [0, 5], [7], []], b"xyz")


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"XX" + encode(["a"])[2:], "not an actorgraph frame"),
        (
            HEADER.pack(b"AG", VERSION + 1, 2, 0) + b"\x91\xa0",
            f"version {VERSION + 1} is not supported",
        ),
        (HEADER.pack(b"AG", VERSION, 1 << 20, 0), "outside 1..4096"),
        (HEADER.pack(b"AG", VERSION, 2, 1 << 20), "over the limit of 4096"),
        (HEADER.pack(b"AG", VERSION, 1, 0) + b"\xc1", "not valid msgpack"),
        (encode([1, 2]), "first field is its kind"),
        (encode({"a": 1}), "first field is its kind"),
        (HEADER.pack(b"AG", VERSION, 4, 0) + b"\x91\xd4\x01\x00", "ext type 1 is not allowed"),
        (encode(["a"]) + b"extra", "its header says"),
        (b"AG", "header is 16 bytes"),
    ],
)
def test_bad_frames_are_wire_errors(frame: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_frame(frame, LIMITS)


def test_field_checks_name_the_field() -> None:
    with pytest.raises(WireError, match="alloc size must be an int, got bool"):
        want_int(True, "alloc size")
    with pytest.raises(WireError, match="base = -1 is outside 0..10"):
        want_int(-1, "base", 0, 10)
    with pytest.raises(WireError, match="dims must have 3 entries, got 2"):
        want_list([1, 2], "dims", size=3)


@given(st.binary(max_size=64))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    try:
        meta, _ = decode_frame(data, LIMITS)
    except WireError:
        return
    assert isinstance(meta, list) and isinstance(meta[0], str)


@given(_values, st.binary(max_size=16))
def test_random_messages_decode_or_are_refused(value: object, tail: bytes) -> None:
    body = msgpack.packb(value, use_bin_type=True)
    frame = HEADER.pack(b"AG", VERSION, len(body), len(tail)) + body + tail
    try:
        meta, got_tail = decode_frame(frame, LIMITS)
    except WireError:
        return
    assert meta == value and got_tail == tail


@given(st.binary(min_size=1, max_size=48), st.integers(0, 40))
def test_corrupted_valid_frames_never_crash(noise: bytes, at: int) -> None:
    frame = bytearray(encode(["prog", 1, "CPU:0", [["s", 0, 1]], True]))
    at = min(at, len(frame) - 1)
    frame[at : at + len(noise)] = noise
    try:
        decode_frame(bytes(frame), LIMITS)
    except WireError:
        pass


def test_optional_fields_at_their_defaults_are_not_sent() -> None:
    # An unprofiled batch goes as before profiles crossed hosts: four fields.
    assert as_meta(Batch(1, [0, 0], [3], [])) == ["batch", 1, [0, 0], [3], []]
    assert as_meta(Batch(1, [0, 0], [3], [], True)) == ["batch", 1, [0, 0], [3], [], True]
    assert decode(["batch", 1, [0, 0], [3], []]).profile is False
    assert as_meta(SignalEntry(2, 1)) == ["s", 2, 1]
    assert as_meta(SignalEntry(2, 1, 0)) == ["s", 2, 1, 0]
    ref = Ref(1, 0, ())
    assert len(as_meta(PullEntry(0, ref, "h", 1, 2, ref, b"t", "CPU:0"))) == 9  # no follows
    # A read between workers that need not wait for its source's client goes without
    # its fence (`after` 0); one that must says how far.
    ticket = bytes(32)
    assert len(as_meta(PRead(4, 2, ref, ticket))) == 5
    assert _sent(PRead(4, 2, ref, ticket, 70)).after == 70


def _sent(message: object) -> object:
    """`message` as the other side decodes it."""
    return decode(decode_frame(encode(as_meta(message)), LIMITS)[0])


def test_a_fence_names_each_source_and_how_far() -> None:
    fence = Fence([("10.0.0.5", 7000, 3, 1 << 40)])
    assert _sent(fence) == fence
    with pytest.raises(WireError, match="fence port = 0 is outside 1..65535"):
        decode(["fence", [["h", 0, 1, 2]]])
    with pytest.raises(WireError, match="fence entry must have 4 entries"):
        decode(["fence", [["h", 1, 2]]])
    with pytest.raises(WireError, match="fence bytes = -1 is outside"):
        decode(["fence", [["h", 1, 2, -1]]])


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (["times", 1, 2, 1, 2.0, None, None, []], "batch received must be a finite float"),
        (["times", 1, 2, 1.0, 2.0, None, float("inf"), []], "job end must be a finite float"),
        (["times", 1, 2, 1.0, 2.0, None, None, [[0, 1.0]]], "span must have 3 entries"),
        (["times", 1, 2, 1.0, 2.0, None, None, [[-1, 1.0, 2.0]]], "span entry index = -1"),
        (["times", 1, 2, 1.0, 2.0, None, None, [[0, 1.0, "x"]]], "span end must be a finite"),
        (["pong", 1, 1.0, True], "pong sent must be a finite float"),
        (["ping", "a"], "ping id must be an int"),
    ],
)
def test_a_workers_times_are_checked_field_by_field(meta: list[object], message: str) -> None:
    with pytest.raises(WireError, match=f"message '{meta[0]}': {message}"):
        decode(meta)
