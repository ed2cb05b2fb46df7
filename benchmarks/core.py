"""Core replay benchmarks: prints figures and writes benchmarks/results/core.json.

Workloads (targets in DESIGN.md):
- 256 tiny xor kernels on 1 CPU device: us per item per replay (target <= 2)
- the same on 2 CPU devices with 1 item in 8 a cross-device copy (target <= 4)
- heavy kernels (4M int32) on 2 CPU devices vs 1: speedup (target >= 1.9)
- planning time for 10k items (target < 100 ms)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import sys
import time

import numpy as np
import trio

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import actorgraph as ag
from actorgraph._program import plan_item
from scheduler import build_plan


def _xor(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    np.bitwise_xor(a, b, out=out)


XOR = ag.Kernel("xor", cpu=_xor, outs=(0,), ins=(1, 2))


def tiny_chain(rt: ag.Runtime, devices: list[str], n_items: int, size: int, copy_every: int):
    """n_items over `devices`, round-robin in blocks; every `copy_every`-th item is a copy
    to the next device. Returns (items, inputs)."""
    bufs = {d: [rt.alloc(d, size, np.int32) for _ in range(4)] for d in devices}
    items: list[ag.Launch | ag.Copy] = []
    block = max(1, n_items // (len(devices) * 4))
    for i in range(n_items):
        dev = devices[(i // block) % len(devices)]
        b = bufs[dev]
        if copy_every and i % copy_every == copy_every - 1 and len(devices) > 1:
            nxt = devices[((i // block) + 1) % len(devices)]
            items.append(ag.Copy(dst=bufs[nxt][i % 2], src=b[2]))
        else:
            k = i % 3
            items.append(ag.Launch(XOR, [b[2 + (k == 2)], b[k % 2], b[1 - k % 2]]))
    return items, [bufs[devices[0]][0]]


async def time_replays(graph: ag.Graph, inputs, replays: int, rounds: int) -> float:
    for _ in range(5):
        await graph(inputs)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(replays):
            await graph(inputs)
        samples.append((time.perf_counter() - start) / replays)
    return statistics.median(samples)


async def bench_tiny(devices: list[str], copy_every: int, n_items: int = 256) -> dict[str, float]:
    async with ag.open_runtime(devices) as rt:
        items, inputs = tiny_chain(rt, devices, n_items, 1024, copy_every)
        graph = await rt.compile(items, inputs=inputs)
        per_replay = await time_replays(graph, inputs, replays=50, rounds=7)
        waits = graph.plan.wait_count
    return {"us_per_item": per_replay / n_items * 1e6, "us_per_replay": per_replay * 1e6,
            "items": n_items, "waits": waits}


async def bench_heavy(ndev: int, total: int = 8, size: int = 4 << 20) -> float:
    """The same `total` heavy xor kernels, spread over `ndev` devices."""
    devices = [f"CPU:{i}" for i in range(ndev)]
    rng = np.random.default_rng(0)
    async with ag.open_runtime(devices) as rt:
        items = []
        for i in range(total):
            dev = devices[i % ndev]
            a, b, c = (rt.alloc(dev, size, np.int32) for _ in range(3))
            # Real data: untouched buffers read the kernel's shared zero page, not memory.
            await rt.copyin(a, rng.integers(0, 1 << 30, size, dtype=np.int32))
            await rt.copyin(b, rng.integers(0, 1 << 30, size, dtype=np.int32))
            items.append(ag.Launch(XOR, [c, a, b]))
        graph = await rt.compile(items)
        return await time_replays(graph, [], replays=2, rounds=5)


def bench_planning(n_items: int = 10_000) -> dict[str, float]:
    async def build() -> tuple[list, dict]:
        async with ag.open_runtime(["CPU:0", "CPU:1", "CPU:2", "CPU:3"]) as rt:
            items, _ = tiny_chain(rt, list(rt.devices), n_items, 16, 8)
            return [plan_item(i) for i in items], dict(rt.caps)

    plan_items, caps = trio.run(build)
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        plan = build_plan(plan_items, caps)
        samples.append(time.perf_counter() - start)
    start = time.perf_counter()
    plan.verify()
    verify_s = time.perf_counter() - start
    return {"plan_ms": statistics.median(samples) * 1e3, "verify_ms": verify_s * 1e3,
            "items": n_items}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "core.json"))
    args = parser.parse_args(argv)

    results: dict[str, object] = {"python": platform.python_version(), "machine": platform.machine()}
    one = trio.run(bench_tiny, ["CPU:0"], 0)
    print(f"tiny xor, 1 device:            {one['us_per_item']:.2f} us/item  (target <= 2)")
    two = trio.run(bench_tiny, ["CPU:0", "CPU:1"], 8)
    print(f"tiny xor, 2 devices, 1/8 copy: {two['us_per_item']:.2f} us/item  (target <= 4)")
    heavy1 = trio.run(bench_heavy, 1)
    heavy2 = trio.run(bench_heavy, 2)
    speedup = heavy1 / heavy2
    print(f"heavy 4M int32, 2 vs 1 device: {speedup:.2f}x  (target >= 1.9)")
    planning = bench_planning()
    print(f"planning 10k items:            {planning['plan_ms']:.1f} ms  (target < 100); "
          f"verify {planning['verify_ms']:.1f} ms")
    results.update(tiny_1dev=one, tiny_2dev_copy8=two,
                   heavy={"one_device_s": heavy1, "two_devices_s": heavy2, "speedup": speedup},
                   planning=planning)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
