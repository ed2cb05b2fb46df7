"""The worker's server (actorgraph/worker/_server.py) among strangers and departed
clients: what a connection that has not proved the token can make the worker hold, a
flood of idle and half-open connections at a low file limit, the memory a client that
left gives back, and a stop that is quiet. Real worker subprocesses on loopback.
"""

from __future__ import annotations

import os
import resource
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import remote_kernels
import trio
import trio.testing
from _workers import GUARD, TOKEN, runtime, start
from actorgraph.devices.remote.frames import HEADER, FrameStream, encode
from actorgraph.devices.remote.wire import (
    HANDSHAKE_LIMITS,
    NONCE_BYTES,
    TO_WORKER,
    VERSION,
    Limits,
    handshake_mac,
)

import actorgraph as ag
from actorgraph.testing import Worker
from actorgraph.worker import _server as worker_server
from actorgraph.worker import run_worker

sys.path.insert(0, str(Path(__file__).parent))
from remote_kernels import HELD

MiB = 1 << 20


async def _raw(port: int) -> FrameStream:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    return FrameStream(sock, Limits())


def _rss(pid: int) -> int:
    """A process's resident memory in bytes, as the kernel counts it now."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _served_within(worker: Worker, seconds: float) -> float:
    """A real client opens a session, writes and reads back a buffer: its seconds, which
    must stay under `seconds`."""
    start_time = time.monotonic()
    with trio.fail_after(seconds):
        async with runtime([worker.name("CPU:0")]) as rt:
            x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
            await rt.copyin(x, np.arange(4, dtype=np.int32))
            np.testing.assert_array_equal(await rt.copyout(x), np.arange(4))
    return time.monotonic() - start_time


async def test_a_handshake_frame_over_its_small_limit_is_refused_unread(
    workers: tuple[Worker, Worker],
) -> None:
    # Before the token is proved a frame is a few hundred bytes: one that says it is
    # larger is refused at its header, so a stranger cannot make the worker hold it.
    worker, _ = workers
    with trio.fail_after(GUARD):
        for size in (HANDSHAKE_LIMITS.max_meta + 1, 64 << 10, Limits().max_meta):
            stream = await _raw(worker.port)
            meta, _ = await stream.receive()
            assert meta[0] == "challenge"
            await stream.send([HEADER.pack(b"AG", VERSION, size, 0)])
            with trio.fail_after(5):  # refused at once, not after the handshake's timeout
                meta, _ = await stream.receive()
            assert meta[0] == "error" and meta[1] == "frame", meta
            assert meta[-1] == (
                f"frame meta of {size} bytes is outside 1..{HANDSHAKE_LIMITS.max_meta}: "
                f"before it proves the token, a connection's frames are at most "
                f"{HANDSHAKE_LIMITS.max_meta} bytes (a handshake message); is this an "
                f"actorgraph client of this version?"
            )
            assert await stream.sock.recv(1) == b""  # and that connection is closed


async def _flood(port: int, count: int, kind: int, held: list[trio.socket.SocketType]) -> None:
    """Open `count` connections that never authenticate, of three kinds in turn: idle,
    half a frame header, a hello and no answer to the challenge. Connections the worker
    has not taken in yet wait in its listen queue; one that waits too long is given up."""

    async def one(i: int) -> None:
        sock = trio.socket.socket()
        with trio.move_on_after(2):
            try:
                await sock.connect(("127.0.0.1", port))
                if (kind + i) % 3 == 1:
                    await sock.send(HEADER.pack(b"AG", VERSION, 40, 0)[:7])
                elif (kind + i) % 3 == 2:
                    await sock.send(encode(["hello", "client", b"n" * 32]))
            except OSError:
                pass  # shed by the worker before it was in: what a flood meets
        held.append(sock)

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)


async def test_a_flood_of_idle_and_half_open_connections_at_the_file_limit() -> None:
    # The worker's file limit is lowered to a few dozen above what it holds; far more
    # connections than that come and never authenticate. It sheds them and backs off
    # where accept finds no file left, never exits, keeps answering a real client
    # within a second, holds little memory for them, and says what it shed in a few
    # lines, not one per connection.
    worker = start("CPU:0")
    held: list[trio.socket.SocketType] = []
    try:
        pid = worker.process.pid
        limit = _open_files(pid) + 16
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
        with trio.fail_after(GUARD):
            await _served_within(worker, GUARD)  # warm: its first session's one-time work
            rss = _rss(pid)
            for round_ in range(4):
                await _flood(worker.port, 150, round_, held)
                assert worker.process.poll() is None, worker.output
                await _served_within(worker, 1.0)
            assert _rss(pid) - rss < 32 * MiB
            assert _open_files(pid) <= limit
    finally:
        for sock in held:
            sock.close()
        worker.stop()
    shed = [line for line in worker.output.splitlines() if "not authenticated" in line]
    assert 1 <= len(shed) <= 6, worker.output
    assert "Traceback" not in worker.output, worker.output


def test_a_worker_started_with_sigint_ignored_still_stops_quietly_on_it() -> None:
    # A shell starts background jobs with SIGINT ignored, and a child inherits that: the
    # worker still stops on SIGINT (Ctrl-C, or `kill -INT`), quietly, with exit code 0.
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        worker = start("CPU:0")
    finally:
        signal.signal(signal.SIGINT, before)
    try:
        worker.process.send_signal(signal.SIGINT)
        assert worker.process.wait(GUARD) == 0
    finally:
        worker.stop()
    assert "Traceback" not in worker.output, worker.output


async def _stranger(port: int, source: str) -> tuple[FrameStream, bytes]:
    """A connection from `source` (a loopback address) that has read its challenge, and
    the challenge's nonce."""
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    stream = FrameStream(sock, Limits())
    meta, _ = await stream.receive()
    assert meta[0] == "challenge", meta
    return stream, meta[1]


async def _authenticate(stream: FrameStream, theirs: bytes) -> list[object]:
    """The rest of a client's handshake: the worker's answer."""
    ours = secrets.token_bytes(NONCE_BYTES)
    mac = handshake_mac(TOKEN, "client", ours, theirs, TO_WORKER)
    await stream.send([encode(["hello", "client", ours]), encode(["auth", mac, ["CPU:0"]])])
    meta, _ = await stream.receive()
    return meta


async def test_connections_not_yet_authenticated_are_bounded_the_oldest_shed() -> None:
    # At most 4 from one address and 6 in all: the fifth from 127.0.0.1 sheds its
    # oldest, then a third from 127.0.0.2 sheds the oldest of all. Those kept can still
    # authenticate; the worker says what it shed, and the rest of the count at its stop.
    worker = start(
        "CPU:0", extra_args=["--max-handshakes", "6", "--max-handshakes-per-address", "4"]
    )
    try:
        with trio.fail_after(GUARD):
            ones = [await _stranger(worker.port, "127.0.0.1") for _ in range(6)]
            twos = [await _stranger(worker.port, "127.0.0.2") for _ in range(3)]
            for stream, _ in ones[:3]:
                assert await stream.sock.recv(1) == b"", "a shed connection is closed"
            for stream, nonce in ones[3:] + twos:
                assert (await _authenticate(stream, nonce))[0] == "welcome"
                stream.close()
            await _served_within(worker, GUARD)
        worker.process.send_signal(signal.SIGINT)
        assert worker.process.wait(GUARD) == 0
    finally:
        worker.stop()
    lines = [line for line in worker.output.splitlines() if "not authenticated" in line]
    bounds = "bounds: --max-handshakes 6, --max-handshakes-per-address 4)"
    assert lines == [
        "actorgraph worker: shed 1 connection(s) that had not authenticated, the oldest "
        f"first (the latest from 127.0.0.1, as its address had 4 such; {bounds}",
        "actorgraph worker: shed 2 connection(s) that had not authenticated, the oldest "
        f"first (the latest from 127.0.0.1, as there were 6 such in all; {bounds}",
    ], worker.output


async def test_a_worker_stopped_while_a_connection_ends_stops_and_raises_nothing() -> None:
    # A client leaves while its kernel runs on its queue's thread, so its connection
    # ends (the worker read the close) only once that run returns; the worker is
    # stopped meanwhile. The stop is all there is: the connection's end, a disconnect
    # met at the same time, is no error of the worker's.
    remote_kernels.RELEASE.clear()
    stop = trio.CancelScope()

    async def serve(task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        with stop:
            await run_worker(
                ["CPU:0"], token=TOKEN, kernel_modules=["remote_kernels"], task_status=task_status
            )

    try:
        with trio.fail_after(GUARD):
            async with trio.open_nursery() as nursery:
                host, port = await nursery.start(serve)
                name = f"CPU:0@{host}:{port}"
                async with runtime([name]) as rt:
                    x = rt.alloc(name, 4, np.int32)
                    graph = await rt.compile([ag.Launch(HELD, [x, x])])
                    await graph.submit()
                    await trio.testing.wait_all_tasks_blocked()
                await trio.testing.wait_all_tasks_blocked()  # the worker read the close
                stop.cancel()
                await trio.testing.wait_all_tasks_blocked()
                remote_kernels.RELEASE.set()
    finally:
        remote_kernels.RELEASE.set()


def _stopped_with(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: BaseException
) -> tuple[int, str]:
    """What `actorgraph worker` exits with, and says, when its run ends in `error`."""

    def run(main: object) -> None:
        raise error

    monkeypatch.setattr(worker_server.trio, "run", run)
    code = worker_server.worker_main(["CPU:0"], "127.0.0.1", 0, None, [], Limits())
    return code, capsys.readouterr().err


def test_a_stop_grouped_with_connections_reset_meanwhile_is_quiet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ctrl-C while links are being reset: the interrupt comes grouped with the resets.
    # A stop exits 0 and says nothing; an error that is no disconnect is still said.
    resets = ExceptionGroup("links", [BrokenPipeError(32, "x"), ConnectionResetError(104, "y")])
    stop = BaseExceptionGroup("worker", [KeyboardInterrupt(), resets])
    assert _stopped_with(monkeypatch, capsys, stop) == (0, "")
    nested = BaseExceptionGroup("worker", [BaseExceptionGroup("runtime", [stop])])
    assert _stopped_with(monkeypatch, capsys, nested) == (0, "")
    bug = BaseExceptionGroup("worker", [KeyboardInterrupt(), RuntimeError("a bug")])
    assert _stopped_with(monkeypatch, capsys, bug) == (
        0,
        "actorgraph worker: stopped; meanwhile this failed: RuntimeError('a bug')\n",
    )


_CLIENT = """
import sys, trio, numpy as np
import actorgraph as ag

sys.path.insert(0, sys.argv[3])
from remote_kernels import GATED


async def main(name, token, gated):
    async with ag.open_runtime([name], remote_token=token) as rt:
        for _ in range(4):
            x = rt.alloc(name, 16 << 20, np.int32)
            await rt.copyin(x, np.ones(16 << 20, np.int32))
        if gated:  # a kernel of it runs on the worker until the test opens the gate
            graph = await rt.compile([ag.Launch(GATED, [x, x])])
            await graph.submit()
        print("allocated", flush=True)
        await trio.sleep_forever()

trio.run(main, sys.argv[1], sys.argv[2].encode(), sys.argv[4] == "gated")
"""


async def _rss_back_to(pid: int, bound: int) -> None:
    """Wait until process `pid`'s resident memory is at most `bound` bytes."""
    while _rss(pid) > bound:
        await trio.sleep(0.05)


async def _client_killed(worker: Worker, how: str) -> None:
    """A client process allocates and writes 256 MiB on `worker` (and, `how` =
    "gated", leaves a kernel running there), then is killed."""
    here = str(Path(__file__).parent)
    client = await trio.lowlevel.open_process(
        [sys.executable, "-c", _CLIENT, worker.name("CPU:0"), TOKEN.decode(), here, how],
        stdout=subprocess.PIPE,
    )
    try:
        assert client.stdout is not None
        said = b""
        while b"allocated" not in said:
            said += await client.stdout.receive_some()
    finally:
        client.kill()
        await client.wait()


async def test_a_departed_clients_memory_is_given_back_at_once(gate: Path) -> None:
    # A client allocates 256 MiB on the worker and writes all of it, then leaves: by
    # closing its runtime, killed, and killed while a kernel of it runs there. Each
    # time the worker's resident memory is back within 32 MiB of what it was before
    # within seconds (once that kernel returned), not whenever Python's cycle collector
    # happens to run.
    worker = start("CPU:0")
    try:
        pid = worker.process.pid
        with trio.fail_after(GUARD):
            await _served_within(worker, GUARD)  # its first session's one-time work
            base = _rss(pid)
            async with runtime([worker.name("CPU:0")]) as rt:
                for _ in range(4):
                    x = rt.alloc(worker.name("CPU:0"), 16 << 20, np.int32)
                    await rt.copyin(x, np.ones(16 << 20, np.int32))
                assert _rss(pid) > base + 200 * MiB
            with trio.fail_after(5):
                await _rss_back_to(pid, base + 32 * MiB)
            await _client_killed(worker, "idle")
            with trio.fail_after(5):
                await _rss_back_to(pid, base + 32 * MiB)
            await _client_killed(worker, "gated")
            # Its connection ends once its kernel returns (a thread cannot be stopped):
            # until then the memory stays, as it does for a client still there.
            assert _rss(pid) > base + 200 * MiB
            gate.touch()
            with trio.fail_after(5):
                await _rss_back_to(pid, base + 32 * MiB)
    finally:
        worker.stop()


async def test_a_departed_clients_memory_read_by_another_worker_is_given_back() -> None:
    # Another worker read the client's buffers over its link to this one (a copy
    # between the two workers); the link stays, the client leaves: what the link read
    # is not kept.
    a, b = start("CPU:0"), start("CPU:0")
    try:
        pid = a.process.pid
        with trio.fail_after(GUARD):
            await _served_within(a, GUARD)
            base = _rss(pid)
            async with runtime([a.name("CPU:0"), b.name("CPU:0")]) as rt:
                for _ in range(4):
                    x = rt.alloc(a.name("CPU:0"), 16 << 20, np.int32)
                    y = rt.alloc(b.name("CPU:0"), 16 << 20, np.int32)
                    await rt.copyin(x, np.ones(16 << 20, np.int32))
                    await rt.run([ag.Copy(dst=y, src=x)])
                assert _rss(pid) > base + 200 * MiB
            with trio.fail_after(5):
                await _rss_back_to(pid, base + 32 * MiB)
    finally:
        a.stop()
        b.stop()
