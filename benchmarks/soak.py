"""Soak: many replays of a small multi-device graph; memory must stay flat.

Prints RSS and Python-heap figures at checkpoints and writes benchmarks/results/soak.json.
With --remote, the graph lives on a loopback worker (two of its devices, and a copy back
to a local one): RSS of the client and of the worker process at each checkpoint, written
to benchmarks/results/soak_remote.json. `--quick`: 300 replays, to check the script runs;
it writes to results/quick/.
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
KERNELS = [XOR, INC]  # what the --remote worker loads (`--kernels soak`)


def rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/statm") as f:
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
            row = {
                "replays": (k + 1) * step,
                "rss_mib": rss_bytes() / 2**20,
                "py_heap_kib": tracemalloc.get_traced_memory()[0] / 1024,
                "seconds": time.perf_counter() - start,
            }
            rows.append(row)
            print(
                f"{row['replays']:>8} replays  rss {row['rss_mib']:.1f} MiB  "
                f"python heap {row['py_heap_kib']:.1f} KiB  {row['seconds']:.1f} s"
            )
        tracemalloc.stop()
        expected = 1  # c = (a ^ a) + 1 after every replay
        got = int((await rt.copyout(c))[0])
        if got != expected:
            raise SystemExit(f"wrong result after soak: {got} != {expected}")
    return rows


async def soak_remote(replays: int, checkpoints: int) -> list[dict[str, float]]:
    from actorgraph.testing import start_worker

    rows = []
    with start_worker(["CPU:0", "CPU:1"], kernels=["soak"]) as worker:
        r0, r1 = worker.name("CPU:0"), worker.name("CPU:1")
        async with ag.open_runtime(["CPU:0", r0, r1], remote_token=worker.token) as rt:
            a, b = rt.alloc(r0, 256, np.int32), rt.alloc(r0, 256, np.int32)
            c = rt.alloc(r1, 256, np.int32)
            d = rt.alloc("CPU:0", 256, np.int32)
            graph = await rt.compile(
                [
                    ag.Launch(XOR, [b, a, a]),
                    ag.Copy(dst=c, src=b),
                    ag.Launch(INC, [c]),
                    ag.Copy(dst=d, src=c),
                ],
                inputs=[a],
            )
            step = replays // checkpoints
            start = time.perf_counter()
            for k in range(checkpoints):
                for _ in range(step):
                    await graph([a])
                row = {
                    "replays": (k + 1) * step,
                    "client_rss_mib": rss_bytes() / 2**20,
                    "worker_rss_mib": rss_bytes(worker.process.pid) / 2**20,
                    "seconds": time.perf_counter() - start,
                }
                rows.append(row)
                print(
                    f"{row['replays']:>8} replays  client rss {row['client_rss_mib']:.1f} MiB  "
                    f"worker rss {row['worker_rss_mib']:.1f} MiB  {row['seconds']:.1f} s"
                )
            got = int((await rt.copyout(d))[0])
            if got != 1:  # d = (a ^ a) + 1 after every replay
                raise SystemExit(f"wrong result after soak: {got} != 1")
    return rows


def main_remote(args: argparse.Namespace) -> int:
    rows = trio.run(soak_remote, args.replays, args.checkpoints)
    # Flat means: from the second checkpoint on (caches warm), RSS does not climb.
    growth = {
        side: rows[-1][f"{side}_rss_mib"] - rows[1][f"{side}_rss_mib"] if len(rows) > 1 else 0.0
        for side in ("client", "worker")
    }
    span = rows[-1]["replays"] - rows[1]["replays"] if len(rows) > 1 else 0
    print(
        f"RSS growth after warm-up over {span} replays: client {growth['client']:.2f} MiB, "
        f"worker {growth['worker']:.2f} MiB; {rows[-1]['seconds'] / rows[-1]['replays'] * 1e6:.0f} "
        f"us per replay"
    )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"checkpoints": rows, "rss_growth_mib": growth}, indent=2))
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--replays",
        type=int,
        default=None,
        help="replays in all (default 100000; 10000 with --remote)",
    )
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument(
        "--remote",
        action="store_true",
        help="soak a graph on a loopback worker; RSS of client and worker",
    )
    parser.add_argument(
        "--quick", action="store_true", help="300 replays, 3 checkpoints: checks the script runs"
    )
    parser.add_argument("--out", default=None, help="the JSON to write")
    args = parser.parse_args(argv)
    if args.quick:
        args.replays, args.checkpoints = 300, 3
    results = pathlib.Path(__file__).parent / "results" / ("quick" if args.quick else "")
    if args.remote:
        args.replays = args.replays or 10_000
        args.out = args.out or str(results / "soak_remote.json")
        return main_remote(args)
    args.replays = args.replays or 100_000
    args.out = args.out or str(results / "soak.json")
    rows = trio.run(soak, args.replays, args.checkpoints)
    # Flat means: from the second checkpoint on (caches warm), the heap does not climb.
    growth = rows[-1]["py_heap_kib"] - rows[1]["py_heap_kib"] if len(rows) > 1 else 0.0
    print(
        f"python heap growth after warm-up: {growth:.1f} KiB over "
        f"{rows[-1]['replays'] - rows[1]['replays']} replays"
    )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"checkpoints": rows, "heap_growth_kib": growth}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
