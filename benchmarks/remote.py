"""REMOTE benchmark: per-replay overhead over loopback and copy bandwidth.

    python benchmarks/remote.py        # prints figures, writes benchmarks/results/remote.json

Starts two workers on loopback (`actorgraph worker --port 0`). Figures:
- replay of a 100-item graph living on one worker (target: one round trip, <= 300 us),
  next to a 1-item graph and a bare TCP round trip between two trio tasks;
- copy bandwidth client <-> worker (copyin/copyout, and graph Copy items between a local
  CPU device and a remote one) and worker -> worker (a graph Copy between two workers,
  the bytes going directly), 64 MiB (target >= 1 GB/s).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from remote_kernels import INC  # noqa: E402

import actorgraph as ag  # noqa: E402


def start_worker(devices: str) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "actorgraph",
            "worker",
            "--port",
            "0",
            "--devices",
            devices,
            "--kernels",
            "remote_kernels",
        ],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"listening on \S+:(\d+)", line)
    if match is None:
        proc.kill()
        raise SystemExit(f"worker did not start: {line!r}")
    return proc, int(match.group(1))


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


async def per_replay(rt: ag.Runtime, device: str, nitems: int, n: int) -> dict[str, float]:
    x = rt.alloc(device, 256, np.int32)
    graph = await rt.compile([ag.Launch(INC, [x, x]) for _ in range(nitems)])
    conn = rt.device(device).connection
    for _ in range(20):
        await graph()
    samples = []
    sent0, recv0 = conn.batches_sent, conn.frames_received
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            await graph()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    replays = 5 * n
    return {
        "us_per_replay": min(samples),
        "us_per_replay_median": statistics.median(samples),
        "batches_per_replay": (conn.batches_sent - sent0) / replays,
        "frames_back_per_replay": (conn.frames_received - recv0) / replays,
    }


async def bandwidth(rt: ag.Runtime, a: str, b: str, nbytes: int, reps: int = 8) -> dict[str, float]:
    """GB/s, best of `reps`: host copies (copyin/copyout, whose output array is fresh
    memory every call) and device copies (graph Copy items into buffers in use)."""
    n = nbytes // 4
    src = np.arange(n, dtype=np.int32)
    xa = rt.alloc(a, n, np.int32)
    xb = rt.alloc(b, n, np.int32)
    local = rt.alloc("CPU:0", n, np.int32)
    await rt.copyin(local, src)
    copies = {
        "client_to_worker_device_copy": await rt.compile([ag.Copy(dst=xa, src=local)]),
        "worker_to_worker_device_copy": await rt.compile([ag.Copy(dst=xb, src=xa)]),
        "worker_to_client_device_copy": await rt.compile([ag.Copy(dst=local, src=xb)]),
    }
    timings: dict[str, list[float]] = {
        "client_to_worker_copyin": [],
        "worker_to_client_copyout": [],
    }
    timings.update({k: [] for k in copies})
    for _ in range(reps):
        t0 = time.perf_counter()
        await rt.copyin(xa, src)
        timings["client_to_worker_copyin"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out = await rt.copyout(xa)
        timings["worker_to_client_copyout"].append(time.perf_counter() - t0)
        for key, graph in copies.items():
            t0 = time.perf_counter()
            await graph()
            timings[key].append(time.perf_counter() - t0)
    if not np.array_equal(out, src) or not np.array_equal(await rt.copyout(local), src):
        raise SystemExit("bandwidth check: data did not arrive intact")
    return {k: nbytes / min(v) / 1e9 for k, v in timings.items()}


async def main() -> dict[str, Any]:
    wa, port_a = start_worker("CPU:0")
    wb, port_b = start_worker("CPU:0")
    try:
        a, b = f"CPU:0@127.0.0.1:{port_a}", f"CPU:0@127.0.0.1:{port_b}"
        floor = await tcp_round_trip()
        async with ag.open_runtime(["CPU:0", a, b]) as rt:
            r100 = await per_replay(rt, a, 100, 400)
            r1 = await per_replay(rt, a, 1, 400)
            bw = await bandwidth(rt, a, b, 64 << 20)
    finally:
        wa.kill()
        wb.kill()
    return {
        "tcp_round_trip_us": floor,
        "replay_100_items": r100,
        "replay_1_item": r1,
        "bandwidth_GBps_64MiB": bw,
        "targets": {"replay_100_items_us": 300, "bandwidth_GBps": 1.0},
    }


def report(results: dict[str, Any]) -> None:
    r100, r1 = results["replay_100_items"], results["replay_1_item"]
    bw = results["bandwidth_GBps_64MiB"]
    print(f"bare loopback TCP round trip (trio):      {results['tcp_round_trip_us']:7.1f} us")
    print(f"replay, 1-item graph on one worker:       {r1['us_per_replay']:7.1f} us")
    print(
        f"replay, 100-item graph on one worker:     {r100['us_per_replay']:7.1f} us "
        f"(median {r100['us_per_replay_median']:.1f}; {r100['batches_per_replay']:.0f} batch "
        f"out, {r100['frames_back_per_replay']:.0f} frame back per replay; target <= 300 us)"
    )
    for key, value in bw.items():
        print(f"copy {key.replace('_', ' '):36s} {value:6.2f} GB/s (64 MiB; target >= 1 GB/s)")


if __name__ == "__main__":
    results = trio.run(main)
    report(results)
    out = HERE / "results" / "remote.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
