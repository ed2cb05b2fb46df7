"""A worker's sessions (actorgraph/worker/_session.py, _server.py): every refusal is an
error reply, the session and the worker go on, one client cannot stall another, and
peers read only what a ticket names. Spoken to over the raw wire protocol.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from _workers import GUARD, TOKEN, handshake, hello, runtime, start
from _workers import Replies as _Replies
from actorgraph.devices import Job, QueueActor, RunOp, Submission
from actorgraph.devices.remote.frames import HEADER, FrameStream, decode_frame, encode
from actorgraph.devices.remote.wire import (
    TO_WORKER,
    VERSION,
    Limits,
    WireError,
    as_meta,
    decode,
    handshake_mac,
    read_ticket,
    ref,
)
from actorgraph.scheduler import QueueKind

import actorgraph as ag
from actorgraph import remote
from actorgraph.testing import Worker
from actorgraph.worker._kernels import load_kernels
from actorgraph.worker._lowered import Refused
from actorgraph.worker._outbox import Outbox
from actorgraph.worker._server import Worker as WorkerServer
from actorgraph.worker._session import Session
from actorgraph.worker._staging import land

sys.path.insert(0, str(Path(__file__).parent))
from remote_kernels import GATED, INC, INC_GPU


async def _raw(port: int, limits: Limits | None = None) -> FrameStream:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    return FrameStream(sock, limits or Limits())


async def _session(port: int, devices: tuple[str, ...] = ("CPU:0",)) -> FrameStream:
    stream = await _raw(port)
    meta = await handshake(stream, "client", devices)
    assert meta[0] == "welcome"
    return stream


async def _peer(port: int, token: bytes = TOKEN) -> FrameStream:
    """A worker-to-worker link, as a worker holding `token` opens it."""
    stream = await _raw(port)
    meta = await handshake(stream, "peer", (), token)
    assert meta[0] == "welcome", meta
    return stream


async def _still_serves(worker: Worker) -> None:
    async with runtime([worker.name("CPU:0")]) as rt:
        x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
        await rt.copyin(x, np.arange(4, dtype=np.int32))
        np.testing.assert_array_equal(await rt.copyout(x), np.arange(4))


async def test_refuses_missing_and_wrong_tokens(
    workers: tuple[Worker, Worker],
) -> None:
    worker, _ = workers
    with trio.fail_after(GUARD):
        with pytest.raises(
            remote.RemoteConnectionError,
            match=re.escape(
                f"cannot connect to the worker at 127.0.0.1:{worker.port}: the worker is running and "
                f"requires a token; pass open_runtime(..., remote_token_file=PATH) naming its "
                f"--token-file, or set ACTORGRAPH_TOKEN_FILE=PATH (the actorgraph command: "
                f"--token-file PATH)"
            ),
        ) as info:
            async with ag.open_runtime([worker.name("CPU:0")]):
                pass
        assert "start one" not in str(info.value)  # it runs: starting another is no help
        with pytest.raises(
            remote.RemoteConnectionError,
            match=re.escape(
                f"cannot connect to the worker at 127.0.0.1:{worker.port}: the worker is running but "
                f"refused this client's token (authentication failed: wrong or missing token); check "
                f"that remote_token= or remote_token_file= holds the token in the worker's --token-file"
            ),
        ) as info:
            async with ag.open_runtime([worker.name("CPU:0")], remote_token=b"wrong"):
                pass
        assert "start one" not in str(info.value)
        stream = await _raw(worker.port)
        await hello(stream, "client")
        await stream.send([encode(["auth", b"", ["CPU:0"]])])
        meta, _ = await stream.receive()
        assert meta[0] == "error" and "authentication failed" in meta[-1]
        await _still_serves(worker)


async def test_refuses_malformed_and_oversized_frames(
    workers: tuple[Worker, Worker],
) -> None:
    worker, _ = workers
    bad_frames = [
        b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 16,  # not our magic
        HEADER.pack(b"AG", 99, 4, 0) + b"\x91\xa1x\0",  # unknown version
        HEADER.pack(b"AG", VERSION, 3, 0) + b"\xc1\xc1\xc1",  # not msgpack
        HEADER.pack(b"AG", VERSION, 1 << 30, 0),  # meta over the limit: refused unread
        HEADER.pack(b"AG", VERSION, 2, 1 << 40) + b"\x91\x00",  # tail over the limit
    ]
    with trio.fail_after(GUARD):
        for frame in bad_frames:
            stream = await _session(worker.port)
            await stream.send([frame])
            meta, _ = await stream.receive()
            assert meta[0] == "error" and meta[1] == "frame", meta
            assert await stream.sock.recv(1) == b""  # and that connection is closed
        await _still_serves(worker)


async def test_refuses_bad_requests_and_keeps_the_session(
    workers: tuple[Worker, Worker],
) -> None:
    worker, _ = workers
    with trio.fail_after(GUARD):
        async with runtime([worker.name("CPU:0")]) as rt:
            # Another client's buffer: it exists on the worker, but not in our session.
            theirs = rt.alloc(worker.name("CPU:0"), 4, np.int32)
            await rt.copyin(theirs, np.arange(4, dtype=np.int32))
            handle = theirs.memory.handle
            stream = await _session(worker.port)
            requests = [
                (["get", 1, [handle, 0, [4]]], "unknown buffer id"),
                (["alloc", "x", "CPU:0", 4, "<i4"], "must be an int"),
                (["alloc", 1, "CPU:0", 1 << 40, "|i1"], "over the limit"),
                (["alloc", 2, "CPU:0", 4, "object"], "'object' is not a bool, int, uint, float"),
                # A name says no byte order: the worker would read it as its own.
                (
                    ["alloc", 4, "CPU:0", 4, "int32"],
                    "'int32' is not a bool, int, uint, float or complex dtype written with its "
                    "byte order, as numpy's dtype.str writes it ('<i4', '>f8', '|u1', ...)",
                ),
                (["get", 1, [handle, 0, [4], "int32"]], "get src dtype is 'int32', not a bool"),
                (["alloc", 3, "GPU:7", 4, "<i4"], "no device 'GPU:7'"),
                (["batch", 9, [0, 0, 0], [12345], []], "unknown program id 12345"),
                (["frobnicate", 1], "unknown message 'frobnicate'"),
                # A message of the protocol that a worker sends, not a client.
                (
                    ["sig", 1, 2, 3],
                    "unknown request 'sig': a client sends only alloc, batch, ext, fence, forget, "
                    "free, getwhen, ping, prog, watch without data",
                ),
                (["free"], "has 1 fields, got 0"),
            ]
            for request, message in requests:
                await stream.send([encode(request)])
                meta, _ = await stream.receive()
                assert meta[0] == "error" and message in meta[-1], (request, meta)
            # Base slots: KICK, BATCH, then the queues' own (from 2; devices/_ops.py).
            bases = [0, 0, 0]
            # A program naming an unknown kernel is refused when a batch runs it.
            await stream.send([encode(["alloc", 5, "CPU:0", 4, "<i4"])])
            prog = [["k", 0, "nope", [[5, 0, [4]]], [], [1, 1, 1], [1, 1, 1]], ["s", 2, 1]]
            await stream.send(
                [encode(["prog", 1, "CPU:0", prog, False]), encode(["batch", 2, bases, [1], []])]
            )
            meta, _ = await stream.receive()
            assert meta[:3] == ["done", 2, 2] and "unknown kernel 'nope'" in meta[3][2]
            # The session still works: a valid program runs.
            inc = ["k", 0, "inc", [[5, 0, [4]], [5, 0, [4]]], [], [1, 1, 1], [1, 1, 1]]
            await stream.send(
                [
                    encode(["prog", 3, "CPU:0", [inc, ["s", 2, 1]], False]),
                    encode(["batch", 4, bases, [3], []]),
                ]
            )
            meta, _ = await stream.receive()
            assert meta == ["done", 4, 2, None]
            # A program may not signal past its own range on the shared queue, nor on the
            # slots of KICK and BATCH.
            for prog_id, prog, message in [
                (5, [["s", 2, 1000]], "signals must rise to its item count"),
                (7, [inc, ["s", 1, 1]], "signals on base slot 1, which is KICK or BATCH"),
            ]:
                await stream.send(
                    [
                        encode(["prog", prog_id, "CPU:0", prog, False]),
                        encode(["batch", prog_id + 1, bases, [prog_id], []]),
                    ]
                )
                meta, _ = await stream.receive()
                assert meta[0] == "done" and message in meta[3][2], meta
            # A batch carries the KICK and BATCH slots at least.
            await stream.send([encode(["batch", 9, [0], [], []])])
            meta, _ = await stream.receive()
            assert meta[0] == "error" and "a batch has KICK and BATCH first" in meta[-1]
            stream.sock.close()
            np.testing.assert_array_equal(await rt.copyout(theirs), np.arange(4))


async def test_a_replaced_pending_write_gives_its_bytes_back() -> None:
    """The pending host-write limit counts what is pending now: a blob sent again under
    the same id replaces the first, whose bytes stop counting."""
    worker = start("CPU:0", extra_args=("--max-pending-writes", "65536"))
    try:
        with trio.fail_after(GUARD):
            stream = await _session(worker.port)
            big = b"x" * 40000
            for _ in range(6):  # 240000 bytes sent, never more than 40000 pending
                await stream.send([encode(["blob", 1], len(big)), big])
            await stream.send([encode(["blob", 2], 16), b"y" * 16])
            await stream.send([encode(["frobnicate", 1])])
            meta, _ = await stream.receive()  # the first reply: no blob was refused
            assert meta[:2] == ["error", "frobnicate"], meta
            # The limit still holds for bytes really pending: 40016 + 40000 > 65536.
            await stream.send([encode(["blob", 3], len(big)), big])
            meta, _ = await stream.receive()
            assert (
                meta[:2] == ["error", "blob"]
                and "too many bytes of pending host writes" in meta[-1]
            )
            stream.sock.close()
            await _still_serves(worker)
    finally:
        worker.kill()


async def test_one_client_cannot_stall_another_on_a_shared_device() -> None:
    """Client A's job on the worker's CPU:0 waits on a signal A never sets; client B's
    work on the same device still runs: sessions do not queue behind each other."""
    worker = start("CPU:0")
    try:
        with trio.fail_after(GUARD):
            stream = await _session(worker.port)
            bases = [0, 0, 0]  # KICK, BATCH, then A's queue slot
            inc = ["k", 0, "inc", [[5, 0, [4]], [5, 0, [4]]], [], [1, 1, 1], [1, 1, 1]]
            stuck = [["w", 77, 0, 1], inc, ["s", 2, 1]]  # mirror 77 >= 1: only A sets it
            await stream.send(
                [
                    encode(["alloc", 5, "CPU:0", 4, "<i4"]),
                    encode(["prog", 1, "CPU:0", stuck, False]),
                    encode(["batch", 2, bases, [1], []]),
                    encode(["frobnicate", 3]),
                ]
            )
            (
                meta,
                _,
            ) = await stream.receive()  # the batch is posted: the request after it got its answer
            assert meta[:2] == ["error", "frobnicate"], meta
            with trio.fail_after(10):
                async with runtime([worker.name("CPU:0")]) as rt:
                    x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
                    graph = await rt.compile([ag.Launch(INC, [x, x])])
                    for _ in range(3):
                        await graph()
                    np.testing.assert_array_equal(await rt.copyout(x), np.full(4, 3))
            await stream.send([encode(["ext", [[77, 1]]])])  # A lets its own job go
            meta, _ = await stream.receive()
            assert meta == ["done", 2, 2, None]
            stream.sock.close()
    finally:
        worker.kill()


async def test_one_client_cannot_stall_another_on_a_workers_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As on a CPU device: client A's job on the worker's CUDA:0 waits on a signal A never
    sets, and client B's graph on CUDA:0 still runs, on a stream of its own (the worker
    runs the fake CUDA driver)."""
    monkeypatch.setenv("ACTORGRAPH_CUDA_DRIVER", "fake")
    worker = start("CUDA:0")
    gpu = worker.name("CUDA:0")
    try:
        with trio.fail_after(GUARD):
            stream = await _session(worker.port, ("CUDA:0",))
            inc = ["k", 0, "inc_gpu", [[5, 0, [4]], [5, 0, [4]]], [], [4, 1, 1], [1, 1, 1]]
            # Mirror 77 >= 1, which only A sets, on base slot 3: the stream waits on it.
            stuck = [["w", 77, 3, 1], inc, ["s", 2, 1]]
            await stream.send(
                [
                    encode(["alloc", 5, "CUDA:0", 4, "<i4"]),
                    encode(["prog", 1, "CUDA:0", stuck, False]),
                    encode(["batch", 2, [0, 0, 0, 0], [1], []]),
                    encode(["frobnicate", 3]),
                ]
            )
            meta, _ = await stream.receive()  # the batch is posted
            assert meta[:2] == ["error", "frobnicate"], meta
            with trio.fail_after(10):
                async with runtime([gpu]) as rt:
                    x = rt.alloc(gpu, 4, np.int32)
                    await rt.copyin(x, np.arange(4, dtype=np.int32))
                    graph = await rt.compile([ag.Launch(INC_GPU, [x, x], global_size=4)])
                    for _ in range(3):
                        await graph()
                    np.testing.assert_array_equal(await rt.copyout(x), np.arange(4) + 3)
            await stream.send([encode(["ext", [[77, 1]]])])  # A lets its own job go
            meta, _ = await stream.receive()
            assert meta == ["done", 2, 2, None]
            stream.sock.close()
            await _still_serves_gpu(worker)
    finally:
        worker.kill()


async def _still_serves_gpu(worker: Worker) -> None:
    gpu = worker.name("CUDA:0")
    async with runtime([gpu]) as rt:
        x = rt.alloc(gpu, 4, np.int32)
        await rt.copyin(x, np.arange(4, dtype=np.int32))
        await rt.run([ag.Launch(INC_GPU, [x, x], global_size=4)])
        np.testing.assert_array_equal(await rt.copyout(x), np.arange(4) + 1)


@pytest.mark.parametrize("options", [(), ("--thread-bytes", "0")], ids=["default", "threads"])
async def test_a_slow_kernel_of_one_client_does_not_freeze_the_worker(
    gate: Path, options: tuple[str, ...]
) -> None:
    """Client A's small kernel runs until A's test opens its gate; meanwhile client B's
    work on the same worker device runs: a kernel the worker has not yet seen to be quick
    runs on its client's thread (and with `--thread-bytes 0` every kernel does)."""
    worker = start("CPU:0", extra_args=options)
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime([r0]) as rt_a, runtime([r0]) as rt_b:
                x = rt_a.alloc(r0, 8, np.int32)
                slow = await (await rt_a.compile([ag.Launch(GATED, [x, x])])).submit()
                y = rt_b.alloc(r0, 8, np.int32)
                with trio.fail_after(10):
                    await rt_b.run([ag.Launch(INC, [y, y])])
                    np.testing.assert_array_equal(await rt_b.copyout(y), np.ones(8))
                assert not slow.done
                gate.touch()
                await slow.wait()
    finally:
        worker.kill()


async def test_peer_reads_need_a_valid_ticket(workers: tuple[Worker, Worker]) -> None:
    worker, _ = workers
    with trio.fail_after(GUARD):
        async with runtime([worker.name("CPU:0")]) as rt:
            x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
            await rt.copyin(x, np.arange(4, dtype=np.int32))
            conn = rt.device(worker.name("CPU:0")).connection
            stream = await _peer(worker.port)
            ref = [x.memory.handle, 0, [4]]
            for ticket in (b"0" * 16, conn.ticket(x.memory.handle + 1)):
                await stream.send([encode(["pread", 1, conn.session_id, ref, ticket])])
                meta, _ = await stream.receive()
                assert meta[0] == "error" and "bad read ticket" in meta[-1]
            await stream.send([encode(["get", 1, ref])])  # a peer may do nothing else
            meta, _ = await stream.receive()
            assert meta[0] == "error" and "can only read" in meta[-1]
            await stream.send([encode(["pread", 2, conn.session_id, ref, conn.ticket(ref[0])])])
            meta, tail = await stream.receive()
            assert meta[:2] == ["data", 2] and tail == 16
            stream.sock.close()


async def test_a_peer_read_waits_for_what_the_client_sent_before_its_fence(
    workers: tuple[Worker, Worker],
) -> None:
    # A read names how far the source's client had written there (`after`, bytes of its
    # frames): it is answered once the worker has taken that much, and a bad ticket is
    # refused at once whatever it names.
    worker, _ = workers
    with trio.fail_after(GUARD):
        async with runtime([worker.name("CPU:0")]) as rt:
            x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
            await rt.copyin(x, np.arange(4, dtype=np.int32))
            conn = rt.device(worker.name("CPU:0")).connection
            ref = [x.memory.handle, 0, [4]]
            ticket = conn.ticket(ref[0])
            ahead = conn.transport.taken + 1  # the client has not sent that much yet
            parked, other = await _peer(worker.port), await _peer(worker.port)
            await parked.send([encode(["pread", 1, conn.session_id, ref, b"0" * 32, 1 << 60])])
            meta, _ = await parked.receive()
            assert meta[0] == "error" and "bad read ticket" in meta[-1]
            await parked.send([encode(["pread", 2, conn.session_id, ref, ticket, ahead])])
            taken = conn.transport.taken
            await other.send([encode(["pread", 3, conn.session_id, ref, ticket, taken])])
            meta, tail = await other.receive()
            assert meta[:2] == ["data", 3] and tail == 16
            assert not parked.buffered  # still waiting for the client: nothing came
            with socket.socket(fileno=os.dup(parked.sock.fileno())) as raw:
                raw.setblocking(False)
                with pytest.raises(BlockingIOError):
                    raw.recv(1, socket.MSG_PEEK)
            # The client sends more (a read of its own): the parked read goes.
            np.testing.assert_array_equal(await rt.copyout(x), np.arange(4))
            meta, tail = await parked.receive()
            assert meta[:2] == ["data", 2] and tail == 16
            parked.sock.close()
            other.sock.close()


def test_worker_refuses_to_serve_other_hosts_without_a_token(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from actorgraph._cli import main

    assert main(["worker", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "refusing to serve 0.0.0.0 without a token; pass --token-file" in capsys.readouterr().err


async def test_a_client_that_leaves_mid_job_does_not_block_others(
    workers: tuple[Worker, Worker],
) -> None:
    worker, _ = workers
    with trio.fail_after(GUARD):
        stream = await _session(worker.port)
        # A job that waits for a signal of this client, which then goes away: the job
        # sits on the worker's shared CPU:0 queue until the worker lets it go.
        await stream.send([encode(["alloc", 1, "CPU:0", 4, "<i4"])])
        prog = [
            ["w", 1, 0, 5],
            ["k", 0, "inc", [[1, 0, [4]], [1, 0, [4]]], [], [1, 1, 1], [1, 1, 1]],
            ["s", 2, 1],
        ]
        await stream.send(
            [encode(["prog", 1, "CPU:0", prog, False]), encode(["batch", 2, [0, 0, 0], [1], []])]
        )
        stream.sock.close()
        await _still_serves(worker)


async def test_a_copy_between_a_gpu_and_a_remote_device_is_refused_clearly(ag_worker: Any) -> None:
    remote_name = ag_worker.devices[0]
    async with ag.open_runtime(
        ["CUDA:0", remote_name], remote_token=ag_worker.token, cuda_driver="fake"
    ) as rt:
        with trio.fail_after(GUARD):
            gpu = rt.alloc("CUDA:0", 16, np.int32)
            far = rt.alloc(remote_name, 16, np.int32)
            for dst, src in ((far, gpu), (gpu, far)):
                with pytest.raises(
                    ag.DeviceError,
                    match=re.escape(
                        f"copy {src.device}->{dst.device}: a copy between a remote device and CUDA:0 "
                        f"is not supported (CUDA:0's memory is not host memory, and the bytes go to "
                        f"the worker from host memory); copy through a CPU device"
                    ),
                ):
                    await rt.compile([ag.Copy(dst=dst, src=src)])


def _incs(handle: int, count: int, slot: int) -> list[Any]:
    """A program of `count` inc kernels on buffer `handle`, signalling on `slot`."""
    inc = ["k", 0, "inc", [[handle, 0, [4]], [handle, 0, [4]]], [], [1, 1, 1], [1, 1, 1]]
    return [inc] * count + [["s", slot, count]]


async def test_a_batch_of_programs_seen_before_is_checked_as_any_other() -> None:
    """A replay's batch names the programs it named before: the worker remembers that they
    passed its checks together, and still checks every id and base, and finds a program
    forgotten, or an id given to another program, since: each refused as the first time."""
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt, trio.open_nursery() as nursery:
            server = WorkerServer(rt, load_kernels(["remote_kernels"]), None, Limits())
            replies = _Replies()
            session = Session(server, 1, replies, nursery)  # type: ignore[arg-type]
            session.handle(decode(["alloc", 1, "CPU:0", 4, "<i4"]))
            session.handle(decode(["alloc", 2, "CPU:1", 4, "<i4"]))
            session.handle(decode(["prog", 1, "CPU:0", _incs(1, 2, 2), True]))
            session.handle(decode(["prog", 2, "CPU:1", _incs(2, 3, 3), True]))
            for batch in (10, 11, 12):  # the first is checked in full, the others remembered
                session.handle(decode(["batch", batch, [0, 0, 0, 0], [1, 2], []]))
                await replies.wait_for(2 * (batch - 9))
            assert (
                session.batches._seen(decode(["batch", 13, [0, 0, 0, 0], [1, 2], []])) is not None
            )
            assert sorted(replies.sent) == sorted(
                ["done", b, slot, None] for b in (10, 11, 12) for slot in (2, 3)
            )
            np.testing.assert_array_equal(session.buffers[1].host_view(), np.full(4, 6))
            np.testing.assert_array_equal(session.buffers[2].host_view(), np.full(4, 9))
            refusals = [
                (["batch", 14, [0, 0, "x", 0], [1, 2], []], "base must be an int"),
                (["batch", 14, [0, 0, -1, 0], [1, 2], []], "base = -1 is outside"),
                (["batch", 14, [0, 0, 0], [1, 2], []], "uses base slot 3 of 3"),
                (["batch", True, [0, 0, 0, 0], [1, 2], []], "batch id must be an int"),
                (["batch", 14, [0, 0, 0, 0], [True, 2], []], "program id must be an int"),
            ]
            for request, message in refusals:
                count = len(replies.sent)
                try:
                    session.handle(decode(request))
                except (Refused, WireError) as exc:
                    assert re.search(message, str(exc)), (request, exc)
                else:
                    done = await replies.wait_for(count + 2)
                    assert all(message in m[3][2] for m in done[count:]), (request, done)
            session.handle(decode(["forget", 2]))
            with pytest.raises(Refused, match="batch 15: unknown program id 2"):
                session.handle(decode(["batch", 15, [0, 0, 0, 0], [1, 2], []]))
            # Id 2 given to a program refused when lowered: its batch fails, as it would
            # have the first time.
            session.handle(decode(["prog", 2, "CPU:1", [["k", 0, "nope", [], [], [1], [1]]], True]))
            count = len(replies.sent)
            session.handle(decode(["batch", 16, [0, 0, 0, 0], [1, 2], []]))
            done = await replies.wait_for(count + 2)
            assert all(m[:2] == ["done", 16] and m[3] is not None for m in done[count:])
            nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _in_process_session(
    kernels: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[Session, _Replies]]:
    """A worker's session on a runtime of CPU:0 in this process, with `kernels` (the
    test kernels by default) and what it sends kept in a list; its tasks end with it."""
    if kernels is None:
        kernels = load_kernels(["remote_kernels"])
    async with ag.open_runtime(["CPU:0"]) as rt, trio.open_nursery() as nursery:
        server = WorkerServer(rt, kernels, None, Limits())
        replies = _Replies()
        yield Session(server, 1, replies, nursery), replies  # type: ignore[arg-type]
        nursery.cancel_scope.cancel()


async def test_a_kept_program_reads_to_the_client_under_the_read_ids_each_batch_names() -> None:
    """A program with host reads is kept like any other: each batch of it names the read
    id of each of its reads (Batch.reads), and its bytes go there, as they are when its
    queue gets there. A batch that names too few or too many, or a program whose reads
    are not numbered 0, 1, ... in order, is refused with the rule."""
    with trio.fail_after(GUARD):
        async with _in_process_session() as (session, replies):
            session.handle(decode(["alloc", 1, "CPU:0", 4, "<i4"]))
            inc = ["k", 0, "inc", [[1, 0, [4]], [1, 0, [4]]], [], [1, 1, 1], [1, 1, 1]]
            reads = [inc, ["hr", -1, [1, 0, [4]], 0], ["hr", -1, [1, 0, [4]], 1], ["s", 2, 3]]
            session.handle(decode(["prog", 1, "CPU:0", reads, True]))
            for batch, ids in ((10, [70, 71]), (11, [90, 91])):
                count = len(replies.sent)
                session.handle(decode(["batch", batch, [0, 0, 0], [1], [], False, [], [ids]]))
                got = await replies.wait_for(count + 3)
                data = [m for m in got[count:] if m[0] == "data"]
                assert [m[1] for m in data] == ids  # one Data each, under the batch's ids
                assert ["done", batch, 2, None] in got[count:]
            np.testing.assert_array_equal(session.buffers[1].host_view(), np.full(4, 2))
            refusals = [
                (["batch", 12, [0, 0, 0], [1], []], r"have \[2\] host reads.*read ids for none"),
                (["batch", 12, [0, 0, 0], [1], [], False, [], [[5]]], r"names read ids for \[1\]"),
                (["batch", 12, [0, 0, 0], [1], [], False, [], [[5, 6, 7]]], "one read id for each"),
                (
                    ["batch", 12, [0, 0, 0], [1], [], False, [], [[5, 6], []]],
                    "one read id for each",
                ),
            ]
            for request, message in refusals:
                with pytest.raises(Refused, match=message):
                    session.handle(decode(request))
            # Numbered out of order: refused when lowered, and its batch fails with why.
            wrong = [["hr", -1, [1, 0, [4]], 1], ["s", 2, 1]]
            session.handle(decode(["prog", 2, "CPU:0", wrong, True]))
            count = len(replies.sent)
            session.handle(decode(["batch", 13, [0, 0, 0], [2], [], False, [], [[8]]]))
            done = await replies.wait_for(count + 1)
            assert done[count][:3] == ["done", 13, 2]
            assert "numbers its host reads 0, 1, ... in order" in done[count][3][2]


async def test_a_kept_program_writes_the_blobs_each_batch_names() -> None:
    """A program with host writes is kept like any other: each batch of it names the blobs
    its writes land (Batch.blobs), sent ahead of it. A batch that names too few or too
    many is refused, one whose blob never came or holds other than the buffer's bytes
    fails with why, and a batch that never runs lets go of the blobs it names."""
    with trio.fail_after(GUARD):
        async with _in_process_session() as (session, replies):
            session.handle(decode(["alloc", 1, "CPU:0", 4, "<i4"]))
            write = [["hw", -1, [1, 0, [4]], 2], ["s", 2, 1]]  # 16 bytes in two blobs
            session.handle(decode(["prog", 1, "CPU:0", write, True]))

            def blobs(first: int, *parts: bytes) -> list[int]:
                for k, part in enumerate(parts):
                    session.keep_blob(first + k, bytearray(part), len(part))
                return list(range(first, first + len(parts)))

            def batch(b: int, ids: list[int]) -> Any:
                return decode(["batch", b, [0, 0, 0], [1], [], False, [], [], [ids]])

            for b, values in ((10, [1, 2, 3, 4]), (11, [5, 6, 7, 8])):
                data = np.array(values, np.int32).tobytes()
                session.handle(batch(b, blobs(100 + 10 * b, data[:4], data[4:])))
                assert (await replies.wait_for(b - 9))[-1] == ["done", b, 2, None]
                np.testing.assert_array_equal(session.buffers[1].host_view(), values)
            assert session.blob_bytes == 0
            for ids, message in (
                ([], r"land \[2\] blobs and it names \[0\]"),
                ([7], r"names \[1\]"),
            ):
                with pytest.raises(Refused, match=message):
                    session.handle(batch(12, blobs(7, b"x" * 16) if ids else []))
                assert session.blob_bytes == 0  # the refused batch's blob went back
            for b, sent, why in (
                (13, lambda: [*blobs(300, b"z" * 8), 301], "unknown blob id 301"),
                (14, lambda: blobs(400, b"x" * 8, b"y" * 4), "host write of 12 bytes into 16"),
            ):
                count = len(replies.sent)
                session.handle(batch(b, sent()))
                done = (await replies.wait_for(count + 1))[-1]
                assert done[:3] == ["done", b, 2] and why in done[3][2], done
                assert session.blob_bytes == 0
            np.testing.assert_array_equal(session.buffers[1].host_view(), [5, 6, 7, 8])


async def test_a_view_a_program_names_is_made_once_and_goes_with_its_buffer() -> None:
    """The views of a buffer that programs name are made once and kept while the buffer
    lives: a program lowered again names the same view, and one lowered after its
    buffer was freed and its id allocated again names the new memory."""
    with trio.fail_after(GUARD):
        async with _in_process_session() as (session, replies):
            ref = decode(["get", 1, [1, 4, [4]]]).src  # elements 4..7 of buffer 1
            session.handle(decode(["alloc", 1, "CPU:0", 8, "<i4"]))
            view = session.buffer(ref, "a view")
            assert session.buffer(ref, "a view") is view
            inc = ["k", 0, "inc", [[1, 4, [4]], [1, 4, [4]]], [], [1, 1, 1], [1, 1, 1]]
            for batch, handle in ((10, 1), (11, 2)):
                if handle == 2:  # the id freed and allocated again: new memory
                    session.handle(decode(["free", 1]))
                    session.handle(decode(["alloc", 1, "CPU:0", 8, "<i4"]))
                    assert session.buffer(ref, "a view") is not view
                session.handle(decode(["prog", handle, "CPU:0", [inc, ["s", 2, 1]], True]))
                session.handle(decode(["batch", batch, [0, 0, 0], [handle], []]))
                await replies.wait_for(batch - 9)
                np.testing.assert_array_equal(session.buffers[1].host_view(), [0] * 4 + [1] * 4)


async def test_a_program_forgotten_or_defined_again_is_let_go_of() -> None:
    """A worker lets go of a program its client forgot, or whose id the client gave to
    another, even one of a set of programs it checked together for a batch (kept to
    skip those checks when the same set comes again): what the program holds (its ops,
    the views of buffers they name) goes with it."""
    import gc
    import weakref

    with trio.fail_after(GUARD):
        async with _in_process_session() as (session, replies):
            session.handle(decode(["alloc", 1, "CPU:0", 8, "<i4"]))
            inc = ["k", 0, "inc", [[1, 4, [4]], [1, 4, [4]]], [], [1, 1, 1], [1, 1, 1]]
            gone = []
            for batch, forget in ((10, ["forget", 1]), (11, None)):
                session.handle(decode(["prog", 1, "CPU:0", [inc, ["s", 2, 1]], True]))
                gone.append(weakref.ref(session.programs[1]))
                for again in (batch, batch + 10):  # a set checked, then seen
                    count = len(replies.sent) + 1
                    session.handle(decode(["batch", again, [0, 0, 0], [1], []]))
                    assert (await replies.wait_for(count))[-1] == ["done", again, 2, None]
                if forget is not None:
                    session.handle(decode(forget))
            # Program 1 forgotten, then defined again (the second one replaced below).
            session.handle(decode(["prog", 1, "CPU:0", [inc, ["s", 2, 1]], True]))
            gc.collect()
            assert [ref() is None for ref in gone] == [True, True]
            np.testing.assert_array_equal(session.buffers[1].host_view(), [0] * 4 + [4] * 4)


async def _frame(stream: FrameStream) -> list[Any]:
    """The next message from a worker (its tail read and checked: a read's int32s)."""
    meta, tail = await stream.receive()
    if tail:
        data = bytearray(tail)
        await stream.receive_into(memoryview(data))
        assert np.frombuffer(data, np.int32).tolist() == [0] * 4
    return meta


async def test_what_the_requests_received_together_make_leaves_in_one_send() -> None:
    """Frames that came together (a client's submission: its batches) are handled one by
    one and what they make (their reports, a read's bytes) leaves in one send after the
    last; a frame that is still coming does not hold back what the ones before made."""
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"]) as rt, trio.open_nursery() as nursery:
            server = WorkerServer(rt, load_kernels(["remote_kernels"]), None, Limits())
            here, there = socket.socketpair()
            worker_side = FrameStream(here, Limits())
            client = FrameStream(there, Limits())
            sends: list[int] = []
            send_nowait = worker_side.send_nowait

            def counted(data: bytes | memoryview) -> int:
                sends.append(len(data))
                return send_nowait(data)

            worker_side.send_nowait = counted  # type: ignore[method-assign]
            out = Outbox(worker_side)
            nursery.start_soon(out.run)
            session = Session(server, 1, out, nursery)
            nursery.start_soon(server._client_loop, worker_side, session)
            buf = ["alloc", 1, "CPU:0", 4, "<i4"]
            prog = ["prog", 1, "CPU:0", [["hr", -1, [1, 0, [4]], 0], ["s", 2, 1]], True]
            batches = [["batch", b, [0, 0, 0], [1], [], False, [], [[b]]] for b in (9, 10, 11, 12)]
            await client.send([encode(m) for m in (buf, prog, batches[0])])
            got = [await _frame(client) for _ in range(2)]  # (its queue starts meanwhile)
            sends.clear()
            await client.send([encode(m) for m in batches[1:]])
            got = [await _frame(client) for _ in range(6)]  # a Data and a Done each
            assert [m[:2] for m in got] == [[k, b] for b in (10, 11, 12) for k in ("data", "done")]
            assert len(sends) == 1, sends
            # A batch whose next frame is only partly here: its reports go at once.
            head = encode(["batch", 14, [0, 0, 0], [1], [], False, [], [[14]]])
            await client.send(
                [encode(["batch", 13, [0, 0, 0], [1], [], False, [], [[13]]]), head[:5]]
            )
            got = [await _frame(client) for _ in range(2)]
            assert [m[:2] for m in got] == [["data", 13], ["done", 13]]
            await client.send([head[5:]])
            got = [await _frame(client) for _ in range(2)]
            assert [m[:2] for m in got] == [["data", 14], ["done", 14]]
            assert len(sends) == 3, sends
            nursery.cancel_scope.cancel()


async def test_a_batch_refused_for_overflow_leaves_the_timelines_as_they_were() -> None:
    """One program of a batch would take its actor's timeline past 2**64-1: every program
    of the batch is refused, and the timelines the others had reserved are given back."""
    top = (1 << 64) - 1
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0", "CPU:1"], timeline_start=top - 3) as rt:
            server = WorkerServer(rt, load_kernels(["remote_kernels"]), None, Limits())
            replies = _Replies()
            session = Session(server, 1, replies)  # type: ignore[arg-type]
            queues = [rt.device(name).queues[QueueKind.COMPUTE] for name in ("CPU:0", "CPU:1")]
            session.handle(decode(["alloc", 1, "CPU:0", 4, "<i4"]))
            session.handle(decode(["alloc", 2, "CPU:1", 4, "<i4"]))
            session.handle(
                decode(["prog", 1, "CPU:0", _incs(1, 2, 2), True])
            )  # fits: 2 values left
            session.handle(decode(["prog", 2, "CPU:1", _incs(2, 5, 3), False]))  # does not
            session.handle(decode(["batch", 7, [0, 0, 0, 0], [1, 2], []]))
            done = await replies.wait_for(2)
            for slot, meta in zip((2, 3), done):
                assert meta[:3] == ["done", 7, slot]
                assert "CPU:1/compute: timeline would pass 2**64-1" in meta[3][2]
            assert [q.next_value for q in queues] == [top - 3, top - 3]
            # The values the refused batch would have taken are there for the next one.
            session.handle(decode(["batch", 8, [0, 0, 0], [1], []]))
            assert (await replies.wait_for(3))[2] == ["done", 8, 2, None]
            assert queues[0].next_value == top - 1
            np.testing.assert_array_equal(session.buffers[1].host_view(), np.full(4, 2))


async def test_a_peer_link_needs_the_token(workers: tuple[Worker, Worker]) -> None:
    # A stranger cannot open a worker-to-worker link: not without a token, not with a
    # wrong one; and a link that did authenticate still only reads, with tickets.
    worker, _ = workers
    with trio.fail_after(GUARD):
        for token in (b"", b"wrong-token", None):
            stream = await _raw(worker.port)
            ours, theirs, _ = await hello(stream, "peer")
            answer = b"" if token is None else handshake_mac(token, "peer", ours, theirs, TO_WORKER)
            await stream.send([encode(["auth", answer, []])])
            meta, _ = await stream.receive()
            assert meta[0] == "error"
            assert re.search(
                r"authentication failed: a worker-to-worker link needs this worker's token; "
                r"start every worker of a runtime with the same --token-file",
                meta[-1],
            )
            with pytest.raises(ConnectionError):
                await stream.receive()  # and the connection is closed
        await _still_serves(worker)


async def test_forged_frames_on_a_peer_link_are_refused(workers: tuple[Worker, Worker]) -> None:
    worker, _ = workers
    with trio.fail_after(GUARD):
        async with runtime([worker.name("CPU:0")]) as rt:
            x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
            await rt.copyin(x, np.arange(4, dtype=np.int32))
            conn = rt.device(worker.name("CPU:0")).connection
            ref = [x.memory.handle, 0, [4]]
            stream = await _peer(worker.port)
            # What only a client may send: writes (with data), allocations, batches, signals.
            forged: list[tuple[list[Any], bytes]] = [
                (["put", ref, 0], b"\xff" * 16),
                (["alloc", 99, "CPU:0", 4, "<i4"], b""),
                (["batch", 1, [0, 0, 0], [], []], b""),
                (["ext", [[1, 5]]], b""),
                (["data", 1, 0, None], b"\xff" * 16),
            ]
            for meta_out, tail in forged:
                await stream.send([encode(meta_out, len(tail)), tail])
                meta, _ = await stream.receive()
                assert meta[0] == "error", meta
                assert re.search(
                    rf"'{meta_out[0]}' on a worker-to-worker link: a peer connection can only "
                    r"read \('pread', 'pwhen', 'pwatch'\); other requests come from the client",
                    meta[-1],
                )
            # The stream stayed in step (the refused data was skipped) and nothing changed.
            await stream.send([encode(["pread", 7, conn.session_id, ref, conn.ticket(ref[0])])])
            meta, tail = await stream.receive()
            assert meta[:3] == ["data", 7, 0] and tail == 16
            data = bytearray(tail)
            await stream.receive_into(memoryview(data))
            np.testing.assert_array_equal(np.frombuffer(data, np.int32), np.arange(4))
            # A frame that breaks the framing closes this link only.
            await stream.send([b"XX" + bytes(HEADER.size - 2)])
            meta, _ = await stream.receive()
            assert meta[0] == "error" and "not an actorgraph frame" in meta[-1]
            with pytest.raises(ConnectionError):
                await stream.receive()
            np.testing.assert_array_equal(await rt.copyout(x), np.arange(4))


async def test_a_peer_cannot_read_another_sessions_buffer(
    workers: tuple[Worker, Worker],
) -> None:
    # Two clients of one worker, each with a buffer under the same handle. A ticket names
    # one session's buffer: used with the other session's id, it reads nothing.
    worker, _ = workers
    name = worker.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([name]) as rt_a, runtime([name]) as rt_b:
            x_a, x_b = rt_a.alloc(name, 4, np.int32), rt_b.alloc(name, 4, np.int32)
            assert x_a.memory.handle == x_b.memory.handle
            await rt_b.copyin(x_b, np.full(4, 42, np.int32))
            conn_a, conn_b = rt_a.device(name).connection, rt_b.device(name).connection
            handle = x_a.memory.handle
            ref = [handle, 0, [4]]
            stream = await _peer(worker.port)
            await stream.send([encode(["pread", 1, conn_b.session_id, ref, conn_a.ticket(handle)])])
            meta, tail = await stream.receive()
            assert (meta[0], tail) == ("error", 0)
            assert re.search(
                rf"read of buffer {handle} of session {conn_b.session_id} refused: no such "
                r"session or a bad read ticket \(a read needs the ticket the buffer's own "
                r"client made for it",
                meta[-1],
            )
            # With B's own ticket the same read is served: the refusal was the ticket's.
            await stream.send([encode(["pread", 2, conn_b.session_id, ref, conn_b.ticket(handle)])])
            meta, tail = await stream.receive()
            assert meta[:2] == ["data", 2] and tail == 16
            stream.sock.close()


async def test_a_peer_read_checks_every_time_what_a_worker_keeps_of_a_buffer(
    workers: tuple[Worker, Worker],
) -> None:
    # A worker keeps a buffer's read ticket and bytes once read by a peer: a wrong ticket
    # or a malformed buffer is still refused after a good read, and a freed buffer reads
    # nothing.
    worker, _ = workers
    name = worker.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([name]) as rt:
            x = rt.alloc(name, 4, np.int32)
            await rt.copyin(x, np.full(4, 7, np.int32))
            conn = rt.device(name).connection
            handle = x.memory.handle
            ticket = conn.ticket(handle)
            stream = await _peer(worker.port)

            async def read(req: int, ref: list[Any], ticket: bytes) -> tuple[list[Any], int]:
                await stream.send([encode(["pread", req, conn.session_id, ref, ticket])])
                meta, tail = await stream.receive()
                if tail:
                    await stream.receive_into(memoryview(bytearray(tail)))
                return meta, tail

            for req in (1, 2):
                meta, tail = await read(req, [handle, 0, [4]], ticket)
                assert meta[:2] == ["data", req] and tail == 16
            meta, _ = await read(3, [handle, 0, [4]], conn.ticket(handle + 1))
            assert meta[0] == "error" and "bad read ticket" in meta[-1]
            for bad in ([handle, 0, 4], [handle, 0, [[4]]], [handle, 8, [4]]):
                meta, _ = await read(4, bad, ticket)
                assert meta[0] == "error", bad
            rt.free(x)
            await rt.copyout(rt.alloc(name, 1, np.int32))  # the free has been taken
            meta, _ = await read(5, [handle, 0, [4]], ticket)
            assert meta[0] == "error" and f"unknown buffer id {handle}" in meta[-1]
            stream.sock.close()


async def test_a_worker_runs_a_kernel_on_its_loop_only_once_seen_to_be_quick() -> None:
    """Where a worker runs a small CPU kernel, on a clock the kernel itself moves: on the
    client's thread until one run was quick; then on the event loop until a run is slow
    (on other data, say); then on the thread again until a streak of quick runs."""
    from actorgraph.worker._placement import INLINE_BOUND_S, KernelTimes

    now = [0.0]
    cost = [1e-6]
    on_loop: list[bool] = []

    def tick(out: np.ndarray, a: np.ndarray) -> None:
        on_loop.append(threading.current_thread() is threading.main_thread())
        now[0] += cost[0]
        np.add(a, 1, out=out)

    kernels = {"tick": ag.Kernel("tick", cpu=tick, outs=(0,), ins=(1,))}
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"]) as rt, trio.open_nursery() as nursery:
            server = WorkerServer(rt, kernels, None, Limits())
            # The kernel's cost is CPU time: it moves both clocks.
            server.times = KernelTimes(clock=lambda: now[0], cpu_clock=lambda: now[0])
            replies = _Replies()
            session = Session(server, 1, replies, nursery)  # type: ignore[arg-type]
            session.handle(decode(["alloc", 1, "CPU:0", 4, "<i4"]))
            session.handle(decode(["alloc", 2, "CPU:0", 8, "<i4"]))
            tick_1 = ["k", 0, "tick", [[1, 0, [4]], [1, 0, [4]]], [], [1, 1, 1], [1, 1, 1]]
            tick_2 = ["k", 0, "tick", [[2, 0, [8]], [2, 0, [8]]], [], [1, 1, 1], [1, 1, 1]]
            session.handle(decode(["prog", 1, "CPU:0", [tick_1, ["s", 2, 1]], True]))
            session.handle(decode(["prog", 2, "CPU:0", [tick_2, ["s", 2, 1]], True]))

            async def replay(program: int, cost_s: float) -> bool:
                cost[0] = cost_s
                batch = len(replies.sent) + 10
                session.handle(decode(["batch", batch, [0, 0, 0], [program], []]))
                assert (await replies.wait_for(batch - 9))[-1] == ["done", batch, 2, None]
                return on_loop[-1]

            quick, slow = INLINE_BOUND_S / 10, INLINE_BOUND_S * 10
            assert [await replay(1, quick) for _ in range(3)] == [False, True, True]
            assert await replay(1, slow)  # coded for the loop: it runs there, and is seen
            # Back on the thread until 8 quick runs there (a slow run may have been the
            # OS's doing, not the kernel's).
            assert [await replay(1, quick) for _ in range(9)] == [False] * 8 + [True]
            # Another shape of the same kernel is measured on its own, and slow from the
            # first run: it never comes to the loop.
            assert [await replay(2, slow)] + [await replay(2, quick)] == [False, False]
            np.testing.assert_array_equal(session.buffers[1].host_view(), np.full(4, 13))
            nursery.cancel_scope.cancel()


async def test_a_kernels_var_values_are_its_data_not_its_shape() -> None:
    """A kernel seen to be quick runs on the worker's loop at var values it never had (a
    decoder's kernels at its next position): the values are what it runs on, as its
    buffers' contents are, not a shape to be timed on the thread first."""
    on_loop: list[bool] = []

    def add_n(out: np.ndarray, a: np.ndarray, n: int) -> None:
        on_loop.append(threading.current_thread() is threading.main_thread())
        np.add(a, n, out=out)

    kernels = {"add_n": ag.Kernel("add_n", cpu=add_n, outs=(0,), ins=(1,))}
    with trio.fail_after(GUARD):
        async with _in_process_session(kernels) as (session, replies):
            session.handle(decode(["alloc", 1, "CPU:0", 4, "<i4"]))
            for n in (1, 1, 5, 9):
                call = ["k", 0, "add_n", [[1, 0, [4]], [1, 0, [4]]], [n], [1, 1, 1], [1, 1, 1]]
                batch = len(replies.sent) + 1
                session.handle(decode(["prog", batch, "CPU:0", [call, ["s", 2, 1]], False]))
                session.handle(decode(["batch", batch, [0, 0, 0], [batch], []]))
                assert (await replies.wait_for(batch))[-1] == ["done", batch, 2, None]
            assert on_loop == [False, True, True, True]
            np.testing.assert_array_equal(session.buffers[1].host_view(), np.full(4, 16))


async def test_a_large_host_write_runs_off_the_workers_event_loop() -> None:
    """A host write of --thread-bytes or more is copied into its buffer on the client's
    thread, not on the event loop every client shares; a small one stays inline."""
    from actorgraph.devices import EXEC, EXEC_THREAD

    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"], cpu_thread_bytes=64) as rt:
            async with trio.open_nursery() as nursery:
                server = WorkerServer(rt, {}, None, Limits())
                replies = _Replies()
                session = Session(server, 1, replies, nursery)  # type: ignore[arg-type]
                codes = []
                for handle, count in ((1, 16), (2, 8)):  # 64 bytes, then 32
                    data = np.arange(count, dtype=np.int32)
                    session.handle(decode(["alloc", handle, "CPU:0", count, "<i4"]))
                    staged = bytearray(data.tobytes())
                    session.keep_blob(handle, staged, len(staged))
                    session.blob_bytes += len(staged)
                    write = ["hw", -1, [handle, 0, [count]], 1]
                    session.handle(decode(["prog", handle, "CPU:0", [write, ["s", 2, 1]], False]))
                    codes.append(
                        [
                            op.code
                            for op in session.programs[handle].ops
                            if isinstance(op, RunOp) and op.fn is land
                        ]
                    )
                    batch = ["batch", handle, [0, 0, 0], [handle], [], False, [], [], [[handle]]]
                    session.handle(decode(batch))
                    assert (await replies.wait_for(handle))[-1] == ["done", handle, 2, None]
                    np.testing.assert_array_equal(session.buffers[handle].host_view(), data)
                assert codes == [[EXEC_THREAD], [EXEC]]
                nursery.cancel_scope.cancel()


def _on(kernel: str, handle: int) -> list[Any]:
    return ["k", 0, kernel, [[handle, 0, [4]], [handle, 0, [4]]], [], [4, 1, 1], [1, 1, 1]]


async def test_a_clients_gpu_queue_reports_its_own_faults_and_goes_with_it() -> None:
    """A client's work on a worker's CUDA device runs on a stream of the client's own,
    made on first use: a kernel that fails there fails that client's job (and no later
    one), and when the client leaves, its stream is destroyed."""
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CUDA:0"], cuda_driver="fake") as rt:
            device = rt.device("CUDA:0")
            server = WorkerServer(rt, load_kernels(["remote_kernels"]), None, Limits())
            replies = _Replies()
            async with trio.open_nursery() as nursery:
                session = Session(server, 1, replies, nursery)  # type: ignore[arg-type]
                session.handle(decode(["alloc", 1, "CUDA:0", 4, "<i4"]))
                assert len(device.all_queues()) == 2  # nothing made before it is used
                session.handle(
                    decode(["prog", 1, "CUDA:0", [_on("boom_gpu", 1), ["s", 2, 1]], False])
                )
                session.handle(decode(["batch", 3, [0, 0, 0], [1], []]))
                failed = (await replies.wait_for(1))[0]
                assert failed[:3] == ["done", 3, 2]
                assert "ZeroDivisionError: boom on purpose" in failed[3][2]
                session.handle(
                    decode(["prog", 2, "CUDA:0", [_on("inc_gpu", 1), ["s", 2, 1]], False])
                )
                session.handle(decode(["batch", 4, [0, 0, 0], [2], []]))
                assert (await replies.wait_for(2))[1] == ["done", 4, 2, None]
                own = session.queues[("CUDA:0", QueueKind.COMPUTE)]
                assert own in device.all_queues()
                assert own.stream is not device.queues[QueueKind.COMPUTE].stream
                nursery.cancel_scope.cancel()
            session.abandon()
            assert len(device.all_queues()) == 2
            assert own.stream.closed  # the fake driver's stream, destroyed


async def test_a_dtype_a_workers_device_refuses_is_refused_and_the_session_goes_on() -> None:
    """A GPU's kernels read memory in its own byte order: a worker's CUDA device refuses a
    big-endian buffer, the client's request is refused naming why (and the buffer id is
    known as refused), and the session goes on."""
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CUDA:0"], cuda_driver="fake") as rt:
            server = WorkerServer(rt, load_kernels(["remote_kernels"]), None, Limits())
            async with trio.open_nursery() as nursery:
                session = Session(server, 1, _Replies(), nursery)  # type: ignore[arg-type]
                with pytest.raises(
                    Refused,
                    match=r"CUDA:0: dtype >i4 is not in this machine's byte order, and a GPU's "
                    r"kernels read memory in theirs: allocate int32",
                ):
                    session.handle(decode(["alloc", 1, "CUDA:0", 4, ">i4"]))
                with pytest.raises(Refused, match=r"buffer 1 was refused: CUDA:0: dtype >i4"):
                    session.buffer(ref([1, 0, [4]], "get src"), "get src")
                session.handle(decode(["alloc", 2, "CUDA:0", 4, "<i4"]))
                assert session.buffers[2].dtype == np.dtype("<i4")
                nursery.cancel_scope.cancel()
            session.abandon()


async def test_copies_with_a_workers_gpu_run_on_it_or_are_refused_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's CUDA device copies to and from a CPU device of its own worker; its
    memory is not host memory, so a copy between it and a device off its worker is
    refused before anything runs, naming the way through a CPU device of that worker."""
    monkeypatch.setenv("ACTORGRAPH_CUDA_DRIVER", "fake")
    worker = start("CUDA:0,CPU:0")
    gpu, cpu = worker.name("CUDA:0"), worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", gpu, cpu]) as rt:
                far = rt.alloc(gpu, 16, np.int32)
                here = rt.alloc("CPU:0", 16, np.int32)
                near = rt.alloc(cpu, 16, np.int32)
                for dst, src in ((far, here), (here, far)):
                    with pytest.raises(
                        ag.DeviceError,
                        match=re.escape(
                            f"copy {src.device}->{dst.device}: a copy between {gpu} and a "
                            f"device off its worker is not supported (its memory is GPU "
                            f"memory, and the bytes go over the network from host memory); "
                            f"copy through a CPU device of that worker: CUDA:0 <-> "
                            f"CPU:N@127.0.0.1:{worker.port}"
                        ),
                    ):
                        await rt.compile([ag.Copy(dst=dst, src=src)])
                await rt.copyin(near, np.arange(16, dtype=np.int32))
                await rt.run([ag.Copy(dst=far, src=near)])
                # Back to the worker's CPU device: it runs on that device's queue, which
                # has the GPU copy it out once the kernel is done.
                graph = await rt.compile(
                    [ag.Launch(INC_GPU, [far, far], global_size=16), ag.Copy(dst=near, src=far)]
                )
                for _ in range(2):
                    await graph()
                np.testing.assert_array_equal(await rt.copyout(near), np.arange(16) + 2)
                np.testing.assert_array_equal(await rt.copyout(far), np.arange(16) + 2)
    finally:
        worker.kill()


async def test_a_client_leaving_with_gpu_work_stuck_lets_its_memory_go_safely() -> None:
    """A client leaves while its job on a worker's GPU waits on a signal only it could set:
    the worker releases the wait, destroys the client's stream, and frees the client's
    memory on the helper thread (cuMemFree may wait for that stream's work, which needs
    the event loop to write the released word: on the loop it could wait for good)."""
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CUDA:0"], cuda_driver="fake") as rt:
            device = rt.device("CUDA:0")
            server = WorkerServer(rt, load_kernels(["remote_kernels"]), None, Limits())
            async with trio.open_nursery() as nursery:
                session = Session(server, 1, _Replies(), nursery)  # type: ignore[arg-type]
                session.handle(decode(["alloc", 1, "CUDA:0", 4, "<i4"]))
                # Base slot 3 (not KICK's): the stream itself waits, on the mirror's word.
                stuck = [["w", 77, 3, 1], _on("inc_gpu", 1), ["s", 2, 1]]
                session.handle(decode(["prog", 1, "CUDA:0", stuck, False]))
                session.handle(decode(["batch", 3, [0, 0, 0, 0], [1], []]))
                await trio.testing.wait_all_tasks_blocked()
                own = session.queues[("CUDA:0", QueueKind.COMPUTE)]
                assert own.gpu_busy  # on the stream, waiting on mirror 77's word
                nursery.cancel_scope.cancel()
            session.abandon()
            assert own.stream.closed and own not in device.all_queues()
            assert device._reaper is None
            rt.free(session.buffers.pop(1))
            assert device._reaper is not None  # the free went to the helper thread


async def test_a_client_leaving_keeps_the_gpu_words_any_of_its_streams_waits_on() -> None:
    """A client's compute stream on a worker's GPU is idle, its copy stream waits on a
    mirror's word when it leaves: the word stays out of reuse (a stream of the device may
    still read it), whichever of the client's queues comes first."""
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CUDA:0"], cuda_driver="fake") as rt:
            device = rt.device("CUDA:0")
            server = WorkerServer(rt, load_kernels(["remote_kernels"]), None, Limits())
            replies = _Replies()
            async with trio.open_nursery() as nursery:
                session = Session(server, 1, replies, nursery)  # type: ignore[arg-type]
                for handle in (1, 2):
                    session.handle(decode(["alloc", handle, "CUDA:0", 4, "<i4"]))
                session.handle(
                    decode(["prog", 1, "CUDA:0", [_on("inc_gpu", 1), ["s", 2, 1]], False])
                )
                session.handle(decode(["batch", 3, [0, 0, 0], [1], []]))
                assert (await replies.wait_for(1))[0] == ["done", 3, 2, None]
                stuck = [["w", 77, 3, 1], ["c", 0, [2, 0, [4]], [1, 0, [4]]], ["s", 2, 1]]
                session.handle(decode(["prog", 2, "CUDA:0", stuck, False, "copy"]))
                session.handle(decode(["batch", 4, [0, 0, 0, 0], [2], []]))
                await trio.testing.wait_all_tasks_blocked()
                compute = session.queues[("CUDA:0", QueueKind.COMPUTE)]
                copy = session.queues[("CUDA:0", QueueKind.COPY)]
                assert copy is not compute and copy.gpu_busy and not compute.gpu_busy
                nursery.cancel_scope.cancel()
            spare = len(device._spare_words)
            session.abandon()
            assert compute.stream.closed and copy.stream.closed
            assert len(device._spare_words) == spare and len(device._kept_words) == 1


async def test_clients_coming_and_going_leave_no_gpu_words_or_tasks_behind() -> None:
    """The mapped words (and the tasks that keep them equal to the signals) a client's
    waits on a worker's GPU use are given back when it leaves, and the next client's
    reuse them: a worker's pinned memory does not grow with every client it has served."""
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CUDA:0"], cuda_driver="fake") as rt:
            device = rt.device("CUDA:0")
            server = WorkerServer(rt, load_kernels(["remote_kernels"]), None, Limits())
            live = []
            for sid in range(1, 4):
                replies = _Replies()
                async with trio.open_nursery() as nursery:
                    session = Session(server, sid, replies, nursery)  # type: ignore[arg-type]
                    session.handle(decode(["alloc", 1, "CUDA:0", 4, "<i4"]))
                    waits = [["w", 10 + k, 3 + k, 1] for k in range(3)]  # on the stream
                    program = [*waits, _on("inc_gpu", 1), ["s", 2, 1]]
                    session.handle(decode(["prog", 1, "CUDA:0", program, False]))
                    session.handle(decode(["batch", 3, [0, 0, 0, 0, 0, 0], [1], []]))
                    session.handle(decode(["ext", [[10, 1], [11, 1], [12, 1]]]))
                    assert (await replies.wait_for(1))[0] == ["done", 3, 2, None]
                    assert len(device._mirrors) == 3
                    nursery.cancel_scope.cancel()
                session.abandon()
                rt.free(session.buffers.pop(1))
                assert device._mirrors == {}
                live.append(device.driver.statistics().live_allocations)
            assert live[0] == live[1] == live[2]


async def test_programs_run_on_a_devices_copy_queue(workers: tuple[Worker, Worker]) -> None:
    # A program names its queue: a copy on the device's copy queue, a kernel on its compute
    # queue that waits there for the copy; a wrong kind or a local wait on a queue the
    # batch does not run is refused, and the session goes on.
    worker, _ = workers
    with trio.fail_after(GUARD):
        stream = await _session(worker.port)
        for handle in (1, 2):
            await stream.send([encode(["alloc", handle, "CPU:0", 4, "<i4"])])
        data = np.arange(4, dtype=np.int32) + 40
        await stream.send([encode(["put", [2, 0, [4]], 0], data.nbytes), data.tobytes()])
        bases = [0, 0, 0, 0]
        copy = [["c", 0, [1, 0, [4]], [2, 0, [4]]], ["s", 2, 1]]
        inc = [
            ["l", "CPU:0", 2, 1, "copy"],
            ["k", 1, "inc", [[1, 0, [4]]] * 2, [], [1] * 3, [1] * 3],
        ]
        await stream.send(
            [
                encode(["prog", 1, "CPU:0", copy, False, "copy"]),
                encode(["prog", 2, "CPU:0", [*inc, ["s", 3, 1]], False, "compute"]),
                encode(["batch", 3, bases, [1, 2], []]),
            ]
        )
        done = [(await stream.receive())[0] for _ in range(2)]
        assert sorted(meta[2] for meta in done) == [2, 3], done
        assert all(meta[:2] == ["done", 3] and meta[3] is None for meta in done), done
        await stream.send([encode(["get", 9, [1, 0, [4]]])])
        meta, tail = await stream.receive()
        assert meta[:2] == ["data", 9] and tail == 16
        got = bytearray(16)
        await stream.receive_into(memoryview(got))
        np.testing.assert_array_equal(np.frombuffer(got, np.int32), data + 1)
        # A kind that is neither; a local wait on the copy queue when slot 2 is compute's.
        refusals = [
            (
                [encode(["prog", 4, "CPU:0", copy, False, "dma"])],
                [4],
                r"queue kind 'dma' is not 'compute' or 'copy': a program runs on its device's "
                r"compute or copy queue; name one of the two",
            ),
            (
                [
                    encode(
                        [
                            "prog",
                            5,
                            "CPU:0",
                            [["c", 0, [1, 0, [4]], [2, 0, [4]]], ["s", 2, 1]],
                            False,
                        ]
                    ),
                    encode(["prog", 6, "CPU:0", [*inc, ["s", 3, 1]], False, "copy"]),
                ],
                [5, 6],
                r"a local wait on slot 2 names no copy queue of this batch on CPU:0",
            ),
        ]
        for batch_id, (progs, ids, message) in enumerate(refusals, start=10):
            await stream.send([*progs, encode(["batch", batch_id, bases, ids, []])])
            for _ in ids:
                meta, _ = await stream.receive()
                assert meta[:2] == ["done", batch_id] and re.search(message, meta[3][2]), meta
        stream.sock.close()
        # A peer asks to read after a queue the worker does not have.
        async with runtime([worker.name("CPU:0")]) as rt:
            x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
            await rt.copyin(x, np.arange(4, dtype=np.int32))
            conn = rt.device(worker.name("CPU:0")).connection
            peer = await _peer(worker.port)
            ref = [x.memory.handle, 0, [4]]
            read = ["pwhen", 1, conn.session_id, ref, conn.ticket(ref[0]), "CPU:0/dma", 1]
            await peer.send([encode(read)])
            meta, _ = await peer.receive()
            assert meta[0] == "error" and re.search(
                r"this worker has no queue 'CPU:0/dma': name a device's compute queue as DEVICE "
                r"and its copy queue as DEVICE/copy",
                meta[-1],
            )
            peer.sock.close()


async def test_a_read_asked_before_its_buffer_is_allocated_waits_for_it(
    workers: tuple[Worker, Worker],
) -> None:
    # A destination asks for the bytes as its batch arrives, which may be before the
    # source's client's "alloc" reached the source worker (it travels on another
    # connection). The ticket is good: the read waits for the queue, then finds the buffer.
    worker, _ = workers
    with trio.fail_after(GUARD):
        client = await _raw(worker.port)
        welcome = await handshake(client, "client", ["CPU:0"])
        sid, key = welcome[1], welcome[2]
        peer = await _peer(worker.port)
        ref = [1, 0, [4]]
        await peer.send([encode(["pwhen", 5, sid, ref, read_ticket(key, 1), "CPU:0", 1])])
        inc = ["k", 0, "inc", [ref, ref], [], [1, 1, 1], [1, 1, 1]]
        await client.send(
            [
                encode(["alloc", 1, "CPU:0", 4, "<i4"]),
                encode(["prog", 1, "CPU:0", [inc, ["s", 2, 1]], False]),
                encode(["batch", 2, [0, 0, 0], [1], []]),
            ]
        )
        meta, tail = await peer.receive()
        assert meta[:3] == ["data", 5, 0] and tail == 16, meta
        got = bytearray(16)
        await peer.receive_into(memoryview(got))
        np.testing.assert_array_equal(np.frombuffer(got, np.int32), np.ones(4))
        meta, _ = await client.receive()
        assert meta == ["done", 2, 2, None]
        peer.sock.close()
        client.sock.close()


async def test_a_read_asked_ahead_comes_with_the_report_of_its_value(
    workers: tuple[Worker, Worker],
) -> None:
    # "getwhen": the bytes leave once the client's queue reaches the value, as they are
    # then, ahead of that signal's report in one send; a read of a buffer or a queue the
    # session does not have is refused with an error naming the read, and it goes on.
    worker, _ = workers
    with trio.fail_after(GUARD):
        stream = await _session(worker.port)
        data = np.arange(4, dtype=np.int32)
        await stream.send(
            [
                encode(["alloc", 1, "CPU:0", 4, "<i4"]),
                encode(["put", [1, 0, [4]], 0], data.nbytes),
                data.tobytes(),
                # Due at value 5 of the client's CPU:0 compute queue: its base 4, plus 1.
                encode(["getwhen", 7, [1, 0, [4]], "CPU:0", 5]),
            ]
        )
        inc = ["k", 0, "inc", [[1, 0, [4]]] * 2, [], [1] * 3, [1] * 3]
        program = [inc, ["s", 2, 1], inc, ["s", 2, 2]]  # the first signal is reported
        await stream.send(
            [
                encode(["prog", 1, "CPU:0", program, False]),
                encode(["batch", 3, [0, 0, 4], [1], []]),
            ]
        )
        meta, tail = await stream.receive()
        assert meta == ["data", 7, 0, None] and tail == data.nbytes
        got = bytearray(tail)
        await stream.receive_into(memoryview(got))
        np.testing.assert_array_equal(np.frombuffer(got, np.int32), data + 1)  # one inc
        assert (await stream.receive())[0] == ["sig", 3, 2, 1]
        assert (await stream.receive())[0] == ["done", 3, 2, None]
        refusals = [
            (["getwhen", 8, [9, 0, [4]], "CPU:0", 1], r"getwhen src: unknown buffer id 9"),
            (["getwhen", 9, [1, 0, [4]], "CPU:7", 1], r"this worker has no queue 'CPU:7'"),
        ]
        for request, message in refusals:
            await stream.send([encode(request)])
            meta, _ = await stream.receive()
            assert meta[:3] == ["error", "getwhen", request[1]] and re.search(message, meta[3])
        # Asked for a value already reached: the bytes come at once.
        await stream.send([encode(["getwhen", 10, [1, 0, [4]], "CPU:0", 6])])
        meta, tail = await stream.receive()
        assert meta == ["data", 10, 0, None] and tail == data.nbytes
        await stream.receive_into(memoryview(got))
        np.testing.assert_array_equal(np.frombuffer(got, np.int32), data + 2)
        stream.sock.close()


class _HeldReplies(_Replies):
    """Replies that also note where the outbox was held and released: what goes out
    between a hold and its release leaves in one send."""

    def send(self, message: Any, tail: memoryview | None = None) -> trio.Event:
        meta = [*as_meta(message), "(tail)"] if tail is not None else message
        return super().send(meta, None)

    def hold(self) -> None:
        self.sent.append(["hold"])

    def release(self) -> None:
        self.sent.append(["release"])


async def test_a_job_that_waited_sends_a_read_ahead_with_the_report_of_its_value() -> None:
    # A job that waited on a mirror goes on later, outside the frame that brought its
    # batch: the bytes a reported signal makes due still leave in one send with the
    # report (the report runs just before the signal, and holds the outbox).
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"]) as rt, trio.open_nursery() as nursery:
            server = WorkerServer(rt, load_kernels(["remote_kernels"]), None, Limits())
            replies = _HeldReplies()
            session = Session(server, 1, replies, nursery)  # type: ignore[arg-type]
            session.handle(decode(["alloc", 1, "CPU:0", 4, "<i4"]))
            session.handle(decode(["getwhen", 7, [1, 0, [4]], "CPU:0", 1]))
            inc = ["k", 0, "inc", [[1, 0, [4]]] * 2, [], [1] * 3, [1] * 3]
            program = [["w", 9, 0, 1], inc, ["s", 2, 1], inc, ["s", 2, 2]]
            session.handle(decode(["prog", 1, "CPU:0", program, False]))
            session.handle(decode(["batch", 3, [0, 0, 0], [1], []]))
            await trio.testing.wait_all_tasks_blocked()
            assert not [m for m in replies.sent if m[0] in ("data", "sig", "done")]
            del replies.sent[:]
            session.handle(decode(["ext", [[9, 1]]]))  # the job goes on
            sent = await replies.wait_for(6)
            assert sent[:4] == [
                ["hold"],
                ["data", 7, 0, None, "(tail)"],
                ["sig", 3, 2, 1],
                ["release"],
            ]
            assert ["done", 3, 2, None] in sent[4:]
            np.testing.assert_array_equal(session.buffers[1].host_view(), np.full(4, 2))
            nursery.cancel_scope.cancel()


async def test_a_long_run_of_quick_kernels_lets_other_clients_in_between() -> None:
    """Kernels each quick enough for the event loop, but many in a row: the worker cuts
    the run where it would hold the loop past RUN_BUDGET_S by their known times, with a
    checkpoint there, and still runs every kernel in order."""
    from actorgraph.devices import AWAIT, EXEC, run_op

    from actorgraph.worker._placement import RUN_BUDGET_S, AdaptiveKernel, KernelTimes

    ran: list[int] = []
    note = ran.append
    times = KernelTimes(clock=lambda: 0.0)
    per_call = RUN_BUDGET_S / 11.5  # 11 fit in the budget, the 12th does not
    times.record("quick", per_call)
    assert times.inline("quick")
    template = [AdaptiveKernel(times, "quick", run_op(EXEC, note, (i,), i)) for i in range(23)]
    ops, _ = times.code(template)
    kernels_between: list[list[int]] = [[]]  # kernels of each run, cut at the checkpoints
    for op in ops:
        assert isinstance(op, RunOp)  # a program of kernels: calls and checkpoints only
        if op.code == AWAIT:
            kernels_between.append([])
        elif op.fn is note:
            kernels_between[-1].append(op.args[0])
    assert [len(run) for run in kernels_between] == [11, 11, 1]
    actor = QueueActor("q")
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        sub = Submission(1, [], [], [()], [])
        actor.post(Job(ops, [0, 0, 0], sub, 0))
        with trio.fail_after(GUARD):
            await sub.done.wait()
        nursery.cancel_scope.cancel()
    assert sub.error is None and ran == list(range(23))


def test_a_run_slow_only_on_the_wall_is_held_against_a_kernel_only_when_it_repeats() -> None:
    """Wall time also counts the moments the OS ran another process: runs slow on the
    wall but quick on the CPU leave a kernel where it was, unless SUSPECTS_SLOW come in
    a row (a kernel that sleeps or blocks is slow on the wall every time)."""
    from actorgraph.worker._placement import INLINE_BOUND_S, SUSPECTS_SLOW, KernelTimes

    times = KernelTimes(clock=lambda: 0.0, cpu_clock=lambda: 0.0)
    quick, slow = INLINE_BOUND_S / 10, INLINE_BOUND_S * 10
    times.record("k", quick, quick)
    assert times.inline("k")
    for _ in range(3):
        for _ in range(SUSPECTS_SLOW - 1):
            times.record("k", slow, quick)  # preempted
        times.record("k", quick, quick)
        assert times.inline("k")
    for _ in range(SUSPECTS_SLOW):
        times.record("k", slow, quick)  # so many in a row: it blocks
    assert not times.inline("k")
    # A kernel that blocks from its first run never comes to the loop.
    for _ in range(2 * SUSPECTS_SLOW):
        times.record("sleeper", slow, quick)
        assert not times.inline("sleeper")
    # Slow on the CPU too is judged at once.
    times.record("spinner", quick, quick)
    times.record("spinner", slow, slow)
    assert not times.inline("spinner")


def test_a_strike_is_forgotten_after_a_long_streak_of_quick_runs() -> None:
    """A slow run that was a fluke (the machine's doing) is forgotten after FORGIVEN_AFTER
    times the streak it asked for, so strikes over a long life do not pile up into ever
    longer stays on the thread; a kernel slow again before then keeps its strikes."""
    from actorgraph.worker._placement import FORGIVEN_AFTER, INLINE_BOUND_S, KernelTimes

    times = KernelTimes(clock=lambda: 0.0, cpu_clock=lambda: 0.0)
    quick, slow = INLINE_BOUND_S / 10, INLINE_BOUND_S * 10
    times.record("k", quick)
    times.record("k", slow)
    times.record("k", quick)
    times.record("k", slow)  # back on the thread after 1 quick run: 2 strikes
    for _ in range(64):
        times.record("k", quick)
    assert times.inline("k") and times.shapes["k"].strikes == 2
    times.record("k", slow)  # slow again before it is forgiven: 3 strikes
    for _ in range(512 * FORGIVEN_AFTER - 1):
        times.record("k", quick)
    assert times.shapes["k"].strikes == 3
    times.record("k", quick)
    assert times.shapes["k"].strikes == 2 and times.inline("k")
    for _ in range(64 * FORGIVEN_AFTER):
        times.record("k", quick)
    assert times.shapes["k"].strikes == 1


def test_a_kernels_typical_time_ignores_its_cold_first_run_and_spikes() -> None:
    """The time runs of inline kernels are cut by: not the first run (cold), nor the
    longest: later runs move it by an eighth of the difference (a spike as twice it), so
    a program of 100 tiny kernels stays on the loop in one piece."""
    from actorgraph.devices import AWAIT, EXEC, run_op

    from actorgraph.worker._placement import RUN_BUDGET_S, AdaptiveKernel, KernelTimes

    times = KernelTimes(clock=lambda: 0.0, cpu_clock=lambda: 0.0)
    times.record("k", 85e-6)  # the cold first run, on the thread
    assert times.quick_time("k") == pytest.approx(85e-6)
    times.record("k", 2e-6)
    assert times.quick_time("k") == pytest.approx(2e-6)
    times.record("k", 90e-6)  # a spike, still under the bound: counted as 2x at most
    assert times.quick_time("k") == pytest.approx(2e-6 + 2e-6 / 8)
    times.record("k", 1e-6)
    assert times.quick_time("k") == pytest.approx(2.25e-6 - 1.25e-6 / 8)
    template = [AdaptiveKernel(times, "k", run_op(EXEC, print, (i,), i)) for i in range(100)]
    assert not [op for op in times.code(template)[0] if op.code == AWAIT]
    # Still cut where the typical times add up past the budget.
    count = int(RUN_BUDGET_S / times.quick_time("k")) + 2
    many = [AdaptiveKernel(times, "k", run_op(EXEC, print, (i,), i)) for i in range(count)]
    assert len([op for op in times.code(many)[0] if op.code == AWAIT]) == 1


def test_a_run_of_inline_kernels_faster_than_expected_recodes_its_programs() -> None:
    """Kernels only ever timed cold on the thread: a run of them on the loop, timed as a
    whole, brings their typical times down to what the run took, and programs whose
    runs were cut recode, so their runs are no longer cut where they need not be."""
    from actorgraph.devices import AWAIT, EXEC, run_op

    from actorgraph.worker._placement import AdaptiveKernel, KernelTimes

    now = [0.0]
    times = KernelTimes(clock=lambda: now[0], cpu_clock=lambda: now[0])
    times.record("a", 80e-6)
    times.record("b", 40e-6)
    template = [AdaptiveKernel(times, key, run_op(EXEC, print, (), 0)) for key in "ab" * 20]
    _, cut = times.code(template)  # 40 kernels, 2.4 ms by their cold times: cut
    _, small = times.code(template[:2])  # 2 kernels: far from the budget
    assert not times.stale(cut) and not times.stale(small)
    cell = [0.0, 0.0]
    times.start_run(cell)
    now[0] += 12e-6  # 4 kernels expected to take 240 us took 12
    times.check_run(cell, {"a": 80e-6, "b": 40e-6}, 240e-6)
    assert times.quick_time("a") == pytest.approx(4e-6)
    assert times.quick_time("b") == pytest.approx(2e-6)
    assert times.stale(cut) and not times.stale(small)
    assert times.inline("a") and times.inline("b")
    ops, cut = times.code(template)
    assert not [op for op in ops if op.code == AWAIT] and not times.stale(cut)


async def test_a_peer_is_told_how_far_a_queue_got_only_with_its_ticket(
    workers: tuple[Worker, Worker],
) -> None:
    # "pwatch" on a link: the answer (a "data" frame of no bytes) comes once the client's
    # queue reaches the value; a wrong ticket, or one for another queue, is refused.
    worker, _ = workers
    name = worker.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([name]) as rt:
            conn = rt.device(name).connection
            sid = conn.session_id
            x = rt.alloc(name, 4, np.int32)
            await rt.run([ag.Launch(INC, [x, x])])  # the client's CPU:0 queue moves
            peer = await _peer(worker.port)
            for req, ticket in [(1, b"\0" * 16), (2, conn.watch_ticket("CPU:0/copy"))]:
                await peer.send([encode(["pwatch", req, sid, "CPU:0", 1, ticket])])
                meta, _ = await peer.receive()
                assert meta[:3] == ["error", "pwatch", req] and re.search(
                    rf"watch of queue 'CPU:0' of session {sid} refused: no such session or "
                    r"a bad watch ticket",
                    meta[3],
                ), meta
            await peer.send([encode(["pwatch", 3, sid, "CPU:0", 1, conn.watch_ticket("CPU:0")])])
            meta, tail = await peer.receive()
            assert meta == ["data", 3, 0, None] and tail == 0
            peer.sock.close()


async def test_a_profiled_batch_sends_each_jobs_times_before_its_done() -> None:
    """A batch that asks to be profiled: its job goes to its actor, which times its items
    and the wait it parks on; their times, named by program entry (the worker's report
    op left out), leave before the job's done, with when the batch came. One that does
    not ask sends nothing of this. A ping is answered at once, saying when."""
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"]) as rt, trio.open_nursery() as nursery:
            server = WorkerServer(rt, load_kernels(["remote_kernels"]), None, Limits())
            replies = _Replies()
            session = Session(server, 1, replies, nursery)  # type: ignore[arg-type]
            session.handle(decode(["alloc", 1, "CPU:0", 4, "<i4"]))
            inc = ["k", 7, "inc", [[1, 0, [4]]] * 2, [], [1] * 3, [1] * 3]
            last = ["k", 8, "inc", [[1, 0, [4]]] * 2, [], [1] * 3, [1] * 3]
            # entries: 0 wait, 1 item 7, 2 signal (reported), 3 item 8, 4 signal
            program = [["w", 9, 0, 1], inc, ["s", 2, 1], last, ["s", 2, 2]]
            session.handle(decode(["prog", 1, "CPU:0", program, True]))
            session.handle(decode(["batch", 3, [0, 0, 0], [1], []]))  # not profiled
            assert (await replies.wait_for(0)) == []
            session.handle(decode(["ext", [[9, 1]]]))
            sent = await replies.wait_for(2)
            assert [m[0] for m in sent] == ["sig", "done"]
            del replies.sent[:]
            before = time.perf_counter()
            session.handle(decode(["batch", 4, [1, 0, 0], [1], [], True]))  # waits for 2
            await trio.testing.wait_all_tasks_blocked()  # parked on the mirror
            session.handle(decode(["ext", [[9, 2]]]))
            sent = await replies.wait_for(3)
            after = time.perf_counter()
            assert [m[0] for m in sent] == ["sig", "times", "done"]
            times = decode(decode_frame(encode(sent[1]), Limits())[0])  # as it arrives
            assert (times.batch, times.slot) == (4, 2)
            assert before <= times.received <= times.sent <= after
            assert [span[0] for span in times.spans] == [0, 1, 3]  # the wait, then items
            wait, first, second = times.spans
            assert times.start is not None and times.end is not None
            assert times.start <= wait[1] <= wait[2] <= first[1] <= first[2]
            assert first[2] <= second[1] <= second[2] <= times.end
            np.testing.assert_array_equal(session.buffers[1].host_view(), np.full(4, 4))
            del replies.sent[:]
            session.handle(decode(["ping", 5]))
            (pong,) = await replies.wait_for(1)
            assert pong[:2] == ["pong", 5] and after <= pong[2] <= pong[3]
            nursery.cancel_scope.cancel()


def test_a_program_with_kernels_placed_by_their_times_is_made_with_those_times() -> None:
    from actorgraph.devices import EXEC, run_op

    from actorgraph.worker._lowered import Program
    from actorgraph.worker._placement import AdaptiveKernel, KernelTimes

    times = KernelTimes(clock=lambda: 0.0)
    ops = [AdaptiveKernel(times, "k", run_op(EXEC, print, (), 0))]
    with pytest.raises(ValueError, match="coded with those times: pass the worker's KernelTimes"):
        Program(store=True, slot=2, actor=QueueActor("q"), ops=ops, count=1)
    program = Program(store=True, slot=2, actor=QueueActor("q"), ops=ops, times=times, count=1)
    assert len(program.ops) == 1 and program.error is None
