"""Soak: many replays of a small multi-device graph; memory must stay flat.

Prints RSS and Python-heap figures at checkpoints and writes benchmarks/results/soak.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import tracemalloc

import numpy as np
import trio

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import actorgraph as ag

XOR = ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,), ins=(1, 2))
INC = ag.Kernel("inc", cpu=lambda x: np.add(x, 1, out=x), outs=(0,), ins=(0,))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


async def soak(replays: int, checkpoints: int) -> list[dict[str, float]]:
    rows = []
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        a, b = rt.alloc("CPU:0", 256, np.int32), rt.alloc("CPU:0", 256, np.int32)
        c = rt.alloc("CPU:1", 256, np.int32)
        graph = await rt.compile(
            [ag.Launch(XOR, [b, a, a]), ag.Copy(dst=c, src=b), ag.Launch(INC, [c])], inputs=[a]
        )
        tracemalloc.start()
        step = replays // checkpoints
        start = time.perf_counter()
        for k in range(checkpoints):
            for _ in range(step):
                await graph([a])
            row = {"replays": (k + 1) * step, "rss_mib": rss_bytes() / 2**20,
                   "py_heap_kib": tracemalloc.get_traced_memory()[0] / 1024,
                   "seconds": time.perf_counter() - start}
            rows.append(row)
            print(f"{row['replays']:>8} replays  rss {row['rss_mib']:.1f} MiB  "
                  f"python heap {row['py_heap_kib']:.1f} KiB  {row['seconds']:.1f} s")
        tracemalloc.stop()
        expected = 1  # c = (a ^ a) + 1 after every replay
        got = int((await rt.copyout(c))[0])
        if got != expected:
            raise SystemExit(f"wrong result after soak: {got} != {expected}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=100_000)
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "soak.json"))
    args = parser.parse_args(argv)
    rows = trio.run(soak, args.replays, args.checkpoints)
    # Flat means: from the second checkpoint on (caches warm), the heap does not climb.
    growth = rows[-1]["py_heap_kib"] - rows[1]["py_heap_kib"] if len(rows) > 1 else 0.0
    print(f"python heap growth after warm-up: {growth:.1f} KiB over "
          f"{rows[-1]['replays'] - rows[1]['replays']} replays")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"checkpoints": rows, "heap_growth_kib": growth}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
