"""Copies whose source and destination overlap move memory like memmove, on every device kind.

An exact self-copy (the same bytes, through the same or another view) changes nothing; a
shifted overlap copies as if through a temporary. Each case runs eagerly and as a compiled
graph, and is checked against numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio

import actorgraph as ag
from actorgraph.testing import Worker, open_test_runtime

GUARD = 30  # seconds: a hang guard only

# (dst offset, src offset, elements): shifted both ways, by one and by most, and exact.
CASES = [(4, 0, 16), (0, 4, 16), (1, 0, 31), (0, 1, 31), (0, 0, 32), (8, 8, 8)]


def reference(memory: np.ndarray[Any, Any], dst: int, src: int, count: int) -> None:
    memory[dst : dst + count] = memory[src : src + count].copy()


async def check_overlapping_copies(rt: ag.Runtime, device: str) -> None:
    base = rt.alloc(device, 32, np.int32)
    start = (np.arange(32, dtype=np.int32) + 1) * 7
    for dst, src, count in CASES:
        await rt.copyin(base, start)
        expected = start.copy()
        reference(expected, dst, src, count)
        # Distinct view objects, even for the same bytes.
        await rt.run([ag.Copy(dst=base.view(dst, count), src=base.view(src, count))])
        got = await rt.copyout(base)
        np.testing.assert_array_equal(got, expected, err_msg=f"eager {(dst, src, count)}")
    # One graph of every case, after one another, replayed twice.
    items = [ag.Copy(dst=base.view(d, n), src=base.view(s, n)) for d, s, n in CASES]
    items.append(ag.Copy(dst=base, src=base))
    graph = await rt.compile(items, verify=True)
    await rt.copyin(base, start)
    expected = start.copy()
    for _ in range(2):
        for dst, src, count in CASES:
            reference(expected, dst, src, count)
        await graph()
    np.testing.assert_array_equal(await rt.copyout(base), expected, err_msg="graph")


@pytest.mark.parametrize("kind", ["CPU", "CUDA"])
async def test_overlapping_copies(kind: str) -> None:
    with trio.fail_after(GUARD):
        async with open_test_runtime(kind, 1) as rt:
            await check_overlapping_copies(rt, rt.devices[0])


async def test_overlapping_copies_sim(autojump_clock: object) -> None:
    with trio.fail_after(GUARD):
        async with open_test_runtime("SIM", 1) as rt:
            await check_overlapping_copies(rt, rt.devices[0])


async def test_overlapping_copies_remote(ag_worker: Worker) -> None:
    with trio.fail_after(GUARD):
        async with open_test_runtime("REMOTE", 1, worker=ag_worker) as rt:
            await check_overlapping_copies(rt, rt.devices[0])


async def test_an_exact_self_copy_is_allowed_and_a_size_mismatch_is_not() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        a = rt.alloc("CPU:0", 8, np.int32)
        await rt.copyin(a, np.arange(8, dtype=np.int32))
        await rt.run([ag.Copy(dst=a, src=a)])
        np.testing.assert_array_equal(await rt.copyout(a), np.arange(8, dtype=np.int32))
        with pytest.raises(
            ag.UsageError, match="Copy needs dst and src of the same dtype and size"
        ):
            ag.Copy(dst=a.view(0, 4), src=a.view(2, 5))


async def test_host_copies_of_one_size_share_a_program_and_each_moves_its_own_buffer() -> None:
    # A host copy's program is planned once per device, direction and size, and kept (a
    # bounded number of them): the next copy of that size reuses it with its own buffer.
    async with open_test_runtime("CPU", 2) as rt:
        bufs = [rt.alloc(f"CPU:{k % 2}", 8, np.int32) for k in range(6)]
        for k, buf in enumerate(bufs):
            await rt.copyin(buf, np.full(8, k, np.int32))
        for k, buf in enumerate(bufs):
            np.testing.assert_array_equal(await rt.copyout(buf), np.full(8, k))
        kept = rt._eager._host_programs
        assert sorted(kept) == [(f"CPU:{d}", w, 32) for d in (0, 1) for w in (False, True)]
        for size in range(1, 100):  # more sizes than it keeps: the oldest go
            buf = rt.alloc("CPU:0", size, np.int8)
            await rt.copyin(buf, np.arange(size, dtype=np.int8))
            np.testing.assert_array_equal(await rt.copyout(buf), np.arange(size, dtype=np.int8))
            rt.free(buf)
        assert len(kept) == 64
        assert ("CPU:0", False, 99) in kept and ("CPU:1", True, 32) not in kept


@pytest.mark.parametrize("kind", ["CPU", "CUDA", "REMOTE"])
async def test_a_copy_out_lands_in_the_array_given_and_refuses_one_that_cannot_hold_it(
    kind: str, ag_worker: Worker
) -> None:
    """`copyout(buf, out=array)` and `submit_copyout(buf, out=array)` fill that array, on
    every kind of device; an array of another shape or dtype, not C-contiguous, or
    read-only is refused with the rule, and the buffer is read as before."""
    with trio.fail_after(GUARD):
        async with open_test_runtime(kind, 1, worker=ag_worker) as rt:
            buf = rt.alloc(rt.devices[0], (3, 5), np.float32)
            data = np.arange(15, dtype=np.float32).reshape(3, 5)
            await rt.copyin(buf, data)
            out = np.full((3, 5), -1, np.float32)
            assert await rt.copyout(buf, out=out) is out
            np.testing.assert_array_equal(out, data)
            again = np.zeros((3, 5), np.float32)
            copy = await rt.submit_copyout(buf, out=again)
            await copy.wait()
            assert copy.array is again
            np.testing.assert_array_equal(again, data)
            read_only = np.zeros((3, 5), np.float32)
            read_only.flags.writeable = False
            refused = [
                (np.zeros(15, np.float32), r"shape \(15,\).*holds float32 of shape \(3, 5\)"),
                (np.zeros((3, 5), np.float64), r"a float64 array .*np.empty\(buf.shape"),
                (np.zeros((5, 3), np.float32).T, "not C-contiguous"),
                (read_only, "read-only"),
                ([0.0] * 15, "out= takes a numpy array, got a list"),
            ]
            for bad, message in refused:
                with pytest.raises(ag.UsageError, match=message):
                    await rt.copyout(buf, out=bad)  # type: ignore[arg-type]
            np.testing.assert_array_equal(await rt.copyout(buf), data)
