"""The pipeline of multi_gpu_pipeline.py on CUDA GPUs when this machine has some, else on SIM.

    python examples/cuda_pipeline.py [--micro-batches 16] [--replays 20]

It says which devices it used and why. On CUDA the figures are wall-clock times of real
replays; on SIM they are simulated times (the cost model on trio's MockClock). Results are
checked against numpy either way. The same ground as 03_cuda.ipynb.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import trio
import trio.testing
from multi_gpu_pipeline import build_pipeline, expected

import actorgraph as ag


def choose_devices() -> tuple[str, list[str], str]:
    """("CUDA" or "SIM", device names, why)."""
    found = ag.local_devices()
    if "CUDA" not in found.kinds:
        return "SIM", [f"SIM:{i}" for i in range(8)], "this install has no CUDA device kind"
    if not found.gpus:
        return "SIM", [f"SIM:{i}" for i in range(8)], f"no CUDA GPU: {found.gpu_note}"
    names = [f"CUDA:{g.index}" for g in found.gpus[:8]]
    models = ", ".join(sorted({g.name for g in found.gpus[:8]}))
    return "CUDA", names, f"{len(names)} GPU(s): {models}"


async def run(kind: str, devices: list[str], micro_batches: int, replays: int) -> None:
    options = {"sim_preset": "nvlink8"} if kind == "SIM" else {}
    async with ag.open_runtime(devices, **options) as rt:
        items, inputs, outputs = build_pipeline(rt, devices, micro_batches)
        graph = await rt.compile(items, inputs=inputs)
        print(f"{len(items)} items on {len(graph.plan.queues)} queue actors of {devices}")
        rng = np.random.default_rng(0)
        hosts = [rng.random(inputs[0].size, dtype=np.float32) for _ in inputs]
        for buf, host in zip(inputs, hosts):
            await rt.copyin(buf, host)
        await graph(inputs)  # first replay: kernels compile, CUDA graphs are built
        clock = trio.current_time if kind == "SIM" else time.perf_counter
        start = clock()
        for _ in range(replays):
            await graph(inputs)
        per_replay = (clock() - start) / replays
        what = "simulated" if kind == "SIM" else "wall-clock"
        print(f"{per_replay * 1e3:.3f} ms per replay ({what}, {replays} replays)")
        for out, host in zip(outputs, hosts):
            np.testing.assert_allclose(await rt.copyout(out), expected(host), rtol=1e-6)
        print("every micro-batch matches numpy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=16)
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    kind, devices, why = choose_devices()
    print(f"running on {kind}: {why}")
    clock = trio.testing.MockClock(autojump_threshold=0) if kind == "SIM" else None
    try:
        trio.run(run, kind, devices, args.micro_batches, args.replays, clock=clock)
    except ag.DeviceError as error:
        # A GPU the driver lists but that cannot be opened: say so and use SIM instead.
        print(f"could not open {devices}: {error}\nfalling back to SIM")
        sim = [f"SIM:{i}" for i in range(8)]
        trio.run(
            run,
            "SIM",
            sim,
            args.micro_batches,
            args.replays,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )


if __name__ == "__main__":
    main()
