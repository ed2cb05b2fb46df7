"""The REMOTE protocol's messages: typed, versioned, shared by both of its sides.

Clients (devices/remote), workers (actorgraph.worker) and the links between workers
speak the messages below, and only them. A message goes over the wire as the msgpack
array [kind, *fields] in a frame (frames.py); here it is a NamedTuple whose fields are
named, in wire order. `decode` turns a received array into its message, checking every
field's type and range: anything else is a `WireError` that names the message and the
field ("message 'batch': base must be an int, got str"). A message may end in optional
fields; each says its default, and those are all the forms a message has.

`VERSION` is in every frame's header: a peer of another version is refused at its first
frame, naming both. It moves whenever a message's fields change.

    version 2: every message has the schema below; a program names its queue kind, a
               copy from another worker the queue it follows (`PullEntry.follows`)
    version 3: the handshake is mutual (`Hello`, `Challenge`, `Auth`, `Welcome` with the
               worker's proof), each MAC bound to the role, both nonces and its
               direction; a batch may ask to be profiled (`Batch.profile`), and the
               worker then sends each job's times (`JobTimes`) before its "done"; a
               client measures the worker's clock against its own with `Ping` and
               `Pong`. Optional fields left at their defaults are not sent (`as_meta`),
               so a batch that is not profiled goes as in version 2
    version 5: a dtype is its full numpy string, byte order included (`Alloc.dtype`:
               '<i4', '>f8', '|u1'; a name such as 'int32' is refused), so a buffer
               holds the same numbers on both sides whatever their byte orders; a `Ref`
               names its view's dtype when it is not its allocation's (a view with a
               dtype of its own), its offset counting elements of that dtype. A worker
               says at connect what CPU it runs on and whether it runs shipped programs
               (`Welcome.cpu`, `Welcome.programs`); a client ships a compiled CPU
               program once (`Code`, its bytes in the tail) and calls it by id
               (`CodeEntry`); a batch may say which of its device timelines the worker
               moves itself once the jobs that touch them end (`Batch.advances`)
    version 6: a client tells a worker how far it has written to the other workers that
               worker's copies read from (`Fence`: bytes of frames per source session),
               and a read between workers waits until the source has taken that much of
               its client's frames (`PRead.after`, `PWhen.after`): a copy to one worker
               that the client counts done once sent can no longer be overtaken by
               another worker's read of it
    version 7: a program's host reads are numbered in it (`HostReadEntry.read`) and a
               host write says how many blobs its bytes come in (`HostWriteEntry.chunks`);
               each batch names the read ids and blobs of its programs (`Batch.reads`,
               `Batch.blobs`, the blobs sent ahead of it), so a copy is a program kept
               like any other
    version 8: a shipped program's call carries no var values (`CodeEntry`): each batch
               sends those of its programs' calls (`Batch.values`), so a program bound
               to other var values (a decoder's next position) is the same program

A program's entries (`Prog.entries`) are messages of their own, decoded one by one as the
worker lowers them (`decode_entry`), so a refusal names the item it is about. The field
checks, and decoding and encoding by the table below, are in _fields.py; their names are
this module's too.

The handshake is four messages (`Hello`, `Challenge`, `Auth`, `Welcome`): the MACs and
tickets below are HMAC-SHA256 under the worker's token or a session's key.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, NamedTuple

import attrs

from ._fields import (
    DTYPES,
    DTYPES_TEXT,
    ID_MAX,
    REL_MAX,
    SLOT_MAX,
    VALUE_MAX,
    Ref,
    WireError,
    anything,
    as_meta,
    blob,
    decode,
    decode_entry,
    entry,
    flag,
    integer,
    kind_of,
    list_of,
    message,
    optional,
    pairs,
    ref,
    seconds,
    spans,
    text,
    want_bytes,
    want_int,
    want_list,
    want_str,
)

# The protocol's names, those of its field codecs (_fields.py) included.
__all__ = [
    "Alloc",
    "Auth",
    "Batch",
    "Blob",
    "CHUNK",
    "Challenge",
    "Code",
    "CodeEntry",
    "CopyEntry",
    "DTYPES",
    "DTYPES_TEXT",
    "Data",
    "Done",
    "Error",
    "Ext",
    "Fence",
    "Forget",
    "Free",
    "Get",
    "GetWhen",
    "HANDSHAKE_LIMITS",
    "Hello",
    "HostReadEntry",
    "HostWriteEntry",
    "ID_MAX",
    "ItemEntry",
    "JobTimes",
    "KernelEntry",
    "Limits",
    "LocalWaitEntry",
    "MAX_CPU_FEATURES",
    "MAX_CPU_FEATURE_CHARS",
    "NONCE_BYTES",
    "PRead",
    "PWatch",
    "PWhen",
    "Ping",
    "Pong",
    "Prog",
    "PullEntry",
    "Put",
    "REL_MAX",
    "Ref",
    "Relay",
    "SLOT_MAX",
    "Sig",
    "SignalEntry",
    "TO_CONNECTOR",
    "TO_WORKER",
    "VALUE_MAX",
    "VERSION",
    "WaitEntry",
    "Watch",
    "Welcome",
    "WireError",
    "as_meta",
    "decode",
    "decode_entry",
    "handshake_mac",
    "kind_of",
    "read_ticket",
    "ref",
    "want_int",
    "want_list",
    "watch_ticket",
]

VERSION = 8

CHUNK = 64 << 20  # bulk data goes in frames of at most this many bytes


@attrs.frozen
class Limits:
    """Size limits of one side of a connection. Every frame and allocation is checked."""

    max_meta: int = 16 << 20
    max_tail: int = 256 << 20
    max_session_bytes: int = 8 << 30
    max_alloc_bytes: int = 4 << 30
    max_programs: int = 4096
    max_program_ops: int = 1 << 20
    max_pending_blob_bytes: int = 1 << 30
    max_signals: int = 1 << 16
    max_code_count: int = 4096  # shipped programs a client may keep on a worker
    max_code_bytes: int = 256 << 20  # and their bytes

    def as_wire(self) -> dict[str, int]:
        return attrs.asdict(self)

    @classmethod
    def from_wire(cls, value: object) -> Limits:
        if not isinstance(value, dict):
            raise WireError(f"limits must be a map, got {type(value).__name__}")
        known = {f.name for f in attrs.fields(cls)}
        kwargs = {}
        for key, val in value.items():
            if key in known:
                kwargs[key] = want_int(val, key, 0, 1 << 62)
        return cls(**kwargs)


# Before a connection proves the token its frames are handshake messages (`Hello`,
# `Challenge`, `Auth`, `Welcome`, `Error`): a few hundred bytes, never a tail. Both sides
# read them with these limits, so a stranger cannot make the other hold a large frame.
HANDSHAKE_LIMITS = Limits(max_meta=8 << 10, max_tail=0)
# A Welcome's CPU features (`Welcome.cpu`): bounded so that the largest Welcome fits in
# those limits (under 7.2 KiB); a worker says at most these (WorkerCPU.of_this_host).
MAX_CPU_FEATURES = 320
MAX_CPU_FEATURE_CHARS = 20


_DIMS = list_of("launch dim", integer(1, 1 << 40), 3, size=3)
_ITEM = integer(-1, 1 << 40)
_VALUE = integer(-(1 << 63), (1 << 64) - 1)  # a var value as a shipped program takes it
_SLOT = integer(0, SLOT_MAX)
_REL = integer(0, REL_MAX)
_PORT = integer(1, 65535)
_TICKET = blob(32)
_EXT = pairs


# The handshake (see devices/remote/handshake.py). The connecting side (a client, or a
# worker opening a link) says Hello (its role and its nonce) and the worker its Challenge
# (its nonce, and whether it needs a token), each at once; the connecting side answers
# with Auth (its MAC, `handshake_mac`, and a client's devices); the worker says Welcome
# (a client's session: its id, the key its tickets are made with, the worker's limits,
# and the worker's own MAC, its proof that it holds the token too) or Error, and closes
# the connection after an Error.

NONCE_BYTES = 32


@message("hello", ("role", text(16)), ("hello nonce", blob(64)))
class Hello(NamedTuple):
    role: str  # "client" or "peer"
    nonce: bytes


@message("challenge", ("challenge nonce", blob(64)), ("needs token", flag))
class Challenge(NamedTuple):
    nonce: bytes
    needs_token: bool


@message("auth", ("mac", blob(64)), ("devices", list_of("device", text(), 1024)))
class Auth(NamedTuple):
    mac: bytes
    devices: list[str]  # a client's devices of the worker; a peer names none


def _cpu(value: Any, what: str) -> tuple[str, list[str]]:
    """[machine, [feature, ...]]: the CPU a worker runs on, as a compiler targets it
    (a tuple: the default of a Welcome that leaves it out)."""
    fields = want_list(list(value) if type(value) is tuple else value, what, 2, size=2)
    features = want_list(fields[1], "cpu features", MAX_CPU_FEATURES)
    return (
        want_str(fields[0], "cpu machine", 32),
        [want_str(feature, "cpu feature", MAX_CPU_FEATURE_CHARS) for feature in features],
    )


@message(
    "welcome",
    ("session id", integer()),
    ("session key", blob(64)),
    ("limits", anything),
    ("proof", blob(64)),
    ("worker cpu", _cpu),
    ("programs", flag),
)
class Welcome(NamedTuple):
    """`cpu`: the machine (x86_64, arm64, ...) and instruction-set features of the
    worker's CPU; `programs`: whether it runs shipped programs (`--allow-programs`)."""

    session: int
    key: bytes
    limits: dict[str, int]
    proof: bytes  # the worker's MAC (empty when it has no token)
    cpu: tuple[str, list[str]] = ("", [])
    programs: bool = False


@message(
    "error",
    ("refused request", text()),
    ("request id", integer(-(1 << 63))),
    ("why", text(1 << 16)),
)
class Error(NamedTuple):
    """A request refused (the session goes on), or, at the handshake, a connection."""

    request: str
    id: int  # the request's own id (its read id, batch id, ...), or 0
    why: str


# A client's requests to its session.


@message(
    "alloc",
    ("alloc handle", integer()),
    ("alloc device", text()),
    ("alloc size", integer()),
    ("alloc dtype", text(32)),
)
class Alloc(NamedTuple):
    """A new buffer of `elements` of `dtype` (one of DTYPES) on the worker's `device`."""

    handle: int
    device: str
    elements: int
    dtype: str


@message("free", ("free handle", integer()))
class Free(NamedTuple):
    handle: int


@message("forget", ("program id", integer()))
class Forget(NamedTuple):
    program: int


@message("ext", ("ext", _EXT))
class Ext(NamedTuple):
    """Mirrored signals' new values: [[mirror id, value], ...]."""

    values: list[tuple[int, int]]


def _fence(value: Any, what: str) -> list[tuple[str, int, int, int]]:
    out = []
    for item in want_list(value, what, 1 << 12):
        fields = want_list(item, "fence entry", 4, size=4)
        out.append(
            (
                want_str(fields[0], "fence host"),
                want_int(fields[1], "fence port", 1, 65535),
                want_int(fields[2], "fence session"),
                want_int(fields[3], "fence bytes", 0, 1 << 62),
            )
        )
    return out


@message("fence", ("fence", _fence))
class Fence(NamedTuple):
    """How far the client has written to other workers this one reads from: [[host,
    port, session id, bytes], ...], each the bytes of the frames the client had sent
    that session when it sent what follows. A read from that session (`PRead.after`,
    `PWhen.after`) waits until the source has taken them."""

    sources: list[tuple[str, int, int, int]]


@message(
    "prog",
    ("program id", integer()),
    ("program device", text()),
    ("program", anything),
    ("store", flag),
    ("queue kind", text(16)),
)
class Prog(NamedTuple):
    """A program: one queue's op list as entries (decoded as they are lowered); `store`:
    kept for later batches, else used by the next batch only."""

    program: int
    device: str
    entries: list[Any]
    store: bool
    kind: str = "compute"


def _advances(value: Any, what: str) -> list[tuple[int, int, list[int]]]:
    """[[mirror id, value, [job, ...]], ...]: mirrors a batch's jobs move as they end."""
    out = []
    for advance in want_list(value, what, 1 << 12):
        fields = want_list(advance, "advance", 3, size=3)
        jobs = want_list(fields[2], "advance jobs", 1 << 16)
        out.append(
            (
                want_int(fields[0], "signal id"),
                want_int(fields[1], "advance value", 0, VALUE_MAX),
                [want_int(job, "advance job", 0, 1 << 16) for job in jobs],
            )
        )
    return out


@message(
    "batch",
    ("batch id", integer()),
    ("bases", list_of("base", integer(0, VALUE_MAX), 1 << 17)),
    ("program ids", list_of("program id", integer(), 1 << 16)),
    ("mirror values", _EXT),
    ("profile", flag),
    ("advances", _advances),
    ("reads", list_of("program's reads", list_of("read id", integer(), 1 << 12), 1 << 16)),
    ("blobs", list_of("program's blobs", list_of("blob id", integer(), 1 << 16), 1 << 16)),
    ("values", list_of("program's var values", list_of("var value", _VALUE, 1 << 16), 1 << 16)),
)
class Batch(NamedTuple):
    """One job of each program, relative to `bases` (devices/_ops.py's slots), with the
    mirrored signals' values as of now. `profile`: time the jobs and send their
    `JobTimes` (left out when False, so an unprofiled batch carries nothing for it).
    `advances`: [mirror id, value, [job, ...]]: set that mirror to the value once those
    jobs (by their place in `programs`) have ended: a device timeline that only this
    worker's jobs of the submission move, which its next submissions wait on here, with
    no word from the client in between. `reads`: for each program (left out when none
    has any), the read ids of its host reads in their order (HostReadEntry.read); `blobs`:
    likewise, the ids of the blobs its host writes land, in order (HostWriteEntry.chunks
    each). So a program that copies to or from the client is kept like any other, and
    each batch of it names its own reads and bytes. `values`: likewise, the var values
    of each program's calls of shipped programs (`CodeEntry`), in order, as many as
    each call's program takes: a program is kept whatever its var values are."""

    batch: int
    bases: list[int]
    programs: list[int]
    ext: list[tuple[int, int]]
    profile: bool = False
    advances: list[tuple[int, int, list[int]]] = []
    reads: list[list[int]] = []
    blobs: list[list[int]] = []
    values: list[list[int]] = []


@message(
    "getwhen",
    ("read id", integer()),
    ("getwhen src", ref),
    ("queue", text()),
    ("queue value", integer(0, VALUE_MAX + REL_MAX)),
)
class GetWhen(NamedTuple):
    """Send a buffer's bytes once the client's queue reaches a value."""

    read: int
    src: Ref
    queue: str
    value: int


@message(
    "watch",
    ("read id", integer()),
    ("queue", text()),
    ("queue value", integer(0, VALUE_MAX + REL_MAX)),
)
class Watch(NamedTuple):
    """Answer (a Data of no bytes) once the client's queue reaches a value."""

    read: int
    queue: str
    value: int


@message("blob", ("blob id", integer()))
class Blob(NamedTuple):
    """A host write's bytes, in the tail, ahead of the program that uses them."""

    blob: int


@message("put", ("put dst", ref), ("put offset", integer()))
class Put(NamedTuple):
    """Bytes (the tail) into a buffer at an offset (bytes)."""

    dst: Ref
    offset: int


@message(
    "code",
    ("code id", integer()),
    ("code digest", blob(32)),
    ("code name", text()),
    ("code machine", text(32)),
    ("code features", list_of("code feature", text(64), 4096)),
    ("code buffers", integer(0, 64)),
    ("code values", integer(0, 64)),
    ("core id", optional(integer(0, 63))),
)
class Code(NamedTuple):
    """A compiled CPU program (a relocatable ELF object, the tail) for later `CodeEntry`s
    to call by `code` id: built for `machine` with the instruction-set `features` it
    needs; its function takes `buffers` addresses, then `values` 64-bit integers, of
    which the one at `core_id` (if any) is the core number of the call. `digest`: the
    SHA-256 of the bytes."""

    code: int
    digest: bytes
    name: str
    machine: str
    features: list[str]
    buffers: int
    values: int
    core_id: int | None


@message("get", ("read id", integer()), ("get src", ref))
class Get(NamedTuple):
    read: int
    src: Ref


@message("ping", ("ping id", integer()))
class Ping(NamedTuple):
    """Answer with a Pong at once: one round trip of a clock measurement."""

    ping: int


# A worker's reports to its client (and the answers of a link between workers).


@message(
    "pong",
    ("ping id", integer()),
    ("ping received", seconds),
    ("pong sent", seconds),
)
class Pong(NamedTuple):
    """The answer to a Ping: when the worker received it and when it answered, on the
    worker's clock (its `time.perf_counter`)."""

    ping: int
    received: float
    sent: float


@message(
    "times",
    ("batch id", integer()),
    ("signal slot", _SLOT),
    ("batch received", seconds),
    ("times sent", seconds),
    ("job start", optional(seconds)),
    ("job end", optional(seconds)),
    ("spans", spans),
)
class JobTimes(NamedTuple):
    """A profiled batch's job, as it ran, on the worker's clock (its `time.perf_counter`):
    sent before the job's Done. `spans` holds [entry index, start, end] for each entry of
    its program that ran an item or parked on a wait (indices into `Prog.entries`, which
    are the client's op indices); `received` (when the batch arrived) and `sent` (now)
    make this report one round trip of a clock measurement."""

    batch: int
    slot: int
    received: float
    sent: float
    start: float | None
    end: float | None
    spans: list[tuple[int, float, float]]


@message("sig", ("batch id", integer()), ("signal slot", _SLOT), ("signal value", _REL))
class Sig(NamedTuple):
    batch: int
    slot: int
    rel: int


def _job_error(value: Any, what: str) -> tuple[int, str, str]:
    fields = want_list(value, what, 3, size=3)
    return (
        want_int(fields[0], "failed item", -(1 << 62), 1 << 62),
        want_str(fields[1], "failed actor"),
        want_str(fields[2], "failure", 1 << 16),
    )


@message("done", ("batch id", integer()), ("signal slot", _SLOT), ("failure", optional(_job_error)))
class Done(NamedTuple):
    """A job of a batch ended: with (item, actor, message) if its submission failed."""

    batch: int
    slot: int
    error: tuple[int, str, str] | None


@message(
    "data",
    ("read id", integer()),
    ("data offset", integer()),
    ("read error", optional(text(1 << 16))),
)
class Data(NamedTuple):
    """A read's bytes at `offset` (the tail), or why it cannot be read."""

    read: int
    offset: int
    error: str | None


@message(
    "relay",
    ("batch id", integer()),
    ("peer host", text()),
    ("peer port", _PORT),
    ("why", text(1 << 16)),
)
class Relay(NamedTuple):
    """This worker's link to the worker at host:port failed while a job of the batch waited
    on it: the client relays those waits."""

    batch: int
    host: str
    port: int
    why: str


# Reads over a link between two workers (each checked against its ticket).


@message(
    "pread",
    ("request id", integer()),
    ("session id", integer()),
    ("pread src", ref),
    ("ticket", _TICKET),
    ("after", integer(0, 1 << 62)),
)
class PRead(NamedTuple):
    """A buffer's bytes once the source has taken `after` bytes of its client's frames
    (the client's last `Fence` for it), at once if it has."""

    request: int
    session: int
    src: Ref
    ticket: bytes
    after: int = 0


@message(
    "pwhen",
    ("request id", integer()),
    ("session id", integer()),
    ("pread src", ref),
    ("ticket", _TICKET),
    ("queue", text()),
    ("queue value", integer(0, 1 << 63)),
    ("after", integer(0, 1 << 62)),
)
class PWhen(NamedTuple):
    """A buffer's bytes once the session's queue reaches a value, and the source has
    taken `after` bytes of its client's frames (as PRead)."""

    request: int
    session: int
    src: Ref
    ticket: bytes
    queue: str
    value: int
    after: int = 0


@message(
    "pwatch",
    ("request id", integer()),
    ("session id", integer()),
    ("queue", text()),
    ("queue value", integer(0, 1 << 63)),
    ("ticket", _TICKET),
)
class PWatch(NamedTuple):
    """Answer (a Data of no bytes) once the session's queue reaches a value."""

    request: int
    session: int
    queue: str
    value: int
    ticket: bytes


# -- a program's entries --


@entry(
    "k",
    ("item index", _ITEM),
    ("kernel name", text()),
    ("buffers", list_of("kernel buffer", ref, 64)),
    ("vars", list_of("var value", integer(-(1 << 62), 1 << 62), 64)),
    ("global size", _DIMS),
    ("local size", _DIMS),
)
class KernelEntry(NamedTuple):
    item: int
    kernel: str
    buffers: list[Ref]
    vars: list[int]
    global_size: list[int]
    local_size: list[int]


@entry(
    "x",
    ("item index", _ITEM),
    ("code id", integer()),
    ("buffers", list_of("code buffer", ref, 64)),
    ("global size", _DIMS),
    ("local size", _DIMS),
)
class CodeEntry(NamedTuple):
    """A call of a shipped program (`Code`): once per core, `global_size[0]` times, with
    the var values each batch sends for it (`Batch.values`)."""

    item: int
    code: int
    buffers: list[Ref]
    global_size: list[int]
    local_size: list[int]


@entry("c", ("item index", _ITEM), ("copy dst", ref), ("copy src", ref))
class CopyEntry(NamedTuple):
    """A copy within the worker."""

    item: int
    dst: Ref
    src: Ref


def _follows(value: Any, what: str) -> tuple[int, int, int]:
    fields = want_list(value, what, 3, size=3)
    return (
        want_int(fields[0], "wait slot", 0, SLOT_MAX),
        want_int(fields[1], "wait value", 0, REL_MAX),
        want_int(fields[2], "signal id"),
    )


@entry(
    "p",
    ("item index", _ITEM),
    ("pull dst", ref),
    ("peer host", text()),
    ("peer port", _PORT),
    ("peer session", integer()),
    ("peer buffer", ref),
    ("read ticket", _TICKET),
    ("peer queue", text()),
    ("follows", optional(_follows)),
)
class PullEntry(NamedTuple):
    """A copy from another worker's buffer. `queue`: the source's queue this copy follows
    a wait on (DEVICE or DEVICE/copy), with that wait (slot, value, mirror id) as
    `follows`, or the source device and None: the copy reads when it runs."""

    item: int
    dst: Ref
    host: str
    port: int
    session: int
    src: Ref
    ticket: bytes
    queue: str
    follows: tuple[int, int, int] | None = None


@entry("hw", ("item index", _ITEM), ("host write dst", ref), ("chunks", integer(1, 1 << 12)))
class HostWriteEntry(NamedTuple):
    """Land host bytes in `dst`: they come in `chunks` blobs (Blob frames ahead of the
    batch), the next of those each batch names for its program (Batch.blobs)."""

    item: int
    dst: Ref
    chunks: int


@entry("hr", ("item index", _ITEM), ("host read src", ref), ("read index", integer(0, 1 << 12)))
class HostReadEntry(NamedTuple):
    """Send `src`'s bytes to the client: `read` is its place among its program's host
    reads (0, 1, ...), and each batch names the read id of each (Batch.reads)."""

    item: int
    src: Ref
    read: int


# The entries that run an item of the client's program (a WIRE op's entry), each with its
# index in `item`: the others are its waits and signals.
ItemEntry = KernelEntry | CodeEntry | CopyEntry | PullEntry | HostWriteEntry | HostReadEntry


def _watch_source(value: Any, what: str) -> tuple[str, int, int, str, bytes]:
    fields = want_list(value, what, 5, size=5)
    return (
        want_str(fields[0], "peer host"),
        want_int(fields[1], "peer port", 1, 65535),
        want_int(fields[2], "peer session"),
        want_str(fields[3], "peer queue"),
        want_bytes(fields[4], "watch ticket", 32),
    )


@entry(
    "w",
    ("signal id", integer()),
    ("wait slot", _SLOT),
    ("wait value", _REL),
    ("wait source", optional(_watch_source)),
)
class WaitEntry(NamedTuple):
    """A wait on a mirror of a signal off this worker; `source`: the queue of another
    worker it mirrors, which tells this one itself (host, port, session, queue, ticket)."""

    mirror: int
    slot: int
    rel: int
    source: tuple[str, int, int, str, bytes] | None = None


@entry(
    "l",
    ("wait device", text()),
    ("wait slot", _SLOT),
    ("wait value", _REL),
    ("queue kind", text(16)),
)
class LocalWaitEntry(NamedTuple):
    """A wait on a queue of this worker in the same batch."""

    device: str
    slot: int
    rel: int
    kind: str = "compute"


@entry("s", ("signal slot", _SLOT), ("signal value", _REL), ("report", integer(0, 1)))
class SignalEntry(NamedTuple):
    """The queue's own signal; `report` 0: nobody off this worker waits on it."""

    slot: int
    rel: int
    report: int = 1


# -- authentication --


# The two directions a handshake MAC is made in: the connecting side's answer to the
# worker, and the worker's proof to the connecting side. Neither can stand for the other.
TO_WORKER = "connecting side to worker"
TO_CONNECTOR = "worker to connecting side"


def handshake_mac(
    token: bytes, role: str, connector_nonce: bytes, worker_nonce: bytes, direction: str
) -> bytes:
    """A handshake's MAC: HMAC-SHA256 under the shared token of the role the connection
    asked for, the connecting side's nonce, the worker's nonce and the direction it is
    sent in, each length-prefixed. A MAC made for one connection, role or direction is
    worth nothing on another: each side's nonce is fresh, and each side checks its own."""
    parts = (
        b"actorgraph handshake",
        direction.encode(),
        role.encode(),
        connector_nonce,
        worker_nonce,
    )
    message = b"".join(len(part).to_bytes(2, "big") + part for part in parts)
    return hmac.digest(token, message, hashlib.sha256)


def watch_ticket(session_key: bytes, queue: str) -> bytes:
    """A capability to be told how far one queue of one session has got (for waits
    between workers)."""
    return hmac.new(session_key, b"watch\0" + queue.encode(), hashlib.sha256).digest()[:16]


def read_ticket(session_key: bytes, handle: int) -> bytes:
    """A capability to read one allocation of one session (for worker-to-worker copies)."""
    return hmac.new(session_key, b"read\0%d" % handle, hashlib.sha256).digest()[:16]
