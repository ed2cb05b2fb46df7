"""The connecting side of the REMOTE handshake: a client, or a worker linking to another.

The worker speaks first (`Challenge`: a nonce, and whether it needs a token); the other
side answers (`Auth`: its role, its MAC of the nonce under the shared token, and, for a
client, the worker's devices it will use); the worker says `Welcome` (a session) or
`Error`. `greet` is that exchange, from the connecting side, on a stream already open:
what is checked of the worker lives here, so a stronger exchange (mutual
authentication, TLS under the stream) changes this module and the worker's
(actorgraph/worker/_handshake.py), not their callers.
"""

from __future__ import annotations

from .frames import FrameStream, encode
from .wire import Auth, Challenge, Error, Welcome, WireError, auth_mac, decode


class HandshakeRefused(Exception):
    """The worker answered the handshake with an Error: its reason is the message."""


class TokenRequired(Exception):
    """The worker needs a token and this side has none."""


async def greet(stream: FrameStream, token: bytes | None, role: str, devices: list[str]) -> Welcome:
    """Answer the worker's challenge as `role` ("client" or "peer"), naming `devices` (a
    client's; a peer names none); return its Welcome. Raises HandshakeRefused with its
    reason, TokenRequired, or WireError when what answers does not speak this protocol."""
    challenge = await _receive(stream, Challenge, "a challenge")
    assert isinstance(challenge, Challenge)
    if challenge.needs_token and token is None:
        raise TokenRequired()
    mac = auth_mac(token, challenge.nonce) if token is not None and challenge.needs_token else b""
    await stream.send([encode(Auth(role, mac, devices))])
    welcome = await _receive(stream, Welcome, "a welcome")
    assert isinstance(welcome, Welcome)
    return welcome


async def _receive(stream: FrameStream, expected: type, what: str) -> object:
    meta, _ = await stream.receive()
    if meta[0] == "error":
        refusal = decode(meta)
        assert isinstance(refusal, Error)
        raise HandshakeRefused(refusal.why)
    got = decode(meta)
    if not isinstance(got, expected):
        raise WireError(f"expected {what} from the worker, got {meta[0]!r}")
    return got
