"""TLS under REMOTE connections: the standard library's `ssl`, its records sealed and
opened in memory under our own transport (_sealed.py's `TLSSocket`).

A worker started with a certificate and its key (`actorgraph worker --tls-cert F
--tls-key F`) speaks TLS on every connection it accepts; a client reaches it with
`open_runtime(..., remote_tls_ca=F)`, the CA (or the self-signed certificate itself)
that its certificate is checked against, host name included. A worker with a
certificate links to other workers over TLS as well, checking theirs against its
`--tls-ca` (by default its own certificate: workers that share one). The token is
checked as well, inside TLS (handshake.py): TLS says the worker is the one the CA
names and keeps the bytes private and whole; the token says who may use it.

The connecting side speaks first (its hello), so a client that does not speak TLS
meets a TLS worker's clear refusal (`PLAIN_REFUSED`), and a TLS client a plain worker's
first frame in place of the TLS handshake (`handshake_failure` says so).

Both ends use this module: a client (devices/remote/_transport.py) and a worker linking
to another (actorgraph/worker/_peers.py) connect with `client_context` and `connect_tls`;
a worker accepts with `server_context`, `speaks_plain` and `accept_tls`.
"""

from __future__ import annotations

import os
import socket
import ssl
from typing import Any

import trio

from ._sealed import TLSSocket
from .frames import MAGIC

__all__ = [
    "PLAIN_REFUSED",
    "TLS_HANDSHAKE_TIMEOUT_S",
    "TLSSetupError",
    "accept_tls",
    "client_context",
    "connect_tls",
    "handshake_failure",
    "server_context",
    "speaks_plain",
]

# How long a worker gives a connection to finish the TLS handshake, in seconds.
TLS_HANDSHAKE_TIMEOUT_S = 30


class TLSSetupError(ValueError):
    """A certificate, key or CA file could not be loaded: the message names it."""


def client_context(ca_file: Any, what: str) -> ssl.SSLContext:
    """A connecting side's context: it checks a worker's certificate against a CA, and
    that the certificate names the host connected to.

    Args:
        ca_file: the PEM file (a path) of the CA that signed the workers' certificates,
            or a worker's self-signed certificate itself.
        what: the option `ca_file` came from (`remote_tls_ca`, `--tls-ca`), for errors.

    Returns:
        The context, TLS 1.2 at least, for `connect_tls`.

    Raises:
        TLSSetupError: `ca_file` is not a path, names no file, or holds no CA
            certificate that loads; the message names `what` and the file.
    """
    path = _existing(ca_file, what)
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise TLSSetupError(
            f"{what}={path!r} holds no CA certificate that can be loaded ({exc}); give "
            f"the PEM file of the CA that signed the workers' certificates"
        ) from None
    # A worker's own certificate may be the anchor (workers sharing one certificate).
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def server_context(cert_file: Any, key_file: Any) -> ssl.SSLContext:
    """A worker's context, for `accept_tls`: its certificate chain and key.

    Args:
        cert_file: the PEM certificate (chain) the worker shows (`--tls-cert`).
        key_file: the PEM private key that goes with it (`--tls-key`).

    Returns:
        The context, TLS 1.2 at least.

    Raises:
        TLSSetupError: a path that is not one or names no file, or a certificate and
            key that cannot be loaded together; the message names the flags.
    """
    cert = _existing(cert_file, "--tls-cert")
    key = _existing(key_file, "--tls-key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TLSSetupError(
            f"--tls-cert {cert} with --tls-key {key} cannot be loaded ({exc}); give the "
            f"PEM certificate and the PEM private key that goes with it"
        ) from None
    return context


def _existing(path: Any, what: str) -> str:
    try:
        name = os.fspath(path)
    except TypeError:
        raise TLSSetupError(f"{what} takes a file path, got {type(path).__name__}") from None
    if not isinstance(name, str):
        name = os.fsdecode(name)
    if not os.path.isfile(name):
        raise TLSSetupError(f"{what}={name!r}: no such file")
    return name


async def connect_tls(sock: socket.socket, context: ssl.SSLContext, host: str) -> TLSSocket:
    """TLS over a connected non-blocking socket, its handshake done.

    Args:
        sock: a non-blocking socket connected to the worker.
        context: from `client_context`: the worker's certificate is checked against it.
        host: the host connected to, which the certificate must name.

    Returns:
        The TLS socket, ready for frames.

    Raises:
        ssl.SSLError, OSError: the handshake failed; `handshake_failure` says why, with
            the fix.
    """
    tls = TLSSocket(sock, context, server_side=False, server_hostname=host)
    await tls.handshake()
    return tls


async def accept_tls(sock: socket.socket, context: ssl.SSLContext) -> TLSSocket:
    """TLS over an accepted non-blocking socket, its handshake done.

    Args:
        sock: a non-blocking socket a worker accepted.
        context: from `server_context`.

    Returns:
        The TLS socket, ready for frames.

    Raises:
        ssl.SSLError, OSError: the connecting side's handshake failed.
    """
    tls = TLSSocket(sock, context, server_side=True)
    await tls.handshake()
    return tls


async def speaks_plain(sock: trio.socket.SocketType) -> bool:
    """Whether what connected to a TLS worker sent an actorgraph frame (a client without
    TLS, which a worker answers with `PLAIN_REFUSED`) rather than a TLS handshake.

    Args:
        sock: a socket a worker accepted; its first byte is peeked, not read.

    Returns:
        True for a plain frame's first byte.

    Raises:
        OSError: the socket failed.
    """
    first = await sock.recv(1, socket.MSG_PEEK)
    return first == MAGIC[:1]


# What a TLS worker answers (in a plain frame) a client that does not speak TLS.
PLAIN_REFUSED = (
    "this worker speaks TLS: a client opens the runtime with remote_tls_ca=FILE, the CA "
    "that signed the worker's --tls-cert (or sets ACTORGRAPH_TLS_CA=FILE; the actorgraph "
    "command: --tls-ca FILE); a worker linking to it needs --tls-cert and --tls-key of "
    "its own"
)


def handshake_failure(exc: BaseException, ca_option: str = "remote_tls_ca=") -> str:
    """Why a TLS handshake with a worker failed, with the fix.

    Args:
        exc: what `connect_tls` raised (its causes are searched for the ssl.SSLError).
        ca_option: where this side's CA comes from (`remote_tls_ca=`, `--tls-ca`), named
            in the fix.

    Returns:
        The reason, as a sentence: a refused certificate, a worker without TLS, or the
        error itself.
    """
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return (
            f"the worker's certificate was refused ({cause.verify_message}); give "
            f"{ca_option} the CA that signed the worker's --tls-cert, and a certificate "
            f"that names the host connected to"
        )
    if isinstance(cause, ssl.SSLError) and cause.reason in (
        "WRONG_VERSION_NUMBER",
        "RECORD_LAYER_FAILURE",
        "PACKET_LENGTH_TOO_LONG",
    ):
        return (
            "the worker does not speak TLS (it answered the TLS handshake with plain "
            f"frames); start it with --tls-cert and --tls-key, or leave out {ca_option}"
        )
    detail = (
        f"{type(cause).__name__}: {cause}" if cause is not None else f"{type(exc).__name__}: {exc}"
    )
    return f"the TLS handshake failed ({detail})"
