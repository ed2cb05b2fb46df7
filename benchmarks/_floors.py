"""The machine's own floors, measured in the run that compares against them.

- `tcp_round_trip`: a bare request and reply between two trio tasks over loopback TCP;
- `process_round_trip`: the same between this process and another trio process, with
  the CPU each side spends on one: the floor of any call on a worker, which is another
  process;
- `thread_round_trip`: a call handed to a thread that waits for I/O (on an epoll, woken
  by a byte on a socket pair, as a trio run waits) and answered through a
  `concurrent.futures.Future`: the floor of a call from synchronous code (tinygrad's
  thread) into a runtime that runs on a thread of its own.

The benchmark scripts share them, so a figure and its floor come from the same run.
"""

from __future__ import annotations

import concurrent.futures
import os
import select
import socket
import subprocess
import sys
import threading
import time

import trio


async def tcp_round_trip(n: int = 2000) -> float:
    """A bare request/reply between two trio tasks over loopback TCP: the floor."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    async def echo() -> None:
        conn, _ = await listener.accept()
        conn.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        while data := await conn.recv(64):
            await conn.send(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo)
        client = trio.socket.socket()
        await client.connect(("127.0.0.1", port))
        client.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        for _ in range(n):
            await client.send(b"x" * 40)
            await client.recv(64)
        elapsed = time.perf_counter() - t0
        client.close()
        nursery.cancel_scope.cancel()
    return elapsed / n * 1e6


ECHO_SERVER = """
import sys, trio
async def main():
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    print(listener.getsockname()[1], flush=True)
    conn, _ = await listener.accept()
    conn.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
    while data := await conn.recv(64):
        await conn.send(data)
trio.run(main)
"""


async def process_round_trip(n: int = 2000) -> tuple[float, dict[str, float | None]]:
    """A bare request/reply between this process and another trio process over loopback
    TCP: the floor of any replay on a worker, which is in another process. Returns us
    per round trip, and the CPU us each side spends on one (the floor of a replay's
    CPU: "client", and "server" where /proc tells)."""
    proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline()) if proc.stdout else 0
        client = trio.socket.socket()
        await client.connect(("127.0.0.1", port))
        client.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        for _ in range(100):
            await client.send(b"x" * 40)
            await client.recv(64)
        server0 = process_cpu_s(proc.pid)
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        for _ in range(n):
            await client.send(b"x" * 40)
            await client.recv(64)
        elapsed = time.perf_counter() - t0
        cpu = {"client": (time.process_time() - cpu0) / n * 1e6, "server": None}
        server1 = process_cpu_s(proc.pid)
        if server0 is not None and server1 is not None:
            cpu["server"] = (server1 - server0) / n * 1e6
        client.close()
    finally:
        proc.kill()
        proc.wait()
    return elapsed / n * 1e6, cpu


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process `pid` used so far, where /proc tells."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_round_trip(n: int = 2000) -> float:
    """us for a call handed to a thread waiting on an epoll (a byte on a socket pair
    wakes it) and answered through a Future the caller waits on: two thread wake-ups
    and nothing else (see the module docstring)."""
    bell, reader = socket.socketpair()
    reader.setblocking(False)
    calls: list[concurrent.futures.Future[int] | None] = []

    def serve() -> None:
        poller = select.epoll()
        poller.register(reader.fileno(), select.EPOLLIN)
        try:
            while True:
                poller.poll()
                reader.recv(4096)
                while calls:
                    call = calls.pop()
                    if call is None:
                        return
                    call.set_result(1)
        finally:
            poller.close()

    thread = threading.Thread(target=serve, name="floor: thread round trip", daemon=True)
    thread.start()

    def one() -> None:
        call: concurrent.futures.Future[int] = concurrent.futures.Future()
        calls.append(call)
        bell.send(b"\0")
        call.result()

    try:
        for _ in range(100):
            one()
        t0 = time.perf_counter()
        for _ in range(n):
            one()
        elapsed = time.perf_counter() - t0
    finally:
        calls.append(None)
        bell.send(b"\0")
        thread.join()
        bell.close()
        reader.close()
    return elapsed / n * 1e6
