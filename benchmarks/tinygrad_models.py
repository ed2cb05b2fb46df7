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

On workers (tinygrad 0.14; `--no-ag` leaves them out): two loopback `actorgraph worker
--allow-programs` processes become tinygrad's AG and AG:1 (`agt.install(remote=...)`),
and the decoder, cnn and mlp run on AG, dp2 over AG and AG:1 (its batch made here and
sharded to them in the jit), each call with its own input (made on its device before
the round) and reading its output (`.numpy()`), beside the same with tinygrad alone on
this host's CPU devices, and this run's floors (benchmarks/_floors.py): a bare round trip
between this process and another one ("rtt"), a call handed to another thread and back
("thread"), and beside them a Ping and its Pong to a worker through actorgraph's own
connection ("ping"). Targets: a call on a worker at most tinygrad alone's + 1.5 round
trips (dp2: its local data-parallel step's + 1.5), on the bare round trip (the verdicts
on the Ping are kept beside them); an eager kernel whose result is not read costs no
round trip (no message sent, less time than one). "floor" (JSON `floor_two_threads`,
not the jit's own floor of the rows above) is tinygrad alone's + one thread hand-over
+ one round trip: the least a call whose kernels are a small part of it can cost with
tinygrad's thread and the runtime's apart, as they are (a worker runs the kernels
beside this process's Python: a model heavy in kernels can come in under it).

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

from _floors import process_round_trip, thread_round_trip  # noqa: E402
from tinygrad import Device, Tensor, TinyJit, Variable  # noqa: E402

import actorgraph as ag  # noqa: E402
from actorgraph import tinygrad as agt  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "tinygrad_models.json"
INSTALL_TARGET = 1.0
TRIO_TARGET = 0.7
SMALL = ("decoder", "cnn", "mlp", "dp2")


def data(seed: int, *shape: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * 0.1


def randn(seed: int, *shape: int, device: str = "CPU") -> Tensor:
    return Tensor(data(seed, *shape), device=device).realize()


def _no_more(k: int) -> tuple[Any, ...]:
    return ()


@attrs.frozen
class Model:
    """A jitted function; `data(k)` is its k-th call's input data, `more(k)` the rest of
    that call's arguments (a bound position, say). `positions`: how many calls have
    arguments of their own (a decoder's context): calls past `calls` are at positions
    no round has."""

    name: str
    fn: Callable[..., Tensor]
    data: Callable[[int], np.ndarray[Any, Any]]
    calls: int  # per round
    devices: tuple[str, ...] = ("CPU",)
    more: Callable[[int], tuple[Any, ...]] = _no_more
    positions: int = 0


class Block:
    """A decoder block: attention over a KV cache it fills at `pos`, then an MLP."""

    def __init__(self, seed: int, dim: int, heads: int, ctx: int, device: str = "CPU") -> None:
        self.dim, self.heads = dim, heads
        wq, wk, wv, wo = (randn(seed + i, dim, dim, device=device) for i in range(4))
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo
        self.w1 = randn(seed + 4, dim, 4 * dim, device=device)
        self.w2 = randn(seed + 5, 4 * dim, dim, device=device)
        self.cache_k = Tensor.zeros(ctx, dim, device=device).contiguous().realize()
        self.cache_v = Tensor.zeros(ctx, dim, device=device).contiguous().realize()

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


def decoder(quick: bool, device: str = "CPU") -> Model:
    dim, ctx = (16, 16) if quick else (64, 128)
    blocks = [Block(10 * i, dim, 4, ctx, device) for i in range(2)]
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
        (device,),
        more=lambda k: (pos.bind(k % ctx),),
        positions=ctx,
    )


def cnn(quick: bool, device: str = "CPU") -> Model:
    size = 8 if quick else 32
    c1, c2 = randn(1, 8, 3, 3, 3, device=device), randn(2, 16, 8, 3, 3, device=device)
    head = randn(3, 16 * (size // 4) ** 2, 10, device=device)

    def forward(x: Tensor) -> Tensor:
        x = x.conv2d(c1, padding=1).relu().max_pool2d()
        x = x.conv2d(c2, padding=1).relu().max_pool2d()
        return (x.flatten(1) @ head).realize()

    calls = 4 if quick else 100
    return Model("cnn", forward, lambda k: data(2000 + k, 2, 3, size, size), calls, (device,))


def mlp(sizes: tuple[int, ...], batch: int, name: str, calls: int, device: str = "CPU") -> Model:
    weights = [randn(i, a, b, device=device) for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]

    def forward(x: Tensor) -> Tensor:
        for k, w in enumerate(weights):
            x = x @ w
            if k < len(weights) - 1:
                x = x.relu()
        return x.realize()

    return Model(name, forward, lambda k: data(3000 + k, batch, sizes[0]), calls, (device,))


def data_parallel(quick: bool, devs: tuple[str, ...] = ("CPU", "CPU:1")) -> Model:
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
    from actorgraph.tinygrad._convert import build_items, held_lookup

    calls = []
    for item in build_items(batch.calls, roots, held_lookup(batch.hold())):
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


# -- on workers: tinygrad's AG devices --

RT_TARGET = 1.5  # round trips a jitted call on a worker may cost beyond tinygrad alone's


def _ag_models(quick: bool) -> dict[str, Callable[[str, tuple[str, str]], Model]]:
    """The models on a device (decoder, cnn, mlp) or a pair of them (dp2), by name."""
    calls = 4 if quick else 30
    return {
        "decoder": lambda one, two: attrs.evolve(decoder(quick, one), calls=calls),
        "cnn": lambda one, two: attrs.evolve(cnn(quick, one), calls=calls),
        "mlp": lambda one, two: mlp((16, 32, 8), 4, "mlp", calls, one),
        "dp2": lambda one, two: attrs.evolve(data_parallel(quick, two), calls=calls),
    }


class Workers:
    """Two loopback `actorgraph worker --allow-programs` processes (CPU:0 each)."""

    def __init__(self) -> None:
        import subprocess
        import tempfile

        folder = pathlib.Path(tempfile.mkdtemp(prefix="ag-bench-"))
        self.token = folder / "token"
        self.token.write_text(os.urandom(16).hex())
        self.processes, self.devices = [], []
        command = [sys.executable, "-m", "actorgraph", "worker", "--port", "0", "--devices"]
        command += ["CPU:0", "--token-file", str(self.token), "--allow-programs"]
        for _ in range(2):
            process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            assert process.stdout is not None
            banner = process.stdout.readline()
            self.processes.append(process)
            if "listening on " not in banner:
                self.stop()
                raise SystemExit(f"a worker did not start: {banner!r}")
            self.devices.append("CPU:0@" + banner.split("listening on ", 1)[1].split()[0])

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
            process.wait(30)


def _input_device(model: Model) -> str:
    """Where a call's input is made: the model's device, or this host for dp2 (whose jit
    shards it over its devices)."""
    return model.devices[0] if len(model.devices) == 1 else "CPU"


def _per_call(
    jit: Any, inputs: Sequence[Tensor], model: Model, calls: range | None = None
) -> float:
    """Calls `calls` (a round: the model's first `model.calls`), each on the round's
    input of its turn and reading its output (what a caller of a model does)."""
    calls = range(model.calls) if calls is None else calls
    start = time.perf_counter()
    for k in calls:
        jit(inputs[k % model.calls], *model.more(k)).numpy()
    return (time.perf_counter() - start) / len(calls)


def _round_trips(names: Sequence[str], count: int = 20) -> float:
    """The median round trip (a Ping and its Pong) between this process and the
    workers of these AG devices, measured on the runtime's thread."""
    state = agt._install.current()
    assert state is not None
    found = []
    for name in names:
        connection = state.runtime.runtime.device(name).connection
        for _ in range(count):
            found.append(state.runtime.call(connection.round_trip).result())
    return statistics.median(found)


def measure_ag(
    name: str, quick: bool, rounds: int, workers: Workers, eager_calls: int
) -> dict[str, Any]:
    """A model with tinygrad alone on local CPU devices and on the workers (AG, AG:1),
    each call reading its output, beside this run's round trips (a Ping to the workers,
    a bare one to another process) and a thread hand-over."""
    build = _ag_models(quick)[name]
    local = build("CPU", ("CPU", "CPU:1"))
    arrays = [local.data(k) for k in range(local.calls)]
    local_inputs = [Tensor(a, device=_input_device(local)).realize() for a in arrays]
    own = TinyJit(local.fn)
    checked = min(4, local.calls)
    expected = [own(local_inputs[k], *local.more(k)).numpy().tobytes() for k in range(checked)]
    agt.install(devices=2, remote=workers.devices, remote_token_file=str(workers.token))
    try:
        remote = build("AG", ("AG", "AG:1"))
        inputs = [Tensor(a, device=_input_device(remote)).realize() for a in arrays]
        ours = TinyJit(remote.fn)
        got = [ours(inputs[k], *remote.more(k)).numpy().tobytes() for k in range(checked)]
        assert got == expected, f"{name}: on the workers it differs from tinygrad alone"
        before = agt.statistics()
        samples: dict[str, list[float]] = {"tinygrad": [], "ag": []}
        for _ in range(rounds):
            samples["tinygrad"].append(_per_call(own, local_inputs, local))
            samples["ag"].append(_per_call(ours, inputs, remote))
        after = agt.statistics()
        generation = None
        if remote.positions > remote.calls:
            # The rest of a generation: each call at a position no round had (on the
            # rounds' inputs, which the rounds brought to the workers).
            past = range(remote.calls, remote.positions)
            generation = {
                "tinygrad": _per_call(own, local_inputs, local, past) * 1e6,
                "ag": _per_call(ours, inputs, remote, past) * 1e6,
                "calls": remote.positions - remote.calls,
            }
        used = [agt.statistics().remote[i] for i in range(len(remote.devices))]
        rtt = _round_trips(used)
        eager = _eager(eager_calls) if name == "mlp" else None
    finally:
        agt.uninstall()
    trips = 20 if quick else 2000
    process_rtt, _ = trio.run(process_round_trip, trips)
    row: dict[str, Any] = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    row.update(
        name=name,
        mode="ag",
        devices=list(remote.devices),
        rtt=rtt * 1e6,
        process_rtt=process_rtt,
        thread_rtt=thread_round_trip(trips),
        replays=after.replays - before.replays,
        target=row["tinygrad"] + RT_TARGET * process_rtt,
        target_on_ping=row["tinygrad"] + RT_TARGET * rtt * 1e6,
    )
    # The least a call on a worker can cost with the runtime on a thread of its own: one
    # hand-over to that thread and back, and one round trip to the worker's process.
    row["floor_two_threads"] = row["tinygrad"] + row["thread_rtt"] + process_rtt
    row["extra_round_trips"] = (row["ag"] - row["tinygrad"]) / process_rtt
    row["extra_pings"] = (row["ag"] - row["tinygrad"]) / row["rtt"]
    if generation is not None:
        generation["target"] = generation["tinygrad"] + RT_TARGET * process_rtt
        generation["target_on_ping"] = generation["tinygrad"] + RT_TARGET * rtt * 1e6
        row["first_positions"] = generation
    if eager is not None:
        row["eager"] = eager
    return row


def _eager(calls: int) -> dict[str, Any]:
    """Eager kernels on AG whose results nothing reads: per call, and the messages they
    sent the worker (none: they go with the next read)."""
    state = agt._install.current()
    assert state is not None
    connection = state.runtime.runtime.device(state.remote[0]).connection
    x = Tensor(data(7, 64, 64), device="AG").realize()
    for _ in range(3):  # compiled and shipped before the timing
        x = (x * 0.5 + 1).realize()
    Device["AG"].synchronize()
    sent = connection.statistics().messages_sent
    start = time.perf_counter()
    for _ in range(calls):
        x = (x * 0.5 + 1).realize()
    per_call = (time.perf_counter() - start) / calls
    messages = connection.statistics().messages_sent - sent
    Device["AG"].synchronize()
    local = Tensor(data(7, 64, 64)).realize()
    for _ in range(3):
        local = (local * 0.5 + 1).realize()
    start = time.perf_counter()
    for _ in range(calls):
        local = (local * 0.5 + 1).realize()
    local_per_call = (time.perf_counter() - start) / calls
    return {
        "calls": calls,
        "ag": per_call * 1e6,
        "tinygrad": local_per_call * 1e6,
        "messages": messages,
    }


def _verdict(row: dict[str, Any]) -> dict[str, Any]:
    """Against the target on the process round trip (the issue's), and on the Ping."""
    return {
        "us": row["ag"],
        "target_us": row["target"],
        "met": row["ag"] <= row["target"],
        "target_on_ping_us": row["target_on_ping"],
        "met_on_ping": row["ag"] <= row["target_on_ping"],
    }


def ag_verdicts(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        where = "over two workers" if r["name"] == "dp2" else "on a worker"
        out[f"{r['name']} {where}"] = _verdict(r)
        if "first_positions" in r:
            out["decoder at positions not seen before"] = _verdict(r["first_positions"])
        if "eager" in r:
            eager = r["eager"]
            out["eager kernel not read"] = {
                "us": eager["ag"],
                "messages": eager["messages"],
                "rtt_us": r["process_rtt"],
                "ping_us": r["rtt"],
                "met": eager["messages"] == 0,
            }
    return out


def report_ag(rows: Sequence[dict[str, Any]]) -> None:
    print(
        "on workers (loopback), us per call, each reading its output; rtt: a bare round trip "
        "to another process; ping: a Ping and its Pong to the worker; thread: a call handed "
        "to a thread and back; target: tinygrad + 1.5 rtt; floor: tinygrad + thread + rtt\n"
        f"{'model':8} {'devices':>8} {'tinygrad':>9} {'AG':>8} {'rtt':>6} {'ping':>6} "
        f"{'thread':>6} {'target':>8} {'floor':>8} {'extra rtts':>10}"
    )
    for r in rows:
        devices = "AG+AG:1" if r["name"] == "dp2" else "AG"
        print(
            f"{r['name']:8} {devices:>8} {r['tinygrad']:9.1f} {r['ag']:8.1f} "
            f"{r['process_rtt']:6.1f} {r['rtt']:6.1f} {r['thread_rtt']:6.1f} "
            f"{r['target']:8.1f} {r['floor_two_threads']:8.1f} {r['extra_round_trips']:10.2f}"
        )
        if "first_positions" in r:
            f = r["first_positions"]
            print(
                f"decoder at positions no round had ({f['calls']} calls, each position once, "
                f"as a generation goes on): {f['ag']:.1f} us a call on AG ({f['tinygrad']:.1f} "
                f"us on CPU alone; target {f['target']:.1f})"
            )
        if "eager" in r:
            e = r["eager"]
            print(
                f"eager kernel, result not read: {e['ag']:.1f} us a call on AG "
                f"({e['tinygrad']:.1f} us on CPU alone), {e['messages']} messages for "
                f"{e['calls']} calls"
            )
    for name, verdict in ag_verdicts(rows).items():
        print(f"{name}: {'met' if verdict['met'] else 'NOT met'} ({verdict})")


def ag_possible() -> str | None:
    """Why AG rows cannot run here, or None."""
    if agt.TINYGRAD_VERSION != "0.14.0":
        return f"AG devices need tinygrad 0.14.0 (this is {agt.TINYGRAD_VERSION})"
    from actorgraph.worker._machine_code import loader_problem

    return loader_problem()


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
    parser.add_argument(
        "--no-ag", action="store_true", help="leave out the rows on workers (AG devices)"
    )
    parser.add_argument(
        "--ag-only", action="store_true", help="only the rows on workers (AG devices)"
    )
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    chosen = [m for m in models(args.quick) if not args.only or m.name in args.only.split(",")]
    if args.ag_only:
        chosen = []
    ag_names = [n for n in _ag_models(args.quick) if not args.only or n in args.only.split(",")]
    why_not = "--no-ag" if args.no_ag else ag_possible()

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
    ag_rows: list[dict[str, Any]] = []
    if why_not is None and ag_names:
        workers = Workers()
        try:
            for name in ag_names:
                ag_rows.append(
                    measure_ag(name, args.quick, rounds, workers, 20 if args.quick else 500)
                )
        finally:
            workers.stop()
        report_ag(ag_rows)
    elif ag_names:
        print(f"no rows on workers: {why_not}")
    found_ag = ag_verdicts(ag_rows)
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
                "ag_rows": ag_rows,
                "ag_verdicts": found_ag,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
