"""REMOTE frames: length-prefixed msgpack over one socket, for both sides of the protocol.

A frame is a fixed 16-byte header, a msgpack *meta* part and an optional raw *tail*:

    header = b"AG" | version: u16 | meta length: u32 | tail length: u64     (big-endian)
    meta   = one msgpack array [kind: str, *fields], msgpack's own types only (no ext types)
    tail   = raw bytes (buffer contents), so bulk data is never re-encoded or copied twice

Both lengths are checked against `Limits` before a byte of the body is read, so an
oversized frame costs the receiver nothing, and a frame of another protocol version is
refused at its header. What a meta part may hold is the wire module's (wire.py: typed
messages, each field checked); this one moves them. `decode_frame` is pure, so it can
be fuzzed on its own. TLS goes under `FrameStream`: it reads and writes one socket,
plain or through a `TLSSocket` (_sealed.py: records sealed and opened in memory, with a
plain socket's calls), and nothing above it does.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import msgpack  # type: ignore[import-untyped]
import trio

from ._sealed import READ as _TLS_READ
from ._sealed import SMALL_READ as _TLS_SMALL_READ
from ._sealed import TLSSocket
from .wire import VERSION, Limits, WireError, as_meta

MAGIC = b"AG"
HEADER = struct.Struct(">2sHIQ")

_READ = 1 << 16  # the most a read for a frame's header and meta asks for at once
_SMALL = 1 << 16  # frames below this are joined before sending: one syscall for a batch


class ConnectionLostError(ConnectionError):
    """The peer closed the connection or it broke."""


class FrameTooLarge(WireError):
    """A frame's header says it is larger than the receiver's limits allow."""


def pack(value: Any) -> bytes:
    """`value` (msgpack's own types) as msgpack, as a frame's meta is written."""
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def encode(message: Any, tail_len: int = 0) -> bytes:
    """Header + meta of one frame holding `message` (a typed message of wire.py, or the
    list [kind, *fields] itself); the caller sends `tail_len` raw bytes after it."""
    body = pack(as_meta(message))
    return HEADER.pack(MAGIC, VERSION, len(body), tail_len) + body


def parse_header(header: bytes, limits: Limits) -> tuple[int, int]:
    """(meta length, tail length) of a frame header, or WireError."""
    if len(header) != HEADER.size:
        raise WireError(f"frame header is {HEADER.size} bytes, got {len(header)}")
    magic, version, meta_len, tail_len = HEADER.unpack(header)
    if magic != MAGIC:
        raise WireError(f"not an actorgraph frame (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise WireError(f"protocol version {version} is not supported (this side speaks {VERSION})")
    if meta_len == 0 or meta_len > limits.max_meta:
        raise FrameTooLarge(f"frame meta of {meta_len} bytes is outside 1..{limits.max_meta}")
    if tail_len > limits.max_tail:
        raise FrameTooLarge(
            f"frame tail of {tail_len} bytes is over the limit of {limits.max_tail}"
        )
    return meta_len, tail_len


def _no_ext(code: int, data: bytes) -> object:
    raise WireError(f"msgpack ext type {code} is not allowed")


def decode_meta(body: bytes | bytearray | memoryview, limits: Limits) -> list[Any]:
    """The message in a frame's meta part: a non-empty list starting with its kind (a str)."""
    try:
        meta = msgpack.unpackb(
            body,
            raw=False,
            use_list=True,
            strict_map_key=True,
            ext_hook=_no_ext,
            max_str_len=limits.max_meta,
            max_bin_len=limits.max_meta,
            max_array_len=limits.max_program_ops * 8,
            max_map_len=1 << 10,
        )
    except WireError:
        raise
    except Exception as exc:  # msgpack raises many kinds; all mean the same here
        raise WireError(f"frame meta is not valid msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(meta, list) or not meta or not isinstance(meta[0], str):
        raise WireError("a message is a msgpack array whose first field is its kind (a str)")
    return meta


def decode_frame(data: bytes, limits: Limits) -> tuple[list[Any], bytes]:
    """Decode one whole frame held in memory: (message, tail). Raises only WireError."""
    meta_len, tail_len = parse_header(bytes(data[: HEADER.size]), limits)
    end = HEADER.size + meta_len
    if len(data) != end + tail_len:
        raise WireError(f"frame holds {len(data)} bytes, its header says {end + tail_len}")
    return decode_meta(data[HEADER.size : end], limits), bytes(data[end:])


# -- frames over a trio socket --


class FrameStream:
    """Frames over one connected socket. One reader task and one writer at a time.

    Given a plain (stdlib) socket, or a `TLSSocket` over one, it reads and writes it
    directly, non-blocking, and waits on trio only when the socket has nothing to read
    or no room to write: a frame that is already there costs no trip through trio's
    scheduler, and `send_nowait` lets a task send a small frame at once, without a
    writer task; a read waiting for bytes may be cancelled, losing nothing. A trio
    socket (tests that speak the raw protocol) goes through trio's own methods: `raw` is
    None, so its users send by a writer task.
    """

    def __init__(
        self,
        sock: trio.socket.SocketType | socket.socket | TLSSocket,
        limits: Limits,
    ) -> None:
        self.raw: socket.socket | TLSSocket | None = None
        self._tls: TLSSocket | None = None
        if isinstance(sock, TLSSocket):
            self.raw = self._tls = sock
            sock = sock.socket
        if isinstance(sock, socket.socket):
            self.raw = self.raw or sock
            sock = trio.socket.from_stdlib_socket(sock)
        self.sock: trio.socket.SocketType = sock
        self.limits = limits
        self._chunk = _chunk_for(limits)  # the most a read for a frame's head asks for
        self._read_at_most(limits)
        self._buf = bytearray()
        self._pos = 0
        self._eager = 0  # reads in a row that found data waiting: see _recv
        # Bytes of frames taken (headers, metas and tails, read or skipped): a point of
        # the stream the sender counts too (a client's `Transport.taken`).
        self.taken = 0

    async def _recv(self, n: int) -> bytes | bytearray:
        raw = self.raw
        if raw is None:
            return await self.sock.recv(n)
        while True:
            try:
                chunk = raw.recv(n)
            except BlockingIOError:
                self._eager = 0
                await _readable(raw)
                continue
            self._eager += 1
            if self._eager >= 64:
                # Data kept coming without a wait: let other tasks (and cancellation) in.
                self._eager = 0
                await trio.lowlevel.checkpoint()
            return chunk

    @property
    def tls(self) -> bool:
        """Whether the connection speaks TLS."""
        return self._tls is not None

    def _read_at_most(self, limits: Limits) -> None:
        """A TLS read asks the socket for little while frames are small (a handshake's:
        what a stranger sends is not taken in bulk), else for a lot at once."""
        if self._tls is not None:
            small = limits.max_meta + limits.max_tail < _TLS_READ
            self._tls.read_at_most(_TLS_SMALL_READ if small else _TLS_READ)

    async def _recv_into(self, view: memoryview) -> int:
        raw = self.raw
        if raw is None:
            return await self.sock.recv_into(view, len(view))
        while True:
            try:
                return raw.recv_into(view, len(view))
            except BlockingIOError:
                await _readable(raw)

    async def _fill(self, need: int) -> None:
        while len(self._buf) - self._pos < need:
            if self._pos:
                del self._buf[: self._pos]
                self._pos = 0
            chunk = await self._recv(max(self._chunk, need))
            if not chunk:
                raise ConnectionLostError("the connection was closed by the other side")
            self._buf += chunk

    @contextlib.contextmanager
    def limited(self, limits: Limits) -> Iterator[None]:
        """Check the frames received in the block against `limits` (a handshake's, which
        are small), and read no more at once than such a frame needs; then the stream's
        own limits again."""
        kept = self.limits
        self.limits, self._chunk = limits, _chunk_for(limits)
        self._read_at_most(limits)
        try:
            yield
        finally:
            self.limits, self._chunk = kept, _chunk_for(kept)
            self._read_at_most(kept)

    def _take(self, n: int) -> bytes:
        out = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        self.taken += n
        return out

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken: another frame may be waiting in them (TLS:
        records received and not yet opened count too)."""
        opened = len(self._buf) - self._pos
        return opened if self._tls is None else opened + self._tls.pending

    async def receive(self) -> tuple[list[Any], int]:
        """The next message, and the length of its tail (read it with receive_into/skip)."""
        await self._fill(HEADER.size)
        meta_len, tail_len = parse_header(self._take(HEADER.size), self.limits)
        await self._fill(meta_len)
        body = self._take(meta_len)
        return decode_meta(body, self.limits), tail_len

    def next_frame(self, tails: bool = True) -> tuple[list[Any], int] | None:
        """The next message and the length of its tail, if its header and meta are all
        received already (the tail is read with receive_into/skip); None if not, having
        taken nothing. With `tails=False`, a message that has a tail is left there too
        (`has_tail` then says so). Raises WireError on a bad header or meta."""
        buf, pos = self._buf, self._pos
        have = len(buf) - pos
        if have < HEADER.size:
            return None
        meta_len, tail_len = parse_header(bytes(buf[pos : pos + HEADER.size]), self.limits)
        end = pos + HEADER.size + meta_len
        if len(buf) < end or (tail_len and not tails):
            return None
        self._pos = end
        self.taken += end - pos
        return decode_meta(bytes(buf[pos + HEADER.size : end]), self.limits), tail_len

    @property
    def whole_next(self) -> bool:
        """Whether the next message is all received already (its header and meta), and
        has no tail: taking it waits for nothing."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER.size:
            return False
        _, _, meta_len, tail_len = HEADER.unpack_from(buf, pos)
        return not tail_len and len(buf) - pos - HEADER.size >= meta_len

    @property
    def has_tail(self) -> bool:
        """Whether the next message, its header received, has a tail."""
        pos = self._pos
        if len(self._buf) - pos < HEADER.size:
            return False
        return bool(HEADER.unpack_from(self._buf, pos)[3])

    async def wait_more(self) -> None:
        """Receive at least one more byte into the buffer (next_frame takes frames from
        it). Cancelling it loses nothing: bytes received are kept."""
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        chunk = await self._recv(1 << 16)
        if not chunk:
            raise ConnectionLostError("the connection was closed by the other side")
        self._buf += chunk

    async def receive_into(self, view: memoryview) -> None:
        """Fill `view` with the next len(view) bytes of the stream (a tail)."""
        n = len(view)
        self.taken += n
        have = min(n, len(self._buf) - self._pos)
        if have:
            view[:have] = self._buf[self._pos : self._pos + have]
            self._pos += have
        while have < n:
            got = await self._recv_into(view[have:])
            if not got:
                raise ConnectionLostError("the connection was closed by the other side")
            have += got

    async def skip(self, n: int) -> None:
        scratch = memoryview(bytearray(min(n, 1 << 20)))
        while n:
            step = min(n, len(scratch))
            await self.receive_into(scratch[:step])
            n -= step

    def send_nowait(self, data: bytes | memoryview) -> int:
        """Send what the socket takes of `data` now, without waiting: the count taken (0
        when it has no room). Over TLS, what was taken may still be partly in `backlog`,
        which the next `send` (even of nothing) finishes. Only on a stdlib socket (`raw`),
        and only while no send is under way (the caller keeps frames in order). A broken
        connection raises OSError."""
        assert self.raw is not None  # callers check `raw`
        try:
            return self.raw.send(data)
        except BlockingIOError:
            return 0

    @property
    def backlog(self) -> int:
        """Bytes taken by a send over TLS and not yet on the wire (0 without TLS)."""
        return 0 if self._tls is None else self._tls.backlog

    def peek(self) -> bytes:
        """Without waiting or taking anything: a byte of what was received and not read,
        b"" if the other side closed the connection. Raises BlockingIOError when nothing
        came, OSError if it broke. Only on a stdlib socket (`raw`)."""
        raw = self.raw
        if isinstance(raw, TLSSocket):
            return raw.peek()
        assert raw is not None  # callers check `raw`
        return raw.recv(1, socket.MSG_PEEK)

    async def send(self, parts: Sequence[bytes | memoryview]) -> None:
        """Send frames (headers, metas and tails, in order): small parts go in one syscall."""
        small: list[bytes | memoryview] = []
        for part in parts:
            if len(part) < _SMALL:
                small.append(part)
                continue
            if small:
                await self._send_all(b"".join(small))
                small = []
            await self._send_all(part)
        if small:
            await self._send_all(small[0] if len(small) == 1 else b"".join(small))

    async def _send_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        raw = self.raw
        while view:
            if raw is None:
                sent = await self.sock.send(view)
            else:
                try:
                    sent = raw.send(view)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(raw)
                    continue
            view = view[sent:]
        tls = self._tls
        while tls is not None and tls.backlog:
            try:
                tls.flush()
            except BlockingIOError:
                await trio.lowlevel.wait_writable(tls)

    def close(self) -> None:
        """Close the connection at once (no TLS goodbye): a task reading or writing it
        wakes with an error."""
        self.sock.close()


def _chunk_for(limits: Limits) -> int:
    """How much a read for a frame's header and meta asks for under `limits`."""
    return min(_READ, HEADER.size + limits.max_meta)


def plain_socket(family: int = socket.AF_INET) -> socket.socket:
    """A non-blocking TCP socket for a FrameStream."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


def no_delay(sock: socket.socket | trio.socket.SocketType) -> None:
    """Small frames go out at once (no Nagle): every frame here is a whole message."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Frame:
    """Parts to send as they are, in order; `sent` is set once they went (or never will:
    `error` says why). `writes`: they make or fill a buffer on the worker outside its
    queues (an alloc, a put), which another worker's read of it must follow."""

    __slots__ = ("error", "parts", "sent", "writes")

    def __init__(
        self,
        parts: list[bytes | memoryview],
        sent: trio.Event | None = None,
        writes: bool = False,
    ) -> None:
        self.parts = parts
        self.sent = sent
        self.writes = writes
        self.error: BaseException | None = None

    def went(self, error: BaseException | None) -> None:
        """It was sent (`error` None), or never will be (the connection's error)."""
        self.error = error
        if self.sent is not None:
            self.sent.set()


async def _readable(raw: socket.socket | TLSSocket) -> None:
    """Wait until `raw` has bytes to take. Woken by them but cancelled before the task
    ran (the reader task, whose socket a caller took meanwhile to read them itself:
    Transport.wait_done), raise Cancelled: the task takes none of them, and never waits
    on the socket beside that caller (trio refuses that: BusyResourceError)."""
    await trio.lowlevel.wait_readable(raw)
    await trio.lowlevel.checkpoint_if_cancelled()
