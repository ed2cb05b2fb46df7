"""Runtime (actorgraph/_runtime.py): a graph equals the same items run eagerly; alloc."""

import weakref

import numpy as np

import actorgraph as ag

XOR = ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,), ins=(1, 2))


async def test_graph_matches_eager_across_two_devices(ag_cpu_runtime: ag.Runtime) -> None:
    rt = ag_cpu_runtime
    a, b, c = (rt.alloc("CPU:0", 64, np.int32) for _ in range(3))
    d = rt.alloc("CPU:1", 64, np.int32)
    await rt.copyin(a, np.arange(64, dtype=np.int32))
    await rt.copyin(b, np.full(64, 5, np.int32))
    graph = await rt.compile([ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c)], inputs=[a, b])
    graph.plan.verify()
    await graph([a, b])
    np.testing.assert_array_equal(await rt.copyout(d), np.arange(64, dtype=np.int32) ^ 5)


async def test_alloc_counts_elements_starts_zeroed_and_views_count_elements(
    autojump_clock: object,
) -> None:
    # What the runtime page (docs/in-depth/runtime.md) promises about sizes, zeroing and views.
    async with ag.open_runtime(["CPU:0", "SIM:0"]) as rt:
        for device in rt.devices:
            buf = rt.alloc(device, (4, 8), np.int16)
            assert (buf.size, buf.nbytes) == (32, 64)
            np.testing.assert_array_equal(await rt.copyout(buf), np.zeros((4, 8), np.int16))
        base = rt.alloc("CPU:0", 16, np.int32)
        await rt.copyin(base, np.arange(16, dtype=np.int32))
        view = base.view(4, 3)
        assert (view.size, view.nbytes) == (3, 12)
        np.testing.assert_array_equal(await rt.copyout(view), [4, 5, 6])
        np.testing.assert_array_equal(
            await rt.copyout(base.view(2, shape=(2, 2))), [[2, 3], [4, 5]]
        )


async def test_a_freed_buffer_holds_none_of_its_memory(ag_cpu_runtime: ag.Runtime) -> None:
    # A buffer whose host view was used (lowering a kernel caches it) lets go of its
    # memory when freed, though the Buffer object itself is still held.
    rt = ag_cpu_runtime
    buf = rt.alloc("CPU:0", 1 << 20, np.int32)
    buf.host_view()
    memory = weakref.ref(buf.memory)
    rt.free(buf)
    assert memory() is None


async def test_host_copies_not_waited_for_run_in_order_where_they_can_or_are_posted(
    ag_cpu_runtime: ag.Runtime,
) -> None:
    # On idle queues a host copy runs where it is submitted, done at once; behind a
    # replay still in flight (a profiled one goes to the actors) it is posted, and
    # runs after it.
    rt = ag_cpu_runtime
    a, b, c = (rt.alloc("CPU:0", 64, np.int32) for _ in range(3))
    first = await rt.submit_copyin(a, np.arange(64, dtype=np.int32))
    assert first.done and first.array is None
    await first.wait()
    await rt.copyin(b, np.full(64, 5, np.int32))
    graph = await rt.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, b])
    replay = await graph.submit([a, b], profile=True)
    out = await rt.submit_copyout(c)
    again = await rt.submit_copyin(a, np.zeros(64, np.int32))
    assert not out.done
    for step in (replay, out, again):
        await step.wait()
    assert out.array is not None
    np.testing.assert_array_equal(out.array, np.arange(64, dtype=np.int32) ^ 5)
    np.testing.assert_array_equal(await rt.copyout(a), np.zeros(64, np.int32))
