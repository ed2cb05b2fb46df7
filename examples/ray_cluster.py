"""Start actorgraph workers as Ray actors and run a graph across them and this process.

    python examples/ray_cluster.py [--address ADDRESS] [--workers 2] [--replays 20]

Without --address, Ray starts a small local cluster (one node); with it, the script joins
an existing one (`ray start --head` elsewhere) and places one worker per node. Each worker
serves CPU:0 and CPU:1 and loads the kernels of examples/remote_kernels.py by name (Ray
puts this script's folder on its workers' import path). The graph copies x from this
process to the first worker, scales it there, copies it worker to worker, adds x there and
brings the sum back; every replay is checked against numpy. Then one worker is killed:
calls on its devices raise ag.ClosedError while this process's CPU:0 keeps working. The
same ground as 05_ray.ipynb.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import ray
import trio
from remote_kernels import ADD, SCALE

import actorgraph as ag
from actorgraph import ray as agray

ELEMS = 1 << 14
K = ag.Var("k", 1, 100)


def build(
    rt: ag.Runtime, workers: agray.RayWorkers
) -> tuple[list[ag.Launch | ag.Copy], ag.Buffer, ag.Buffer]:
    """x on CPU:0 -> first worker (x*3) -> last worker (+ x) -> back to CPU:0."""
    first, last = workers.workers[0], workers.workers[-1]
    x = rt.alloc("CPU:0", ELEMS, np.int32)
    out = rt.alloc("CPU:0", ELEMS, np.int32)
    x0, y0 = (rt.alloc(first.devices[0], ELEMS, np.int32) for _ in range(2))
    x1, y1, z1 = (rt.alloc(last.devices[1], ELEMS, np.int32) for _ in range(3))
    items: list[ag.Launch | ag.Copy] = [
        ag.Copy(dst=x0, src=x),
        ag.Launch(SCALE, [y0, x0], vars=[K], fixedvars={K: 3}),
        ag.Copy(dst=x1, src=x),
        ag.Copy(dst=y1, src=y0),  # worker to worker: the client only hands over a ticket
        ag.Launch(ADD, [z1, y1, x1]),
        ag.Copy(dst=out, src=z1),
    ]
    return items, x, out


async def main(workers: agray.RayWorkers, replays: int) -> None:
    async with workers.open_runtime(["CPU:0"]) as rt:
        items, x, out = build(rt, workers)
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
            f"{replays} replays across {len(workers.workers)} Ray workers, each checked: "
            f"{elapsed / replays * 1e6:.0f} us per replay"
        )

        # A worker lost: Ray tells the handle, the runtime closes that worker's devices.
        victim = workers.workers[-1]
        ray.kill(workers.actors[-1])
        lost = await trio.to_thread.run_sync(workers.wait_lost, 30.0)
        print(f"lost: {lost}")
        try:
            await graph([x])
        except ag.ClosedError as exc:
            print(f"a replay on {victim.address} now raises ClosedError: {str(exc)[:90]}...")
        local = rt.alloc("CPU:0", 4, np.int32)
        await rt.copyin(local, np.arange(4, dtype=np.int32))
        print(f"local CPU:0 still works: {await rt.copyout(local)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="an existing Ray cluster (default: start a local one)")
    parser.add_argument("--workers", type=int, default=2, help="workers on a local cluster")
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    if args.address:
        ray.init(address=args.address)
        placement: str | int = "node"
        host = None  # each worker listens on its node's address
    else:
        # A local Ray of its own, even where one runs already (--address joins that one).
        ray.init(address="local", num_cpus=2, object_store_memory=80 << 20, include_dashboard=False)
        placement, host = args.workers, "127.0.0.1"
    try:
        with agray.start_workers(
            ["CPU:0", "CPU:1"],
            placement=placement,
            num_cpus=0.5,
            kernels=["remote_kernels"],
            host=host,
        ) as workers:
            print(workers)
            trio.run(main, workers, args.replays)
    finally:
        ray.shutdown()
