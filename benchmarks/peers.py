"""actorgraph side by side with what users would pick instead, in one run on one machine.

    pip install -e ".[bench]"           # dask, matplotlib, tinygrad 0.11.0
    apt-get install clang               # tinygrad's CPU devices compile kernels with clang
    python benchmarks/peers.py          # table on stdout, benchmarks/results/peers.{json,png}

Peers, each given the same workloads (benchmarks/_workloads.py):
- actorgraph on CPU devices: one compiled graph, `await graph(inputs)` per run;
- tinygrad 0.11.0 on its CPU devices: the same xor kernels and copies written as tensors,
  realized one kernel at a time inside a TinyJit, so replays go through its HCQGraph
  (the runners it used are printed); skipped, with a message, without clang or tinygrad;
- Dask's threaded scheduler on the same DAG of numpy calls, one worker per device;
- plain sequential numpy calls: the floor for per-item overhead.

Every peer warms up, runs several times, and is checked against a numpy reference.
Ratios read "how many times actorgraph is ahead": above 1 actorgraph wins that row.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

if __package__ in (None, ""):
    # Run as a script: make the checkout's packages importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _workloads as wl  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = ("actorgraph", "tinygrad", "dask", "numpy")


class Skip(Exception):
    """A peer cannot run here; the message says why and how to fix it."""


@attrs.frozen
class Measurement:
    times: tuple[float, ...]
    outputs: tuple[np.ndarray[Any, Any], ...]
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.times)


@attrs.frozen
class Row:
    """One workload; `per` says how a median is shown: per item (us) or per run (ms)."""

    key: str
    workload: wl.Workload
    per: str
    warmup: int
    runs: int


# -- peers --


def measure_actorgraph(workload: wl.Workload, inputs: Sequence[Any], warmup: int, runs: int) -> Measurement:
    import trio

    import actorgraph as ag

    async def main() -> Measurement:
        async with ag.open_runtime(wl.cpu_devices(workload.devices)) as rt:
            build = wl.build_actorgraph(rt, workload)
            for buf, data in zip(build.inputs, inputs):
                await rt.copyin(buf, data)
            graph = await rt.compile(build.items, inputs=build.inputs)
            for _ in range(warmup):
                await graph(build.inputs)
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                await graph(build.inputs)
                times.append(time.perf_counter() - start)
            outputs = [await rt.copyout(build.buffers[o]) for o in workload.outputs]
            stats = graph.statistics()
            await graph.aclose()
        return Measurement(tuple(times), tuple(outputs), f"{stats.queues} queue actors")

    return trio.run(main)


def _numpy_buffers(workload: wl.Workload, inputs: Sequence[Any]) -> list[np.ndarray[Any, Any]]:
    arrays = [np.zeros(workload.elems, np.int32) for _ in workload.buffer_devices]
    for buf, data in zip(workload.inputs, inputs):
        arrays[buf][:] = data
    return arrays


def measure_numpy(workload: wl.Workload, inputs: Sequence[Any], warmup: int, runs: int) -> Measurement:
    arrays = _numpy_buffers(workload, inputs)
    calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
    for step in workload.steps:
        if isinstance(step, wl.Xor):
            out = arrays[step.out]
            calls.append((functools.partial(np.bitwise_xor, out=out), (arrays[step.a], arrays[step.b])))
        else:
            calls.append((np.copyto, (arrays[step.out], arrays[step.src])))

    def run() -> None:
        for fn, args in calls:
            fn(*args)

    times = _timed(run, warmup, runs)
    return Measurement(times, tuple(arrays[o].copy() for o in workload.outputs), "one thread")


def _xor_task(out: np.ndarray[Any, Any], a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> Any:
    return np.bitwise_xor(a, b, out=out)


def _copy_task(out: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> Any:
    np.copyto(out, src)
    return out


def measure_dask(workload: wl.Workload, inputs: Sequence[Any], warmup: int, runs: int) -> Measurement:
    if importlib.util.find_spec("dask") is None:
        raise Skip('dask is not installed: pip install -e ".[bench]"')
    import dask
    import dask.threaded

    arrays = _numpy_buffers(workload, inputs)
    graph: dict[str, Any] = {f"b{buf}": arrays[buf] for buf in workload.inputs}
    for step in workload.steps:
        out = arrays[step.out]
        if isinstance(step, wl.Xor):
            graph[f"b{step.out}"] = (functools.partial(_xor_task, out), f"b{step.a}", f"b{step.b}")
        else:
            graph[f"b{step.out}"] = (functools.partial(_copy_task, out), f"b{step.src}")
    keys = [f"b{o}" for o in workload.outputs]
    workers = workload.devices

    def run() -> None:
        dask.threaded.get(graph, keys, num_workers=workers)

    times = _timed(run, warmup, runs)
    return Measurement(
        times,
        tuple(arrays[o].copy() for o in workload.outputs),
        f"dask {dask.__version__}, threaded, {workers} worker(s)",
    )


TINYGRAD_VERSION = "0.11.0"


def _tinygrad_device(index: int) -> str:
    return "CPU" if index == 0 else f"CPU:{index}"


def describe_runners(jit_cache: Sequence[Any]) -> str:
    """What tinygrad replays: graph runners with their batch sizes, then loose items."""
    batches: dict[str, list[int]] = {}
    loose: Counter[str] = Counter()
    for item in jit_cache:
        runner = item.prg
        name = type(runner).__name__
        inner = getattr(runner, "jit_cache", None)
        if inner is not None and name.endswith("Graph"):
            batches.setdefault(name, []).append(len(inner))
        else:
            loose[name] += 1
    parts = [
        f"{name} x{len(sizes)} (batches of {'+'.join(map(str, sizes))} items)"
        for name, sizes in batches.items()
    ]
    parts += [f"{name} x{count} ungraphed" for name, count in loose.items()]
    return "; ".join(parts) or "nothing captured"


def measure_tinygrad(workload: wl.Workload, inputs: Sequence[Any], warmup: int, runs: int) -> Measurement:
    compiler = os.environ.get("CC", "clang")
    if shutil.which(compiler) is None:
        raise Skip(
            f"tinygrad's CPU devices compile kernels with {compiler!r}, which is not on PATH: "
            f"install it (Debian/Ubuntu: apt-get install clang)"
        )
    if importlib.util.find_spec("tinygrad") is None:
        raise Skip(f'tinygrad is not installed: pip install -e ".[bench]" (tinygrad=={TINYGRAD_VERSION})')
    import tinygrad
    from tinygrad import Device, Tensor, TinyJit

    version = getattr(tinygrad, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("tinygrad")
    names = [_tinygrad_device(d) for d in range(workload.devices)]
    placed = [
        Tensor(np.asarray(data), device=names[workload.buffer_devices[buf]]).realize()
        for buf, data in zip(workload.inputs, inputs)
    ]
    steps, sinks, input_ids = workload.steps, workload.outputs, workload.inputs

    def body(*tensors: Any) -> tuple[Any, ...]:
        # One realize per item: each xor is its own kernel and each move its own copy,
        # as in the other peers' jit caches.
        values = dict(zip(input_ids, tensors))
        for step in steps:
            if isinstance(step, wl.Xor):
                values[step.out] = (values[step.a] ^ values[step.b]).realize()
            else:
                values[step.out] = values[step.src].to(names[step.device]).realize()
        return tuple(values[o] for o in sinks)

    jit = TinyJit(body)
    devices = [Device[name] for name in names]
    result: tuple[Any, ...] = ()

    def run() -> None:
        nonlocal result
        result = jit(*placed)
        for device in devices:
            device.synchronize()

    # TinyJit runs plainly on call 1, captures on call 2 and builds its graphs on call 3.
    times = _timed(run, max(warmup, 3), runs)
    runners = describe_runners(jit.jit_cache)
    outputs = tuple(t.numpy() for t in result)
    return Measurement(times, outputs, f"tinygrad {version}: {runners}")


MEASURE: dict[str, Callable[[wl.Workload, Sequence[Any], int, int], Measurement]] = {
    "actorgraph": measure_actorgraph,
    "tinygrad": measure_tinygrad,
    "dask": measure_dask,
    "numpy": measure_numpy,
}


def _timed(run: Callable[[], None], warmup: int, runs: int) -> tuple[float, ...]:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return tuple(times)


# -- the run --


def rows_for(quick: bool, runs: int | None, warmup: int | None) -> list[Row]:
    """The workloads; `quick` shrinks every size so a smoke run takes well under a second."""
    if quick:
        tiny, heavy_elems, n_tiny, n_copies, n_dag, n_heavy = 64, 1 << 12, 16, 32, 40, 4
    else:
        tiny, heavy_elems, n_tiny, n_copies, n_dag, n_heavy = (
            wl.TINY_ELEMS, wl.HEAVY_ELEMS, 256, 1024, 1000, 16
        )
    small_runs = runs or (3 if quick else 30)
    big_runs = runs or (3 if quick else 9)
    small_warm = warmup if warmup is not None else (1 if quick else 5)
    big_warm = warmup if warmup is not None else (1 if quick else 3)
    return [
        Row("tiny_1dev", wl.tiny_chain(n_tiny, tiny), "item", small_warm, small_runs),
        Row("copies_2dev", wl.two_device_copies(n_copies, 8, tiny), "item", small_warm, small_runs),
        Row("heavy_1dev", wl.heavy(1, n_heavy, heavy_elems), "run", big_warm, big_runs),
        Row("heavy_2dev", wl.heavy(2, n_heavy, heavy_elems), "run", big_warm, big_runs),
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


def run_row(row: Row, peers: Sequence[str], log: Callable[[str], None]) -> dict[str, Any]:
    inputs = row.workload.host_inputs()
    scale = 1e6 / len(row.workload.steps) if row.per == "item" else 1e3
    result: dict[str, Any] = {
        "workload": row.workload.name,
        "items": len(row.workload.steps),
        "copies": row.workload.copies,
        "devices": row.workload.devices,
        "elems": row.workload.elems,
        "unit": "us/item" if row.per == "item" else "ms/run",
        "warmup": row.warmup,
        "runs": row.runs,
        "peers": {},
    }
    for peer in peers:
        try:
            m = MEASURE[peer](row.workload, inputs, row.warmup, row.runs)
        except Skip as skip:
            log(f"  {peer}: skipped: {skip}")
            result["peers"][peer] = {"skipped": str(skip)}
            continue
        error = check_outputs(row.workload, inputs, m.outputs)
        entry = {
            "median_s": m.median,
            "value": m.median * scale,
            "times_s": list(m.times),
            "note": m.note,
            "correct": error is None,
        }
        if error is not None:
            entry["error"] = error
        result["peers"][peer] = entry
        flag = "" if error is None else f"  WRONG: {error}"
        log(f"  {peer}: {entry['value']:.3f} {result['unit']} ({m.note}){flag}")
    base = result["peers"].get("actorgraph", {}).get("value")
    for entry in result["peers"].values():
        if "value" in entry and base:
            entry["actorgraph_ahead"] = entry["value"] / base
    return result


def speedup_row(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    """Heavy kernels, 2 devices vs 1: the speedup each peer gets from the second device."""
    result: dict[str, Any] = {
        "workload": "heavy, 2 devices vs 1 (speedup)",
        "unit": "x (higher is better)",
        "peers": {},
    }
    for peer, entry in one["peers"].items():
        other = two["peers"].get(peer, {})
        if "median_s" in entry and "median_s" in other:
            result["peers"][peer] = {"value": entry["median_s"] / other["median_s"]}
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

    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 3.6), squeeze=False)
    colors = dict(zip(PEERS, ("tab:blue", "tab:orange", "tab:green", "tab:gray")))
    for ax, (key, row) in zip(axes[0], rows.items()):
        shown = [p for p in peers if "value" in row["peers"].get(p, {})]
        values = [row["peers"][p]["value"] for p in shown]
        bars = ax.bar(shown, values, color=[colors.get(p, "tab:purple") for p in shown])
        for bar, peer in zip(bars, shown):
            ahead = row["peers"][peer].get("actorgraph_ahead")
            label = f"{bar.get_height():.3g}" + (f"\n{ahead:.2f}x" if peer != "actorgraph" and ahead else "")
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
        ax.set_title(key, fontsize=9)
        ax.set_ylabel(row["unit"], fontsize=8)
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.margins(y=0.25)
    fig.suptitle("actorgraph and peers (label: value, and how many times actorgraph is ahead)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated subset of {','.join(PEERS)}")
    parser.add_argument("--rows", default="", help="comma-separated subset of row names (default: all)")
    parser.add_argument("--runs", type=int, default=None, help="timed runs per peer and row")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, not a measurement")
    parser.add_argument("--json", type=Path, default=RESULTS / "peers.json")
    parser.add_argument("--png", type=Path, default=RESULTS / "peers.png")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)

    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [p for p in peers if p not in MEASURE]
    if unknown:
        parser.error(f"unknown peers {unknown}; choose from {', '.join(PEERS)}")
    rows = rows_for(args.quick, args.runs, args.warmup)
    if args.rows:
        wanted = {r.strip() for r in args.rows.split(",")}
        missing = wanted - {r.key for r in rows}
        if missing:
            parser.error(f"unknown rows {sorted(missing)}; choose from {', '.join(r.key for r in rows)}")
        rows = [r for r in rows if r.key in wanted]

    results: dict[str, dict[str, Any]] = {}
    for row in rows:
        print(f"{row.key}: {row.workload.name}", flush=True)
        results[row.key] = run_row(row, peers, lambda line: print(line, flush=True))
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
        f"{key}/{peer}" for key, row in results.items()
        for peer, entry in row["peers"].items() if entry.get("correct") is False
    ]
    if wrong:
        print(f"results differ from the numpy reference: {', '.join(wrong)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
