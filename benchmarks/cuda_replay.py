"""CUDA benchmark: graph replay against raw CUDA, and copy/compute overlap.

1. A graph of K (default 1000) small kernels on one GPU, per replay (launch + wait):
   - actorgraph: `await graph()` (the queue's part of the plan is one CUDA graph),
   - raw CUDA graph: the same kernels as a chain of graph nodes, cuGraphLaunch + sync,
   - plain launches: K cuLaunchKernel calls + sync.
   Target: actorgraph <= 1.2x the raw CUDA graph.
2. Copy/compute overlap on one GPU: a compute-heavy kernel on the compute queue and a
   host -> device copy (through pinned staging) on the copy queue, each alone and both
   in one graph. Overlap shows as time(both) close to max(alone), not their sum.

    python benchmarks/cuda_replay.py                 # real GPU
    python benchmarks/cuda_replay.py --driver fake   # the same code on the fake driver (a smoke run)
    python benchmarks/cuda_replay.py --quick         # tiny sizes: checks the script runs

Prints the figures and writes them as JSON (benchmarks/results/cuda.json by default;
results/quick/ with --quick). The driver defaults to ACTORGRAPH_CUDA_DRIVER, else real.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from actorgraph.scheduler import QueueKind

import actorgraph as ag

INC_SRC = r"""
extern "C" __global__ void inc_k(int *buf, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) buf[i] += 1;
}
"""

SPIN_SRC = r"""
extern "C" __global__ void spin_k(float *buf, int n, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = buf[i];
    for (int k = 0; k < iters; ++k) x = x * 0.999999f + 0.000001f;
    buf[i] = x;
}
"""


def _inc(buf: np.ndarray, n: int) -> None:
    buf[:n] += 1


def _spin(buf: np.ndarray, n: int, iters: int) -> None:
    for _ in range(max(1, iters // 4096)):
        buf[:n] = buf[:n] * np.float32(0.999999) + np.float32(0.000001)


INC = ag.Kernel("inc_k", cpu=_inc, cuda=INC_SRC, outs=(0,), ins=(0,))
SPIN = ag.Kernel("spin_k", cpu=_spin, cuda=SPIN_SRC, outs=(0,), ins=(0,))
N = ag.Var("n", 1, 1 << 30)
ITERS = ag.Var("iters", 1, 1 << 30)
BLOCK = 256


def _launch(kernel: ag.Kernel, buf: ag.Buffer, *extra: tuple[ag.Var, int]) -> ag.Launch:
    n = buf.size
    fixed = {N: n, **dict(extra)}
    return ag.Launch(
        kernel,
        [buf],
        vars=[N, *(v for v, _ in extra)],
        fixedvars=fixed,
        global_size=ag.cdiv(n, BLOCK),
        local_size=BLOCK,
    )


async def _time(fn: Any, replays: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        await fn()
    times = []
    for _ in range(replays):
        start = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - start)
    return times


def _us(times: list[float]) -> float:
    return statistics.median(times) * 1e6


async def replay_vs_raw(rt: ag.Runtime, kernels: int, elems: int, replays: int) -> dict[str, Any]:
    device = rt.device("CUDA:0")
    driver = device.driver
    buf = rt.alloc("CUDA:0", elems, np.int32)
    graph = await rt.compile([_launch(INC, buf) for _ in range(kernels)])
    t_ag = await _time(graph, replays)

    # Submitted back to back, awaited together: throughput when the host keeps ahead.
    async def pipelined() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(graph)

    t_pipe = [t / 8 for t in await _time(pipelined, max(2, replays // 8), warmup=1)]

    function = device.function(INC)
    pointer = buf.memory.pointer
    body = None
    host = buf.memory.host
    if host is not None:  # fake driver: the kernel's CPU body stands in
        view = host.view(np.int32)

        def body() -> None:
            _inc(view, elems)

    grid, block = ((elems + BLOCK - 1) // BLOCK, 1, 1), (BLOCK, 1, 1)
    stream = driver.stream_create()
    raw = driver.graph_create()
    node = None
    for _ in range(kernels):
        node = driver.graph_add_kernel(raw, node, function, grid, block, [pointer], [elems], body)
    raw_exec = driver.graph_instantiate(raw)

    # The baselines wait with a plain blocking cuStreamSynchronize where there is one (no
    # host functions on this stream), so they pay no polling.
    cu = getattr(driver, "cu", None)
    if cu is not None:

        def wait() -> None:
            cu.cuStreamSynchronize(stream)
    else:

        def wait() -> None:
            driver.stream_synchronize(stream)

    async def raw_graph() -> None:
        driver.graph_launch(raw_exec, stream)
        wait()

    async def plain() -> None:
        for _ in range(kernels):
            driver.launch_kernel(stream, function, grid, block, [pointer], [elems], body)
        wait()

    t_raw = await _time(raw_graph, replays)
    t_plain = await _time(plain, replays)
    driver.graph_destroy(raw, raw_exec)
    driver.stream_destroy(stream)
    compute = device.queues[QueueKind.COMPUTE]
    result = {
        "kernels": kernels,
        "elems": elems,
        "replays": replays,
        "actorgraph_us": _us(t_ag),
        "actorgraph_pipelined_us": _us(t_pipe),
        "raw_graph_us": _us(t_raw),
        "plain_launches_us": _us(t_plain),
        "actorgraph_over_raw_graph": _us(t_ag) / _us(t_raw),
        "graph_builds": compute.graph_builds,
        "graph_launches": compute.graph_launches,
    }
    expected = (3 + replays + 8 * (1 + max(2, replays // 8))) * kernels + (
        3 + replays
    ) * kernels * 2
    got = int((await rt.copyout(buf))[0])
    result["result_checked"] = got == expected
    return result


async def overlap(rt: ag.Runtime, copy_mb: int, spin_elems: int, replays: int) -> dict[str, Any]:
    nbytes = copy_mb << 20
    host = rt.alloc("CPU:0", nbytes // 4, np.float32)
    dev_in = rt.alloc("CUDA:0", nbytes // 4, np.float32)
    work = rt.alloc("CUDA:0", spin_elems, np.float32)
    copy_graph = await rt.compile([ag.Copy(dst=dev_in, src=host)])
    t_copy = _us(await _time(copy_graph, replays))
    iters = 4096
    spin_alone = await rt.compile([_launch(SPIN, work, (ITERS, iters))])
    t_spin0 = _us(await _time(spin_alone, 3, warmup=1))
    # Size the kernel to take about as long as the copy: that is where overlap shows most.
    iters = int(min(max(iters * t_copy / max(t_spin0, 1.0), 1), 1 << 28))
    spin = _launch(SPIN, work, (ITERS, iters))
    t_spin = _us(await _time(await rt.compile([spin]), replays))
    both = await rt.compile([spin, ag.Copy(dst=dev_in, src=host)])
    queues = sorted(str(q) for q in both.plan.queues)
    t_both = _us(await _time(both, replays))
    return {
        "copy_mb": copy_mb,
        "spin_iters": iters,
        "copy_alone_us": t_copy,
        "kernel_alone_us": t_spin,
        "both_us": t_both,
        "sum_us": t_copy + t_spin,
        "max_us": max(t_copy, t_spin),
        "overlap_saved_fraction": (t_copy + t_spin - t_both) / min(t_copy, t_spin),
        "queues": queues,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    async with ag.open_runtime(["CUDA:0", "CPU:0"], cuda_driver=args.driver) as rt:
        device = rt.device("CUDA:0")
        out: dict[str, Any] = {
            "driver": device.driver.name,
            "arch": device.arch,
            "mem_ops": device.mem_ops,
        }
        out["replay"] = await replay_vs_raw(rt, args.kernels, args.elems, args.replays)
        out["overlap"] = await overlap(rt, args.copy_mb, args.spin_elems, max(3, args.replays // 4))
    return out


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    driver = os.environ.get("ACTORGRAPH_CUDA_DRIVER", "real")
    parser.add_argument("--driver", default=driver, choices=["real", "fake"])
    parser.add_argument("--kernels", type=int, default=1000)
    parser.add_argument("--elems", type=int, default=1 << 14)
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--copy-mb", type=int, default=256)
    parser.add_argument("--spin-elems", type=int, default=1 << 20)
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: checks the script runs, measures nothing"
    )
    parser.add_argument("--json", default=None, help="the JSON to write (default: results/)")
    args = parser.parse_args()
    if args.quick:
        args.kernels, args.elems, args.replays = 16, 1 << 10, 4
        args.copy_mb, args.spin_elems = 1, 1 << 12
    results = os.path.join(os.path.dirname(__file__), "results", "quick" if args.quick else "")
    args.json = args.json or os.path.join(results, "cuda.json")
    result = trio.run(main, args)
    r, o = result["replay"], result["overlap"]
    print(
        f"CUDA benchmark ({result['driver']} driver, {result['arch']}, "
        f"64-bit stream mem ops: {result['mem_ops']})"
    )
    print(f"  {r['kernels']}-kernel graph, per replay (median of {r['replays']}):")
    print(
        f"    actorgraph            {r['actorgraph_us']:10.1f} us   "
        f"({r['actorgraph_over_raw_graph']:.2f}x raw graph; target <= 1.2x)"
    )
    print(f"    actorgraph, 8 queued  {r['actorgraph_pipelined_us']:10.1f} us")
    print(f"    raw CUDA graph        {r['raw_graph_us']:10.1f} us")
    print(f"    plain launches        {r['plain_launches_us']:10.1f} us")
    print(
        f"    graph builds {r['graph_builds']}, launches {r['graph_launches']}, "
        f"result checked: {r['result_checked']}"
    )
    print(f"  copy/compute overlap ({o['copy_mb']} MiB host->device; queues {o['queues']}):")
    print(
        f"    copy alone {o['copy_alone_us']:.0f} us, kernel alone {o['kernel_alone_us']:.0f} us, "
        f"both {o['both_us']:.0f} us (sum {o['sum_us']:.0f}, max {o['max_us']:.0f}); "
        f"overlap hid {100 * o['overlap_saved_fraction']:.0f}% of the shorter one"
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"  wrote {args.json}")


if __name__ == "__main__":
    cli()
