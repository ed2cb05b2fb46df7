import numpy as np

import actorgraph as ag

XOR = ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,), ins=(1, 2))


async def test_graph_matches_eager_across_two_devices() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        a, b, c = (rt.alloc("CPU:0", 64, np.int32) for _ in range(3))
        d = rt.alloc("CPU:1", 64, np.int32)
        await rt.copyin(a, np.arange(64, dtype=np.int32))
        await rt.copyin(b, np.full(64, 5, np.int32))
        graph = await rt.compile([ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c)], inputs=[a, b])
        graph.plan.verify()
        await graph([a, b])
        np.testing.assert_array_equal(await rt.copyout(d), np.arange(64, dtype=np.int32) ^ 5)
