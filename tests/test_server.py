"""The worker's server (actorgraph/worker/_server.py) among strangers and departed
clients: what a connection that has not proved the token can make the worker hold, a
flood of idle and half-open connections at a low file limit, the memory a client that
left gives back, and a stop that is quiet. Real worker subprocesses on loopback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import remote_kernels
import trio
import trio.testing
from _workers import GUARD, TOKEN, runtime
from actorgraph.devices.remote.frames import HEADER, FrameStream
from actorgraph.devices.remote.wire import HANDSHAKE_LIMITS, VERSION, Limits

import actorgraph as ag
from actorgraph.testing import Worker
from actorgraph.worker import _server as worker_server
from actorgraph.worker import run_worker

sys.path.insert(0, str(Path(__file__).parent))
from remote_kernels import HELD


async def _raw(port: int) -> FrameStream:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    return FrameStream(sock, Limits())


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
