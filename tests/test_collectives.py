"""ag.all_reduce (actorgraph/_collectives.py): ring and tree all-reduce as Launch/Copy items,
equal to numpy, on one SIM node and on a 64-GPU SIM cluster (virtual time)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

import actorgraph as ag


def _values(count: int, size: int, dtype: Any, seed: int = 0, high: int = 1000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(size).astype(dtype) for _ in range(count)]
    return [rng.integers(-high, high, size).astype(dtype) for _ in range(count)]


async def _all_reduce(
    rt: ag.Runtime,
    names: list[str],
    values: list[np.ndarray],
    algorithm: str,
    op: str = "sum",
    replay: bool = True,
) -> list[np.ndarray]:
    bufs = [rt.alloc(name, v.shape, v.dtype) for name, v in zip(names, values)]
    for buf, v in zip(bufs, values):
        await rt.copyin(buf, v)
    items = ag.all_reduce(rt, bufs, algorithm=algorithm, op=op)
    if replay:
        graph = await rt.compile(items, verify=True)
        await graph()
    else:
        await rt.run(items)
    return [await rt.copyout(buf) for buf in bufs]


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
@pytest.mark.parametrize(
    ("preset", "count"), [("nvlink8", 8), ("nvlink8x8", 64)], ids=["8 GPUs", "64 GPUs"]
)
async def test_all_reduce_equals_numpy(
    autojump_clock: trio.testing.MockClock, algorithm: str, preset: str, count: int
) -> None:
    names = [f"SIM:{i}" for i in range(count)]
    async with ag.open_runtime(names, sim_preset=preset) as rt:
        ints = _values(count, 1000, np.int64)  # 1000 elements: chunks of unequal sizes
        for got in await _all_reduce(rt, names, ints, algorithm):
            np.testing.assert_array_equal(got, np.sum(ints, axis=0))
        floats = _values(count, 4096, np.float32, seed=1)
        want = np.sum(np.stack(floats).astype(np.float64), axis=0)
        for got in await _all_reduce(rt, names, floats, algorithm, replay=False):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
async def test_every_op_on_a_mixed_set_of_devices(
    autojump_clock: trio.testing.MockClock, algorithm: str, op: str
) -> None:
    # Five participants (not a power of two), on CPU and SIM devices, 2-D buffers of 3 x 2:
    # fewer elements than participants in a chunk, and some empty chunks.
    names = ["SIM:0", "CPU:0", "SIM:1", "SIM:2", "CPU:1"]
    async with ag.open_runtime(names) as rt:
        values = [v.reshape(3, 2) for v in _values(5, 6, np.int32, seed=2, high=50)]
        reduce = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
        want = reduce(values, axis=0).astype(np.int32)  # |50**5| fits
        for got in await _all_reduce(rt, names, values, algorithm, op):
            np.testing.assert_array_equal(got, want)


async def test_ring_moves_two_n_minus_one_chunks_per_device(
    autojump_clock: trio.testing.MockClock,
) -> None:
    names = [f"SIM:{i}" for i in range(8)]
    async with ag.open_runtime(names) as rt:
        bufs = [rt.alloc(name, 8 * 1024, np.float32) for name in names]
        items = ag.all_reduce(rt, bufs)
        copies = [item for item in items if isinstance(item, ag.Copy)]
        launches = [item for item in items if isinstance(item, ag.Launch)]
        assert len(copies) == 2 * 7 * 8 and len(launches) == 7 * 8
        assert {c.dst.nbytes for c in copies} == {4 * 1024}
        # Each copy goes to the next device in the list.
        assert all(names.index(c.dst.device) == (names.index(c.src.device) + 1) % 8 for c in copies)
        tree = ag.all_reduce(rt, bufs, algorithm="tree")
        assert sum(isinstance(item, ag.Copy) for item in tree) == 2 * 7
        assert ag.all_reduce(rt, bufs[:1]) == []


async def test_ring_on_a_cluster_meets_its_bound(autojump_clock: trio.testing.MockClock) -> None:
    names = [f"SIM:{i}" for i in range(16)]  # two nodes of nvlink8x8
    async with ag.open_runtime(names, sim_preset="nvlink8x8") as rt:
        bufs = [rt.alloc(name, 1 << 22, np.float32) for name in names]
        graph = await rt.compile(ag.all_reduce(rt, bufs))
        t0 = trio.current_time()
        await graph()
        span = trio.current_time() - t0
        bounds = ag.sim_bounds(graph)
        assert bounds.best <= span <= 1.10 * bounds.best


async def test_bad_all_reduce_arguments_are_refused() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        a, b = rt.alloc("CPU:0", 8, np.float32), rt.alloc("CPU:1", 8, np.float32)
        with pytest.raises(ag.UsageError, match=r"algorithm=...\) is 'ring' or 'tree', got 'star'"):
            ag.all_reduce(rt, [a, b], algorithm="star")
        with pytest.raises(
            ag.UsageError, match=r"op=...\) is one of \['max', 'min', 'prod', 'sum'\]"
        ):
            ag.all_reduce(rt, [a, b], op="mean")
        with pytest.raises(ag.UsageError, match=r"takes a list of Buffers, one per participant"):
            ag.all_reduce(rt, a)  # type: ignore[arg-type]
        with pytest.raises(ag.UsageError, match=r"got no buffers"):
            ag.all_reduce(rt, [])
        with pytest.raises(ag.UsageError, match=r"buffers\[1\] must be a Buffer, got"):
            ag.all_reduce(rt, [a, np.zeros(8)])  # type: ignore[list-item]
        c = rt.alloc("CPU:1", 4, np.float32)
        with pytest.raises(
            ag.UsageError, match=r"one dtype and size: buffers\[0\] is .* buffers\[1\] is"
        ):
            ag.all_reduce(rt, [a, c])
        with pytest.raises(ag.UsageError, match=r"buffers\[0\] and buffers\[1\] share memory"):
            ag.all_reduce(rt, [a.view(0, 4), a.view(2, 4)])
        rt.free(b)
        with pytest.raises(ag.BufferFreedError, match=r"all_reduce: buffers\[1\] .* was freed"):
            ag.all_reduce(rt, [a, b])
