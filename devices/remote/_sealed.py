"""TLS records over a non-blocking socket, sealed and opened in memory: what a
`FrameStream` (frames.py) reads and writes when its connection speaks TLS.

`TLSSocket` is the standard library's `ssl.SSLObject` over two memory BIOs, in front of
one non-blocking TCP socket, with the calls a FrameStream makes of a plain socket:
`recv`, `recv_into` and `send`, which never wait and raise BlockingIOError where the
socket has nothing to read or no room, and `fileno` for trio to wait on. So a TLS
connection takes the paths a plain one takes, and goes through trio's scheduler only
where plain TCP does: a caller reads its own replay's report, a small frame leaves from
the task that makes it, and a read opens every record the socket holds before it waits.
A read asks the socket for up to `READ` bytes at once, into memory the connection
keeps, and opens records only while some are there (no failed open per read); a send
seals up to `WRITE` bytes of plaintext into records and hands them to the socket in one
call. What was sealed and not yet taken by the socket is its `backlog`: a send takes
nothing more until the socket took it, and `flush` (or a later send) finishes it.

The handshake (`handshake`) runs the same way, over the same socket, before the
connection's first frame. A peer that closes without a TLS goodbye (as every side here
does: `FrameStream.close`) reads as a closed connection.
"""

from __future__ import annotations

import socket
import ssl

import trio

READ = 1 << 20  # ciphertext asked of the socket at once
SMALL_READ = 1 << 15  # the same, while the other side is not trusted (its handshakes)
WRITE = 1 << 18  # plaintext sealed into records per send


class TLSSocket:
    """One TLS connection over a non-blocking socket (see the module docstring). One
    reader and one writer at a time, in one thread."""

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        server_side: bool,
        server_hostname: str | None = None,
    ) -> None:
        self.socket = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )
        self._backlog = memoryview(b"")
        # What a read asks of the socket at once: little until the connection's owner
        # says (read_at_most), so the TLS handshake of a stranger is not read in bulk.
        self._read = SMALL_READ
        # Where the socket's bytes land on their way into the incoming BIO, as large as
        # a read asks for (made once: a recv of a fresh bytes object that large costs an
        # allocation and its release every read, more than opening a small record).
        self._scratch = memoryview(b"")

    def read_at_most(self, n: int) -> None:
        """Ask the socket for at most `n` bytes at once (a connection not yet trusted
        is not read in bulk)."""
        self._read = n

    def fileno(self) -> int:
        return self.socket.fileno()

    @property
    def backlog(self) -> int:
        """Bytes sealed and not yet taken by the socket."""
        return len(self._backlog) + self._out.pending

    @property
    def pending(self) -> int:
        """Bytes received and not yet opened (more plaintext may be in them)."""
        return self._in.pending + self._tls.pending()

    async def handshake(self) -> None:
        """The TLS handshake, over the socket. Raises ssl.SSLError (the peer's
        certificate refused, a peer that does not speak TLS, ...) or OSError."""
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._drain()
                await self._receive()
        await self._drain()

    async def _drain(self) -> None:
        while self.backlog:
            try:
                self.flush()
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.socket)

    async def _receive(self) -> None:
        while True:
            try:
                self._take_in()
                return
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.socket)

    def _take_in(self) -> None:
        """Move what the socket holds into the incoming BIO (its end, once it closed).
        Raises BlockingIOError when it holds nothing."""
        scratch = self._scratch
        if len(scratch) < self._read:
            scratch = self._scratch = memoryview(bytearray(self._read))
        got = self.socket.recv_into(scratch, self._read)
        if got:
            self._in.write(scratch[:got])
        else:
            self._in.write_eof()

    def _opened_all(self) -> bool:
        """Whether no plaintext is left to open without more from the socket: nothing
        opened and unread, no ciphertext received and unopened, the end not seen (a read
        then needs the socket first; one would raise SSLWantReadError)."""
        return not self._tls.pending() and not self._in.pending and not self._in.eof

    def recv(self, n: int) -> bytes:
        """Up to `n` bytes of plaintext: what the records received hold, opening more
        from the socket while they hold none. b"" once the connection closed; raises
        BlockingIOError when nothing is there yet."""
        out = bytearray()
        while len(out) < n:
            if self._opened_all():
                if out:
                    break
                self._take_in()
            try:
                got = self._tls.read(n - len(out))
            except ssl.SSLWantReadError:
                if out:
                    break
                self._take_in()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break  # closed (with or without a TLS goodbye)
            if not got:
                break
            out += got
        return bytes(out)

    def recv_into(self, view: memoryview, nbytes: int = 0) -> int:
        """Fill `view` with plaintext, opening records straight into it: the count (0
        once the connection closed); raises BlockingIOError when nothing is there yet."""
        n = nbytes or len(view)
        have = 0
        while have < n:
            if self._opened_all():
                if have:
                    break
                self._take_in()
            try:
                # Given a buffer, read returns the count (typeshed says bytes).
                got: int = self._tls.read(n - have, view[have:])  # type: ignore[assignment]
            except ssl.SSLWantReadError:
                if have:
                    break
                self._take_in()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
            if not got:
                break
            have += got
        return have

    def send(self, data: bytes | memoryview) -> int:
        """Seal up to `WRITE` bytes of `data` and hand the records to the socket: the
        count of `data` taken (what the socket did not take yet stays in `backlog`).
        Raises BlockingIOError, having taken nothing, while the backlog has no room to
        go; OSError if the connection broke."""
        self.flush()
        if self._backlog:
            raise BlockingIOError
        view = memoryview(data)[:WRITE]
        self._tls.write(view)
        try:
            self.flush()
        except BlockingIOError:
            pass  # taken: the rest of its records leave with the next send or flush
        return len(view)

    def flush(self) -> None:
        """Hand the socket what was sealed. Raises BlockingIOError if it has no room for
        all of it (what it took is gone from the backlog)."""
        if not self._backlog and self._out.pending:
            self._backlog = memoryview(self._out.read())
        while self._backlog:
            sent = self.socket.send(self._backlog)
            self._backlog = self._backlog[sent:]
            if not self._backlog and self._out.pending:
                self._backlog = memoryview(self._out.read())

    def peek(self) -> bytes:
        """A byte of what was received and not yet read, if any (b"" once the socket
        closed); raises BlockingIOError when nothing is there. Reads nothing off."""
        if self.pending:
            return b"\0"
        return self.socket.recv(1, socket.MSG_PEEK)
