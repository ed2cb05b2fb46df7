"""REMOTE benchmark: a step between hosts, a replay on one worker, and copy bandwidth.

    python benchmarks/remote.py        # prints the table, writes benchmarks/results/remote.json
    python benchmarks/remote.py --quick  # tiny sizes: checks the script runs (results/quick/)

Starts two workers on loopback (`actorgraph worker --port 0`, devices CPU:0,CPU:1). Figures:
- chains alternating between two devices (a kernel, then a copy to the other device): the
  marginal cost of one more step, from chains of S and 2S steps, between two local CPU
  devices, two devices of one worker, a local CPU device and a worker, and two workers
  (targets: <= 10 us on one worker, <= 100 us between hosts); the same chain of tiny
  kernels over two actors through Ray Compiled Graphs when Ray is installed;
- replay of a 1-item and a 100-item graph living on one worker (target <= 120 us), next
  to a bare TCP round trip between two trio tasks, one between this process and another
  trio process (a replay's floor: the worker is another process) and the kernels called
  in a plain loop, with the CPU time per replay on the client and (where /proc tells) on
  the worker;
- small copies: a copyin and a copyout of 4 KiB of new data, each a round trip;
- copy bandwidth client <-> worker (copyin/copyout, and graph Copy items between a local
  CPU device and a remote one) and worker -> worker (a graph Copy between two workers,
  the bytes going directly), 64 MiB (target >= 2 GB/s);
- isolation: a client's 1-item replays on a worker device while another client's small
  kernel on that device runs until the benchmark ends it (default worker options): how
  many of them finish, and their median time (a worker that runs the slow kernel on its
  event loop finishes none until it returns; the row cuts them off after 5 s);
- what TLS costs: the step between two workers, a 1-item replay on a worker and the copy
  bandwidths, over plain connections and over TLS (two more workers started with
  `--tls-cert/--tls-key`, a certificate made for the run with trustme), measured in
  alternating rounds in this one run; without trustme the rows say they were skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _floors import process_cpu_s, process_round_trip, tcp_round_trip  # noqa: E402
from remote_kernels import GATED, INC  # noqa: E402

import actorgraph as ag  # noqa: E402


def start_worker(devices: str, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    proc = subprocess.Popen(
        [
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
            *extra,
        ],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"listening on \S+:(\d+)", line)
    if match is None:
        proc.kill()
        raise SystemExit(f"worker did not start: {line!r}")
    return proc, int(match.group(1))


def kernels_in_a_loop(nitems: int, rounds: int = 400) -> float:
    """us for `nitems` calls of the benchmark's kernel on one 256-int32 buffer, in plain
    Python in this process: the work of an `nitems`-item replay with no runtime at all."""
    x = np.zeros(256, np.int32)
    fn = INC.cpu
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(rounds):
            for _ in range(nitems):
                fn(x, x)
        best = min(best, (time.perf_counter() - t0) / rounds * 1e6)
    return best


async def per_replay(
    rt: ag.Runtime,
    device: str,
    nitems: int,
    n: int,
    worker_pid: int | None = None,
    new_inputs: int = 0,
) -> dict[str, float | None]:
    """us per replay (best and median of 5 rounds of `n`), and CPU us per replay on the
    client and, where /proc tells, on the worker (`worker_pid`). With `new_inputs`, the
    graph's buffer is its input, and each call passes the next of that many buffers in
    turn (more than a graph keeps bindings for: each call binds anew, as a stream of
    new inputs does)."""
    x = rt.alloc(device, 256, np.int32)
    graph = await rt.compile(
        [ag.Launch(INC, [x, x]) for _ in range(nitems)], inputs=[x] if new_inputs else ()
    )
    # The arguments of each call in turn: none, or the next input.
    given: list[tuple[Any, ...]] = [
        ([rt.alloc(device, 256, np.int32)],) for _ in range(new_inputs)
    ] or [()]
    conn = rt.device(device).connection
    for k in range(20):
        await graph(*given[k % len(given)])
    samples = []
    sent0, recv0 = conn.batches_sent, conn.frames_received
    cpu0 = time.process_time()
    worker0 = None if worker_pid is None else process_cpu_s(worker_pid)
    for _ in range(5):
        t0 = time.perf_counter()
        for k in range(n):
            await graph(*given[k % len(given)])
        samples.append((time.perf_counter() - t0) / n * 1e6)
    replays = 5 * n
    worker1 = None if worker_pid is None else process_cpu_s(worker_pid)
    return {
        "us_per_replay": min(samples),
        "us_per_replay_median": statistics.median(samples),
        "batches_per_replay": (conn.batches_sent - sent0) / replays,
        "frames_back_per_replay": (conn.frames_received - recv0) / replays,
        "client_cpu_us_per_replay": (time.process_time() - cpu0) / replays * 1e6,
        "worker_cpu_us_per_replay": (
            None if worker0 is None or worker1 is None else (worker1 - worker0) / replays * 1e6
        ),
    }


async def small_copies(rt: ag.Runtime, device: str, n: int) -> dict[str, float]:
    """us per copyin and per copyout of 4 KiB to and from a worker, each of new data (the
    median of 5 rounds of `n`): a copy costs a round trip, as a replay does."""
    x = rt.alloc(device, 1024, np.int32)
    arrays = [np.full(1024, k, np.int32) for k in range(16)]
    for k in range(20):
        await rt.copyin(x, arrays[k % 16])
        await rt.copyout(x)
    out: dict[str, list[float]] = {"copyin_4KiB_us": [], "copyout_4KiB_us": []}
    for _ in range(5):
        t0 = time.perf_counter()
        for k in range(n):
            await rt.copyin(x, arrays[k % 16])
        out["copyin_4KiB_us"].append((time.perf_counter() - t0) / n * 1e6)
        t0 = time.perf_counter()
        for _ in range(n):
            got = await rt.copyout(x)
        out["copyout_4KiB_us"].append((time.perf_counter() - t0) / n * 1e6)
        if not np.array_equal(got, arrays[(n - 1) % 16]):
            raise AssertionError("a copy to or from the worker read other bytes")
    return {key: statistics.median(values) for key, values in out.items()}


CHAIN_STEPS = 32
CHAIN_ELEMS = 64


async def chain_step(rt: ag.Runtime, a: str, b: str, steps: int = CHAIN_STEPS) -> dict[str, float]:
    """Marginal us per step of a chain alternating between devices `a` and `b`: a kernel
    on one, then a copy to the other. Chains of `steps` and 2*`steps` steps, best of 9
    timed batches each, and the results checked against numpy."""
    xs = [rt.alloc(a, CHAIN_ELEMS, np.int32), rt.alloc(b, CHAIN_ELEMS, np.int32)]

    def items(n: int) -> list[Any]:
        out: list[Any] = []
        for i in range(n):
            here, there = xs[i % 2], xs[(i + 1) % 2]
            out += [ag.Launch(INC, [here, here]), ag.Copy(dst=there, src=here)]
        return out

    graphs = {n: await rt.compile(items(n)) for n in (steps, 2 * steps)}
    best: dict[int, float] = {}
    reps = 20
    for n, graph in graphs.items():
        for _ in range(5):
            await graph()
        samples = []
        for _ in range(9):  # best of 9: the machine may be shared
            t0 = time.perf_counter()
            for _ in range(reps):
                await graph()
            samples.append((time.perf_counter() - t0) / reps * 1e6)
        best[n] = min(samples)
    # Check: one replay of the long chain adds 2*steps to what it started from.
    start = np.arange(CHAIN_ELEMS, dtype=np.int32)
    await rt.copyin(xs[0], start)
    await graphs[2 * steps]()
    got = await rt.copyout(xs[0])
    if not np.array_equal(got, start + 2 * steps):
        raise SystemExit(f"chain {a} <-> {b}: got {got[:4]}, expected {(start + 2 * steps)[:4]}")
    for x in xs:
        rt.free(x)
    return {
        "us_per_step": (best[2 * steps] - best[steps]) / steps,
        f"us_per_replay_{steps}_steps": best[steps],
        f"us_per_replay_{2 * steps}_steps": best[2 * steps],
    }


RAY_SCRIPT = r"""
import json, sys, time
import numpy as np
import ray
from ray.dag import InputNode

steps = int(sys.argv[1])
ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)


@ray.remote
class Stage:
    def step(self, x):
        return np.bitwise_xor(x, 1)


actors = [Stage.remote(), Stage.remote()]
best = {}
for n in (steps, 2 * steps):
    with InputNode() as inp:
        node = inp
        for i in range(n):
            node = actors[i % 2].step.bind(node)
    dag = node.experimental_compile()
    x = np.arange(64, dtype=np.int32)
    for _ in range(5):
        ray.get(dag.execute(x))
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(10):
            out = ray.get(dag.execute(x))
        samples.append((time.perf_counter() - t0) / 10 * 1e6)
    assert np.array_equal(out, x if n % 2 == 0 else x ^ 1)
    best[n] = min(samples)
    dag.teardown()
print(json.dumps({"us_per_kernel": (best[2 * steps] - best[steps]) / steps,
                  f"us_per_replay_{steps}_kernels": best[steps],
                  f"us_per_replay_{2 * steps}_kernels": best[2 * steps]}), flush=True)
"""


def ray_chain(steps: int = CHAIN_STEPS) -> dict[str, float] | str:
    """The same chain of tiny kernels over two Ray actors, a Compiled Graph: its marginal
    us per kernel; or why it was skipped."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'ray==2.60.0' to add this row)"
    proc = subprocess.run(
        [sys.executable, "-c", RAY_SCRIPT, str(steps)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    # The figures are printed before Ray shuts down (which may crash the interpreter on
    # its way out): they count if they are there.
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return f"Ray Compiled Graphs failed (exit {proc.returncode}): {proc.stderr[-500:]!r}"
    return json.loads(lines[-1])


async def bandwidth(rt: ag.Runtime, a: str, b: str, nbytes: int, reps: int = 8) -> dict[str, float]:
    """GB/s, best of `reps`: host copies (copyin/copyout, whose output array is fresh
    memory every call) and device copies (graph Copy items into buffers in use)."""
    n = nbytes // 4
    src = np.arange(n, dtype=np.int32)
    xa = rt.alloc(a, n, np.int32)
    xb = rt.alloc(b, n, np.int32)
    local = rt.alloc("CPU:0", n, np.int32)
    await rt.copyin(local, src)
    copies = {
        "client_to_worker_device_copy": await rt.compile([ag.Copy(dst=xa, src=local)]),
        "worker_to_worker_device_copy": await rt.compile([ag.Copy(dst=xb, src=xa)]),
        "worker_to_client_device_copy": await rt.compile([ag.Copy(dst=local, src=xb)]),
    }
    timings: dict[str, list[float]] = {
        "client_to_worker_copyin": [],
        "worker_to_client_copyout": [],
    }
    timings.update({k: [] for k in copies})
    for _ in range(reps):
        t0 = time.perf_counter()
        await rt.copyin(xa, src)
        timings["client_to_worker_copyin"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out = await rt.copyout(xa)
        timings["worker_to_client_copyout"].append(time.perf_counter() - t0)
        for key, graph in copies.items():
            t0 = time.perf_counter()
            await graph()
            timings[key].append(time.perf_counter() - t0)
    if not np.array_equal(out, src) or not np.array_equal(await rt.copyout(local), src):
        raise SystemExit("bandwidth check: data did not arrive intact")
    for buf in (xa, xb, local):
        rt.free(buf)
    return {k: nbytes / min(v) / 1e9 for k, v in timings.items()}


def tls_files(folder: Path) -> tuple[Path, Path, Path] | str:
    """A CA and a certificate for 127.0.0.1 signed by it: (cert, key, CA) files, or why
    there are none."""
    try:
        import trustme
    except ImportError:
        return "skipped: needs trustme (pip install trustme) to make a certificate"
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key, ca_file = folder / "cert.pem", folder / "key.pem", folder / "ca.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    return cert, key, ca_file


async def tls_cost(
    plain_ports: tuple[int, int], steps: int, replays: int, nbytes: int, rounds: int
) -> dict[str, Any] | str:
    """The same figures over plain connections (the workers at `plain_ports`) and over
    TLS (two workers started here with a certificate), in alternating rounds, best of
    the rounds; and TLS's over plain's."""
    with tempfile.TemporaryDirectory() as folder:
        files = tls_files(Path(folder))
        if isinstance(files, str):
            return files
        cert, key, ca_file = files
        extra = ("--tls-cert", str(cert), "--tls-key", str(key))
        started = [start_worker("CPU:0", extra) for _ in range(2)]
        try:
            names = {
                "plain": [f"CPU:0@127.0.0.1:{port}" for port in plain_ports],
                "tls": [f"CPU:0@127.0.0.1:{port}" for _, port in started],
            }
            async with (
                ag.open_runtime(["CPU:0", *names["plain"]]) as plain,
                ag.open_runtime(["CPU:0", *names["tls"]], remote_tls_ca=ca_file) as tls,
            ):
                runtimes = {"plain": plain, "tls": tls}
                assert tls.device(names["tls"][0]).connection.statistics().tls
                samples: dict[str, dict[str, list[float]]] = {"plain": {}, "tls": {}}
                for index in range(rounds):
                    order = ("plain", "tls") if index % 2 == 0 else ("tls", "plain")
                    for kind in order:
                        rt, (a, b) = runtimes[kind], names[kind]
                        chain = await chain_step(rt, a, b, steps)
                        replay = await per_replay(rt, a, 1, replays)
                        figures = {
                            "step_between_two_workers_us": chain["us_per_step"],
                            "replay_1_item_us": replay["us_per_replay"],
                        }
                        # Best of four copies each: the first into a buffer just allocated
                        # also pays for its memory.
                        for key, value in (await bandwidth(rt, a, b, nbytes, reps=4)).items():
                            figures[f"{key}_GBps"] = value
                        for key, value in figures.items():
                            samples[kind].setdefault(key, []).append(value)
        finally:
            for proc, _ in started:
                proc.kill()
    # The best of the rounds: the least time, the most bandwidth.
    results: dict[str, Any] = {
        kind: {k: (min(v) if k.endswith("_us") else max(v)) for k, v in figures.items()}
        for kind, figures in samples.items()
    }
    results["tls_over_plain"] = {
        key: results["tls"][key] / results["plain"][key] for key in results["plain"]
    }
    results["bytes"] = nbytes
    results["rounds"] = rounds
    return results


# Set before the workers start: they read it when the gated kernel runs.
GATE = Path(
    os.environ.setdefault(
        "ACTORGRAPH_BENCH_GATE", str(Path(tempfile.gettempdir()) / f"actorgraph-gate-{os.getpid()}")
    )
)


async def replay_beside_a_slow_kernel(device: str, n: int = 200) -> dict[str, Any]:
    """Client B's 1-item replays on `device` while client A's small kernel there runs
    until the gate opens: how many finish in 5 s (all `n`, if A's kernel holds nobody)."""
    GATE.unlink(missing_ok=True)
    samples: list[float] = []
    async with ag.open_runtime([device]) as rt_a, ag.open_runtime([device]) as rt_b:
        xa = rt_a.alloc(device, 8, np.int32)
        xb = rt_b.alloc(device, 256, np.int32)
        graph = await rt_b.compile([ag.Launch(INC, [xb, xb])])
        for _ in range(20):
            await graph()
        slow = await (await rt_a.compile([ag.Launch(GATED, [xa, xa])])).submit()
        with trio.move_on_after(5) as cut:
            for _ in range(n):
                t0 = time.perf_counter()
                await graph()
                samples.append((time.perf_counter() - t0) * 1e6)
        GATE.touch()
        await slow.wait()
    GATE.unlink(missing_ok=True)
    return {
        "replays_done": len(samples),
        "replays_asked": n,
        "cut_off_after_5s": cut.cancelled_caught,
        "us_per_replay_median": statistics.median(samples) if samples else None,
    }


async def main(quick: bool = False) -> dict[str, Any]:
    """Every figure; `quick`: tiny sizes and counts, to check the script runs."""
    steps = 4 if quick else CHAIN_STEPS
    trips = 200 if quick else 2000
    replays = 20 if quick else 400
    nbytes = 1 << 20 if quick else 64 << 20
    wa, port_a = start_worker("CPU:0,CPU:1")
    wb, port_b = start_worker("CPU:0,CPU:1")
    try:
        a, b = f"CPU:0@127.0.0.1:{port_a}", f"CPU:0@127.0.0.1:{port_b}"
        a1 = f"CPU:1@127.0.0.1:{port_a}"
        floor = await tcp_round_trip(trips)
        process_floor, floor_cpu = await process_round_trip(trips)
        async with ag.open_runtime(["CPU:0", "CPU:1", a, a1, b]) as rt:
            chains = {
                "two local CPU devices": await chain_step(rt, "CPU:0", "CPU:1", steps),
                "two devices of one worker": await chain_step(rt, a, a1, steps),
                "a local CPU device and a worker": await chain_step(rt, "CPU:0", a, steps),
                "two workers": await chain_step(rt, a, b, steps),
            }
            r100 = await per_replay(rt, a, 100, replays, wa.pid)
            r1 = await per_replay(rt, a, 1, replays, wa.pid)
            r1_new = await per_replay(rt, a, 1, replays, wa.pid, new_inputs=100)
            small = await small_copies(rt, a, replays)
            bw = await bandwidth(rt, a, b, nbytes, reps=2 if quick else 8)
        isolation = await replay_beside_a_slow_kernel(a, n=replays // 2 if quick else 200)
        tls = await tls_cost((port_a, port_b), steps, replays, nbytes, 2 if quick else 4)
    finally:
        wa.kill()
        wb.kill()
    loops = 20 if quick else 400
    return {
        "tcp_round_trip_us": floor,
        "process_round_trip_us": process_floor,
        "process_round_trip_cpu_us": floor_cpu,
        "kernels_in_a_loop_us": {
            "1": kernels_in_a_loop(1, loops),
            "100": kernels_in_a_loop(100, loops),
        },
        "chain_steps": steps,
        "chains": chains,
        "ray_compiled_graphs": "skipped with --quick" if quick else ray_chain(),
        "replay_100_items": r100,
        "replay_1_item": r1,
        "replay_1_item_new_inputs": r1_new,
        "small_copies": small,
        "bandwidth_bytes": nbytes,
        "bandwidth_GBps_64MiB": bw,
        "replay_beside_a_slow_kernel": isolation,
        "tls_cost": tls,
        "targets": {
            "step_one_worker_us": 10,
            "step_between_hosts_us": 100,
            "replay_100_items_us": 120,
            "bandwidth_GBps": 2.0,
        },
    }


def report(results: dict[str, Any]) -> None:
    r100, r1 = results["replay_100_items"], results["replay_1_item"]
    bw = results["bandwidth_GBps_64MiB"]
    steps = results["chain_steps"]
    print(
        f"chains alternating between two devices (a kernel, then a copy), from {steps} and "
        f"{2 * steps} steps (the marginal figure is the difference of two noisy replays; the "
        "average also carries the replay's fixed cost):"
    )
    long = 2 * steps
    print(
        f"| chain between | us per step (marginal) | us per step (a {long}-step replay / {long}) | target |"
    )
    print("| --- | ---: | ---: | --- |")
    targets = {
        "two devices of one worker": "<= 10",
        "a local CPU device and a worker": "<= 100",
        "two workers": "<= 100",
    }
    for name, chain in results["chains"].items():
        average = chain[f"us_per_replay_{long}_steps"] / long
        print(f"| {name} | {chain['us_per_step']:.1f} | {average:.1f} | {targets.get(name, '')} |")
    ray = results["ray_compiled_graphs"]
    if isinstance(ray, dict):
        average = ray[f"us_per_replay_{long}_kernels"] / long
        print(
            f"| Ray Compiled Graphs, two actors (per kernel) | {ray['us_per_kernel']:.1f} | "
            f"{average:.1f} | |"
        )
    else:
        print(f"(Ray Compiled Graphs row skipped: {ray})")
    print()
    print(f"bare loopback TCP round trip (trio):      {results['tcp_round_trip_us']:7.1f} us")
    process_floor = results["process_round_trip_us"]
    print(f"bare loopback TCP round trip to another trio process: {process_floor:7.1f} us")
    floor_cpu = results.get("process_round_trip_cpu_us")
    if floor_cpu is not None:
        server = floor_cpu["server"]
        print(
            f"  CPU per bare round trip: client {floor_cpu['client']:.1f} us, other process "
            + ("(not known)" if server is None else f"{server:.1f} us")
        )
    kernels = results["kernels_in_a_loop_us"]
    print(
        f"the kernels alone, called in a loop here: 1: {kernels['1']:.1f} us, "
        f"100: {kernels['100']:.1f} us"
    )
    print(
        f"  floor of a replay on a worker (process round trip + kernels): 1-item "
        f"{process_floor + kernels['1']:.1f} us, 100-item {process_floor + kernels['100']:.1f} us"
    )
    print(f"replay, 1-item graph on one worker:       {r1['us_per_replay']:7.1f} us")
    r1_new = results.get("replay_1_item_new_inputs")
    if r1_new is not None:
        print(
            f"  with a new input every call (100 in turn): {r1_new['us_per_replay']:7.1f} us "
            f"(client CPU {r1_new['client_cpu_us_per_replay']:.1f} us)"
        )
    print(
        f"replay, 100-item graph on one worker:     {r100['us_per_replay']:7.1f} us "
        f"(median {r100['us_per_replay_median']:.1f}; {r100['batches_per_replay']:.0f} batch "
        f"out, {r100['frames_back_per_replay']:.0f} frame back per replay; target <= 120 us)"
    )
    for name, r in (("1-item", r1), ("100-item", r100)):
        worker = r["worker_cpu_us_per_replay"]
        print(
            f"  CPU per {name} replay: client {r['client_cpu_us_per_replay']:.1f} us, worker "
            + ("(not known)" if worker is None else f"{worker:.1f} us")
        )
    small = results["small_copies"]
    print(
        f"copyin of 4 KiB: {small['copyin_4KiB_us']:.1f} us, copyout of 4 KiB: "
        f"{small['copyout_4KiB_us']:.1f} us (process round trip {process_floor:.1f} us)"
    )
    size = results["bandwidth_bytes"] >> 20
    for key, value in bw.items():
        print(f"copy {key.replace('_', ' '):36s} {value:6.2f} GB/s ({size} MiB; target >= 2 GB/s)")
    iso = results["replay_beside_a_slow_kernel"]
    median = iso["us_per_replay_median"]
    print(
        f"1-item replays while another client's small kernel runs on that device: "
        f"{iso['replays_done']} of {iso['replays_asked']} done"
        + (f", median {median:.1f} us" if median is not None else "")
        + (" (cut off after 5 s)" if iso["cut_off_after_5s"] else "")
    )
    tls = results["tls_cost"]
    if isinstance(tls, str):
        print(f"(TLS rows {tls})")
        return
    print(
        f"\nwhat TLS costs (two plain workers, two TLS workers; best of {tls['rounds']} "
        f"alternating rounds; copies of {tls['bytes'] >> 20} MiB):"
    )
    print("| figure | plain | TLS | TLS / plain |")
    print("| --- | ---: | ---: | ---: |")
    for key, plain in tls["plain"].items():
        unit = "us" if key.endswith("_us") else "GB/s"
        name = key.rsplit("_", 1)[0].replace("_", " ")
        print(
            f"| {name} ({unit}) | {plain:.2f} | {tls['tls'][key]:.2f} | "
            f"{tls['tls_over_plain'][key]:.2f} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes: checks the script runs, measures nothing (writes results/quick/)",
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results/remote.json")
    args = parser.parse_args()
    results = trio.run(main, args.quick)
    report(results)
    out = args.out or HERE / "results" / ("quick" if args.quick else "") / "remote.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
