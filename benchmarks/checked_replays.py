"""What a checked replay costs (`open_runtime(check_replays=N)`), against the same replay
unchecked: chains of tiny xor kernels on one CPU device, and the same with every other
step a copy to a second CPU device.

Each workload is compiled on two runtimes, one checking every replay and one checking
none, and replayed on each in alternating rounds (so drift in the machine's speed hits
both alike); the figures are the best round of each, in us per replay, and their ratio.
A checked replay takes shadows of the memory it touches, snapshots it, replays, reads
the result back, runs every item again as its own submission and compares: its cost
grows with the items and the bytes, and only the first N replays of a graph pay it.
For scale, each row also times `rt.run(items)`, the same items run eagerly.

    python benchmarks/checked_replays.py [--replays N] [--rounds N] [--quick]

Prints the figures and writes them to benchmarks/results/checked_replays.json
(`--quick`: a few replays, to check the script runs, to results/quick/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

import numpy as np
import trio

import actorgraph as ag

ELEMS = 1024
WORKLOADS = [
    ("xor x16, 1 device", 16, 1),
    ("xor x256, 1 device", 256, 1),
    ("xor+copy x64, 2 devices", 64, 2),
]


def _xor(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    np.bitwise_xor(a, b, out=out)


XOR = ag.Kernel("xor", cpu=_xor, outs=(0,), ins=(1, 2))


async def _graph(
    rt: ag.Runtime, steps: int, devices: int
) -> tuple[ag.Graph, list[ag.Buffer], list[ag.Launch | ag.Copy]]:
    """A chain of `steps` xors; on 2 devices every other step is a copy to the other."""
    names = rt.devices[:devices]
    a = rt.alloc(names[0], ELEMS, np.int32)
    b = rt.alloc(names[0], ELEMS, np.int32)
    await rt.copyin(a, np.arange(ELEMS, dtype=np.int32))
    items: list[ag.Launch | ag.Copy] = []
    prev, where = a, 0
    for step in range(steps):
        if devices > 1 and step % 2:
            where = 1 - where
            out = rt.alloc(names[where], ELEMS, np.int32)
            items.append(ag.Copy(dst=out, src=prev))
        else:
            out = rt.alloc(names[where], ELEMS, np.int32)
            other = b if where == 0 else rt.alloc(names[where], ELEMS, np.int32)
            items.append(ag.Launch(XOR, [out, prev, other]))
        prev = out
    return await rt.compile(items, inputs=[a, b]), [a, b], items


async def _time(graph: ag.Graph, inputs: list[ag.Buffer], replays: int) -> float:
    start = time.perf_counter()
    for _ in range(replays):
        await graph(inputs)
    return (time.perf_counter() - start) / replays


async def measure(replays: int, rounds: int) -> dict[str, Any]:
    rows = []
    checks = 1 << 40  # every replay of the checking runtime's graphs
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as plain:
        async with ag.open_runtime(["CPU:0", "CPU:1"], check_replays=checks) as checking:
            for name, steps, devices in WORKLOADS:
                off, off_inputs, items = await _graph(plain, steps, devices)
                on, on_inputs, _ = await _graph(checking, steps, devices)
                best = {"off": float("inf"), "on": float("inf"), "eager": float("inf")}
                for _ in range(rounds):
                    best["off"] = min(best["off"], await _time(off, off_inputs, replays))
                    best["on"] = min(best["on"], await _time(on, on_inputs, replays))
                    start = time.perf_counter()
                    for _ in range(replays):
                        await plain.run(items)
                    best["eager"] = min(best["eager"], (time.perf_counter() - start) / replays)
                rows.append(
                    {
                        "workload": name,
                        "items": steps,
                        "unchecked_us": round(best["off"] * 1e6, 1),
                        "checked_us": round(best["on"] * 1e6, 1),
                        "eager_run_us": round(best["eager"] * 1e6, 1),
                        "ratio": round(best["on"] / best["off"], 1),
                        "checked_replays": on.statistics().checked,
                    }
                )
    return {
        "benchmark": "checked_replays",
        "elements": ELEMS,
        "replays_per_round": replays,
        "rounds": rounds,
        "rows": rows,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=20, help="replays per round (default 20)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 replays, 1 round: checks the script runs, measures nothing (results/quick/)",
    )
    parser.add_argument("--out", default=None, help="the JSON to write (default: results/)")
    args = parser.parse_args()
    if args.quick:
        args.replays, args.rounds = 2, 1
    results = os.path.join(os.path.dirname(__file__), "results", "quick" if args.quick else "")
    args.out = args.out or os.path.join(results, "checked_replays.json")
    result = trio.run(measure, args.replays, args.rounds)
    for row in result["rows"]:
        print(
            f"{row['workload']:26s} unchecked {row['unchecked_us']:9.1f} us/replay   "
            f"checked {row['checked_us']:9.1f} us/replay   {row['ratio']:6.1f}x   "
            f"(rt.run of the items: {row['eager_run_us']:9.1f} us)"
        )
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
