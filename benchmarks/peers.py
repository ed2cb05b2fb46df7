"""actorgraph side by side with what users would pick instead, in one run on one machine.

    pip install -e ".[bench]"           # dask, matplotlib, tinygrad (0.14.0; 0.11.0 works too)
    apt-get install clang               # tinygrad's CPU devices compile kernels with clang
    python benchmarks/peers.py          # table on stdout, benchmarks/results/peers.{json,png}

Peers, each given the same workloads (benchmarks/_workloads.py):
- actorgraph on CPU devices: one compiled graph, `await graph(inputs)` per run;
- tinygrad on its CPU devices: the same xor kernels and copies written as tensors,
  realized one kernel at a time inside a TinyJit, so replays go through its graph runner
  (0.11.0: HCQGraph; 0.14.0 has none for CPU devices: its jit calls them one by one)
  (the runners it used are printed); skipped, with a message, without clang or tinygrad;
- Dask's threaded scheduler on the same DAG of numpy calls, one worker per device;
- plain sequential numpy calls: the floor for per-item overhead.

Every peer warms up, runs several times, and is checked against a numpy reference.
Ratios read "how many times actorgraph is ahead": above 1 actorgraph wins that row.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import trio

if __package__ in (None, ""):
    # Run as a script: make the checkout's packages importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _workloads as wl

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = ("actorgraph", "tinygrad", "dask", "numpy")


class Skip(Exception):
    """A peer cannot run here; the message says why and how to fix it."""


@attrs.frozen
class Row:
    """One workload; `per` says how a median is shown: per item (us) or per run (ms)."""

    key: str
    workload: wl.Workload
    per: str
    warmup: int
    runs: int
    group: str = ""


# -- peers --
#
# A peer is opened for one workload (everything allocated, compiled, inputs placed), then
# run again and again; all peers of a row are open at once and take turns, so a burst of
# load from elsewhere on the machine lands on every peer alike.


class Peer:
    """One way of running a workload: `run` runs it once, to completion."""

    name = ""

    async def run(self) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        """What ran (after at least one run): shown beside the figure."""
        return ""

    async def outputs(self) -> tuple[np.ndarray[Any, Any], ...]:
        """The workload's sinks after the last run."""
        raise NotImplementedError


class ActorgraphPeer(Peer):
    name = "actorgraph"

    def __init__(self, rt: Any, workload: wl.Workload) -> None:
        self.rt = rt
        self.workload = workload
        self.build = wl.build_actorgraph(rt, workload)
        self.graph: Any = None

    async def start(self, inputs: Sequence[Any]) -> None:
        for buf, data in zip(self.build.inputs, inputs):
            await self.rt.copyin(buf, data)
        self.graph = await self.rt.compile(self.build.items, inputs=self.build.inputs)

    async def run(self) -> None:
        await self.graph(self.build.inputs)

    def describe(self) -> str:
        return f"{self.graph.statistics().queues} queue actors"

    async def outputs(self) -> tuple[np.ndarray[Any, Any], ...]:
        return tuple([await self.rt.copyout(self.build.buffers[o]) for o in self.workload.outputs])


async def open_actorgraph(
    stack: AsyncExitStack, workload: wl.Workload, inputs: Sequence[Any]
) -> Peer:
    import actorgraph as ag

    rt = await stack.enter_async_context(ag.open_runtime(wl.cpu_devices(workload.devices)))
    peer = ActorgraphPeer(rt, workload)
    await peer.start(inputs)
    return peer


def _numpy_buffers(workload: wl.Workload, inputs: Sequence[Any]) -> list[np.ndarray[Any, Any]]:
    arrays = [np.zeros(workload.elems, np.int32) for _ in workload.buffer_devices]
    for buf, data in zip(workload.inputs, inputs):
        arrays[buf][:] = data
    return arrays


class NumpyPeer(Peer):
    """The items as prepared numpy calls in one Python loop: no scheduling at all."""

    name = "numpy"

    def __init__(self, workload: wl.Workload, inputs: Sequence[Any]) -> None:
        self.workload = workload
        self.arrays = arrays = _numpy_buffers(workload, inputs)
        self.calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        for step in workload.steps:
            if isinstance(step, wl.Xor):
                # out as the third positional argument: cheaper than out= for a ufunc
                self.calls.append(
                    (np.bitwise_xor, (arrays[step.a], arrays[step.b], arrays[step.out]))
                )
            else:
                self.calls.append((np.copyto, (arrays[step.out], arrays[step.src])))

    async def run(self) -> None:
        for fn, args in self.calls:
            fn(*args)

    def describe(self) -> str:
        return "sequential, one thread"

    async def outputs(self) -> tuple[np.ndarray[Any, Any], ...]:
        return tuple(self.arrays[o].copy() for o in self.workload.outputs)


async def open_numpy(stack: AsyncExitStack, workload: wl.Workload, inputs: Sequence[Any]) -> Peer:
    return NumpyPeer(workload, inputs)


def _xor_task(out: np.ndarray[Any, Any], a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> Any:
    return np.bitwise_xor(a, b, out=out)


def _copy_task(out: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> Any:
    np.copyto(out, src)
    return out


class DaskPeer(Peer):
    """The same DAG as a Dask graph of numpy calls on the threaded scheduler, with one
    worker thread per device (1 worker: the items run one at a time, as on one device)."""

    name = "dask"

    def __init__(self, workload: wl.Workload, inputs: Sequence[Any]) -> None:
        import dask.threaded

        self.get = dask.threaded.get
        self.version = importlib.metadata.version("dask")
        self.workload = workload
        self.arrays = arrays = _numpy_buffers(workload, inputs)
        graph: dict[str, Any] = {f"b{buf}": arrays[buf] for buf in workload.inputs}
        for step in workload.steps:
            out = arrays[step.out]
            if isinstance(step, wl.Xor):
                graph[f"b{step.out}"] = (
                    functools.partial(_xor_task, out),
                    f"b{step.a}",
                    f"b{step.b}",
                )
            else:
                graph[f"b{step.out}"] = (functools.partial(_copy_task, out), f"b{step.src}")
        self.graph = graph
        self.keys = [f"b{o}" for o in workload.outputs]
        self.workers = workload.devices

    async def run(self) -> None:
        self.get(self.graph, self.keys, num_workers=self.workers)

    def describe(self) -> str:
        return f"dask {self.version}, threaded scheduler, {self.workers} worker(s)"

    async def outputs(self) -> tuple[np.ndarray[Any, Any], ...]:
        return tuple(self.arrays[o].copy() for o in self.workload.outputs)


async def open_dask(stack: AsyncExitStack, workload: wl.Workload, inputs: Sequence[Any]) -> Peer:
    if importlib.util.find_spec("dask") is None:
        raise Skip('dask is not installed: pip install -e ".[bench]"')
    return DaskPeer(workload, inputs)


TINYGRAD_VERSIONS = "0.11.0 or 0.14.0"


def _tinygrad_device(index: int) -> str:
    return "CPU" if index == 0 else f"CPU:{index}"


def describe_runners(jit: Any) -> str:
    """What a captured TinyJit replays: graph runners with their batch sizes, then loose
    items (tinygrad 0.11: a jit cache of ExecItems; 0.13 on: a LINEAR of calls)."""
    batches: dict[str, list[int]] = {}
    loose: Counter[str] = Counter()
    cache = getattr(jit, "jit_cache", None)
    if cache is not None:
        for item in cache:
            runner = item.prg
            name = type(runner).__name__
            inner = getattr(runner, "jit_cache", None)
            if inner is not None and name.endswith("Graph"):
                batches.setdefault(name, []).append(len(inner))
            else:
                loose[name] += 1
    else:
        from tinygrad.engine.realize import graph_cache

        for call in jit.captured.linear.src:
            ast = call.src[0]
            if ast.op.name == "CUSTOM_FUNCTION" and ast.arg == "graph":
                name = type(graph_cache.get(ast)).__name__
                batches.setdefault(name, []).append(len(ast.src[0].src))
            else:
                loose[f"{ast.op.name.lower()} call"] += 1
    parts = []
    for name, sizes in batches.items():
        shown = "+".join(map(str, sizes[:12])) + ("+..." if len(sizes) > 12 else "")
        parts.append(f"{name} x{len(sizes)} ({sum(sizes)} items in batches of {shown})")
    parts += [f"{name} x{count} ungraphed" for name, count in loose.items()]
    return "; ".join(parts) or "nothing captured"


class TinygradPeer(Peer):
    """The workload as tinygrad tensors on its CPU devices, one realize per item inside a
    TinyJit: the jit captures one kernel per xor and one copy per move, and from its
    third call on replays them through its graph runner (HCQGraph for 0.11's CPU devices;
    0.14's have none, and its jit calls their kernels one by one)."""

    name = "tinygrad"

    def __init__(self, workload: wl.Workload, inputs: Sequence[Any]) -> None:
        from tinygrad.device import Device
        from tinygrad.engine.jit import TinyJit
        from tinygrad.tensor import Tensor

        self.version = importlib.metadata.version("tinygrad")
        self.workload = workload
        names = [_tinygrad_device(d) for d in range(workload.devices)]
        self.placed = [
            Tensor(np.asarray(data), device=names[workload.buffer_devices[buf]]).realize()
            for buf, data in zip(workload.inputs, inputs)
        ]
        steps, sinks, input_ids = workload.steps, workload.outputs, workload.inputs

        def body(*tensors: Any) -> tuple[Any, ...]:
            values = dict(zip(input_ids, tensors))
            for step in steps:
                if isinstance(step, wl.Xor):
                    values[step.out] = (values[step.a] ^ values[step.b]).realize()
                else:
                    values[step.out] = values[step.src].to(names[step.device]).realize()
            return tuple(values[o] for o in sinks)

        self.jit = TinyJit(body)
        self.devices: list[Any] = [Device[name] for name in names]
        self.result: tuple[Any, ...] = ()

    async def run(self) -> None:
        self.result = self.jit(*self.placed)
        for device in self.devices:
            device.synchronize()

    def describe(self) -> str:
        return f"tinygrad {self.version}: {describe_runners(self.jit)}"

    async def outputs(self) -> tuple[np.ndarray[Any, Any], ...]:
        return tuple(t.numpy() for t in self.result)


async def open_tinygrad(
    stack: AsyncExitStack, workload: wl.Workload, inputs: Sequence[Any]
) -> Peer:
    compiler = os.environ.get("CC", "clang")
    if shutil.which(compiler) is None:
        raise Skip(
            f"tinygrad's CPU devices compile kernels with {compiler!r}, which is not on PATH: "
            f"install it (Debian/Ubuntu: apt-get install clang)"
        )
    if importlib.util.find_spec("tinygrad") is None:
        raise Skip(
            f'tinygrad is not installed: pip install -e ".[bench]" (tinygrad {TINYGRAD_VERSIONS})'
        )
    return TinygradPeer(workload, inputs)


OPEN: dict[str, Callable[[AsyncExitStack, wl.Workload, Sequence[Any]], Awaitable[Peer]]] = {
    "actorgraph": open_actorgraph,
    "tinygrad": open_tinygrad,
    "dask": open_dask,
    "numpy": open_numpy,
}
# TinyJit runs plainly on call 1, captures on call 2 and builds its graphs on call 3.
MIN_WARMUP = {"tinygrad": 3}


# -- the run --


def rows_for(quick: bool, runs: int | None, warmup: int | None) -> list[Row]:
    """The workloads; `quick` shrinks every size so a smoke run takes well under a second."""
    if quick:
        tiny, heavy_elems, n_tiny, n_copies, n_dag, n_heavy = 64, 1 << 12, 16, 32, 40, 4
    else:
        tiny, heavy_elems, n_tiny, n_copies, n_dag, n_heavy = (
            wl.TINY_ELEMS,
            wl.HEAVY_ELEMS,
            256,
            1024,
            1000,
            16,
        )
    small_runs = runs or (3 if quick else 30)
    big_runs = runs or (3 if quick else 15)
    small_warm = warmup if warmup is not None else (1 if quick else 5)
    big_warm = warmup if warmup is not None else (1 if quick else 3)
    return [
        Row("tiny_1dev", wl.tiny_chain(n_tiny, tiny), "item", small_warm, small_runs),
        Row("copies_2dev", wl.two_device_copies(n_copies, 8, tiny), "item", small_warm, small_runs),
        Row("heavy_1dev", wl.heavy(1, n_heavy, heavy_elems), "run", big_warm, big_runs, "heavy"),
        Row("heavy_2dev", wl.heavy(2, n_heavy, heavy_elems), "run", big_warm, big_runs, "heavy"),
        Row("dag_1k", wl.random_dag(n_dag, 2, 8, elems=tiny), "item", small_warm, small_runs),
    ]


def check_outputs(workload: wl.Workload, inputs: Sequence[Any], got: Sequence[Any]) -> str | None:
    want = wl.reference(workload, inputs)
    for buf, value in zip(workload.outputs, got):
        if not np.array_equal(np.asarray(value).reshape(-1), want[buf]):
            return f"buffer {buf} differs from the numpy reference"
    if len(got) != len(workload.outputs):
        return f"{len(got)} outputs, expected {len(workload.outputs)}"
    return None


def _row_header(row: Row) -> dict[str, Any]:
    workload = row.workload
    return {
        "workload": workload.name,
        "items": len(workload.steps),
        "copies": workload.copies,
        "devices": workload.devices,
        "elems": workload.elems,
        "unit": "us/item" if row.per == "item" else "ms/run",
        "warmup": row.warmup,
        "runs": row.runs,
        "peers": {},
    }


async def run_group(
    rows: Sequence[Row], peers: Sequence[str], log: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """Open every peer on every row of the group, warm each up, then time them in turns.

    Rows of one group share their turns (heavy on 1 device and on 2), so a ratio between
    them compares runs made under the same load.
    """
    inputs = {row.key: row.workload.host_inputs() for row in rows}
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    async with AsyncExitStack() as stack:
        opened: dict[tuple[str, str], Peer] = {}
        for row in rows:
            for name in peers:
                try:
                    opened[row.key, name] = await OPEN[name](stack, row.workload, inputs[row.key])
                except Skip as skip:
                    entries[row.key, name] = {"skipped": str(skip)}
        for (key, name), peer in opened.items():
            warmup = next(r.warmup for r in rows if r.key == key)
            for _ in range(max(warmup, MIN_WARMUP.get(name, 0))):
                await peer.run()
        times: dict[tuple[str, str], list[float]] = {slot: [] for slot in opened}
        order = list(opened)
        for turn in range(max(row.runs for row in rows)):
            # Rotate who goes first; each runs once untimed to have its data warm again
            # after the others ran, then once timed.
            shift = turn % len(order)
            for slot in order[shift:] + order[:shift]:
                peer = opened[slot]
                await peer.run()
                start = time.perf_counter()
                await peer.run()
                times[slot].append(time.perf_counter() - start)
        for (key, name), peer in opened.items():
            row = next(r for r in rows if r.key == key)
            error = check_outputs(row.workload, inputs[key], await peer.outputs())
            median = statistics.median(times[key, name])
            scale = 1e6 / len(row.workload.steps) if row.per == "item" else 1e3
            entry: dict[str, Any] = {
                "median_s": median,
                "value": median * scale,
                "min_s": min(times[key, name]),
                "times_s": times[key, name],
                "note": peer.describe(),
                "correct": error is None,
            }
            if error is not None:
                entry["error"] = error
            entries[key, name] = entry
    results: dict[str, dict[str, Any]] = {}
    for row in rows:
        result = _row_header(row)
        log(f"{row.key}: {row.workload.name}")
        for name in peers:
            entry = entries[row.key, name]
            result["peers"][name] = entry
            if "skipped" in entry:
                log(f"  {name}: skipped: {entry['skipped']}")
                continue
            flag = "" if entry["correct"] else f"  WRONG: {entry['error']}"
            log(f"  {name}: {entry['value']:.3f} {result['unit']} ({entry['note']}){flag}")
        base = result["peers"].get("actorgraph", {}).get("value")
        for entry in result["peers"].values():
            if "value" in entry and base:
                entry["actorgraph_ahead"] = entry["value"] / base
        results[row.key] = result
    return results


async def run_rows(rows: Sequence[Row], peers: Sequence[str]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.group or row.key, []).append(row)
    for group in groups.values():
        results.update(await run_group(group, peers, lambda line: print(line, flush=True)))
    return results


def speedup_row(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    """Heavy kernels, 2 devices vs 1: the speedup each peer gets from the second device."""
    result: dict[str, Any] = {
        "workload": "heavy, 2 devices vs 1 (speedup: median of paired runs)",
        "unit": "x (higher is better)",
        "peers": {},
    }
    for peer, entry in one["peers"].items():
        other = two["peers"].get(peer, {})
        if "times_s" in entry and "times_s" in other:
            # Runs of the two rows alternate, so pair them up: each pair saw the same load.
            ratios = [a / b for a, b in zip(entry["times_s"], other["times_s"])]
            result["peers"][peer] = {
                "value": statistics.median(ratios),
                # On a shared machine some pairs ran without a free second core: the
                # best pairs show what the second device gives when it has one.
                "upper_quartile": float(np.percentile(ratios, 75)),
                "ratios": ratios,
            }
        else:
            result["peers"][peer] = {"skipped": entry.get("skipped") or other.get("skipped", "")}
    base = result["peers"].get("actorgraph", {}).get("value")
    for entry in result["peers"].values():
        if "value" in entry and base:
            entry["actorgraph_ahead"] = base / entry["value"]
    return result


def format_table(rows: dict[str, dict[str, Any]], peers: Sequence[str]) -> str:
    header = ["row", "unit", *peers]
    lines = [header]
    for key, row in rows.items():
        cells = [key, row["unit"].split(" ")[0]]
        for peer in peers:
            entry = row["peers"].get(peer, {})
            if "value" not in entry:
                cells.append("skipped")
            elif peer == "actorgraph":
                cells.append(f"{entry['value']:.3g}")
            else:
                wrong = "" if entry.get("correct", True) else " WRONG"
                cells.append(f"{entry['value']:.3g} ({entry['actorgraph_ahead']:.2f}x){wrong}")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def draw(rows: dict[str, dict[str, Any]], peers: Sequence[str], path: Path) -> str | None:
    """One panel per row, one bar per peer; returns why nothing was drawn, if so."""
    if importlib.util.find_spec("matplotlib") is None:
        return 'matplotlib is not installed (pip install -e ".[bench]"): no chart drawn'
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, len(rows))
    lines = -(-len(rows) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(3.6 * columns, 3.4 * lines), squeeze=False)
    colors = dict(zip(PEERS, ("tab:blue", "tab:orange", "tab:green", "tab:gray")))
    for ax in axes.flat[len(rows) :]:
        ax.set_visible(False)
    for ax, (key, row) in zip(axes.flat, rows.items()):
        shown = [p for p in peers if "value" in row["peers"].get(p, {})]
        values = [row["peers"][p]["value"] for p in shown]
        bars = ax.bar(shown, values, color=[colors.get(p, "tab:purple") for p in shown])
        for bar, peer in zip(bars, shown):
            ahead = row["peers"][peer].get("actorgraph_ahead")
            label = f"{bar.get_height():.3g}" + (
                f"\n{ahead:.2f}x" if peer != "actorgraph" and ahead else ""
            )
            ax.annotate(
                label,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        if row["unit"] == "us/item":
            # Per-item overheads span orders of magnitude between peers.
            ax.set_yscale("log")
        ax.set_title(key, fontsize=9)
        ax.set_ylabel(row["unit"], fontsize=8)
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.margins(y=0.25)
    fig.suptitle(
        "actorgraph and peers (label: value, and how many times actorgraph is ahead)", fontsize=9
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--peers", default=",".join(PEERS), help=f"comma-separated subset of {','.join(PEERS)}"
    )
    parser.add_argument(
        "--rows", default="", help="comma-separated subset of row names (default: all)"
    )
    parser.add_argument("--runs", type=int, default=None, help="timed runs per peer and row")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes: a smoke run, not a measurement (writes to results/quick/)",
    )
    parser.add_argument("--json", type=Path, default=None, help="default: results/peers.json")
    parser.add_argument("--png", type=Path, default=None, help="default: results/peers.png")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    results = RESULTS / "quick" if args.quick else RESULTS
    args.json = args.json or results / "peers.json"
    args.png = args.png or results / "peers.png"

    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [p for p in peers if p not in OPEN]
    if unknown:
        parser.error(f"unknown peers {unknown}; choose from {', '.join(PEERS)}")
    rows = rows_for(args.quick, args.runs, args.warmup)
    if args.rows:
        wanted = {r.strip() for r in args.rows.split(",")}
        missing = wanted - {r.key for r in rows}
        if missing:
            parser.error(
                f"unknown rows {sorted(missing)}; choose from {', '.join(r.key for r in rows)}"
            )
        rows = [r for r in rows if r.key in wanted]

    load_before = os.getloadavg()
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        print(
            f"note: load average {load_before[0]:.2f} on {os.cpu_count()} CPUs: other work is "
            f"running, so the heavy rows (which need a free core per device) will read low"
        )
    results = trio.run(run_rows, rows, peers)
    if "heavy_1dev" in results and "heavy_2dev" in results:
        results["heavy_speedup"] = speedup_row(results["heavy_1dev"], results["heavy_2dev"])

    print()
    print("median per row; in brackets how many times actorgraph is ahead (> 1: actorgraph wins)")
    print(format_table(results, peers))
    report = {
        "benchmark": "peers",
        "quick": args.quick,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "peers": peers,
        "rows": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    if not args.no_plot:
        why = draw(results, peers, args.png)
        print(why or f"wrote {args.png}")
    wrong = [
        f"{key}/{peer}"
        for key, row in results.items()
        for peer, entry in row["peers"].items()
        if entry.get("correct") is False
    ]
    if wrong:
        print(f"results differ from the numpy reference: {', '.join(wrong)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
