"""Pipeline parallelism on 8 simulated GPUs: the plan, a timeline, makespan vs lower bound.

    python examples/multi_gpu_pipeline.py [--micro-batches 64] [--plot pipeline_timeline.png]

Stage s of the model runs on SIM:s; each micro-batch's activations are copied to the next
GPU. Time is simulated (a cost model on trio's MockClock), so the run takes no wall time and
prints the same figures every time. The same ground as 02_multi_gpu_pipeline.ipynb; the
builder here is also what cuda_pipeline.py and 03_cuda.ipynb run on real GPUs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
import trio
import trio.testing

import actorgraph as ag

DEVICES = [f"SIM:{i}" for i in range(8)]
ELEMS = 1 << 16  # float32 activations per micro-batch: 256 KiB


STAGES = 8
STAGE_SRC = r"""
extern "C" __global__ void stage(float *out, const float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * 0.5f + 1.0f;
}
"""


def _stage(out: np.ndarray, x: np.ndarray, n: int) -> None:
    np.multiply(x[:n], 0.5, out=out[:n])
    out[:n] += 1.0


# One stage: CUDA source for GPUs, a CPU body for CPU and SIM devices, and its simulated
# time (200 us of compute per micro-batch) for SIM.
STAGE = ag.Kernel("stage", cpu=_stage, cuda=STAGE_SRC, outs=(0,), ins=(1,), cost=200e-6)
N = ag.Var("n", 1, 1 << 24)


def build_pipeline(
    rt: Any, devices: list[str], micro_batches: int, elems: int = ELEMS
) -> tuple[list[ag.Launch | ag.Copy], list[ag.Buffer], list[ag.Buffer]]:
    """Items, the first stage's input buffers, the last stage's outputs.

    Stage s runs on devices[s % len(devices)]; `rt` is a Runtime or a start_runtime() handle.
    """
    items: list[ag.Launch | ag.Copy] = []
    inputs = [rt.alloc(devices[0], elems, np.float32) for _ in range(micro_batches)]
    outputs = []
    for m in range(micro_batches):
        x = inputs[m]
        for s in range(STAGES):
            y = rt.alloc(devices[s % len(devices)], elems, np.float32)
            items.append(
                ag.Launch(
                    STAGE,
                    [y, x],
                    vars=[N],
                    fixedvars={N: elems},
                    global_size=ag.cdiv(elems, 256),
                    local_size=256,
                )
            )
            if s + 1 < STAGES:
                x = rt.alloc(devices[(s + 1) % len(devices)], elems, np.float32)
                items.append(ag.Copy(dst=x, src=y))
        outputs.append(y)
    return items, inputs, outputs


def expected(values: np.ndarray) -> np.ndarray:
    out = values.astype(np.float32)
    for _ in range(STAGES):
        out = out * np.float32(0.5) + np.float32(1.0)
    return out


async def main(micro_batches: int, plot: str | None) -> None:
    async with ag.open_runtime(DEVICES, sim_preset="nvlink8") as rt:
        items, inputs, outputs = build_pipeline(rt, DEVICES, micro_batches)
        graph = await rt.compile(items, inputs=inputs, verify=True)
        print(
            f"{len(items)} items on {len(graph.plan.queues)} queue actors of {len(DEVICES)} SIM GPUs"
        )
        rng = np.random.default_rng(0)
        hosts = [rng.random(ELEMS, dtype=np.float32) for _ in inputs]
        for buf, host in zip(inputs, hosts):
            await rt.copyin(buf, host)

        start = trio.current_time()
        await graph(inputs, profile=plot is not None)
        makespan = trio.current_time() - start
        bounds = ag.sim_bounds(graph)
        print(
            f"makespan {makespan * 1e3:.3f} ms, lower bound {bounds.best * 1e3:.3f} ms "
            f"(critical path {bounds.critical_path * 1e3:.3f}, busiest queue "
            f"{bounds.busiest_queue * 1e3:.3f}, queue window {bounds.queue_window * 1e3:.3f}): "
            f"{makespan / bounds.best:.3f}x the bound"
        )
        for out, host in zip(outputs, hosts):
            np.testing.assert_allclose(await rt.copyout(out), expected(host), rtol=1e-6)
        print("every micro-batch's output matches numpy")
        if plot:
            title = f"pipeline, {micro_batches} micro-batches on {len(DEVICES)} SIM GPUs"
            print("wrote", ag.plot_timeline(graph.last_profile, plot, title=title))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=64)
    parser.add_argument("--plot", metavar="PATH", help="draw the timeline (needs matplotlib)")
    args = parser.parse_args()
    trio.run(
        main, args.micro_batches, args.plot, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    sys.exit(0)
