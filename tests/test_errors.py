"""Every bad input has a clear, early error: each test pins its type and its message."""

from __future__ import annotations

import gc
import re
import traceback
from collections.abc import AsyncIterator

import numpy as np
import pytest
import trio
from actorgraph.devices import DEVICE_KINDS

import actorgraph as ag
from actorgraph._window import Watch

I32 = np.int32
N = ag.Var("n", 1, 64)
K = ag.Var("k", 0, 9)


def _xor(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    np.bitwise_xor(a, b, out=out)


def _fill(out: np.ndarray, n: int) -> None:
    out[:n] = n


XOR = ag.Kernel("xor", cpu=_xor, outs=(0,), ins=(1, 2))
INC = ag.Kernel("inc", cpu=lambda x: np.add(x, 1, out=x), outs=(0,), ins=(0,))
FILL = ag.Kernel("fill", cpu=_fill, outs=(0,))
GPU_ONLY = ag.Kernel(
    "gpu_only", cuda='extern "C" __global__ void gpu_only(int* x) { x[0] = 1; }', outs=(0,)
)


def raises(error: type[BaseException], message: str) -> pytest.RaisesContext[BaseException]:
    """pytest.raises matching `message` literally."""
    return pytest.raises(error, match=re.escape(message))


@pytest.fixture
async def rt() -> AsyncIterator[ag.Runtime]:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        yield rt


def bufs(rt: ag.Runtime, count: int, device: str = "CPU:0", size: int = 64) -> list[ag.Buffer]:
    return [rt.alloc(device, size, I32) for _ in range(count)]


async def xor_graph(rt: ag.Runtime) -> tuple[ag.Graph, list[ag.Buffer]]:
    a, b, c = bufs(rt, 3)
    return await rt.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, b]), [a, b, c]


# -- graph inputs -----------------------------------------------------------------------------


async def test_wrong_input_count(rt: ag.Runtime) -> None:
    graph, (a, _, _) = await xor_graph(rt)
    with raises(
        ag.InputError,
        "graph was compiled with 2 inputs but was called with 1; pass one buffer per input",
    ):
        await graph([a])


async def test_wrong_input_shape(rt: ag.Runtime) -> None:
    graph, (a, _, _) = await xor_graph(rt)
    with raises(ag.InputError, "input 1 has shape (8, 8) but the graph was compiled for (64,)"):
        await graph([a, rt.alloc("CPU:0", (8, 8), I32)])


async def test_wrong_input_dtype(rt: ag.Runtime) -> None:
    graph, (a, _, _) = await xor_graph(rt)
    with raises(ag.InputError, "input 1 has dtype float32 but the graph was compiled for int32"):
        await graph([a, rt.alloc("CPU:0", 64, np.float32)])


async def test_dtypes_that_differ_only_in_byte_order_are_told_apart(rt: ag.Runtime) -> None:
    # A dtype's name says nothing of its byte order ('>i4' and '<i4' are both int32):
    # every message about a dtype mismatch says the byte order where it is not native.
    (a,) = bufs(rt, 1)
    big = rt.alloc("CPU:1", 64, ">i4")
    with raises(
        ag.UsageError,
        f"Copy needs dst and src of the same dtype and size: dst is <Buffer CPU:1 64 int32 "
        f"big-endian #{big.alloc_id}>, src is <Buffer CPU:0 64 int32 #{a.alloc_id}>",
    ):
        ag.Copy(dst=big, src=a)
    graph, _ = await xor_graph(rt)
    with raises(
        ag.InputError,
        "input 1 has dtype int32 big-endian but the graph was compiled for int32; pass a "
        "buffer of that dtype",
    ):
        await graph([a, rt.alloc("CPU:0", 64, ">i4")])
    with raises(
        ag.UsageError,
        f"copyin: array dtype int32 does not match {big!r}; convert with array.astype('>i4')",
    ):
        await rt.copyin(big, np.zeros(64, I32))

    @ag.jit
    async def step(x: ag.Buffer) -> None:
        await rt.launch(INC, [x])

    for _ in range(2):
        await step(a)
    with raises(
        ag.InputError,
        "step(): argument x has dtype int32 big-endian but the capture used int32",
    ):
        await step(rt.alloc("CPU:0", 64, ">i4"))


async def test_wrong_input_device(rt: ag.Runtime) -> None:
    graph, (a, _, _) = await xor_graph(rt)
    with raises(
        ag.InputError,
        "input 1 is on CPU:1 but the graph was compiled for one on CPU:0; copy it to CPU:0 first",
    ):
        await graph([a, rt.alloc("CPU:1", 64, I32)])


async def test_input_that_is_not_a_buffer(rt: ag.Runtime) -> None:
    graph, (a, _, _) = await xor_graph(rt)
    with raises(
        ag.InputError, "input 1 must be a Buffer, got a numpy array (shape (64,), dtype int32): "
    ):
        await graph([a, np.zeros(64, I32)])  # type: ignore[list-item]
    b = rt.alloc("CPU:0", 64, I32)
    await graph([a, b])  # bound: the next calls look their inputs up first
    with raises(
        ag.InputError, "input 1 must be a Buffer, got a numpy array (shape (64,), dtype int32): "
    ):
        await graph([a, np.zeros(64, I32)])  # type: ignore[list-item]
    with raises(ag.InputError, "input 1 must be a Buffer, got 7"):
        await graph([a, 7])  # type: ignore[list-item]
    await graph([a, b])
    with raises(ag.UsageError, "input 0 must be a Buffer, got 'a'"):
        await rt.compile([ag.Launch(XOR, bufs(rt, 3))], inputs=["a"])  # type: ignore[list-item]


async def test_inputs_aliasing_each_other(rt: ag.Runtime) -> None:
    graph, _ = await xor_graph(rt)
    big = rt.alloc("CPU:0", 128, I32)
    first, second = big.view(offset=0, size=64), big.view(offset=36, size=64)
    with raises(
        ag.InputError,
        f"inputs 0 and 1 share memory ({first!r} and {second!r}); the plan assumes distinct memory: pass separate buffers, or compile with aliasing='replan' to plan again for aliased inputs",
    ):
        await graph([first, second])
    x = rt.alloc("CPU:0", 64, I32)
    with raises(ag.InputError, "inputs 0 and 1 share memory"):
        await graph([x, x])
    # Disjoint views of one buffer are distinct inputs.
    await graph([big.view(offset=0, size=64), big.view(offset=64, size=64)])


async def test_compile_refuses_inputs_aliasing_each_other(rt: ag.Runtime) -> None:
    a, b, c = bufs(rt, 3)
    with raises(ag.InputError, "inputs 0 and 1 share memory"):
        await rt.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, a])


async def test_input_aliasing_an_internal_buffer(rt: ag.Runtime) -> None:
    graph, (_, b, c) = await xor_graph(rt)
    with raises(
        ag.InputError,
        f"input 0 {c!r} shares memory with {c!r}, which the graph uses internally; the plan assumes distinct memory: pass separate buffers, or compile with aliasing='replan' to plan again for aliased inputs",
    ):
        await graph([c, b])
    with raises(ag.InputError, "input 1 <Buffer CPU:0 64 int32 view@0"):
        await graph([b, c.view(offset=0, size=64)])


async def test_an_item_buffer_overlapping_an_input_without_being_it(rt: ag.Runtime) -> None:
    a, b, c = bufs(rt, 3)
    window = a.view(offset=8, size=32)
    part = window.view(offset=0, size=8)
    items = [ag.Launch(XOR, [c.view(offset=0, size=8), part, b.view(offset=0, size=8)])]
    with raises(
        ag.UsageError,
        f"item 0 (xor) uses {part!r}, which overlaps input 0 {window!r} without being it; pass the base buffer as the input",
    ):
        await rt.compile(items, inputs=[window])


# -- vars ------------------------------------------------------------------------------------


async def fill_graph(rt: ag.Runtime) -> ag.Graph:
    (out,) = bufs(rt, 1)
    return await rt.compile([ag.Launch(FILL, [out], vars=[N])])


async def test_var_out_of_bounds(rt: ag.Runtime) -> None:
    graph = await fill_graph(rt)
    message = "Var 'n' = 65 is outside its bounds [1, 64]; pass a value in range or widen the Var's bounds"
    with raises(ag.VarError, message):
        await graph(var_vals={N: 65})
    with raises(ag.VarError, "Var 'n' = 0 is outside its bounds [1, 64]"):
        await rt.run([ag.Launch(FILL, bufs(rt, 1), vars=[N])], var_vals={N: 0})
    with raises(ag.VarError, "Var 'n' = 99 is outside its bounds [1, 64]"):
        ag.Launch(FILL, bufs(rt, 1), vars=[N], fixedvars={N: 99})


async def test_var_value_that_is_not_an_int(rt: ag.Runtime) -> None:
    graph = await fill_graph(rt)
    with raises(ag.VarError, "Var 'n' needs an int value, got 2.5"):
        await graph(var_vals={N: 2.5})  # type: ignore[dict-item]
    with raises(ag.VarError, "Var 'n' needs an int value, got True"):
        await graph(var_vals={N: True})


async def test_missing_var(rt: ag.Runtime) -> None:
    graph = await fill_graph(rt)
    with raises(ag.VarError, "this graph needs values for Vars ['n']; pass var_vals={var: value}"):
        await graph()
    with raises(ag.VarError, "run() needs values for Vars ['n']"):
        await rt.run([ag.Launch(FILL, bufs(rt, 1), vars=[N])])


async def test_unknown_var(rt: ag.Runtime) -> None:
    graph = await fill_graph(rt)
    with raises(ag.VarError, "this graph does not use Var 'k' (it uses: ['n']); drop it"):
        await graph(var_vals={N: 3, K: 1})
    with raises(ag.VarError, "run() does not use Var 'k' (it uses: none); drop it"):
        await rt.run([ag.Launch(XOR, bufs(rt, 3))], var_vals={K: 1})
    with raises(ag.VarError, "this graph: var_vals keys must be ag.Var objects, got 'n'"):
        await graph(var_vals={"n": 3})  # type: ignore[dict-item]


async def test_launch_dims_that_evaluate_below_one(rt: ag.Runtime) -> None:
    (out,) = bufs(rt, 1)
    graph = await rt.compile([ag.Launch(FILL, [out], vars=[N], global_size=N - 5)])
    with raises(
        ag.UsageError,
        "item 0 (fill): global_size is (-2,) for these var values; "
        "launch dims must all be >= 1 (leave out a launch that has no work)",
    ):
        await graph(var_vals={N: 3})
    await graph(var_vals={N: 6})


def test_bad_vars_and_dims() -> None:
    with raises(ag.VarError, "Var 'v': bounds must be ints with lo <= hi, got [5, 1]"):
        ag.Var("v", 5, 1)
    with raises(ag.VarError, "Var name must be a non-empty string, got ''"):
        ag.Var("", 0, 1)
    with raises(TypeError, "launch-dim expressions combine ints and Vars only; got 1.5 (float)"):
        N * 1.5  # type: ignore[operator]
    with raises(ag.VarError, "launch dim (n // (n - n)) divides by zero for these var values"):
        (N // (N - N)).evaluate({N: 3})


# -- freed buffers ---------------------------------------------------------------------------


async def test_freed_buffer_in_items(rt: ag.Runtime) -> None:
    a, b, c = bufs(rt, 3)
    rt.free(b)
    items = [ag.Launch(XOR, [c, a, b])]
    message = (
        f"item 0 (xor): buffer {b!r} was freed; allocate a new buffer with rt.alloc(...) instead"
    )
    with raises(ag.BufferFreedError, message):
        await rt.run(items)
    with raises(ag.BufferFreedError, message):
        await rt.compile(items)
    assert "freed" in repr(b)


async def test_freed_buffer_as_input(rt: ag.Runtime) -> None:
    graph, (a, b, _) = await xor_graph(rt)
    (gone,) = bufs(rt, 1)
    rt.free(gone)
    with raises(ag.BufferFreedError, f"input 1: {gone!r} was freed"):
        await graph([a, gone])
    with raises(ag.BufferFreedError, f"input 0: {gone!r} was freed"):
        await rt.compile([ag.Launch(XOR, bufs(rt, 3))], inputs=[gone])
    # An input used by the previous calls (a replay loop, whose calls after the second
    # take the shortest path) and freed since.
    for _ in range(3):
        await graph([a, b])
    rt.free(b)
    with raises(ag.BufferFreedError, f"input 1: {b!r} was freed"):
        await graph([a, b])


async def test_freed_internal_buffer_on_replay(rt: ag.Runtime) -> None:
    graph, (a, b, c) = await xor_graph(rt)
    for _ in range(3):
        await graph([a, b])
    rt.free(c)
    message = (
        f"this graph's buffer {c!r} was freed; allocate a new buffer with rt.alloc(...) instead"
    )
    with raises(ag.BufferFreedError, message):
        await graph([a, b])  # the same inputs as the last call
    with raises(ag.BufferFreedError, message):
        await graph(bufs(rt, 2))


@pytest.mark.parametrize("device", ["CPU:0", "SIM:0"])
async def test_freed_buffers_through_the_replan_cache(device: str) -> None:
    """Replanned graphs are cached per input set: a cached plan checks liveness like the
    first call does, for its inputs and for the buffers the graph uses internally."""
    add = ag.Kernel("add", cpu=lambda out, a, b: np.add(a, b, out=out), outs=(0,), ins=(1, 2))
    async with ag.open_runtime([device]) as rt:
        a, b, tmp, other = (rt.alloc(device, 8, I32) for _ in range(4))
        items = [ag.Launch(add, [tmp, a, b]), ag.Launch(add, [b, tmp, a]), ag.Launch(INC, [other])]
        graph = await rt.compile(items, inputs=[a, b], aliasing="replan")
        x, y = rt.alloc(device, 8, I32), rt.alloc(device, 8, I32)
        for inputs in ([x, x], [y, y]):
            for _ in range(2):  # the second call comes from the cache
                await graph(inputs)
        rt.free(x)
        with raises(ag.BufferFreedError, f"input 0: {x!r} was freed"):
            await graph([x, x])
        await graph([y, y])
        rt.free(other)  # used by a static item: lowered once, never re-lowered
        with raises(ag.BufferFreedError, f"this graph's buffer {other!r} was freed"):
            await graph([y, y])
        assert rt.in_flight == 0


async def test_freed_buffer_in_copyin_copyout_view_and_free(rt: ag.Runtime) -> None:
    (a,) = bufs(rt, 1)
    view = a.view(offset=4, size=4)
    rt.free(a)
    with raises(ag.BufferFreedError, f"copyin: {a!r} was freed"):
        await rt.copyin(a, np.zeros(64, I32))
    with raises(ag.BufferFreedError, f"copyout: {view!r} was freed"):
        await rt.copyout(view)
    with raises(ag.BufferFreedError, f"view(): {a!r} was freed"):
        a.view(offset=0, size=1)
    with raises(ag.BufferFreedError, f"free: {a!r} was freed"):
        rt.free(a)
    (b,) = bufs(rt, 1)
    with raises(ag.UsageError, "free() takes a base buffer; "):
        rt.free(b.view(offset=1, size=1))


# -- buffers of another runtime -------------------------------------------------------------


def other_runtime(buffer: ag.Buffer, owner: ag.Runtime, rt: ag.Runtime, what: str = "") -> str:
    return f"{what}{buffer!r} was allocated by {owner!r}, not by this runtime {rt!r}"


async def test_every_call_refuses_a_buffer_another_runtime_allocated() -> None:
    async with (
        ag.open_runtime(["CPU:0", "CPU:1"]) as mine,
        ag.open_runtime(["CPU:0", "CPU:1"]) as other,
        ag.open_runtime(["CPU:2"]) as third,
    ):
        assert repr(mine) == f"<Runtime {mine.number} on CPU:0, CPU:1>"
        x = other.alloc("CPU:0", 64, I32)
        await other.copyin(x, np.arange(64, dtype=I32))
        half = x.view(offset=0, size=32)
        a, b, c = bufs(mine, 3)
        foreign = other_runtime(x, other, mine)
        with raises(ag.UsageError, f"copyin: {foreign}"):
            await mine.copyin(x, np.zeros(64, I32))
        with raises(ag.UsageError, f"copyout: {half!r} was allocated by {other!r}, not by"):
            await mine.copyout(half)
        with raises(ag.UsageError, f"item 0 (xor): buffer {foreign}"):
            await mine.run([ag.Launch(XOR, [c, x, b])])
        with raises(ag.UsageError, f"item 1 (copy CPU:0->CPU:0): buffer {foreign}"):
            await mine.run([ag.Launch(XOR, [c, a, b]), ag.Copy(dst=c, src=x)])
        with raises(ag.UsageError, f"item 0 (xor): buffer {foreign}"):
            await mine.compile([ag.Launch(XOR, [x, a, b])])
        with raises(ag.UsageError, f"input 0: {foreign}"):
            await mine.compile([ag.Launch(XOR, [c, a, b])], inputs=[x])
        graph = await mine.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, b])
        with raises(ag.InputError, f"input 1: {foreign}"):
            await graph([a, x])
        with raises(ag.InputError, f"input 0: {half!r} was allocated by {other!r}"):
            await graph.submit([half, b])
        with raises(ag.InputError, f"input 0: {foreign}"):
            graph.submit_nowait([x, b])
        with raises(ag.UsageError, f"wrap: {foreign}"):
            mine.wrap("CPU:0", x)
        with raises(ag.UsageError, f"free: {foreign}"):
            mine.free(x)
        # A runtime without the buffer's device names the runtimes, not a missing device.
        with raises(ag.UsageError, f"copyout: {other_runtime(x, other, third)}"):
            await third.copyout(x)
        # Nothing was freed or written: the buffer is still its runtime's, intact.
        assert not x.freed
        np.testing.assert_array_equal(await other.copyout(x), np.arange(64))
        assert mine.in_flight == other.in_flight == 0


async def test_a_buffer_of_a_closed_runtime_is_named_as_such() -> None:
    async with ag.open_runtime(["CPU:0"]) as old:
        x = old.alloc("CPU:0", 64, I32)
    async with ag.open_runtime(["CPU:0"]) as new:
        message = f"copyin: {x!r} was allocated by {old!r}, which has closed"
        assert repr(old).endswith("(closed)>")
        with raises(ag.UsageError, message):
            await new.copyin(x, np.zeros(64, I32))
        with raises(ag.UsageError, "allocate a new buffer here with rt.alloc(...)"):
            await new.run([ag.Launch(INC, [x])])


def test_a_background_runtime_refuses_another_runtimes_buffer_at_once() -> None:
    with ag.start_runtime(["CPU:0"]) as mine, ag.start_runtime(["CPU:0"]) as other:
        x = other.alloc("CPU:0", 64, I32)
        foreign = other_runtime(x, other.runtime, mine.runtime)
        with raises(ag.UsageError, f"free: {foreign}"):
            mine.free(x)  # at once, not on the runtime's thread later
        with raises(ag.UsageError, f"copyin: {foreign}"):
            mine.copyin(x, np.zeros(64, I32)).result()
        assert not x.freed


# -- kernels, launches, copies, views --------------------------------------------------------


async def test_kernel_with_no_body_for_the_device(rt: ag.Runtime) -> None:
    (out,) = bufs(rt, 1)
    items = [ag.Launch(GPU_ONLY, [out])]
    message = (
        "kernel 'gpu_only' has no CPU body, so it cannot run on CPU:0; give Kernel(..., cpu=fn) "
        "or launch it on a device it has a body for"
    )
    with raises(ag.DeviceError, message):
        await rt.run(items)
    with raises(ag.DeviceError, message):
        await rt.compile(items)
    # Refused before anything ran: the runtime goes on.
    await rt.run([ag.Launch(XOR, bufs(rt, 3))])


def test_bad_kernels() -> None:
    with raises(
        ag.UsageError,
        "Kernel 'k' has no body; give cpu=fn, cuda=SOURCE and/or code=ag.remote.MachineCode(...)",
    ):
        ag.Kernel("k", outs=(0,))
    with raises(ag.UsageError, "Kernel 'k' writes no buffer: list the written slots in outs=(...)"):
        ag.Kernel("k", cpu=_fill)
    with raises(ag.UsageError, "Kernel name must be an identifier, got 'a-b'"):
        ag.Kernel("a-b", cpu=_fill, outs=(0,))
    with raises(ag.UsageError, "Kernel 'k': cpu= must be callable, got 3"):
        ag.Kernel("k", cpu=3, outs=(0,))
    with raises(ag.UsageError, "Kernel outs must list buffer slots as ints >= 0, got (-1,)"):
        ag.Kernel("k", cpu=_fill, outs=(-1,))


async def test_launch_mixing_devices(rt: ag.Runtime) -> None:
    a, c = bufs(rt, 2)
    (b,) = bufs(rt, 1, "CPU:1")
    with raises(
        ag.UsageError,
        "Launch of 'xor' mixes buffers of ['CPU:0', 'CPU:1']; a kernel runs on one device: add a Copy to bring the data over first",
    ):
        ag.Launch(XOR, [c, a, b])


async def test_slot_in_neither_outs_nor_ins(rt: ag.Runtime) -> None:
    with raises(
        ag.UsageError,
        "buffer slot 1 of Kernel 'fill' is in neither outs nor ins; say whether the kernel reads or writes it",
    ):
        ag.Launch(FILL, bufs(rt, 2))


async def test_slot_out_of_range(rt: ag.Runtime) -> None:
    with raises(
        ag.UsageError,
        "Kernel 'xor' uses buffer slot 2 but the Launch passes 2 buffers; pass one buffer per slot",
    ):
        ag.Launch(XOR, bufs(rt, 2))


async def test_bad_launch_arguments(rt: ag.Runtime) -> None:
    with raises(ag.UsageError, "buffer slot 0 must be an actorgraph Buffer, got"):
        ag.Launch(FILL, [np.zeros(4)])
    with raises(ag.UsageError, "launch dims are 1 to 3 ints or Var expressions, got (1, 1, 1, 1)"):
        ag.Launch(FILL, bufs(rt, 1), global_size=(1, 1, 1, 1))
    with raises(ag.UsageError, "Launch needs an actorgraph Kernel, got 'xor'"):
        ag.Launch("xor", bufs(rt, 1))  # type: ignore[arg-type]


async def test_copy_size_or_dtype_mismatch(rt: ag.Runtime) -> None:
    (a,) = bufs(rt, 1)
    small = rt.alloc("CPU:1", 32, I32)
    floats = rt.alloc("CPU:1", 64, np.float32)
    with raises(
        ag.UsageError,
        f"Copy needs dst and src of the same dtype and size: dst is {small!r}, src is {a!r}; use views of matching size",
    ):
        ag.Copy(dst=small, src=a)
    with raises(
        ag.UsageError,
        f"Copy needs dst and src of the same dtype and size: dst is {floats!r}, src is {a!r}",
    ):
        ag.Copy(dst=floats, src=a)
    ag.Copy(dst=a.view(offset=0, size=8), src=a.view(offset=4, size=8))  # memmove: allowed


async def test_view_past_end(rt: ag.Runtime) -> None:
    (a,) = bufs(rt, 1)
    with raises(
        ag.UsageError,
        f"view(offset=60, size=8) of {a!r} runs past its end (68 > 64); shrink the view or its offset",
    ):
        a.view(offset=60, size=8)
    part = a.view(offset=32, size=16)
    with raises(ag.UsageError, "view(offset=10, size=8) of"):
        part.view(offset=10, size=8)
    with raises(ag.UsageError, "view offset must be an int >= 0, got -1"):
        a.view(offset=-1, size=1)
    with raises(ag.UsageError, "view size=6 does not match shape=(2, 2)"):
        a.view(size=6, shape=(2, 2))


BAD_DTYPES = [
    (object, "Python objects"),
    (np.dtype("U4"), "strings"),
    (np.dtype("S8"), "strings"),
    (np.dtype([("x", np.int32), ("y", np.float32)]), "structured records"),
    (np.dtype((np.int32, (2,))), "sub-arrays"),
    (np.dtype("datetime64[s]"), "dates and times"),
    (np.dtype("V0"), "zero-size items"),
]


@pytest.mark.parametrize(("dtype", "kind"), BAD_DTYPES, ids=lambda v: str(v))
async def test_buffers_hold_numbers_or_raw_bytes_only(
    rt: ag.Runtime, dtype: object, kind: str
) -> None:
    rule = (
        f"holds {kind}; a buffer holds fixed-size numbers (bool, int, uint, float or complex "
        f"dtypes) or raw bytes ('V8')"
    )
    with raises(ag.UsageError, f"alloc: dtype {np.dtype(dtype)!r} {rule}"):
        rt.alloc("CPU:0", 4, dtype)
    with raises(ag.UsageError, f"wrap: dtype {np.dtype(dtype)!r} {rule}"):
        rt.wrap("CPU:0", np.zeros(64, np.uint8), dtype=dtype)
    (a,) = bufs(rt, 1)
    with raises(ag.UsageError, f"view(): dtype {np.dtype(dtype)!r} {rule}"):
        a.view(byte_offset=0, dtype=dtype, shape=(2,))
    with raises(ag.UsageError, f"view(): dtype {np.dtype(dtype)!r} {rule}"):
        a.view(dtype=dtype)


async def test_numbers_and_raw_bytes_make_buffers(rt: ag.Runtime) -> None:
    for dtype in (bool, np.int8, np.uint64, np.float16, np.complex128, "V16", ">i4"):
        buf = rt.alloc("CPU:0", 4, dtype)
        assert buf.dtype == np.dtype(dtype)
        assert buf.view(byte_offset=0, dtype=np.uint8).nbytes == buf.nbytes


async def test_offsets_and_sizes_are_ints_never_bools(rt: ag.Runtime) -> None:
    (a,) = bufs(rt, 1)
    for call, message in [
        (lambda: a.view(offset=True), "view offset must be an int >= 0, got True"),
        (
            lambda: a.view(offset=True, dtype=np.int32, shape=(2,)),
            "view offset must be an int >= 0, got True",
        ),
        (lambda: a.view(offset=1.0, size=2), "view offset must be an int >= 0, got 1.0"),
        (lambda: a.view(offset=0, size=True), "view size must be an int >= 0, got True"),
        (lambda: a.view(size=True, shape=(1,)), "view size must be an int >= 0, got True"),
        (
            lambda: a.view(byte_offset=True, dtype=np.uint8),
            "view byte_offset must be an int >= 0, got True",
        ),
        (
            lambda: a.view(byte_offset=np.False_, dtype=np.uint8),
            "view byte_offset must be an int >= 0, got np.False_",
        ),
        (
            lambda: rt.wrap("CPU:0", np.zeros(1, np.uint8), nbytes=True),
            "wrap: nbytes must be an int >= 0, got True",
        ),
        (
            lambda: rt.wrap("CPU:0", True, nbytes=8),
            "wrap: address must be a positive int, got True",
        ),
    ]:
        with raises(ag.UsageError, message):
            call()
    assert a.view(offset=np.int64(2), size=np.int32(3)).shape == (3,)  # numpy ints are ints
    for option, value in [
        ("max_in_flight", True),
        ("max_in_flight", 2.5),
        ("timeline_start", True),
        ("timeline_start", 1.5),
        ("cpu_thread_bytes", False),
    ]:
        with raises(ag.UsageError, f"{option} must be an int >= 0, got {value!r}"):
            async with ag.open_runtime(["CPU:0"], **{option: value}):
                pass


async def test_bad_alloc_and_copyin(rt: ag.Runtime) -> None:
    with raises(ag.UsageError, "a buffer shape is an int or a tuple of ints >= 0, got -3"):
        rt.alloc("CPU:0", -3, I32)
    with raises(ag.UsageError, "alloc: 'no such type' is not a numpy dtype"):
        rt.alloc("CPU:0", 4, "no such type")
    (a,) = bufs(rt, 1)
    with raises(
        ag.UsageError,
        f"copyin: array dtype float64 does not match {a!r}; convert with array.astype(np.int32)",
    ):
        await rt.copyin(a, np.zeros(64))
    with raises(ag.UsageError, f"copyin: array has 63 elements but {a!r} holds 64"):
        await rt.copyin(a, np.zeros(63, I32))
    with raises(ag.UsageError, "copyout takes a Buffer, got"):
        await rt.copyout(np.zeros(3))  # type: ignore[arg-type]
    with raises(
        ag.UsageError,
        f"submit_copyin: array dtype float64 does not match {a!r}; convert with "
        f"array.astype(np.int32)",
    ):
        await rt.submit_copyin(a, np.zeros(64))
    with raises(ag.UsageError, "submit_copyout takes a Buffer, got"):
        await rt.submit_copyout(np.zeros(3))  # type: ignore[arg-type]


async def test_alloc_shapes_are_checked(rt: ag.Runtime) -> None:
    for shape in (2.5, "64", (4, 2.0), (3, None), True, ()):
        with raises(
            ag.UsageError, f"a buffer shape is an int or a tuple of ints >= 0, got {shape!r}"
        ):
            rt.alloc("CPU:0", shape, I32)  # type: ignore[arg-type]
    # The element count is an exact int: it never wraps round to a small buffer.
    with raises(
        ag.UsageError,
        "alloc: shape (4294967296, 4294967296) of int8 is 18446744073709551616 bytes, more "
        "than one buffer can hold (9223372036854775807); allocate less or split it",
    ):
        rt.alloc("CPU:0", (2**32, 2**32), np.int8)
    with raises(ag.UsageError, "alloc: shape (4611686018427387904,) of int32 is"):
        rt.alloc("CPU:0", 2**62, I32)
    a = rt.alloc("CPU:0", (np.int64(2), 3), I32)  # numpy ints are ints
    assert a.shape == (2, 3) and type(a.shape[0]) is int and a.memory.size == 6
    assert rt.alloc("CPU:0", (0, 5), I32).nbytes == 0


async def test_bad_item_lists(rt: ag.Runtime) -> None:
    with raises(ag.UsageError, "compile() got no items; a graph needs at least one Launch or Copy"):
        await rt.compile([])
    with raises(
        ag.UsageError, "item 0 is 'xor'; a jit cache holds ag.Launch(...) and ag.Copy(...) items"
    ):
        await rt.run(["xor"])  # type: ignore[list-item]


# -- devices and runtimes --------------------------------------------------------------------


async def test_unknown_device_name() -> None:
    for name in ("GPU:0", "cpu:0", "CPU0", "CPU:-1"):
        kinds = ", ".join(f"{k}:N" for k in DEVICE_KINDS)
        with raises(
            ag.DeviceError, f"unknown device name {name!r}: expected one of {kinds} (e.g. 'CPU:0')"
        ):
            async with ag.open_runtime([name]):
                pass  # pragma: no cover


async def test_bad_device_lists() -> None:
    with raises(
        ag.UsageError,
        "open_runtime needs a list of device names like ['CPU:0', 'CPU:1'], got 'CPU:0'",
    ):
        async with ag.open_runtime("CPU:0"):
            pass  # pragma: no cover
    with raises(ag.UsageError, "device 'CPU:0' is listed twice in open_runtime(...)"):
        async with ag.open_runtime(["CPU:0", "CPU:0"]):
            pass  # pragma: no cover


async def test_device_not_opened_in_the_runtime(rt: ag.Runtime) -> None:
    with raises(
        ag.UsageError,
        "device 'CPU:3' is not open in this runtime (open: ['CPU:0', 'CPU:1']); add it to open_runtime([...])",
    ):
        rt.alloc("CPU:3", 4, I32)
    # A buffer from another runtime, on a device this one did not open: the runtimes are
    # what is wrong, not a missing device.
    async with ag.open_runtime(["CPU:5"]) as other:
        stranger = other.alloc("CPU:5", 64, I32)
        (mine,) = bufs(rt, 1)
        items = [ag.Copy(dst=mine, src=stranger)]
        message = f"buffer {stranger!r} was allocated by {other!r}, not by this runtime {rt!r}"
        with raises(ag.UsageError, message):
            await rt.compile(items)
        with raises(ag.UsageError, message):
            await rt.run(items)


async def test_graph_after_aclose(rt: ag.Runtime) -> None:
    graph, (a, b, _) = await xor_graph(rt)
    async with graph:
        for _ in range(3):  # a replay loop: the later calls take the shortest path
            await graph([a, b])
    with raises(ag.ClosedError, "was closed with aclose(); compile a new graph"):
        await graph([a, b])
    await graph.aclose()  # closing twice is fine
    assert "closed" in repr(graph)


async def test_runtime_after_exit() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        graph, (a, b, c) = await xor_graph(rt)
    message = "this runtime has exited its `async with open_runtime(...)` block; open a new runtime to run more work"
    with raises(ag.ClosedError, message):
        rt.alloc("CPU:0", 4, I32)
    with raises(ag.ClosedError, message):
        await graph([a, b])
    with raises(ag.ClosedError, message):
        await rt.run([ag.Launch(XOR, [c, a, b])])
    with raises(ag.ClosedError, message):
        await rt.compile([ag.Launch(XOR, [c, a, b])])
    with raises(ag.ClosedError, message):
        await rt.copyin(a, np.zeros(64, I32))
    with raises(ag.ClosedError, message):
        await rt.copyout(a)


# -- a kernel that raises --------------------------------------------------------------------


class Boom:
    """A kernel body that raises while `armed`."""

    def __init__(self) -> None:
        self.armed = True
        self.error = ValueError("bad value in the kernel")

    def __call__(self, out: np.ndarray, a: np.ndarray) -> None:
        if self.armed:
            raise self.error
        out[:] = a + 1


@pytest.mark.parametrize("thread_bytes", [1 << 30, 0], ids=["inline", "thread"])
async def test_a_kernel_that_raises(thread_bytes: int) -> None:
    boom = Boom()
    kernel = ag.Kernel("boom", cpu=boom, outs=(0,), ins=(1,))
    async with ag.open_runtime(["CPU:0", "CPU:1"], cpu_thread_bytes=thread_bytes) as rt:
        a, b, c = bufs(rt, 3)
        (d,) = bufs(rt, 1, "CPU:1")
        await rt.copyin(a, np.arange(64, dtype=I32))
        # Item 1 raises; item 2 on another device waits for it and must not hang.
        items = [ag.Launch(XOR, [c, a, a]), ag.Launch(kernel, [b, a]), ag.Copy(dst=d, src=b)]
        graph = await rt.compile(items, inputs=[a])
        message = "item 1 (boom) on CPU:0/compute raised ValueError: bad value in the kernel"
        for _attempt in range(2):
            with raises(ag.ItemError, message) as info:
                await graph([a])
            error = info.value
            assert (error.index, error.label, error.device) == (1, "boom", "CPU:0")
            assert error.__cause__ is boom.error

        # Eager: the index is the item's place in the list given to run().
        with raises(ag.ItemError, "item 2 (boom) on CPU:0/compute raised ValueError") as info:
            await rt.run(items[:1] + items)
        assert info.value.index == 2 and info.value.__cause__ is boom.error

        # The runtime, and the graph, go on working.
        boom.armed = False
        await graph([a])
        np.testing.assert_array_equal(await rt.copyout(d), np.arange(64, dtype=I32) + 1)
        await rt.copyin(a, np.full(64, 7, I32))
        await rt.run(items)
        np.testing.assert_array_equal(await rt.copyout(d), np.full(64, 8, I32))
        assert rt.statistics().in_flight == 0  # nothing is left over from the failed ones


def test_every_error_shares_one_base() -> None:
    for error in (
        ag.DeviceError,
        ag.PlanError,
        ag.PlanDeadlockError,
        ag.PlanRaceError,
        ag.UsageError,
        ag.InputError,
        ag.VarError,
        ag.BufferFreedError,
        ag.ClosedError,
        ag.ItemError,
        ag.DeadlockError,
    ):
        assert issubclass(error, ag.ActorGraphError), error


# -- errors leaving `async with open_runtime(...)` -------------------------------------------


async def test_an_error_in_the_block_comes_out_as_itself() -> None:
    # The runtime's nursery wraps what leaves it in an ExceptionGroup; one error must not be.
    with raises(ag.UsageError, "device 'CPU:7' is not open in this runtime") as info:
        async with ag.open_runtime(["CPU:0"]) as rt:
            rt.alloc("CPU:7", 4, I32)
    assert type(info.value) is ag.UsageError
    assert not isinstance(info.value.__context__, BaseExceptionGroup)  # no group in front
    # Its traceback still reaches down from the block into the call that raised.
    assert 'rt.alloc("CPU:7", 4, I32)' in "".join(traceback.format_tb(info.value.__traceback__))
    try:
        async with ag.open_runtime(["CPU:0"]) as rt:
            await rt.copyin(rt.alloc("CPU:0", 4, I32), np.zeros(5, I32))
    except ag.UsageError as error:  # the habit the library must support
        assert str(error).startswith("copyin: array has 5 elements but <Buffer CPU:0 4 int32")
    else:
        raise AssertionError("copyin of the wrong size did not raise")


async def test_an_error_with_a_cause_keeps_it() -> None:
    with raises(ag.ItemError, "item 0 (boom) on CPU:0/compute raised ValueError") as info:
        async with ag.open_runtime(["CPU:0"]) as rt:
            boom = Boom()
            (a, b) = bufs(rt, 2)
            await rt.run([ag.Launch(ag.Kernel("boom", cpu=boom, outs=(0,), ins=(1,)), [b, a])])
    assert info.value.__cause__ is boom.error


async def test_one_failure_inside_the_runtime_comes_out_as_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken_monitor(self: Watch) -> None:
        await trio.sleep(0)
        raise RuntimeError("the monitor broke")

    monkeypatch.setattr(Watch, "run", broken_monitor)
    with trio.fail_after(10), raises(RuntimeError, "the monitor broke"):
        async with ag.open_runtime(["CPU:0"]):
            await trio.sleep_forever()  # cancelled by the failure, which alone comes out


async def test_several_failures_stay_a_group(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken_monitor(self: Watch) -> None:
        await trio.sleep(0)
        raise RuntimeError("the monitor broke")

    monkeypatch.setattr(Watch, "run", broken_monitor)
    with trio.fail_after(10), pytest.raises(BaseExceptionGroup) as info:
        async with ag.open_runtime(["CPU:0"]):
            try:
                await trio.sleep_forever()
            finally:
                raise ag.UsageError("the block failed too")
    kinds = sorted(type(e).__name__ for e in info.value.exceptions)
    assert kinds == ["RuntimeError", "UsageError"]


async def test_a_device_that_cannot_open_comes_out_as_itself() -> None:
    with raises(ag.DeviceError, "unknown device name 'GPU:0'"):
        async with ag.open_runtime(["GPU:0"]):
            pass  # pragma: no cover


# -- a forgotten await -------------------------------------------------------------------------


async def test_async_with_an_unawaited_compile(rt: ag.Runtime) -> None:
    a, b, c = bufs(rt, 3)
    items = [ag.Launch(XOR, [c, a, b])]
    with raises(
        ag.UsageError,
        "`async with rt.compile(...)` needs the graph, so await the call first: write `async with await rt.compile(...) as graph:`",
    ):
        async with rt.compile(items, inputs=[a, b]):  # type: ignore[attr-defined]
            pass  # pragma: no cover
    async with await rt.compile(items, inputs=[a, b]) as graph:  # the right way
        await graph([a, b])


async def test_an_unawaited_compile_used_as_a_graph(rt: ag.Runtime) -> None:
    a, b, c = bufs(rt, 3)
    pending = rt.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, b])
    assert "await it for its graph" in repr(pending)
    hint = "on rt.compile(...) itself, which is not awaited yet: write `graph = await rt.compile(...)`, then use graph"
    with raises(ag.UsageError, ".plan " + hint):
        print(pending.plan)
    with raises(ag.UsageError, "calling graph(...) " + hint):
        await pending([a, b])
    with raises(
        ag.UsageError,
        "sim_bounds() takes a Graph, got <awaitable rt.compile(...): await it for its graph>, an awaitable: await it for its result",
    ):
        ag.sim_bounds(pending)  # type: ignore[arg-type]
    graph = await pending  # still usable, once
    with raises(
        ag.UsageError, "rt.compile(...) was awaited twice; call it again for another graph"
    ):
        await pending
    assert isinstance(graph, ag.Graph)


async def test_a_compile_never_awaited_warns(rt: ag.Runtime) -> None:
    a, b, c = bufs(rt, 3)
    with pytest.warns(
        RuntimeWarning,
        match=re.escape(
            "rt.compile(...) was never awaited, so it never ran; write `graph = await rt.compile(...)`"
        ),
    ):
        rt.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, b])
        gc.collect()


async def test_an_unawaited_result_passed_as_a_buffer(rt: ag.Runtime) -> None:
    a, b, c = bufs(rt, 3)

    @ag.jit
    async def step(x: ag.Buffer) -> ag.Buffer:
        await rt.launch(XOR, [c, x, x])
        return c

    out = step(a)  # forgot await
    hint = "a coroutine: the async call step(...) that made it was not awaited; write `await` before it"
    with raises(ag.UsageError, f"copyout takes a Buffer, got {out!r}, {hint}"):
        await rt.copyout(out)
    with raises(ag.UsageError, f"buffer slot 1 must be an actorgraph Buffer, got {out!r}, {hint}"):
        ag.Launch(XOR, [c, out, b])
    with raises(ag.UsageError, f"Copy src must be an actorgraph Buffer, got {out!r}, {hint}"):
        ag.Copy(dst=c, src=out)
    out.close()  # we never ran it
    graph, (a, b, c) = await xor_graph(rt)
    replay = graph([a, b])
    with raises(ag.InputError, "input 0 must be a Buffer, got <coroutine object Graph.__call__"):
        await graph([replay, b])  # type: ignore[list-item]
    await replay
    with raises(ag.UsageError, "copyin takes a Buffer, got <Graph"):
        await rt.copyin(graph, np.zeros(64, I32))  # type: ignore[arg-type]
    with raises(ag.UsageError, "a Graph: a graph's call writes into its buffers; pass those"):
        await rt.copyin(graph, np.zeros(64, I32))  # type: ignore[arg-type]


async def test_an_option_nobody_takes_is_refused_naming_the_close_one() -> None:
    # A typo of cpu_thread_bytes would otherwise be ignored, and every kernel run inline.
    with raises(
        ag.UsageError,
        "open_runtime(...) got an option 'cpu_thread_byte' that neither the runtime nor any "
        "kind of device takes; did you mean 'cpu_thread_bytes'? the options are ",
    ):
        async with ag.open_runtime(["CPU:0"], cpu_thread_byte=1):
            pass
    with pytest.raises(ag.UsageError, match=r"option 'frobnicate' .* takes; the options are "):
        async with ag.open_runtime(["CPU:0"], frobnicate=True):
            pass


async def test_every_option_some_device_or_the_runtime_takes_is_accepted() -> None:
    # An option of a kind of device not opened is no error (one dict of options for any
    # set of devices), and each one the runtime or a device reads is known.
    from actorgraph.devices import DEVICE_OPTIONS

    from actorgraph._options import RUNTIME_OPTIONS

    assert {"cpu_thread_bytes", "sim_preset", "cuda_driver", "remote_token"} <= DEVICE_OPTIONS
    assert {"timeline_start", "profile", "watchdog"} <= RUNTIME_OPTIONS
    async with ag.open_runtime(["CPU:0"], sim_preset="pcie8", cuda_graphs=False) as rt:
        assert rt.devices == ("CPU:0",)


async def test_an_unawaited_copyout_passed_as_copyin_data(rt: ag.Runtime) -> None:
    a, b = bufs(rt, 2)
    data = rt.copyout(b)  # forgot await
    with raises(
        ag.UsageError,
        f"copyin takes host data (a numpy array) for {a!r}, got {data!r}, a coroutine: the "
        f"async call Runtime.copyout(...) that made it was not awaited; write `await` before it",
    ):
        await rt.copyin(a, data)
    data.close()  # we never ran it
    with raises(
        ag.UsageError,
        f"copyin takes host data (a numpy array) for {a!r}, got {b!r}, a Buffer: copy "
        f"between buffers with `await rt.copy(dst, src)` or an ag.Copy item",
    ):
        await rt.copyin(a, b)
    graph, _ = await xor_graph(rt)
    with raises(ag.UsageError, f"got {graph!r}, a Graph: a graph's call writes into its buffers"):
        await rt.copyin(a, graph)


async def test_one_buffer_where_a_list_belongs(rt: ag.Runtime) -> None:
    graph, (a, b, c) = await xor_graph(rt)
    takes = "a graph call takes its inputs as a list of Buffers, one per input in compile() order"
    for call in (graph, graph.submit):
        with raises(ag.InputError, f"{takes}, got {a!r}; write `await graph([x, ...])`"):
            await call(a)  # type: ignore[operator, arg-type]
    with raises(ag.InputError, f"{takes}, got None; write `await graph([x, ...])`"):
        graph.submit_nowait(None)  # type: ignore[arg-type]
    item = ag.Launch(XOR, [c, a, b])
    for call, name in ((rt.run, "rt.run"), (rt.compile, "rt.compile")):
        with raises(
            ag.UsageError,
            f"{name}(items) takes a list of items (ag.Launch, ag.Copy), got {item!r}; write "
            f"`{name}([item, ...])`",
        ):
            await call(item)  # type: ignore[operator, arg-type]
    with raises(
        ag.UsageError,
        f"compile(..., inputs=...) takes a list of Buffers, got {a!r}; write "
        f"`rt.compile(items, inputs=[x, ...])`",
    ):
        await rt.compile([item], inputs=a)  # type: ignore[arg-type]
    await graph([a, b])  # the right way
    assert graph.replays == 1


# -- host arrays where Buffers belong ---------------------------------------------------------

ARRAY_HINT = (
    "a numpy array (shape (64,), dtype int32): actorgraph's calls take Buffers; make one "
    "from it with `buf = rt.alloc(device, arr.shape, arr.dtype)` and "
    "`await rt.copyin(buf, arr)`, or use its memory in place with "
    '`buf = rt.wrap("CPU:0", arr)`'
)


async def test_a_numpy_array_where_a_buffer_belongs_says_how_to_make_one(
    rt: ag.Runtime,
) -> None:
    graph, (a, b, c) = await xor_graph(rt)
    arr = np.arange(64, dtype=I32)
    with raises(ag.InputError, f"input 0 must be a Buffer, got {ARRAY_HINT}"):
        await graph([arr, b])  # type: ignore[list-item]
    with raises(ag.UsageError, f"input 0 must be a Buffer, got {ARRAY_HINT}"):
        await rt.compile([ag.Launch(XOR, [c, a, b])], inputs=[arr])  # type: ignore[list-item]
    with raises(ag.UsageError, f"buffer slot 1 must be an actorgraph Buffer, got {ARRAY_HINT}"):
        ag.Launch(XOR, [c, arr, b])  # type: ignore[list-item]
    with raises(ag.UsageError, f"Copy src must be an actorgraph Buffer, got {ARRAY_HINT}"):
        ag.Copy(dst=c, src=arr)  # type: ignore[arg-type]
    with raises(ag.UsageError, f"copyout takes a Buffer, got {ARRAY_HINT}"):
        await rt.copyout(arr)  # type: ignore[arg-type]
    with raises(ag.UsageError, f"all_reduce: buffers[0] must be a Buffer, got {ARRAY_HINT}"):
        ag.all_reduce(rt, [arr, b])  # type: ignore[list-item]
    # The array itself where the list of inputs belongs: not 64 inputs, one array.
    with raises(
        ag.InputError,
        "a graph call takes its inputs as a list of Buffers, one per input in compile() "
        f"order, got {ARRAY_HINT}; write `await graph([x, ...])`",
    ):
        await graph(arr)  # type: ignore[arg-type]
    await graph([a, b])  # the right way
    assert graph.replays == 1


async def test_another_host_array_where_a_buffer_belongs_says_how_to_make_one(
    rt: ag.Runtime,
) -> None:
    # Anything numpy can read (here a memoryview) is named as an array, with the way in.
    graph, (_, b, _) = await xor_graph(rt)
    view = memoryview(bytearray(256)).cast("i")
    with raises(
        ag.InputError,
        "input 0 must be a Buffer, got a memoryview, an array of host data: actorgraph's "
        "calls take Buffers; make one from it with `arr = np.asarray(x)`, "
        "`buf = rt.alloc(device, arr.shape, arr.dtype)` and `await rt.copyin(buf, arr)`, or "
        'use its memory in place with `buf = rt.wrap("CPU:0", x)`',
    ):
        await graph([view, b])  # type: ignore[list-item]


# -- keyword typos where our own code reads the keywords ---------------------------------------


def test_start_runtime_suggests_its_own_keyword_beside_open_runtimes() -> None:
    with raises(
        ag.UsageError,
        "start_runtime(...) got an option 'clok' that neither start_runtime(...) nor "
        "open_runtime(...) takes; did you mean 'clock'? the options are ",
    ):
        ag.start_runtime(["CPU:0"], clok=trio.testing.MockClock())
    with raises(ag.UsageError, "got an option 'profil' that neither start_runtime(...) nor"):
        ag.start_runtime(["CPU:0"], profil=True)  # refused before any thread starts


async def test_a_jit_call_keyword_typo_names_the_function_and_the_near_name(
    rt: ag.Runtime,
) -> None:
    @ag.jit
    async def step(rt: ag.Runtime, x: ag.Buffer, *, scale: int = 1) -> None:
        await rt.launch(XOR, [x, x, x])

    (a,) = bufs(rt, 1)
    with raises(
        TypeError,
        "step() got an unexpected keyword argument 'var_val'; did you mean 'var_vals'? "
        "(step takes rt, x, scale; var_vals= is @ag.jit's own: the calls' Var values)",
    ):
        await step(rt, a, var_val={N: 3})
    with raises(
        TypeError, "step() got an unexpected keyword argument 'scal'; did you mean 'scale'?"
    ):
        await step(rt, a, scal=2)
    with raises(TypeError, "step(): missing a required argument: 'x' (step takes rt, x, scale;"):
        await step(rt)
    await step(rt, a, scale=2)  # the right way
    assert step.statistics().calls == 1
