"""Quickstart without Jupyter: buffers, kernels, a graph on two CPU devices, and @ag.jit.

    python examples/quickstart.py

The same ground as 01_quickstart.ipynb, inside one `async with ag.open_runtime(...)` block.
"""

from __future__ import annotations

import numpy as np
import trio

import actorgraph as ag

xor = ag.Kernel("xor", cpu=lambda out, x, y: np.bitwise_xor(x, y, out=out), outs=(0,), ins=(1, 2))
n = ag.Var("n", 1, 8)


def head(out: np.ndarray, x: np.ndarray, n: int) -> None:
    out[:] = 0
    out[:n] = x[:n] * 10


head_k = ag.Kernel("head", cpu=head, outs=(0,), ins=(1,))


async def main() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        # Buffers, and data in and out of them.
        a, b, c = (rt.alloc("CPU:0", 8, np.int32) for _ in range(3))
        d = rt.alloc("CPU:1", 8, np.int32)
        await rt.copyin(a, np.arange(8, dtype=np.int32))
        await rt.copyin(b, np.full(8, 5, dtype=np.int32))

        # Items, run eagerly: the reference semantics.
        items = [ag.Launch(xor, [c, a, b]), ag.Copy(dst=d, src=c)]
        await rt.run(items)
        print("eager:", await rt.copyout(d))

        # A graph: planned once, one column per queue actor, replayed with new inputs.
        graph = await rt.compile(items, inputs=[a, b])
        print(graph.plan)
        a2 = rt.alloc("CPU:0", 8, np.int32)
        await rt.copyin(a2, np.full(8, 3, dtype=np.int32))
        await graph([a2, b])
        print("replay with a2:", await rt.copyout(d))

        # Capture: call 1 eager, call 2 captures, calls 3+ replay.
        out = rt.alloc("CPU:1", 8, np.int32)

        @ag.jit
        async def step(rt: ag.Runtime, x: ag.Buffer, y: ag.Buffer) -> ag.Buffer:
            tmp = rt.alloc("CPU:0", 8, np.int32)
            await rt.launch(xor, [tmp, x, y])
            await rt.copy(out, tmp)
            return out

        for i in range(4):
            x = rt.alloc("CPU:0", 8, np.int32)
            await rt.copyin(x, np.full(8, i, dtype=np.int32))
            print(f"step call {i}:", await rt.copyout(await step(rt, x, b)))
        print(step.statistics())

        # Symbolic sizes: launch dims from Var expressions, values per call.
        @ag.jit
        async def take(rt: ag.Runtime, x: ag.Buffer, out: ag.Buffer) -> None:
            await rt.launch(head_k, [out, x], vars=[n], global_size=ag.cdiv(n, 4))

        for count in (2, 5, 8, 3):
            await take(rt, a, c, var_vals={n: count})
            print(f"take n={count}:", await rt.copyout(c))


if __name__ == "__main__":
    trio.run(main)
