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

import trio

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from actorgraph.scheduler import build_plan

import actorgraph as ag
from actorgraph._program import plan_item
from benchmarks import _workloads as wl


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


async def bench_tiny(
    devices: list[str], copy_every: int, n_items: int = 256, replays: int = 50, rounds: int = 7
) -> dict[str, float]:
    if len(devices) == 1:
        workload = wl.tiny_chain(n_items)
    else:
        workload = wl.two_device_copies(n_items, copy_every)
    async with ag.open_runtime(devices) as rt:
        build = wl.build_actorgraph(rt, workload, devices)
        inputs = list(build.inputs)
        graph = await rt.compile(build.items, inputs=inputs)
        per_replay = await time_replays(graph, inputs, replays=replays, rounds=rounds)
        waits = graph.plan.wait_count
    return {
        "us_per_item": per_replay / n_items * 1e6,
        "us_per_replay": per_replay * 1e6,
        "items": n_items,
        "waits": waits,
    }


async def bench_heavy(ndev: int, total: int = 8, size: int = 4 << 20) -> float:
    """The same `total` heavy xor kernels (two chains), spread over `ndev` devices."""
    workload = wl.heavy(ndev, kernels=total, elems=size)
    async with ag.open_runtime(wl.cpu_devices(ndev)) as rt:
        build = wl.build_actorgraph(rt, workload)
        # Real data: untouched buffers read the kernel's shared zero page, not memory.
        for buf, data in zip(build.inputs, workload.host_inputs(), strict=True):
            await rt.copyin(buf, data)
        graph = await rt.compile(build.items)
        return await time_replays(graph, [], replays=2, rounds=5)


def bench_planning(n_items: int = 10_000) -> dict[str, float]:
    async def build() -> tuple[list, dict]:
        workload = wl.random_dag(n_items, devices=4, copy_every=8, elems=16)
        async with ag.open_runtime(wl.cpu_devices(4)) as rt:
            build = wl.build_actorgraph(rt, workload)
            return [plan_item(i) for i in build.items], dict(rt.caps)

    plan_items, caps = trio.run(build)
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        plan = build_plan(plan_items, caps)
        samples.append(time.perf_counter() - start)
    start = time.perf_counter()
    plan.verify()
    verify_s = time.perf_counter() - start
    return {
        "plan_ms": statistics.median(samples) * 1e3,
        "verify_ms": verify_s * 1e3,
        "items": n_items,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes: checks the script runs, measures nothing (writes results/quick/)",
    )
    parser.add_argument("--out", default=None, help="the JSON to write (default: results/)")
    args = parser.parse_args(argv)
    results_dir = pathlib.Path(__file__).parent / "results" / ("quick" if args.quick else "")
    args.out = args.out or str(results_dir / "core.json")
    # Quick: every workload at a size that runs in moments.
    tiny = {"n_items": 16, "replays": 5, "rounds": 2} if args.quick else {}
    heavy_elems = 1 << 12 if args.quick else 4 << 20
    plan_items = 200 if args.quick else 10_000

    results: dict[str, object] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    one = trio.run(lambda: bench_tiny(["CPU:0"], 0, **tiny))
    print(f"tiny xor, 1 device:            {one['us_per_item']:.2f} us/item  (target <= 2)")
    two = trio.run(lambda: bench_tiny(["CPU:0", "CPU:1"], 8, **tiny))
    print(f"tiny xor, 2 devices, 1/8 copy: {two['us_per_item']:.2f} us/item  (target <= 4)")
    heavy1 = trio.run(lambda: bench_heavy(1, size=heavy_elems))
    heavy2 = trio.run(lambda: bench_heavy(2, size=heavy_elems))
    speedup = heavy1 / heavy2
    print(f"heavy 4M int32, 2 vs 1 device: {speedup:.2f}x  (target >= 1.9)")
    planning = bench_planning(plan_items)
    print(
        f"planning {plan_items:<6} items:      {planning['plan_ms']:.1f} ms  (target < 100); "
        f"verify {planning['verify_ms']:.1f} ms"
    )
    results.update(
        tiny_1dev=one,
        tiny_2dev_copy8=two,
        heavy={"one_device_s": heavy1, "two_devices_s": heavy2, "speedup": speedup},
        planning=planning,
    )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
