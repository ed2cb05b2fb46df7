"""What profiling costs a replay: 256 tiny xor kernels on one CPU device.

Replays the same graph with profiling off and on, in alternating rounds (so drift in
the machine's speed hits both alike), and reports the best round of each in us/item,
their ratio, and what turning a recorded replay into a Profile costs afterwards.

    python benchmarks/profile_overhead.py [--replays N] [--rounds N] [--off-only] [--quick]

Prints the figures and writes them to benchmarks/results/profile_overhead.json
(`--quick`: a few replays, to check the script runs, to results/quick/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import trio

import actorgraph as ag
from actorgraph._progress import progress

ITEMS = 256
ELEMS = 1024


def _xor(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    np.bitwise_xor(a, b, out=out)


XOR = ag.Kernel("xor", cpu=_xor, outs=(0,), ins=(1, 2))


async def measure(replays: int, rounds: int, off_only: bool) -> dict[str, object]:
    async with ag.open_runtime(["CPU:0"]) as rt:
        a = rt.alloc("CPU:0", ELEMS, np.int32)
        b = rt.alloc("CPU:0", ELEMS, np.int32)
        await rt.copyin(a, np.arange(ELEMS, dtype=np.int32))
        await rt.copyin(b, np.full(ELEMS, 7, np.int32))
        chain = [rt.alloc("CPU:0", ELEMS, np.int32) for _ in range(ITEMS)]
        items, prev = [], a
        for out in chain:
            items.append(ag.Launch(XOR, [out, prev, b]))
            prev = out
        graph = await rt.compile(items, inputs=[a, b])
        inputs = [a, b]
        for _ in range(50):  # warm up both paths
            await graph(inputs)
            if not off_only:
                await graph(inputs, profile=True)
        if not off_only:
            rt.profile(clear=True)

        best = {"off": float("inf"), "on": float("inf")}
        build = float("inf")
        modes = ["off"] if off_only else ["off", "on"]
        for _ in progress(range(rounds), desc="rounds"):
            for mode in modes:
                start = time.perf_counter()
                if mode == "off":
                    for _ in range(replays):
                        await graph(inputs)
                else:
                    for _ in range(replays):
                        await graph(inputs, profile=True)
                took = time.perf_counter() - start
                best[mode] = min(best[mode], took / (replays * ITEMS))
            if not off_only:
                start = time.perf_counter()
                profile = rt.profile(clear=True)
                build = min(build, (time.perf_counter() - start) / (replays * ITEMS))
                if len(profile.events) != replays * ITEMS:
                    raise RuntimeError(
                        f"profile holds {len(profile.events)} items, not {replays * ITEMS}"
                    )
        stats = graph.statistics()
        result: dict[str, object] = {
            "benchmark": "profile_overhead",
            "items": ITEMS,
            "elements": ELEMS,
            "replays_per_round": replays,
            "rounds": rounds,
            "off_us_per_item": round(best["off"] * 1e6, 4),
            "replays_done": stats.replays_done,
            "python": platform.python_version(),
            "machine": platform.machine(),
        }
        if not off_only:
            result.update(
                on_us_per_item=round(best["on"] * 1e6, 4),
                ratio_on_off=round(best["on"] / best["off"], 3),
                build_profile_us_per_item=round(build * 1e6, 4),
            )
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=50, help="replays per round (default 50)")
    parser.add_argument("--rounds", type=int, default=30, help="alternating rounds (default 30)")
    parser.add_argument("--off-only", action="store_true", help="measure profiling off only")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="3 replays, 2 rounds: checks the script runs, measures nothing (results/quick/)",
    )
    parser.add_argument("--out", default=None, help="the JSON to write (default: results/)")
    args = parser.parse_args()
    if args.quick:
        args.replays, args.rounds = 3, 2
    results = os.path.join(os.path.dirname(__file__), "results", "quick" if args.quick else "")
    args.out = args.out or os.path.join(results, "profile_overhead.json")
    result = trio.run(measure, args.replays, args.rounds, args.off_only)
    for key, value in result.items():
        print(f"{key:28s} {value}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
