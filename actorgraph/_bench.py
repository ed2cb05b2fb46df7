"""`actorgraph bench`: the core benchmarks of a checkout, or a small built-in replay benchmark.

The built-in one needs nothing but the installed package: a chain of tiny xor kernels on
one device (CPU:0, or `--device`, a worker's too), replayed as a Graph and as an @ag.jit
function, in microseconds per item and per call (the jit's extra cost is the per-call
check of its arguments).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import platform
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import trio

from ._demo import BENCH_XOR
from ._jit import jit
from ._kernel import Launch
from ._options import remote_options
from ._runtime import Runtime, open_runtime

XOR = BENCH_XOR  # every worker knows it, so a worker's device runs the benchmark too


def core_script() -> pathlib.Path | None:
    """benchmarks/core.py next to the package, when running from a checkout."""
    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "core.py"
    return path if path.is_file() else None


def run_core(path: pathlib.Path, argv: Sequence[str]) -> int:
    spec = importlib.util.spec_from_file_location("actorgraph_core_benchmarks", path)
    if spec is None or spec.loader is None:  # pragma: no cover - a file that is not Python
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.main(list(argv)))


async def _median_call_s(call: Any, calls: int, rounds: int = 5) -> float:
    for _ in range(3):
        await call()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            await call()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


async def builtin(
    items: int,
    replays: int,
    device: str = "CPU:0",
    token_file: str | None = None,
    tls_ca: str | None = None,
) -> dict[str, Any]:
    async with open_runtime([device], **remote_options(token_file, tls_ca)) as rt:
        a, b, c, d = (rt.alloc(device, 1024, np.int32) for _ in range(4))
        chain = [
            Launch(XOR, [c, a, b]) if i % 2 == 0 else Launch(XOR, [d, c, a]) for i in range(items)
        ]
        graph = await rt.compile(chain, inputs=[a])
        graph_s = await _median_call_s(lambda: graph([a]), replays)

        @jit
        async def step(rt: Runtime, x: Any) -> None:
            for i in range(items):
                await rt.launch(XOR, [c, x, b] if i % 2 == 0 else [d, c, x])

        jit_s = await _median_call_s(lambda: step(rt, a), replays)
        # New input objects on every call: the full argument check, no identity shortcut.
        spare = [rt.alloc(device, 1024, np.int32) for _ in range(2)]
        turn = [0]

        def alternate() -> Any:
            turn[0] ^= 1
            return step(rt, spare[turn[0]])

        jit_new_s = await _median_call_s(alternate, replays)
        graph_alt = await rt.compile(chain, inputs=[a])

        def alternate_graph() -> Any:
            turn[0] ^= 1
            return graph_alt([spare[turn[0]]])

        graph_new_s = await _median_call_s(alternate_graph, replays)
        eager_s = await _median_call_s(lambda: rt.run(chain), max(1, replays // 10), rounds=3)
    return {
        "device": device,
        "items": items,
        "graph_us_per_item": graph_s / items * 1e6,
        "graph_us_per_call": graph_s * 1e6,
        "jit_us_per_call": jit_s * 1e6,
        "jit_overhead_us_per_call": (jit_s - graph_s) * 1e6,
        "jit_new_inputs_us_per_call": jit_new_s * 1e6,
        "graph_new_inputs_us_per_call": graph_new_s * 1e6,
        "jit_new_inputs_overhead_us_per_call": (jit_new_s - graph_new_s) * 1e6,
        "eager_us_per_item": eager_s / items * 1e6,
    }


def main_builtin(
    items: int,
    replays: int,
    out: str | None,
    *,
    device: str = "CPU:0",
    token_file: str | None = None,
    tls_ca: str | None = None,
) -> int:
    results = trio.run(builtin, items, replays, device, token_file, tls_ca)
    print(f"built-in replay benchmark: {items} tiny xor kernels on {device}")
    print(
        f"  graph replay: {results['graph_us_per_item']:.2f} us/item "
        f"({results['graph_us_per_call']:.0f} us per replay; "
        f"{results['graph_new_inputs_us_per_call']:.0f} us with new inputs each replay)"
    )
    print(
        f"  @ag.jit call: {results['jit_us_per_call']:.0f} us per call "
        f"({results['jit_overhead_us_per_call']:+.1f} us over the graph; "
        f"{results['jit_new_inputs_overhead_us_per_call']:+.1f} us with new inputs each call)"
    )
    print(f"  eager rt.run: {results['eager_us_per_item']:.1f} us/item")
    if out:
        path = pathlib.Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        results.update(python=platform.python_version(), machine=platform.machine())
        path.write_text(json.dumps(results, indent=2))
        print(f"figures written as JSON to {path}")
    else:
        print("figures not written to a file: add --out PATH to write them as JSON")
    return 0
