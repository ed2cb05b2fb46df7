"""The worker's side of the handshake (the connecting side's is
actorgraph/devices/remote/handshake.py, which describes the exchange): challenge a new
connection, check its answer, prove this worker holds the token too.

A client must answer the challenge with the worker's token (when it has one); another
worker linking to this one answers it with the same token (the workers of a runtime
share it; a worker without one serves loopback only, as for clients) and can then only
read allocations named by a ticket. Every answer is bound to the role asked for and to
both nonces, so one made for another connection or role is refused.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Sequence

import attrs
import trio

from actorgraph.devices.remote.frames import FrameStream, FrameTooLarge
from actorgraph.devices.remote.wire import (
    HANDSHAKE_LIMITS,
    NONCE_BYTES,
    TO_CONNECTOR,
    TO_WORKER,
    Auth,
    Challenge,
    Hello,
    Limits,
    Welcome,
    WireError,
    decode,
    handshake_mac,
)

from ._outbox import Outbox

HANDSHAKE_TIMEOUT_S = 30


@attrs.frozen
class Greeted:
    """A connection that passed the handshake: its role, and the proof its Welcome
    carries (this worker's MAC; empty without a token)."""

    role: str  # "client" or "peer"
    proof: bytes


async def challenge(
    stream: FrameStream, out: Outbox, token: bytes | None, limits: Limits, devices: Sequence[str]
) -> Greeted:
    """Challenge the connection on `stream` and check its answer. A "peer" is welcomed
    here; a "client"'s session is welcomed by the caller, with the proof. A WireError
    says why it is refused (the caller answers it and closes the connection)."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    # Sent at once, before the hello is read: a client of another version reads this
    # frame's version and says so, instead of waiting for a hello of its own.
    out.send(Challenge(nonce, token is not None))
    with trio.fail_after(HANDSHAKE_TIMEOUT_S), stream.limited(HANDSHAKE_LIMITS):
        hello = await _expect(stream, Hello, "['hello', role, nonce]")
        auth = await _expect(stream, Auth, "['auth', mac, devices]")
    assert isinstance(hello, Hello) and isinstance(auth, Auth)
    role = hello.role
    if role not in ("client", "peer"):
        raise WireError(f"unknown role {role!r}: a connection is a 'client' or a 'peer'")
    if len(hello.nonce) != NONCE_BYTES:
        raise WireError(f"a hello's nonce is {NONCE_BYTES} bytes, got {len(hello.nonce)}")
    proof = b""
    if token is not None:
        expected = handshake_mac(token, role, hello.nonce, nonce, TO_WORKER)
        if not hmac.compare_digest(auth.mac, expected):
            if role == "peer":
                raise WireError(
                    "authentication failed: a worker-to-worker link needs this worker's "
                    "token; start every worker of a runtime with the same --token-file"
                )
            raise WireError("authentication failed: wrong or missing token")
        proof = handshake_mac(token, role, hello.nonce, nonce, TO_CONNECTOR)
    if role == "peer":
        if auth.devices:
            raise WireError("a peer names no devices: its answer is ['auth', mac, []]")
        out.send(Welcome(0, b"", limits.as_wire(), proof))
        return Greeted(role, proof)
    for name in auth.devices:
        if name not in devices:
            raise WireError(f"this worker has no device {name!r} (it has {list(devices)})")
    return Greeted(role, proof)


async def _expect(stream: FrameStream, expected: type, form: str) -> object:
    try:
        meta, tail = await stream.receive()
    except FrameTooLarge as exc:
        limit = HANDSHAKE_LIMITS.max_meta
        raise WireError(
            f"{exc}: before it proves the token, a connection's frames are at most {limit} "
            f"bytes (a handshake message); is this an actorgraph client of this version?"
        ) from None
    try:
        message = decode(meta)
    except WireError:
        message = None
    if not isinstance(message, expected) or tail:
        raise WireError(f"the handshake's next message must be {form}, got {meta[0]!r}")
    return message
