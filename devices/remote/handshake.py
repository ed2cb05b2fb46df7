"""The connecting side of the REMOTE handshake: a client, or a worker linking to another.

Both sides speak at once: the connecting side says `Hello` (its role and a fresh nonce),
the worker its `Challenge` (a fresh nonce, and whether it needs a token). The
connecting side answers with `Auth`: its MAC under the shared token of the role, both
nonces and the direction (`handshake_mac`, TO_WORKER), and a client's devices. The
worker checks it and says `Welcome` (with its own MAC of the same, TO_CONNECTOR: its
proof that it holds the token as well) or `Error`. The connecting side checks that
proof before it trusts the worker with anything.

So a MAC is good for one connection only, in one role and one direction: a stranger
that hands a token holder a worker's nonce as its own challenge gets an answer bound to
the holder's nonce, which the worker did not get from the stranger; a client's answer
does not open a worker-to-worker link; and the worker's proof is no answer. A stranger
posing as a worker cannot make the proof: the client refuses it. What the token does
not do is hide or seal what follows the handshake: a relay that passes a whole
connection on, byte for byte, sees and can change it. TLS under the stream does that
(the worker's certificate, checked against the client's CA: tls.py).

`greet` is this exchange on a stream already open, for both connecting sides: a client
(devices/remote/_transport.py) and a worker linking to another (actorgraph/worker/
_peers.py). The worker's side is actorgraph/worker/_handshake.py.
"""

from __future__ import annotations

import hmac
import secrets

from .frames import FrameStream, FrameTooLarge, encode
from .wire import (
    HANDSHAKE_LIMITS,
    NONCE_BYTES,
    TO_CONNECTOR,
    TO_WORKER,
    Auth,
    Challenge,
    Error,
    Hello,
    Welcome,
    WireError,
    decode,
    handshake_mac,
)

__all__ = ["HandshakeRefused", "TokenRequired", "WorkerUnproven", "greet"]


class HandshakeRefused(Exception):
    """The worker answered the handshake with an Error: its reason is the message."""


class TokenRequired(Exception):
    """The worker needs a token and this side has none."""


class WorkerUnproven(Exception):
    """This side holds a token and what answered could not prove it holds it too: the
    message says how (it asks for no token, or its proof is wrong)."""


async def greet(stream: FrameStream, token: bytes | None, role: str, devices: list[str]) -> Welcome:
    """The connecting side's handshake: say hello, answer the worker's challenge, and
    check the worker's proof when this side holds a token. The worker's frames are read
    with the handshake's small limits until it has proved the token.

    Args:
        stream: the connection, open (and under TLS where it speaks it).
        token: the shared token of the role, or None without one.
        role: "client", or "peer" for a worker linking to another.
        devices: the worker's devices a client uses (`CPU:0`, ...); a peer names none.

    Returns:
        The worker's Welcome (its session, limits, CPU and proof).

    Raises:
        HandshakeRefused: the worker refused; the message is its reason.
        TokenRequired: the worker needs a token and `token` is None.
        WorkerUnproven: this side holds a token and what answered could not prove it
            holds it too.
        WireError: what answered does not speak this protocol (or this version of it).
    """
    with stream.limited(HANDSHAKE_LIMITS):
        return await _greet(stream, token, role, devices)


async def _greet(
    stream: FrameStream, token: bytes | None, role: str, devices: list[str]
) -> Welcome:
    nonce = secrets.token_bytes(NONCE_BYTES)
    await stream.send([encode(Hello(role, nonce))])
    challenge = await _receive(stream, Challenge, "a challenge")
    assert isinstance(challenge, Challenge)
    if challenge.needs_token and token is None:
        raise TokenRequired()
    if token is not None and not challenge.needs_token:
        raise WorkerUnproven("it asks for no token, so it cannot prove it holds this side's token")
    mac = b""
    if token is not None:
        mac = handshake_mac(token, role, nonce, challenge.nonce, TO_WORKER)
    await stream.send([encode(Auth(mac, devices))])
    welcome = await _receive(stream, Welcome, "a welcome")
    assert isinstance(welcome, Welcome)
    if token is not None:
        proof = handshake_mac(token, role, nonce, challenge.nonce, TO_CONNECTOR)
        if not hmac.compare_digest(welcome.proof, proof):
            raise WorkerUnproven("its proof of the token is wrong")
    return welcome


async def _receive(stream: FrameStream, expected: type, what: str) -> object:
    try:
        meta, _ = await stream.receive()
    except FrameTooLarge as exc:
        raise WireError(
            f"{exc}: a worker's handshake messages are at most {HANDSHAKE_LIMITS.max_meta} bytes"
        ) from None
    if meta[0] == "error":
        refusal = decode(meta)
        assert isinstance(refusal, Error)
        raise HandshakeRefused(refusal.why)
    got = decode(meta)
    if not isinstance(got, expected):
        raise WireError(f"expected {what} from the worker, got {meta[0]!r}")
    return got
