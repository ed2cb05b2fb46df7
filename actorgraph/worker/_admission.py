"""Connections not yet authenticated, and what a worker says of those it turns away.

Before a connection proves the token it is a stranger's: it holds a file and a little
memory of the worker's and gets nothing. `Admission` bounds how many of them the worker
holds, in all and per address, and sheds the oldest when a new one would pass a bound
(a client of the worker's answers the challenge within milliseconds, so the oldest is
the one most likely to never answer). Where accept finds no file left (the process's or
the system's limit), the worker sheds the oldest stranger to make room, and backs off
while there is none to shed, instead of exiting. `RareLog` says what it shed or refused
in a line at most every few seconds, with how many, so a flood of connections is not a
flood of log lines.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable

import trio

# What accept raises when the worker or the system is out of something a connection
# takes (files, socket buffers, memory): wait for some to come back, then go on.
SHORT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
BACKOFF_S = (0.01, 1.0)  # the first pause after accept ran short, and the longest


class Stranger:
    """One connection that has not authenticated: its address, and how to end it (cancel
    the stage of its handshake under way, close its socket)."""

    __slots__ = ("_scope", "address", "close", "was_shed")

    def __init__(self, address: str, close: Callable[[], None]) -> None:
        self.address = address
        self.close = close
        self.was_shed = False
        self._scope: trio.CancelScope | None = None

    def guard(self) -> trio.CancelScope:
        """A scope for one stage of its handshake (TLS, then the challenge), which
        `shed` cancels (cancelled from the start if it was shed already)."""
        self._scope = trio.CancelScope()
        if self.was_shed:
            self._scope.cancel()
        return self._scope

    def shed(self) -> None:
        self.was_shed = True
        if self._scope is not None:
            self._scope.cancel()
        self.close()  # its file comes back now, not when its task next runs


class Admission:
    """The connections not yet authenticated, oldest first, at most `most` in all and
    `per_address` from one address.

    Invariants: every Stranger in `_all` is in `_by_address[its address]` and the other
    way round; both keep arrival order."""

    def __init__(self, most: int, per_address: int, log: RareLog) -> None:
        self.most = most
        self.per_address = per_address
        self.log = log
        self._all: dict[Stranger, None] = {}
        self._by_address: dict[str, dict[Stranger, None]] = {}

    def __len__(self) -> int:
        return len(self._all)

    def arrive(self, address: str, close: Callable[[], None]) -> Stranger:
        """A new connection from `address`: the oldest one of its address is shed if
        that address is at its bound, else the oldest of all if all are at theirs."""
        same = self._by_address.get(address)
        if same is not None and len(same) >= self.per_address:
            self._shed(next(iter(same)), f"its address had {self.per_address} such")
        elif len(self._all) >= self.most:
            self._shed(next(iter(self._all)), f"there were {self.most} such in all")
        stranger = Stranger(address, close)
        self._all[stranger] = None
        self._by_address.setdefault(address, {})[stranger] = None
        return stranger

    def leave(self, stranger: Stranger) -> None:
        """`stranger` authenticated, or its connection ended."""
        if self._all.pop(stranger, 0) is None:
            same = self._by_address[stranger.address]
            del same[stranger]
            if not same:
                del self._by_address[stranger.address]

    def shed_oldest(self, why: str) -> bool:
        """Shed the oldest connection not yet authenticated (to free its file): whether
        there was one."""
        if not self._all:
            return False
        self._shed(next(iter(self._all)), why)
        return True

    def _shed(self, stranger: Stranger, why: str) -> None:
        self.leave(stranger)
        stranger.shed()
        self.log.note(
            "shed",
            f"shed {{count}} connection(s) that had not authenticated, the oldest first (the "
            f"latest from {stranger.address}, as {why}; bounds: --max-handshakes "
            f"{self.most}, --max-handshakes-per-address {self.per_address})",
            stranger.address,
        )


# The most kinds a verbose RareLog tells apart by address at once: past it, an event
# from yet another address is counted under its kind alone, so a flood from many
# addresses costs the worker a bounded table and a bounded number of lines.
MOST_ADDRESSES = 256


class RareLog:
    """Lines to stderr, at most one per kind every `every` seconds: a kind noted more
    often is counted, and its next line (when that time has passed) says how many.

    `verbose`: an event noted with its address is a kind of its own per address (at
    most `MOST_ADDRESSES` of them at once, the others counted under the kind alone), so
    each address's latest reason is said, still at most once every `every` seconds."""

    def __init__(self, every: float = 10.0, verbose: bool = False) -> None:
        self.every = every
        self.verbose = verbose
        self._next: dict[str, float] = {}  # kind -> when its next line may go out
        self._counts: dict[str, int] = {}
        self._lines: dict[str, str] = {}
        self._nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        """Counts left over are said by a task in `nursery`, once their time comes."""
        self._nursery = nursery

    def note(self, kind: str, line: str, address: str | None = None) -> None:
        """One more event of `kind`; `line` says it, its `{count}` replaced by how many
        there were since the last line of that kind. `address`: where it came from (a
        verbose log tells addresses apart)."""
        if self.verbose and address is not None:
            kind = self._by_address(kind, address)
        self._counts[kind] = self._counts.get(kind, 0) + 1
        self._lines[kind] = line
        now = trio.current_time()
        due = self._next.get(kind)
        if due is None or now >= due:
            self._say(kind, now)
        elif self._counts[kind] == 1 and self._nursery is not None:
            self._nursery.start_soon(self._say_later, kind, due)

    def _by_address(self, kind: str, address: str) -> str:
        """The kind of an event of `kind` from `address`: its own, while the table of
        kinds has room (kinds whose time has passed and that have nothing left to say
        leave it first), else `kind` itself."""
        own = f"{kind} from {address}"
        if own in self._next or len(self._next) < MOST_ADDRESSES:
            return own
        now = trio.current_time()
        for old in [k for k, due in self._next.items() if due <= now and k not in self._counts]:
            del self._next[old]
            self._lines.pop(old, None)
        return own if len(self._next) < MOST_ADDRESSES else kind

    def flush(self) -> None:
        """Say every count not said yet (the worker stops)."""
        for kind in list(self._counts):
            self._say(kind, trio.current_time())

    async def _say_later(self, kind: str, due: float) -> None:
        await trio.sleep_until(due)
        if self._counts.get(kind):
            self._say(kind, trio.current_time())

    def _say(self, kind: str, now: float) -> None:
        count = self._counts.pop(kind)
        line = self._lines[kind].replace("{count}", str(count))
        print(f"actorgraph worker: {line}", file=sys.stderr)
        self._next[kind] = now + self.every
