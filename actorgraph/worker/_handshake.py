"""The worker's side of the handshake (the connecting side's is
actorgraph/devices/remote/_handshake.py): challenge a new connection, check its answer.

A client must answer the challenge with the worker's token (when it has one); another
worker linking to this one answers the same challenge with the same token (the workers
of a runtime share it; a worker without one serves loopback only, as for clients) and
can then only read allocations named by a ticket.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Sequence

import trio

from actorgraph.devices.remote.frames import FrameStream
from actorgraph.devices.remote.wire import (
    Auth,
    Challenge,
    Limits,
    Welcome,
    WireError,
    auth_mac,
    decode,
)

from ._outbox import Outbox

HANDSHAKE_TIMEOUT_S = 30


async def challenge(
    stream: FrameStream, out: Outbox, token: bytes | None, limits: Limits, devices: Sequence[str]
) -> str:
    """Challenge the connection on `stream` and check its answer: its role, "client" (its
    session is welcomed by the caller) or "peer" (welcomed here). A WireError says why
    it is refused (the caller answers it and closes the connection)."""
    nonce = secrets.token_bytes(32)
    out.send(Challenge(nonce, token is not None))
    with trio.fail_after(HANDSHAKE_TIMEOUT_S):
        meta, tail = await stream.receive()
    try:
        auth = decode(meta)
    except WireError:
        auth = None
    if not isinstance(auth, Auth) or tail:
        raise WireError("the first message must be ['auth', role, mac, devices]")
    if auth.role not in ("client", "peer"):
        raise WireError(f"unknown role {auth.role!r}: a connection is a 'client' or a 'peer'")
    if token is not None and not hmac.compare_digest(auth.mac, auth_mac(token, nonce)):
        if auth.role == "peer":
            raise WireError(
                "authentication failed: a worker-to-worker link needs this worker's "
                "token; start every worker of a runtime with the same --token-file"
            )
        raise WireError("authentication failed: wrong or missing token")
    if auth.role == "peer":
        if auth.devices:
            raise WireError(
                "a peer names no devices: its first message is ['auth', 'peer', mac, []]"
            )
        out.send(Welcome(0, b"", limits.as_wire()))
        return "peer"
    for name in auth.devices:
        if name not in devices:
            raise WireError(f"this worker has no device {name!r} (it has {list(devices)})")
    return "client"
