"""tinygrad jits on actorgraph: per-call time against tinygrad's own graph and the floor.

Three jits (tinygrad 0.11.0, CPU devices):
- small: an MLP 16 -> 32 -> 8 on a batch of 4 (3 tiny kernels): replay overhead
- large: an MLP 512 -> 1024 -> 512 on a batch of 64 (milliseconds of compute per call)
- dp2:   a data-parallel MLP layer over CPU and CPU:1 (shards, kernels on both, copies)

Paths, measured in alternating rounds so load from elsewhere lands on all of them:
- tinygrad:  TinyJit with tinygrad's own graph runner (HCQGraph on CPU devices)
- install:   TinyJit with actorgraph installed as the graph runner (agt.install())
- trio:      `await jit_graph(x)` (agt.graph_from_jit) in a trio program, one call at a time
- direct:    the jit cache's compiled functions called one after another through ctypes
             (copies as memmove), prepared once: the floor

A round is N calls then a synchronize of the devices; the figure is the median round's
time per call. The jit columns include TinyJit's own per-call work (argument checks,
input binding); the "runner" rows time the graph runner calls alone (tinygrad's HCQGraph
vs ours, N runner calls then a synchronize) and the actorgraph Graph replay alone.

Targets: install and trio per call <= 0.5x tinygrad's on `small`; within 5% of direct on
`large`. Writes benchmarks/results/tinygrad.json. `--quick`: checks the script only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import trio

# Run as a script, this file's folder comes first on sys.path, where this file's own name
# would hide the tinygrad package: take the folder off, and put the checkout on.
_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))
os.environ.setdefault("CPU", "1")

from tinygrad import Device, Tensor, TinyJit  # noqa: E402
from tinygrad.engine.realize import BufferCopy, BufferXfer, CompiledRunner, ViewOp  # noqa: E402

import actorgraph as ag  # noqa: E402
from actorgraph import tinygrad as agt  # noqa: E402

Device.DEFAULT = "CPU"
RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "tinygrad.json"
_VAL = ctypes.c_int64 if platform.machine() in ("arm64", "aarch64") else ctypes.c_int32


def _randn(seed: int, *shape: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * 0.1


def mlp(sizes: tuple[int, ...], batch: int) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    weights = [Tensor(_randn(i, a, b)).realize() for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]

    def forward(x: Tensor) -> Tensor:
        for k, w in enumerate(weights):
            x = x @ w
            if k < len(weights) - 1:
                x = x.relu()
        return x.realize()

    return forward, Tensor(_randn(99, batch, sizes[0])).realize()


def data_parallel(width: int, batch: int) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    devs = ("CPU", "CPU:1")
    w = Tensor(_randn(5, width, width)).shard(devs, axis=None).realize()

    def forward(x: Tensor) -> Tensor:
        return (x.shard(devs, axis=0) @ w).relu().sum(0).realize()

    return forward, Tensor(_randn(98, batch, width)).realize()


def direct_calls(jit: TinyJit[Any], x: Tensor) -> list[tuple[Any, tuple[Any, ...]]]:
    """The floor: each item of the captured cache as a prepared ctypes call."""
    captured = jit.captured
    assert captured is not None
    inputs = [x.uop.base.realized]
    calls: list[tuple[Any, tuple[Any, ...]]] = []
    for j, ei in enumerate(captured.jit_cache):
        bufs = [
            inputs[captured.input_replace[(j, i)]] if (j, i) in captured.input_replace else b
            for i, b in enumerate(ei.bufs)
        ]
        addrs = [int(b._buf.va_addr) for b in bufs]  # type: ignore[union-attr]
        if isinstance(ei.prg, CompiledRunner):
            p = ei.prg.p
            fn = ctypes.CFUNCTYPE(None, *([ctypes.c_uint64] * len(addrs) + [_VAL] * len(p.vars)))(
                ctypes.cast(ei.prg._prg.fxn, ctypes.c_void_p).value
            )
            calls.append((fn, tuple(addrs)))
        elif isinstance(ei.prg, (BufferCopy, BufferXfer)):
            calls.append((ctypes.memmove, (addrs[0], addrs[1], bufs[0].nbytes)))  # type: ignore[union-attr]
        elif not isinstance(ei.prg, ViewOp):
            raise RuntimeError(f"unexpected item {ei.prg}")
    return calls


def sync_all() -> None:
    for name in list(Device._opened_devices):
        if name.startswith("CPU"):
            Device[name].synchronize()


def timed(fn: Callable[[], None], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync_all()
    return (time.perf_counter() - start) / calls


async def atimed(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        await fn()
    sync_all()
    return (time.perf_counter() - start) / calls


def first_runner(jit: TinyJit[Any]) -> tuple[Any, list[Any]]:
    """The first graph runner in a jit's graphed cache and its input buffers."""
    for ei in jit.jit_cache:
        if hasattr(ei.prg, "input_replace"):
            return ei.prg, ei.bufs
    raise RuntimeError("this jit has no graph runner")


async def measure(
    name: str,
    make: Callable[[], tuple[Any, Tensor]],
    calls: int,
    rounds: int,
    rt: ag.Runtime,
    max_pending: int = 1,
) -> dict[str, Any]:
    fn, x = make()
    expected = fn(x).numpy()
    own = TinyJit(fn)
    for _ in range(3):
        own(x)  # captured and graphed by tinygrad's own runner
    agt.install(devices=2, max_pending=max_pending)
    try:
        ours = TinyJit(fn)
        for _ in range(3):
            ours(x)
        assert agt.statistics().graphs >= 1, "install() built no runner"
        mirror = TinyJit(fn)
        for _ in range(2):
            mirror(x)  # captured: the trio path's source (graphed by nobody)
        jit_graph = await agt.graph_from_jit(rt, mirror)
        out = await jit_graph(x)
        assert out.numpy().tobytes() == expected.tobytes(), "trio path differs from tinygrad"
        assert ours(x).numpy().tobytes() == expected.tobytes(), "install path differs"
        assert own(x).numpy().tobytes() == expected.tobytes()
        floor = direct_calls(mirror, x)
        graph, roots, values = await jit_graph.inputs(x)
        own_runner, own_bufs = first_runner(own)
        our_runner, our_bufs = first_runner(ours)
        inputs = [x.uop.base.realized]
        own_raw = [inputs[0] if b is None else b for b in own_bufs]
        our_raw = [inputs[0] if b is None else b for b in our_bufs]

        def direct() -> None:
            for f, args in floor:
                f(*args)

        samples: dict[str, list[float]] = {
            k: []
            for k in (
                "tinygrad",
                "install",
                "trio",
                "direct",
                "runner_tinygrad",
                "runner_install",
                "graph_replay",
            )
        }
        for _ in range(rounds):
            samples["tinygrad"].append(timed(lambda: own(x), calls))
            samples["install"].append(timed(lambda: ours(x), calls))
            samples["trio"].append(await atimed(lambda: jit_graph(x), calls))
            samples["direct"].append(timed(direct, calls))
            samples["runner_tinygrad"].append(timed(lambda: own_runner(own_raw, {}), calls))
            samples["runner_install"].append(timed(lambda: our_runner(our_raw, {}), calls))
            samples["graph_replay"].append(await atimed(lambda: graph(roots, values), calls))
    finally:
        agt.uninstall()
    row = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    row["items"] = len(mirror.captured.jit_cache) if mirror.captured else 0
    row["name"] = name
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    parser.add_argument("--max-pending", type=int, default=1, help="install(max_pending=N)")
    parser.add_argument("--only", default="", help="run one jit: small, large or dp2")
    args = parser.parse_args()
    calls, rounds = (5, 2) if args.quick else (200, 9)
    large_calls = 5 if args.quick else 10
    jobs: list[tuple[str, Callable[[], tuple[Any, Tensor]], int]] = [
        ("small", lambda: mlp((16, 32, 8), 4), calls),
        (
            "large",
            lambda: mlp((512, 1024, 512), 64) if not args.quick else mlp((64, 64, 64), 8),
            large_calls,
        ),
        ("dp2", lambda: data_parallel(64, 32), calls),
    ]

    if args.only:
        jobs = [job for job in jobs if job[0] == args.only]

    async def run() -> list[dict[str, Any]]:
        rows = []
        async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
            for name, make, n in jobs:
                rows.append(await measure(name, make, n, rounds, rt, args.max_pending))
        return rows

    rows = trio.run(run)
    head = (
        f"{'jit':6} {'items':>5} {'tinygrad':>10} {'install':>10} {'trio':>10} {'direct':>10}   "
        f"{'runner tg':>10} {'runner ag':>10} {'ag replay':>10}"
    )
    print("us per call (median of rounds)")
    print(head)
    for r in rows:
        print(
            f"{r['name']:6} {r['items']:5d} {r['tinygrad']:10.1f} {r['install']:10.1f} {r['trio']:10.1f} "
            f"{r['direct']:10.1f}   {r['runner_tinygrad']:10.1f} {r['runner_install']:10.1f} "
            f"{r['graph_replay']:10.1f}"
        )
    if args.only:
        return
    small = next(r for r in rows if r["name"] == "small")
    large = next(r for r in rows if r["name"] == "large")
    verdicts = {
        "small_install_over_tinygrad": small["install"] / small["tinygrad"],
        "small_trio_over_tinygrad": small["trio"] / small["tinygrad"],
        "small_runner_install_over_runner_tinygrad": small["runner_install"]
        / small["runner_tinygrad"],
        "large_install_over_direct": large["install"] / large["direct"],
        "large_trio_over_direct": large["trio"] / large["direct"],
    }
    for key, value in verdicts.items():
        print(f"{key}: {value:.2f}")
    if args.quick:
        return
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "max_pending": args.max_pending,
                "cpus": os.cpu_count(),
                "rows": rows,
                "ratios": verdicts,
                "targets": {"small_over_tinygrad": 0.5, "large_over_direct": 1.05},
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
