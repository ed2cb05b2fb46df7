"""Where a worker may listen, and in what: the rules checked before it binds.

Off loopback, a worker's connections cross a network: without a token anyone there may
use it, and without TLS anyone on the path reads the buffers and can take over a
connection once its handshake is done (the token decides who opens a session, it does
not seal what follows). So a worker that binds anything but loopback needs a token, and
TLS unless it is told `--insecure-plaintext` (for a network its owner trusts).
"""

from __future__ import annotations

import ipaddress

INSECURE_FLAG = "--insecure-plaintext"

# The one-line command the README gives to make a self-signed certificate and its key.
SELF_SIGNED_HINT = (
    "the docs page 'TLS between clients and workers' gives one `openssl req -x509 ...` "
    "line that makes a self-signed pair"
)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address, or the name localhost) is this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def plaintext_problem(
    host: str, tls: bool, insecure_plaintext: bool, flag: str = INSECURE_FLAG
) -> str | None:
    """Why a worker must not serve `host` as asked, or None: off loopback it speaks TLS
    (`tls`) or is told `insecure_plaintext` (`flag` names that option to its user)."""
    if tls or insecure_plaintext or is_loopback(host):
        return None
    return (
        f"refusing to serve {host} over plain TCP: off loopback, anyone on the network "
        f"path reads the buffers and can take over a connection after its handshake (the "
        f"token does not protect that); give --tls-cert and --tls-key ({SELF_SIGNED_HINT}), "
        f"or pass {flag} on a network you trust"
    )


def token_problem(host: str, has_token: bool) -> str | None:
    """Why a worker without a token must not serve `host` (anything but loopback), or None."""
    if has_token or is_loopback(host):
        return None
    return f"refusing to serve {host} without a token; pass --token-file F"
