"""Start a worker process and run a graph across it: local CPU:0 plus the worker's two devices.

    python examples/remote.py [--replays 50]

The worker (`actorgraph worker --port 0 --kernels remote_kernels`) serves CPU:0 and CPU:1 on
loopback; this process names them CPU:0@127.0.0.1:PORT and CPU:1@127.0.0.1:PORT. The graph
copies x to the worker, scales it there on one device, copies the result to the other and
adds, then brings the sum back; every replay is checked against numpy. The same ground as
04_remote.ipynb.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import trio
from remote_kernels import ADD, SCALE

import actorgraph as ag

HERE = pathlib.Path(__file__).resolve().parent
ELEMS = 1 << 14
K = ag.Var("k", 1, 100)


class Worker:
    """An `actorgraph worker` process on a free loopback port, serving `devices`."""

    def __init__(self, devices: str = "CPU:0,CPU:1") -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
        command = [
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
        ]
        self.process = subprocess.Popen(
            command, cwd=HERE, env=env, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.banner = self.process.stdout.readline().strip()
        found = re.search(r"listening on (\S+)", self.banner)
        if found is None:
            self.stop()
            raise RuntimeError(f"the worker did not start (it printed {self.banner!r})")
        self.address: str = found.group(1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def build(rt: ag.Runtime, address: str) -> tuple[list[ag.Launch | ag.Copy], ag.Buffer, ag.Buffer]:
    """x on CPU:0 -> worker CPU:0 (x*3) -> worker CPU:1 (+ x) -> back to CPU:0."""
    r0, r1 = f"CPU:0@{address}", f"CPU:1@{address}"
    x = rt.alloc("CPU:0", ELEMS, np.int32)
    out = rt.alloc("CPU:0", ELEMS, np.int32)
    x0, y0 = rt.alloc(r0, ELEMS, np.int32), rt.alloc(r0, ELEMS, np.int32)
    x1, y1, z1 = (rt.alloc(r1, ELEMS, np.int32) for _ in range(3))
    items: list[ag.Launch | ag.Copy] = [
        ag.Copy(dst=x0, src=x),
        ag.Launch(SCALE, [y0, x0], vars=[K], fixedvars={K: 3}),
        ag.Copy(dst=x1, src=x),
        ag.Copy(dst=y1, src=y0),
        ag.Launch(ADD, [z1, y1, x1]),
        ag.Copy(dst=out, src=z1),
    ]
    return items, x, out


async def main(address: str, replays: int) -> None:
    devices = ["CPU:0", f"CPU:0@{address}", f"CPU:1@{address}"]
    async with ag.open_runtime(devices) as rt:
        items, x, out = build(rt, address)
        graph = await rt.compile(items, inputs=[x])
        print(graph.plan)
        rng = np.random.default_rng(0)
        elapsed = 0.0
        for _ in range(replays):
            host = rng.integers(0, 1000, ELEMS, dtype=np.int32)
            await rt.copyin(x, host)
            start = time.perf_counter()
            await graph([x])
            elapsed += time.perf_counter() - start
            np.testing.assert_array_equal(await rt.copyout(out), host * 4)
        print(
            f"{replays} replays across the worker, each checked: "
            f"{elapsed / replays * 1e6:.0f} us per replay"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=50)
    args = parser.parse_args()
    with Worker() as server:
        print(server.banner)
        trio.run(main, server.address, args.replays)
