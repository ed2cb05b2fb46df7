"""`actorgraph demo`: a multi-device graph on any device kind, its plan, and a check against eager."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import trio

from ._buffer import Buffer
from ._graph import Graph
from ._kernel import Copy, Kernel, Launch
from ._options import remote_options
from ._progress import progress
from ._runtime import Runtime, open_runtime
from ._vars import Var, cdiv


def _xor(out: np.ndarray, a: np.ndarray, b: np.ndarray, n: int) -> None:
    np.bitwise_xor(a[:n], b[:n], out=out[:n])


def _add(out: np.ndarray, a: np.ndarray, b: np.ndarray, n: int) -> None:
    np.add(a[:n], b[:n], out=out[:n])


_CUDA = r"""
extern "C" __global__ void NAME(int *out, const int *a, const int *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] OP b[i];
}
"""

# Every device kind the demo accepts can run these: CPU and SIM run the CPU body, CUDA
# compiles the source (the fake driver runs the CPU body), and every worker knows them by
# name (its registry always holds the demo's KERNELS), so remote devices run them too.
XOR = Kernel(
    "demo_xor",
    cpu=_xor,
    cuda=_CUDA.replace("NAME", "demo_xor").replace("OP", "^"),
    outs=(0,),
    ins=(1, 2),
)
ADD = Kernel(
    "demo_add",
    cpu=_add,
    cuda=_CUDA.replace("NAME", "demo_add").replace("OP", "+"),
    outs=(0,),
    ins=(1, 2),
)


def _xor_whole(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    np.bitwise_xor(a, b, out=out)


# The kernel of `actorgraph bench`'s built-in benchmark: no vars, so a replay costs what
# actorgraph adds. It is here so that every worker knows it too (`bench --device`).
BENCH_XOR = Kernel("bench_xor", cpu=_xor_whole, outs=(0,), ins=(1, 2))
KERNELS = [XOR, ADD, BENCH_XOR]
N = Var("n", 1, 1 << 30)
BLOCK = 256


def _launch(kernel: Kernel, bufs: list[Buffer]) -> Launch:
    n = bufs[0].size
    return Launch(
        kernel, bufs, vars=[N], fixedvars={N: n}, global_size=cdiv(n, BLOCK), local_size=BLOCK
    )


async def run_demo(
    devices: Sequence[str],
    size: int = 4096,
    replays: int = 10,
    *,
    trace: str | None = None,
    plot: str | None = None,
    token_file: str | None = None,
    tls_ca: str | None = None,
) -> bool:
    """Build a two-stage graph over `devices`, print its plan, replay it, compare with eager.

    With `trace` / `plot`, the replays are profiled and written as a Chrome trace / a
    timeline picture. `token_file`: the workers' token, for remote devices (else
    open_runtime's default, ACTORGRAPH_TOKEN_FILE); `tls_ca`: the CA of TLS workers'
    certificates (else ACTORGRAPH_TLS_CA).
    """
    profiled = trace is not None or plot is not None
    remote = remote_options(token_file, tls_ca)
    async with open_runtime(list(devices), profile=profiled, **remote) as rt:
        items, a, b, acc = _demo_items(rt, devices, size)
        graph = await rt.compile(items, inputs=[a, b], verify=True)
        print(f"plan for {len(items)} items on {', '.join(devices)}:\n")
        print(graph.plan)
        print()
        ok = await _replays_match_eager(rt, graph, items, (a, b, acc), replays)
        print(f"{replays} replays checked against eager: {'OK' if ok else 'FAILED'}")
        if profiled:
            await _write_profile(rt, graph, [a, b], trace, plot)
        await graph.aclose()
        return ok


def _demo_items(
    rt: Runtime, devices: Sequence[str], size: int
) -> tuple[list[Launch | Copy], Buffer, Buffer, Buffer]:
    """The demo's items over `devices`: each device gets a's and b's data, mixes them,
    and ships the result to the last, which adds them all up; and a, b and the sum."""
    first, last = devices[0], devices[-1]
    a = rt.alloc(first, size, np.int32)
    b = rt.alloc(first, size, np.int32)
    mids = [rt.alloc(d, size, np.int32) for d in devices]
    moved = [rt.alloc(last, size, np.int32) for _ in devices]
    out = rt.alloc(last, size, np.int32)
    items: list[Launch | Copy] = []
    for i, dev in enumerate(devices):
        local_a = a if dev == first else rt.alloc(dev, size, np.int32)
        local_b = b if dev == first else rt.alloc(dev, size, np.int32)
        if dev != first:
            items += [Copy(dst=local_a, src=a), Copy(dst=local_b, src=b)]
        items.append(_launch(XOR if i % 2 == 0 else ADD, [mids[i], local_a, local_b]))
        items.append(
            Copy(dst=moved[i], src=mids[i])
            if dev != last
            else _launch(XOR, [moved[i], mids[i], mids[i]])
        )
    acc = moved[0]
    for m in moved[1:]:
        items.append(_launch(ADD, [out, acc, m]))
        acc = out
    return items, a, b, acc


async def _replays_match_eager(
    rt: Runtime,
    graph: Graph,
    items: Sequence[Launch | Copy],
    buffers: tuple[Buffer, Buffer, Buffer],
    replays: int,
) -> bool:
    """Replay `graph` on random a and b, `replays` times, each against the items run
    eagerly; whether every result matched (a mismatch is printed)."""
    a, b, acc = buffers
    rng = np.random.default_rng(0)
    ok = True
    for replay in progress(range(replays), desc="replays"):
        await rt.copyin(a, rng.integers(0, 1 << 20, a.size, dtype=np.int32))
        await rt.copyin(b, rng.integers(0, 1 << 20, b.size, dtype=np.int32))
        await graph([a, b])
        got = await rt.copyout(acc)
        await rt.run(items)
        want = await rt.copyout(acc)
        if not np.array_equal(got, want):
            ok = False
            print(f"replay {replay}: MISMATCH against eager")
    return ok


async def _write_profile(
    rt: Runtime, graph: Graph, inputs: list[Buffer], trace: str | None, plot: str | None
) -> None:
    """Print the profile's summary; write it as a Chrome trace to `trace`, and draw two
    replays submitted back to back to `plot`, where given."""
    profile = rt.profile()
    print(profile.summary())
    if trace is not None:
        profile.to_chrome_trace(trace)
        print(f"trace written to {trace} (open it in Perfetto or chrome://tracing)")
    if plot is not None:
        from ._plot import plot_timeline

        # The checked replays sit far apart (eager runs between them), so the
        # picture shows two more, submitted back to back, on an axis of their own.
        one = await graph.submit(inputs)
        two = await graph.submit(inputs)
        await two.wait()
        plot_timeline(
            rt.profile(),
            plot,
            replays=[one.number, two.number],
            title=f"demo: replays {one.number} and {two.number}, submitted back to back",
        )
        print(f"timeline of replays {one.number} and {two.number} written to {plot}")


def main(
    devices: Sequence[str],
    replays: int,
    trace: str | None = None,
    plot: str | None = None,
    token_file: str | None = None,
    tls_ca: str | None = None,
) -> int:
    ok = trio.run(
        lambda: run_demo(
            list(devices),
            4096,
            replays,
            trace=trace,
            plot=plot,
            token_file=token_file,
            tls_ca=tls_ca,
        )
    )
    return 0 if ok else 1
