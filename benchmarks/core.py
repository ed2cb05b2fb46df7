"""Core replay benchmarks: prints figures and writes benchmarks/results/core.json.

Workloads (targets in DESIGN.md and the README):
- 256 tiny xor kernels on 1 CPU device: us per item per replay (target <= 2)
- the same on 2 CPU devices with 1 item in 8 a cross-device copy (target <= 4)
- heavy kernels (4M int32) on 2 CPU devices vs 1: speedup (target >= 1.9)
- planning: build_plan alone for 10k items on 4 CPU devices, and `rt.compile` (check,
  plan, lower, ready to replay) of random DAGs on SIM devices: 10k items on 8 and on 64
  devices (target < 100 ms), 50k items on 64 devices (target well under 1 s). Each compile
  gets items over freshly allocated buffers, as a program's first compile does.

    python benchmarks/core.py [--quick] [--planning] [--out PATH]

`--quick` runs tiny sizes (a smoke run, written under results/quick/); `--planning` runs the planning figures only.
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
import trio.testing

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


async def bench_tiny(devices: list[str], copy_every: int, n_items: int = 256) -> dict[str, float]:
    if len(devices) == 1:
        workload = wl.tiny_chain(n_items)
    else:
        workload = wl.two_device_copies(n_items, copy_every)
    async with ag.open_runtime(devices) as rt:
        build = wl.build_actorgraph(rt, workload, devices)
        inputs = list(build.inputs)
        graph = await rt.compile(build.items, inputs=inputs)
        per_replay = await time_replays(graph, inputs, replays=50, rounds=7)
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
    """build_plan alone (the pure planner) on a random DAG over 4 CPU devices."""

    async def build() -> tuple[list, dict]:
        workload = wl.random_dag(n_items, devices=4, copy_every=8, elems=16)
        async with ag.open_runtime(wl.cpu_devices(4)) as rt:
            build = wl.build_actorgraph(rt, workload)
            return [plan_item(i) for i in build.items], dict(rt.caps)

    plan_items, caps = trio.run(build)
    samples, cpu = [], []
    for _ in range(5):
        start, start_cpu = time.perf_counter(), time.process_time()
        plan = build_plan(plan_items, caps)
        samples.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    start = time.perf_counter()
    plan.verify()
    verify_s = time.perf_counter() - start
    return {
        "plan_ms": statistics.median(samples) * 1e3,
        "plan_cpu_ms": statistics.median(cpu) * 1e3,
        "verify_ms": verify_s * 1e3,
        "items": n_items,
    }


def bench_compile(n_items: int, n_devices: int, rounds: int) -> dict[str, float]:
    """`rt.compile` of a random DAG of `n_items` over `n_devices` SIM devices: median and
    min of `rounds` compiles, each of items over newly allocated buffers (a compile's
    first lowering of a buffer makes its views, as a program's first compile does)."""
    names = [f"SIM:{i}" for i in range(n_devices)]
    # A cluster preset where this install has one (64 SIM GPUs are 8 nodes of 8).
    options = {"sim_preset": "nvlink8x8"} if "nvlink8x8" in ag.SIM_PRESETS else {}
    workload = wl.random_dag(n_items, devices=n_devices, copy_every=8, elems=16)

    async def main() -> tuple[list[float], list[float]]:
        wall, cpu = [], []
        async with ag.open_runtime(names, **options) as rt:
            for _ in range(rounds):
                build = wl.build_actorgraph(rt, workload, names)
                start, start_cpu = time.perf_counter(), time.process_time()
                graph = await rt.compile(build.items, inputs=list(build.inputs))
                wall.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
                await graph.aclose()
                for buf in build.buffers:
                    rt.free(buf)
        return wall, cpu

    wall, cpu = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return {
        "compile_ms": statistics.median(wall) * 1e3,
        "min_ms": min(wall) * 1e3,
        # CPU seconds of this process: what other processes on a shared machine move least.
        "cpu_ms": statistics.median(cpu) * 1e3,
        "items": n_items,
        "devices": n_devices,
        "rounds": rounds,
    }


COMPILE_CASES = [(10_000, 8, 7), (10_000, 64, 7), (50_000, 64, 3)]  # (items, devices, rounds)
QUICK_COMPILE_CASES = [(500, 8, 3), (500, 64, 3)]


def planning(quick: bool) -> dict[str, object]:
    plan = bench_planning(500 if quick else 10_000)
    print(
        f"build_plan {plan['items']} items, 4 CPU:  {plan['plan_ms']:.1f} ms "
        f"({plan['plan_cpu_ms']:.1f} ms CPU); verify {plan['verify_ms']:.1f} ms"
    )
    compiles = []
    for items, devices, rounds in QUICK_COMPILE_CASES if quick else COMPILE_CASES:
        row = bench_compile(items, devices, rounds)
        target = " (target < 100)" if items == 10_000 else " (target well under 1000)"
        print(
            f"rt.compile {items} items, {devices} SIM: {row['compile_ms']:.1f} ms median, "
            f"{row['min_ms']:.1f} min of {rounds}, {row['cpu_ms']:.1f} ms CPU"
            f"{'' if quick else target}"
        )
        compiles.append(row)
    return {"build_plan": plan, "compile": compiles}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes: checks the script runs, measures nothing (writes results/quick/)",
    )
    parser.add_argument("--planning", action="store_true", help="the planning figures only")
    parser.add_argument("--out", default=None, help="the JSON to write (default: results/)")
    args = parser.parse_args(argv)
    results_dir = pathlib.Path(__file__).parent / "results" / ("quick" if args.quick else "")
    args.out = args.out or str(results_dir / "core.json")

    results: dict[str, object] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "quick": args.quick,
    }
    if not args.planning:
        n_items = 32 if args.quick else 256
        one = trio.run(bench_tiny, ["CPU:0"], 0, n_items)
        print(f"tiny xor, 1 device:            {one['us_per_item']:.2f} us/item  (target <= 2)")
        two = trio.run(bench_tiny, ["CPU:0", "CPU:1"], 8, n_items)
        print(f"tiny xor, 2 devices, 1/8 copy: {two['us_per_item']:.2f} us/item  (target <= 4)")
        size = 1 << 12 if args.quick else 4 << 20
        heavy1 = trio.run(bench_heavy, 1, 8, size)
        heavy2 = trio.run(bench_heavy, 2, 8, size)
        speedup = heavy1 / heavy2
        print(f"heavy {size} int32, 2 vs 1 device: {speedup:.2f}x  (target >= 1.9)")
        results.update(
            tiny_1dev=one,
            tiny_2dev_copy8=two,
            heavy={"one_device_s": heavy1, "two_devices_s": heavy2, "speedup": speedup},
        )
    results.update(planning=planning(args.quick))
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
