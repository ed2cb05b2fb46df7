"""Device names: `KIND:N` for a device of this process, `KIND:N@HOST:PORT` for one of a
worker (devices/remote)."""

from __future__ import annotations

import re

REMOTE_NAME = re.compile(r"^([A-Z]+):(\d+)@(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+):(\d{1,5})$")


def parse_remote_name(name: str) -> tuple[str, int, str, int] | None:
    """'CPU:0@127.0.0.1:7000' -> ('CPU', 0, '127.0.0.1', 7000); None if not a remote name."""
    match = REMOTE_NAME.match(name) if isinstance(name, str) else None
    if match is None:
        return None
    host = match.group(3).strip("[]")
    port = int(match.group(4))
    if not 0 < port < 65536:
        return None
    return match.group(1), int(match.group(2)), host, port
