"""tinygrad models on actorgraph: per call, against tinygrad alone, on the installed release.

Five real-shaped models, each called with a new input tensor every call, on tinygrad's
CPU devices, in two input modes (MODES): `pool`, a pool of live tensors made before, one
per call of a round, so every call binds memory it has not seen in the round (the worst
case for actorgraph's per-input binding); `recycled`, two live tensors taking turns, as
a loop that makes a tensor per call sees tinygrad's allocator hand the same memory out
again (tinygrad's own tensor creation is left out of the timing: on 0.14 it costs more
than these jits do):
- decoder: a 2-block transformer decode step (dim 64, 4 heads) with a KV cache of 128
           positions and a symbolic start_pos (a new position every call)
- cnn:     two 3x3 convolutions and a linear head on a 2x3x32x32 batch
- mlp:     an MLP 16 -> 32 -> 8 on a batch of 4
- dp2:     a data-parallel layer over CPU and CPU:1 (the batch sharded, weights on both)
- heavy:   an MLP 512 -> 2048 -> 512 on a batch of 64 (milliseconds of kernels a call)

Paths, measured in alternating rounds so load from elsewhere lands on all of them:
- tinygrad: TinyJit alone (0.14: its kernels called one by one, inline; 0.11: HCQGraph)
- install:  TinyJit with actorgraph installed as the CPU devices' graph runner
- trio:     `await jit_graph(*args)` (agt.graph_from_jit) in a trio program
- floor:    the jit's kernels called back to back through ctypes, prepared once

A round is N calls then a synchronize of the devices; a figure is the median round's
time per call. Every path's outputs are checked bitwise against tinygrad alone first.
The CPU time the process spent per call (all its threads) is kept beside it (JSON
`cpu`; printed for install()): other work on the machine stretches wall-clock rounds,
not this, so where the kernels are nearly all of a call (heavy) it tells a cost of ours
from the machine's load.
Targets: install <= 1.0x tinygrad alone on every model; the trio path <= 0.7x on the
small models (all but heavy).

    python benchmarks/tinygrad_models.py            # -> benchmarks/results/tinygrad_models.json
    python benchmarks/tinygrad_models.py --quick    # tiny sizes: checks the script runs
                                                    #    (-> results/quick/, measures nothing)

Named so that it never shadows the tinygrad package for scripts in this folder.
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
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import trio

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
os.environ.setdefault("DEV", "CPU")

from tinygrad import Device, Tensor, TinyJit, Variable  # noqa: E402

import actorgraph as ag  # noqa: E402
from actorgraph import tinygrad as agt  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "tinygrad_models.json"
INSTALL_TARGET = 1.0
TRIO_TARGET = 0.7
SMALL = ("decoder", "cnn", "mlp", "dp2")


def data(seed: int, *shape: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * 0.1


def randn(seed: int, *shape: int) -> Tensor:
    return Tensor(data(seed, *shape)).realize()


def _no_more(k: int) -> tuple[Any, ...]:
    return ()


@attrs.frozen
class Model:
    """A jitted function; `data(k)` is its k-th call's input data, `more(k)` the rest of
    that call's arguments (a bound position, say)."""

    name: str
    fn: Callable[..., Tensor]
    data: Callable[[int], np.ndarray[Any, Any]]
    calls: int  # per round
    devices: tuple[str, ...] = ("CPU",)
    more: Callable[[int], tuple[Any, ...]] = _no_more


class Block:
    """A decoder block: attention over a KV cache it fills at `pos`, then an MLP."""

    def __init__(self, seed: int, dim: int, heads: int, ctx: int) -> None:
        self.dim, self.heads = dim, heads
        self.wq, self.wk, self.wv, self.wo = (randn(seed + i, dim, dim) for i in range(4))
        self.w1, self.w2 = randn(seed + 4, dim, 4 * dim), randn(seed + 5, 4 * dim, dim)
        self.cache_k = Tensor.zeros(ctx, dim).contiguous().realize()
        self.cache_v = Tensor.zeros(ctx, dim).contiguous().realize()

    def __call__(self, x: Tensor, pos: Any) -> Tensor:
        q, k, v = x @ self.wq, x @ self.wk, x @ self.wv
        self.cache_k[pos : pos + 1].assign(k).realize()
        self.cache_v[pos : pos + 1].assign(v).realize()
        keys, values = self.cache_k[0 : pos + 1], self.cache_v[0 : pos + 1]
        hd = self.dim // self.heads
        qh = q.reshape(self.heads, 1, hd)
        kh = keys.reshape(-1, self.heads, hd).permute(1, 2, 0)
        vh = values.reshape(-1, self.heads, hd).permute(1, 0, 2)
        att = ((qh @ kh) / hd**0.5).softmax(-1) @ vh
        x = x + att.reshape(1, self.dim) @ self.wo
        return x + (x @ self.w1).relu() @ self.w2


def decoder(quick: bool) -> Model:
    dim, ctx = (16, 16) if quick else (64, 128)
    blocks = [Block(10 * i, dim, 4, ctx) for i in range(2)]
    pos = Variable("start_pos", 0, ctx - 1)

    def step(x: Tensor, p: Any) -> Tensor:
        for block in blocks:
            x = block(x, p)
        return x.realize()

    calls = 4 if quick else 100
    return Model(
        "decoder",
        step,
        lambda k: data(1000 + k, 1, dim),
        calls,
        more=lambda k: (pos.bind(k % ctx),),
    )


def cnn(quick: bool) -> Model:
    size = 8 if quick else 32
    c1, c2 = randn(1, 8, 3, 3, 3), randn(2, 16, 8, 3, 3)
    head = randn(3, 16 * (size // 4) ** 2, 10)

    def forward(x: Tensor) -> Tensor:
        x = x.conv2d(c1, padding=1).relu().max_pool2d()
        x = x.conv2d(c2, padding=1).relu().max_pool2d()
        return (x.flatten(1) @ head).realize()

    return Model("cnn", forward, lambda k: data(2000 + k, 2, 3, size, size), 4 if quick else 100)


def mlp(sizes: tuple[int, ...], batch: int, name: str, calls: int) -> Model:
    weights = [randn(i, a, b) for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]

    def forward(x: Tensor) -> Tensor:
        for k, w in enumerate(weights):
            x = x @ w
            if k < len(weights) - 1:
                x = x.relu()
        return x.realize()

    return Model(name, forward, lambda k: data(3000 + k, batch, sizes[0]), calls)


def data_parallel(quick: bool) -> Model:
    devs = ("CPU", "CPU:1")
    width, batch = (8, 4) if quick else (64, 32)
    w = randn(5, width, width).shard(devs, axis=None).realize()

    def forward(x: Tensor) -> Tensor:
        return (x.shard(devs, axis=0) @ w).relu().sum(0).realize()

    return Model("dp2", forward, lambda k: data(4000 + k, batch, width), 4 if quick else 100, devs)


def models(quick: bool) -> list[Model]:
    return [
        decoder(quick),
        cnn(quick),
        mlp((16, 32, 8), 4, "mlp", 4 if quick else 100),
        data_parallel(quick),
        mlp(
            (64, 128, 64) if quick else (512, 2048, 512),
            8 if quick else 64,
            "heavy",
            3 if quick else 10,
        ),
    ]


def sync(devices: Sequence[str]) -> None:
    for name in devices:
        Device[name].synchronize()


def floor_calls(batch: Any, roots: Sequence[ag.Buffer], values: dict[Any, int]) -> list[Any]:
    """The batch's kernels and copies as prepared (function, args), over these roots."""
    from actorgraph.tinygrad._convert import build_items

    calls = []
    for item in build_items(batch.calls, roots, batch.wrapper):
        if isinstance(item, ag.Launch):
            fixed = dict(item.fixedvars)
            vals = [fixed[v] if v in fixed else values[v] for v in item.vars]
            calls.append((item.kernel.cpu, (*[b.address for b in item.bufs], *vals)))
        else:
            calls.append((ctypes.memmove, (item.dst.address, item.src.address, item.dst.nbytes)))
    return calls


MODES = {
    "pool": "a pool of live tensors, one per call of a round: every call binds memory it has "
    "not seen in the round (the worst case for actorgraph's per-input binding)",
    "recycled": "two live tensors taking turns, as a loop making a tensor per call sees "
    "tinygrad's allocator hand the same memory out again (without timing tinygrad's "
    "tensor creation, which costs more than these jits on 0.14)",
}


async def measure(model: Model, rounds: int, rt: ag.Runtime, mode: str) -> dict[str, Any]:
    arrays = [model.data(k) for k in range(model.calls)]
    live = [Tensor(a).realize() for a in (arrays if mode == "pool" else arrays[:2])]

    def args(k: int) -> tuple[Any, ...]:
        return (live[k % len(live)], *model.more(k))

    checked = min(4, model.calls)  # calls compared bitwise with tinygrad alone first
    own = TinyJit(model.fn)
    expected = [own(*args(k)).numpy().tobytes() for k in range(checked)]  # captured, replays
    agt.install(devices=2)
    try:
        ours = TinyJit(model.fn)
        got = [ours(*args(k)).numpy().tobytes() for k in range(checked)]
        assert got == expected, f"{model.name}: install() differs from tinygrad alone"
        mirror = TinyJit(model.fn)
        mirror(*args(0)), mirror(*args(1))  # captured: the trio path's source
        jit_graph = await agt.graph_from_jit(rt, mirror)
        got = [(await jit_graph(*args(k))).numpy().tobytes() for k in range(checked)]
        assert got == expected, f"{model.name}: the trio path differs from tinygrad alone"
        graph, roots, values = await jit_graph.inputs(*args(0))
        floor = floor_calls(jit_graph._source.batch, roots, values)
        before = agt.statistics()

        cpu: dict[str, list[float]] = {k: [] for k in ("tinygrad", "install", "trio", "floor")}

        def timed(call: Callable[[tuple[Any, ...]], Any], path: str) -> float:
            start, used = time.perf_counter(), time.process_time()
            for k in range(model.calls):
                call(args(k))
            sync(model.devices)
            cpu[path].append((time.process_time() - used) / model.calls)
            return (time.perf_counter() - start) / model.calls

        async def atimed() -> float:
            start, used = time.perf_counter(), time.process_time()
            for k in range(model.calls):
                await jit_graph(*args(k))
            sync(model.devices)
            cpu["trio"].append((time.process_time() - used) / model.calls)
            return (time.perf_counter() - start) / model.calls

        def direct(given: tuple[Any, ...]) -> None:
            for fn, fargs in floor:
                fn(*fargs)

        samples: dict[str, list[float]] = {k: [] for k in ("tinygrad", "install", "trio", "floor")}
        for _ in range(rounds):
            samples["tinygrad"].append(timed(lambda a: own(*a), "tinygrad"))
            samples["install"].append(timed(lambda a: ours(*a), "install"))
            samples["trio"].append(await atimed())
            samples["floor"].append(timed(direct, "floor"))
        after = agt.statistics()
        assert after.replays > before.replays, f"{model.name}: install() replayed nothing"
    finally:
        agt.uninstall()
    row: dict[str, Any] = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    row["name"] = model.name
    row["mode"] = mode
    row["calls"] = jit_graph._source.size
    row["replays"] = after.replays - before.replays
    row["handed_off"] = after.handed_off - before.handed_off
    row["install_ratio"] = row["install"] / row["tinygrad"]
    row["trio_ratio"] = row["trio"] / row["tinygrad"]
    row["floor_ratio"] = row["floor"] / row["tinygrad"]
    # CPU time of the whole process per call (every thread's), which other processes on
    # the machine do not stretch as they do the wall-clock figures.
    row["cpu"] = {k: statistics.median(v) * 1e6 for k, v in cpu.items()}
    row["install_cpu_ratio"] = row["cpu"]["install"] / row["cpu"]["tinygrad"]
    return row


def verdicts(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for r in rows:
        out[f"{r['name']} {r['mode']} install"] = {
            "ratio": r["install_ratio"],
            "target": INSTALL_TARGET,
            "met": r["install_ratio"] <= INSTALL_TARGET,
        }
        if r["name"] in SMALL:
            out[f"{r['name']} {r['mode']} trio"] = {
                "ratio": r["trio_ratio"],
                "target": TRIO_TARGET,
                "met": r["trio_ratio"] <= TRIO_TARGET,
            }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per path (median taken)")
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument(
        "--modes", default="pool,recycled", help="comma-separated input modes (see MODES)"
    )
    parser.add_argument("--out", default="", help="where the JSON goes (default: RESULTS)")
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    chosen = [m for m in models(args.quick) if not args.only or m.name in args.only.split(",")]

    async def run() -> list[dict[str, Any]]:
        rows = []
        async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
            for mode in args.modes.split(","):
                for model in chosen:
                    rows.append(await measure(model, rounds, rt, mode))
        return rows

    load = os.getloadavg()
    rows = trio.run(run)
    print(
        f"tinygrad {agt.TINYGRAD_VERSION}, us per call (median of {rounds} rounds), load {load[0]:.1f}"
    )
    print(
        f"{'model':8} {'calls':>5} {'tinygrad':>10} {'install':>10} {'trio':>10} {'floor':>10}   "
        f"{'install/tg':>10} {'trio/tg':>8} {'cpu: install/tg':>15}"
    )
    for r in rows:
        print(
            f"{r['name']:8} {r['calls']:5d} {r['tinygrad']:10.1f} {r['install']:10.1f} "
            f"{r['trio']:10.1f} {r['floor']:10.1f}   {r['install_ratio']:10.2f} "
            f"{r['trio_ratio']:8.2f} {r['install_cpu_ratio']:15.2f}"
        )
    found = verdicts(rows)
    for name, verdict in found.items():
        met = "met" if verdict["met"] else "NOT met"
        print(f"{name}: {verdict['ratio']:.2f}x (target <= {verdict['target']}x): {met}")
    # A quick run writes under results/quick/, never over a full run's figures.
    out = (
        pathlib.Path(args.out)
        if args.out
        else RESULTS.parent / ("quick" if args.quick else "") / RESULTS.name
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "tinygrad": agt.TINYGRAD_VERSION,
                "quick": args.quick,
                "machine": platform.platform(),
                "cpus": os.cpu_count(),
                "load_before": load,
                "load_after": os.getloadavg(),
                "rounds": rounds,
                "modes": {m: MODES[m] for m in args.modes.split(",")},
                "rows": rows,
                "verdicts": found,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
