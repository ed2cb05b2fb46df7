"""`actorgraph demo`: a multi-device graph on CPU devices, its plan, and a check against eager."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import trio

from ._kernel import Copy, Kernel, Launch
from ._progress import progress
from ._runtime import open_runtime


def _xor(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    np.bitwise_xor(a, b, out=out)


def _add(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    np.add(a, b, out=out)


XOR = Kernel("xor", cpu=_xor, outs=(0,), ins=(1, 2))
ADD = Kernel("add", cpu=_add, outs=(0,), ins=(1, 2))


async def run_demo(
    devices: Sequence[str],
    size: int = 4096,
    replays: int = 10,
    *,
    trace: str | None = None,
    plot: str | None = None,
) -> bool:
    """Build a two-stage graph over `devices`, print its plan, replay it, compare with eager.

    With `trace` / `plot`, the replays are profiled and written as a Chrome trace / a
    timeline picture.
    """
    rng = np.random.default_rng(0)
    profiled = trace is not None or plot is not None
    async with open_runtime(list(devices), profile=profiled) as rt:
        first, last = devices[0], devices[-1]
        a = rt.alloc(first, size, np.int32)
        b = rt.alloc(first, size, np.int32)
        mids = [rt.alloc(d, size, np.int32) for d in devices]
        moved = [rt.alloc(last, size, np.int32) for _ in devices]
        out = rt.alloc(last, size, np.int32)
        items: list[Launch | Copy] = []
        for i, dev in enumerate(devices):
            # Each device gets a's and b's data, mixes them, and ships the result to `last`.
            local_a = a if dev == first else rt.alloc(dev, size, np.int32)
            local_b = b if dev == first else rt.alloc(dev, size, np.int32)
            if dev != first:
                items += [Copy(dst=local_a, src=a), Copy(dst=local_b, src=b)]
            items.append(Launch(XOR if i % 2 == 0 else ADD, [mids[i], local_a, local_b]))
            items.append(Copy(dst=moved[i], src=mids[i]) if dev != last else Launch(XOR, [moved[i], mids[i], mids[i]]))
        acc = moved[0]
        for m in moved[1:]:
            items.append(Launch(ADD, [out, acc, m]))
            acc = out
        graph = await rt.compile(items, inputs=[a, b], verify=True)
        print(f"plan for {len(items)} items on {', '.join(devices)}:\n")
        print(graph.plan)
        print()
        ok = True
        for replay in progress(range(replays), desc="replays"):
            a_host = rng.integers(0, 1 << 20, size, dtype=np.int32)
            b_host = rng.integers(0, 1 << 20, size, dtype=np.int32)
            await rt.copyin(a, a_host)
            await rt.copyin(b, b_host)
            await graph([a, b])
            got = await rt.copyout(acc)
            await rt.run(items)
            want = await rt.copyout(acc)
            if not np.array_equal(got, want):
                ok = False
                print(f"replay {replay}: MISMATCH against eager")
        await graph.aclose()
        print(f"{replays} replays checked against eager: {'OK' if ok else 'FAILED'}")
        if profiled:
            profile = rt.profile()
            print(profile.summary())
            if trace is not None:
                profile.to_chrome_trace(trace)
                print(f"trace written to {trace} (open it in Perfetto or chrome://tracing)")
            if plot is not None:
                from ._plot import plot_timeline

                plot_timeline(profile, plot, title=f"demo: {replays} replays")
                print(f"timeline written to {plot}")
        return ok


def main(
    devices: Sequence[str], replays: int, trace: str | None = None, plot: str | None = None
) -> int:
    ok = trio.run(lambda: run_demo(list(devices), 4096, replays, trace=trace, plot=plot))
    return 0 if ok else 1
