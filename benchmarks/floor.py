"""Replay cost against the floor: the same kernels called one after another in plain Python.

The floor of a workload is its numpy calls (the workload's xor kernel, which is
np.bitwise_xor itself, into a fresh buffer; copyto for a copy) run in a plain Python loop
over prepared arguments, on the very buffers the graph uses, in the same run.
Each row is measured for actorgraph and for its floor in alternating rounds, so load from
elsewhere on the machine lands on both; the figure is the median of the rounds and the
row's verdict is the ratio of the two medians.

Rows:
- tiny:    256 tiny xor kernels (1024 int32, a fresh output buffer each), 1 CPU device
- copies:  the same on 2 CPU devices, 1 item in 8 a cross-device copy
- small:   a 16-item graph replayed back to back, 1 device (us per replay)
- chain:   a dependent chain alternating between 2 CPU devices (a kernel, then a copy to
           the other device): the cost of one more step, from chains of S and 2S steps
- sync:    a graph called through `start_runtime` from synchronous code (`.result()`),
           against the same call awaited in trio on the runtime's own thread

The replay rows also give one trio scheduler pass, timed in the same rounds: every
`await graph(...)` takes one (it stays a scheduling point) and the floor takes none, so
it is the part of a row's gap that no replay can close.

Writes benchmarks/results/floor.json. `--quick` runs tiny sizes: it checks the script,
it measures nothing (and writes to results/quick/).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import trio

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import actorgraph as ag
from benchmarks import _workloads as wl

TARGETS = {"tiny": 1.15, "copies": 1.3, "small": 2.0}
CHAIN_TARGET_US = 6.0  # per step
SYNC_TARGET_US = 15.0  # added per call


# -- the floor: plain Python over prepared numpy calls --


def floor_calls(
    workload: wl.Workload, arrays: Sequence[np.ndarray[Any, Any]]
) -> list[tuple[Any, ...]]:
    """The workload's items as (function, args) over `arrays`, one per buffer: the
    kernel's own CPU body, with the arguments a replay passes it."""
    xor = wl.XOR.cpu
    calls: list[tuple[Any, ...]] = []
    for step in workload.steps:
        if isinstance(step, wl.Xor):
            calls.append((xor, (arrays[step.a], arrays[step.b], arrays[step.out])))
        else:
            calls.append((np.copyto, (arrays[step.out], arrays[step.src])))
    return calls


def run_floor(calls: list[tuple[Any, ...]]) -> None:
    for fn, args in calls:
        fn(*args)


def time_floor(calls: list[tuple[Any, ...]], repeats: int) -> float:
    """Seconds for one pass over `calls` (the best of nothing: a plain mean of `repeats`)."""
    start = time.perf_counter()
    for _ in range(repeats):
        run_floor(calls)
    return (time.perf_counter() - start) / repeats


def graph_arrays(build: wl.ActorgraphBuild) -> list[np.ndarray[Any, Any]]:
    """The host memory of the graph's own buffers (CPU devices): the floor runs on it."""
    return [buf.host_view() for buf in build.buffers]


def floor_arrays(workload: wl.Workload) -> list[np.ndarray[Any, Any]]:
    arrays = [np.zeros(workload.elems, np.int32) for _ in workload.buffer_devices]
    for buf, data in zip(workload.inputs, workload.host_inputs(), strict=True):
        arrays[buf][:] = data
    return arrays


# -- actorgraph --


async def time_graph(graph: ag.Graph, inputs: Sequence[ag.Buffer], repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        await graph(inputs)
    return (time.perf_counter() - start) / repeats


async def time_pass(repeats: int) -> float:
    """Seconds for one trio scheduler pass, as `await graph(...)` takes after its work (a
    graph call stays a scheduling point): a fixed part of every replay the floor has not."""
    start = time.perf_counter()
    for _ in range(repeats):
        await trio.lowlevel.cancel_shielded_checkpoint()
    return (time.perf_counter() - start) / repeats


async def compiled(
    rt: ag.Runtime, workload: wl.Workload, devices: Sequence[str]
) -> tuple[ag.Graph, list[ag.Buffer], wl.ActorgraphBuild]:
    build = wl.build_actorgraph(rt, workload, devices)
    for buf, data in zip(build.inputs, workload.host_inputs(), strict=True):
        await rt.copyin(buf, data)
    graph = await rt.compile(build.items, inputs=list(build.inputs))
    return graph, list(build.inputs), build


async def check_equal(rt: ag.Runtime, workload: wl.Workload, build: wl.ActorgraphBuild) -> None:
    """One replay's outputs equal numpy's: a benchmark of wrong work measures nothing."""
    expect = wl.reference(workload, workload.host_inputs())
    for out in workload.outputs:
        got = await rt.copyout(build.buffers[out])
        if not np.array_equal(got, expect[out]):
            raise SystemExit(f"{workload.name}: buffer {out} differs from numpy")


async def measure_row(
    workload: wl.Workload, devices: Sequence[str], rounds: int, repeats: int
) -> dict[str, Any]:
    """Alternating rounds of actorgraph replays and floor passes of the same workload."""
    async with ag.open_runtime(list(devices)) as rt:
        graph, inputs, build = await compiled(rt, workload, devices)
        calls = floor_calls(workload, graph_arrays(build))
        for _ in range(max(3, repeats // 10)):
            await graph(inputs)
            run_floor(calls)
        await check_equal(rt, workload, build)
        ours, floor, passes = [], [], []
        for _ in range(rounds):
            ours.append(await time_graph(graph, inputs, repeats))
            floor.append(time_floor(calls, repeats))
            passes.append(await time_pass(repeats))
    ours_s, floor_s = statistics.median(ours), statistics.median(floor)
    items = len(workload.steps)
    return {
        "workload": workload.name,
        "items": items,
        "us_per_replay": ours_s * 1e6,
        "floor_us_per_replay": floor_s * 1e6,
        "us_per_item": ours_s / items * 1e6,
        "floor_us_per_item": floor_s / items * 1e6,
        "ratio": ours_s / floor_s,
        "trio_pass_us": statistics.median(passes) * 1e6,
    }


def alternating_chain(steps: int, elems: int = wl.TINY_ELEMS) -> wl.Workload:
    """`steps` times: a kernel on one device, then a copy of its result to the other one,
    which the next kernel there reads: every step depends on the one before, across devices."""
    build = wl._Builder(2)
    keys = [build.input(0), build.input(1)]
    head = build.input(0)
    device = 0
    for _ in range(steps):
        head = build.xor(device, head, keys[device])
        device = 1 - device
        head = build.move(device, head)
    return build.done(f"alternating chain of {steps} steps, 2 devices", elems)


async def measure_chain(steps: int, rounds: int, repeats: int) -> dict[str, Any]:
    """Marginal cost of a step: the chain of 2*steps minus the chain of `steps`, per step."""
    devices = wl.cpu_devices(2)
    short, long = alternating_chain(steps), alternating_chain(2 * steps)
    async with ag.open_runtime(devices) as rt:
        graphs = [await compiled(rt, w, devices) for w in (short, long)]
        floors = [floor_calls(w, graph_arrays(g[2])) for w, g in zip((short, long), graphs)]
        for (graph, inputs, build), w in zip(graphs, (short, long), strict=True):
            await graph(inputs)
            await check_equal(rt, w, build)
        ours_step, floor_step = [], []
        for _ in range(rounds):
            t_short = await time_graph(graphs[0][0], graphs[0][1], repeats)
            t_long = await time_graph(graphs[1][0], graphs[1][1], repeats)
            ours_step.append((t_long - t_short) / steps)
            f_short = time_floor(floors[0], repeats)
            f_long = time_floor(floors[1], repeats)
            floor_step.append((f_long - f_short) / steps)
    ours_us = statistics.median(ours_step) * 1e6
    floor_us = statistics.median(floor_step) * 1e6
    return {
        "steps": [steps, 2 * steps],
        "us_per_step": ours_us,
        "floor_us_per_step": floor_us,
        "ratio": ours_us / floor_us if floor_us > 0 else float("inf"),
    }


def measure_sync(items: int, rounds: int, repeats: int) -> dict[str, Any]:
    """A graph call from synchronous code through start_runtime, against the same call
    awaited in trio on the runtime's own thread (rt.call runs a loop there)."""
    workload = wl.tiny_chain(items)
    rt = ag.start_runtime(["CPU:0"])
    try:
        build = wl.build_actorgraph(rt.runtime, workload)
        graph = rt.compile(build.items, inputs=list(build.inputs)).result()
        inputs = list(build.inputs)

        async def in_trio(count: int) -> float:
            start = time.perf_counter()
            for _ in range(count):
                await graph.graph(inputs)
            return (time.perf_counter() - start) / count

        def from_sync(count: int) -> float:
            start = time.perf_counter()
            for _ in range(count):
                graph(inputs).result()
            return (time.perf_counter() - start) / count

        from_sync(max(3, repeats // 10))
        trio_s, sync_s = [], []
        for _ in range(rounds):
            trio_s.append(rt.call(in_trio, repeats).result())
            sync_s.append(from_sync(repeats))
    finally:
        rt.close()
    t, s = statistics.median(trio_s) * 1e6, statistics.median(sync_s) * 1e6
    return {"items": items, "trio_us_per_call": t, "sync_us_per_call": s, "added_us": s - t}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    parser.add_argument("--out", default=None, help="the JSON to write (default: results/)")
    args = parser.parse_args(argv)
    results_dir = pathlib.Path(__file__).parent / "results" / ("quick" if args.quick else "")
    args.out = args.out or str(results_dir / "floor.json")
    rounds = 2 if args.quick else args.rounds
    scale = 1 if args.quick else 10

    results: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "rounds": rounds,
    }
    rows: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("tiny", lambda: trio.run(measure_row, wl.tiny_chain(256), ["CPU:0"], rounds, 2 * scale)),
        (
            "copies",
            lambda: trio.run(
                measure_row, wl.two_device_copies(256, 8), wl.cpu_devices(2), rounds, 2 * scale
            ),
        ),
        ("small", lambda: trio.run(measure_row, wl.tiny_chain(16), ["CPU:0"], rounds, 20 * scale)),
    ]
    for name, run in rows:
        row = run()
        results[name] = {**row, "target_ratio": TARGETS[name]}
        print(
            f"{name:7s} {row['workload']}: {row['us_per_item']:.2f} us/item, "
            f"{row['us_per_replay']:.1f} us/replay; floor {row['floor_us_per_item']:.2f} us/item, "
            f"{row['floor_us_per_replay']:.1f} us/replay"
        )
        print(f"        ratio {row['ratio']:.2f}x (target {TARGETS[name]})")
        print(
            f"        of which one trio scheduler pass per replay: {row['trio_pass_us']:.1f} us "
            f"({row['trio_pass_us'] / row['floor_us_per_replay']:.2f}x of the floor)"
        )
    chain = trio.run(measure_chain, 4 if args.quick else 32, rounds, 2 * scale)
    results["chain"] = {**chain, "target_us_per_step": CHAIN_TARGET_US}
    print(
        f"chain   one more step (kernel + copy to the other device): {chain['us_per_step']:.1f} us; "
        f"floor {chain['floor_us_per_step']:.2f} us"
    )
    print(
        f"        ratio {chain['ratio']:.2f}x (target {CHAIN_TARGET_US} us per step: "
        f"{'met' if chain['us_per_step'] <= CHAIN_TARGET_US else 'not met'})"
    )
    sync = measure_sync(16, rounds, 20 * scale)
    results["sync"] = {**sync, "target_added_us": SYNC_TARGET_US}
    print(
        f"sync    16-item graph from synchronous code: {sync['sync_us_per_call']:.1f} us/call; "
        f"awaited in trio {sync['trio_us_per_call']:.1f} us/call"
    )
    print(
        f"        added {sync['added_us']:.1f} us (target <= +{SYNC_TARGET_US} us: "
        f"{'met' if sync['added_us'] <= SYNC_TARGET_US else 'not met'})"
    )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
