"""Ordering cases every graph runner must get right.

Each case is replayed several times with fresh inputs (new buffers and new contents) and
fresh contents in every other buffer it touches; every replay must equal eager `rt.run`
of the same work from the same state, and a numpy reference written out by hand.
Every case runs twice: with kernels inline in the actors, and with every item on its
actor's worker thread (so queues really overlap in time).
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import attrs
import numpy as np
import pytest
import trio
from _model import (
    HostArrays,
    assert_same,
    bases_of,
    random_contents,
    random_fill,
    rebind_buffer,
    rebind_items,
    snapshot,
)
from actorgraph.scheduler import Run, Wait

import actorgraph as ag

I32 = np.int32


def _xor(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    np.bitwise_xor(a, b, out=out)


def _add1(out: np.ndarray, a: np.ndarray) -> None:
    np.add(a, 1, out=out)


def _times3(out: np.ndarray, a: np.ndarray) -> None:
    np.multiply(a, 3, out=out)


def _inc(x: np.ndarray) -> None:
    x += 1


XOR = ag.Kernel("xor", cpu=_xor, outs=(0,), ins=(1, 2))
ADD1 = ag.Kernel("add1", cpu=_add1, outs=(0,), ins=(1,))
TIMES3 = ag.Kernel("times3", cpu=_times3, outs=(0,), ins=(1,))
INC = ag.Kernel("inc", cpu=_inc, outs=(0,), ins=(0,))

Reference = Callable[[HostArrays, "dict[ag.Var, int] | None"], None]
Item = ag.Launch | ag.Copy


@pytest.fixture(params=["inline", "threads"])
async def rt(request: pytest.FixtureRequest) -> AsyncIterator[ag.Runtime]:
    thread_bytes = 0 if request.param == "threads" else 1 << 30
    devices = [f"CPU:{i}" for i in range(4)]
    async with ag.open_runtime(devices, cpu_thread_bytes=thread_bytes, verify_plans=True) as rt:
        yield rt


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    # Seeded from the test's name: the same data on every run (str hash() is salted).
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


@attrs.frozen
class Compiled:
    graph: ag.Graph
    items: list[Item]
    inputs: list[ag.Buffer]
    reference: Reference


@attrs.frozen
class Call:
    """One graph call: the graph, its new inputs, its var values."""

    compiled: Compiled
    inputs: list[ag.Buffer]
    var_vals: dict[ag.Var, int] | None = None

    @property
    def mapping(self) -> dict[ag.Buffer, ag.Buffer]:
        return dict(zip(self.compiled.inputs, self.inputs))


async def compile_checked(
    rt: ag.Runtime, items: Sequence[Item], inputs: Sequence[ag.Buffer], reference: Reference
) -> Compiled:
    graph = await rt.compile(items, inputs=inputs)
    graph.plan.verify()
    return Compiled(graph, list(items), list(inputs), reference)


def fresh_like(rt: ag.Runtime, inputs: Sequence[ag.Buffer]) -> list[ag.Buffer]:
    return [rt.alloc(b.device, b.shape, b.dtype) for b in inputs]


async def check_calls(
    rt: ag.Runtime, calls: Sequence[Call], rng: np.random.Generator, *, concurrent: bool = False
) -> None:
    """Run `calls` (one after another, or all at once from separate tasks), then check the
    result against the numpy references and against eager `rt.run` from the same state."""
    bound = [rebind_items(c.compiled.items, c.mapping) for c in calls]
    bases = bases_of(item for items in bound for item in items)
    host = HostArrays()
    await random_fill(rt, host, bases, rng)
    before = host.copy()

    order: list[int] = []
    if concurrent:

        async def one(index: int) -> None:
            order.append(index)  # a call submits before its first checkpoint
            await calls[index].compiled.graph(calls[index].inputs, var_vals=calls[index].var_vals)

        async with trio.open_nursery() as nursery:
            for index in range(len(calls)):
                nursery.start_soon(one, index)
    else:
        for index, call in enumerate(calls):
            order.append(index)
            await call.compiled.graph(call.inputs, var_vals=call.var_vals)
    got = await snapshot(rt, bases)

    for index in order:
        calls[index].compiled.reference(host.rebound(calls[index].mapping), calls[index].var_vals)
    want = {b.alloc_id: host.base_array(b) for b in bases}
    assert_same("graph replays vs numpy", got, want)

    for base in bases:
        await rt.copyin(base, before.base_array(base))
    for index in order:
        await rt.run(bound[index], var_vals=calls[index].var_vals)
    assert_same("eager rt.run vs numpy", await snapshot(rt, bases), want)


async def check_replays(
    rt: ag.Runtime,
    items: Sequence[Item],
    inputs: Sequence[ag.Buffer],
    reference: Reference,
    rng: np.random.Generator,
    *,
    replays: int = 4,
    make_inputs: Callable[[int], list[ag.Buffer]] | None = None,
    var_vals: Callable[[int], dict[ag.Var, int]] | None = None,
) -> Compiled:
    """Replay one graph several times: new input buffers each time, except one replay that
    reuses the previous buffers with new contents."""
    compiled = await compile_checked(rt, items, inputs, reference)
    new_inputs: list[ag.Buffer] = list(inputs)
    for r in range(replays):
        if r != 2:
            new_inputs = make_inputs(r) if make_inputs else fresh_like(rt, inputs)
        vals = var_vals(r) if var_vals else None
        await check_calls(rt, [Call(compiled, new_inputs, vals)], rng)
    return compiled


def waits_between(plan: Any, writer: int, reader: int) -> list[Wait]:
    """The waits of `reader`'s queue before it runs item `reader`, on `writer`'s queue."""
    queue = plan.item_queue[reader]
    other = plan.queues[plan.item_queue[writer]]
    out: list[Wait] = []
    for msg in plan.programs[queue]:
        if isinstance(msg, Run) and msg.item == reader:
            return out
        if isinstance(msg, Wait) and msg.queue == other:
            out.append(msg)
    raise AssertionError(f"item {reader} not in its queue's program")


# -- the cases ------------------------------------------------------------------------------


async def test_two_writes_to_one_buffer(rt: ag.Runtime, rng: np.random.Generator) -> None:
    # c is written by the CPU:0 copy queue, the CPU:0 compute queue, then the copy queue
    # again (its source on another device): the last write must win every time.
    a, c, x = (rt.alloc("CPU:0", 64, I32) for _ in range(3))
    y = rt.alloc("CPU:1", 64, I32)
    items = [ag.Copy(dst=c, src=x), ag.Launch(ADD1, [c, a]), ag.Copy(dst=c, src=y)]

    def reference(h: HostArrays, _: object) -> None:
        h[c][:] = h[x]
        h[c][:] = h[a] + 1
        h[c][:] = h[y]

    compiled = await check_replays(rt, items, [a, y], reference, rng)
    assert waits_between(compiled.graph.plan, 1, 2), "write-after-write across queues needs a wait"


async def test_read_then_write(rt: ag.Runtime, rng: np.random.Generator) -> None:
    # CPU:1's copy queue reads c, then CPU:0's compute queue overwrites it.
    a, c = (rt.alloc("CPU:0", 64, I32) for _ in range(2))
    d = rt.alloc("CPU:1", 64, I32)
    items = [ag.Copy(dst=d, src=c), ag.Launch(ADD1, [c, a]), ag.Launch(TIMES3, [a, c])]

    def reference(h: HostArrays, _: object) -> None:
        h[d][:] = h[c]
        h[c][:] = h[a] + 1
        h[a][:] = h[c] * 3

    compiled = await check_replays(rt, items, [a], reference, rng)
    assert waits_between(compiled.graph.plan, 0, 1), "write-after-read across queues needs a wait"


async def test_write_then_read(rt: ag.Runtime, rng: np.random.Generator) -> None:
    a, b, c, e, f = (rt.alloc("CPU:0", 64, I32) for _ in range(5))
    items = [
        ag.Launch(XOR, [c, a, b]),
        ag.Copy(dst=f, src=c),  # CPU:0's copy queue reads what compute wrote
        ag.Launch(TIMES3, [e, c]),  # same queue: in order, no wait
        ag.Launch(INC, [c]),  # and then c changes again, after the copy read it
    ]

    def reference(h: HostArrays, _: object) -> None:
        h[c][:] = h[a] ^ h[b]
        h[f][:] = h[c]
        h[e][:] = h[c] * 3
        h[c][:] += 1

    compiled = await check_replays(rt, items, [a, b], reference, rng)
    plan = compiled.graph.plan
    assert waits_between(plan, 0, 1) and waits_between(plan, 1, 3)
    assert not waits_between(plan, 0, 2)


async def test_copy_after_a_kernel_writes_its_source(
    rt: ag.Runtime, rng: np.random.Generator
) -> None:
    a, b, c = (rt.alloc("CPU:0", 64, I32) for _ in range(3))
    d = rt.alloc("CPU:1", 64, I32)
    items = [ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c), ag.Launch(INC, [d])]

    def reference(h: HostArrays, _: object) -> None:
        h[c][:] = h[a] ^ h[b]
        h[d][:] = h[c] + 1

    await check_replays(rt, items, [a, b], reference, rng)


async def test_kernel_after_a_copy_writes_its_input(
    rt: ag.Runtime, rng: np.random.Generator
) -> None:
    a = rt.alloc("CPU:0", 64, I32)
    d, e, f = (rt.alloc("CPU:1", 64, I32) for _ in range(3))
    items = [
        ag.Copy(dst=d, src=a),  # CPU:1's copy queue
        ag.Launch(ADD1, [e, d]),  # CPU:1's compute queue reads it
        ag.Copy(dst=d, src=f),  # and the copy queue may not overwrite d before that read
        ag.Launch(XOR, [f, d, e]),
    ]

    def reference(h: HostArrays, _: object) -> None:
        h[d][:] = h[a]
        h[e][:] = h[d] + 1
        h[d][:] = h[f]
        h[f][:] = h[d] ^ h[e]

    await check_replays(rt, items, [a], reference, rng)


async def _shared_graphs(rt: ag.Runtime) -> tuple[list[Compiled], list[ag.Buffer]]:
    """Three graphs that read and write each other's buffers on two devices."""
    a, b, c, e = (rt.alloc("CPU:0", 64, I32) for _ in range(4))
    d = rt.alloc("CPU:1", 64, I32)
    g = rt.alloc("CPU:1", 64, I32)

    def ref1(h: HostArrays, _: object) -> None:
        h[c][:] = h[a] ^ h[b]
        h[d][:] = h[c]

    def ref2(h: HostArrays, _: object) -> None:
        h[d][:] += 1
        h[c][:] = h[d]

    def ref3(h: HostArrays, _: object) -> None:
        h[e][:] = h[c] * 3
        h[g][:] = h[e]

    first = await compile_checked(
        rt, [ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c)], [a, b], ref1
    )
    second = await compile_checked(rt, [ag.Launch(INC, [d]), ag.Copy(dst=c, src=d)], [], ref2)
    third = await compile_checked(rt, [ag.Launch(TIMES3, [e, c]), ag.Copy(dst=g, src=e)], [g], ref3)
    return [first, second, third], [a, b, g]


async def test_several_graphs_sharing_buffers_interleaved(
    rt: ag.Runtime, rng: np.random.Generator
) -> None:
    graphs, _ = await _shared_graphs(rt)
    for sequence in [(0, 1, 2), (2, 1, 0, 1, 2, 0), (1, 1, 0, 0, 2, 2)]:
        calls = [Call(graphs[i], fresh_like(rt, graphs[i].inputs)) for i in sequence]
        await check_calls(rt, calls, rng)


async def test_several_graphs_sharing_buffers_from_concurrent_tasks(
    rt: ag.Runtime, rng: np.random.Generator
) -> None:
    graphs, _ = await _shared_graphs(rt)
    for _ in range(3):
        sequence = rng.integers(0, 3, size=9)
        calls = [Call(graphs[i], fresh_like(rt, graphs[i].inputs)) for i in sequence]
        await check_calls(rt, calls, rng, concurrent=True)


async def test_one_graph_replayed_from_many_tasks_at_once(
    rt: ag.Runtime, rng: np.random.Generator
) -> None:
    # Every replay folds its input into an accumulator the graph keeps, then ships it to
    # CPU:1: the replays must run whole, one after another, in the order they were issued.
    a, acc = (rt.alloc("CPU:0", 64, I32) for _ in range(2))
    mirror = rt.alloc("CPU:1", 64, I32)

    def reference(h: HostArrays, _: object) -> None:
        h[acc][:] = h[acc] ^ h[a]
        h[acc][:] += 1
        h[mirror][:] = h[acc]
        h[a][:] = h[mirror] * 3

    items = [
        ag.Launch(XOR, [acc, acc, a]),
        ag.Launch(INC, [acc]),
        ag.Copy(dst=mirror, src=acc),
        ag.Copy(dst=a, src=mirror),
        ag.Launch(TIMES3, [a, a]),
    ]
    compiled = await compile_checked(rt, items, [a], reference)
    for _ in range(2):
        calls = [Call(compiled, fresh_like(rt, [a])) for _ in range(8)]
        await check_calls(rt, calls, rng, concurrent=True)


async def test_graph_reading_another_devices_memory_waits_for_earlier_work_there(
    rt: ag.Runtime, rng: np.random.Generator
) -> None:
    # The writer runs on CPU:0 only; the reader's copy runs on CPU:1's copy queue but
    # reads CPU:0's memory, so it must first sync with CPU:0's timeline.
    a, c = (rt.alloc("CPU:0", 4096, I32) for _ in range(2))
    d = rt.alloc("CPU:1", 4096, I32)

    def write(h: HostArrays, _: object) -> None:
        h[c][:] = h[a] * 3

    def read(h: HostArrays, _: object) -> None:
        h[d][:] = h[c]

    writer = await compile_checked(rt, [ag.Launch(TIMES3, [c, a])], [a], write)
    reader = await compile_checked(rt, [ag.Copy(dst=d, src=c)], [], read)
    assert reader.graph.plan.queues[0].device == "CPU:1"
    for _ in range(4):
        calls = [Call(writer, fresh_like(rt, [a])), Call(reader, []), Call(writer, [a])]
        await check_calls(rt, calls, rng, concurrent=True)


@pytest.mark.parametrize("ndevices", [2, 4])
async def test_copies_across_devices(
    rt: ag.Runtime, rng: np.random.Generator, ndevices: int
) -> None:
    # A ring (each device mixes in its neighbour's data), then a gather of every device's
    # result into disjoint views of one buffer on CPU:0, read whole by a last kernel.
    names = [f"CPU:{i}" for i in range(ndevices)]
    src = [rt.alloc(n, 32, I32) for n in names]
    mine = [rt.alloc(n, 32, I32) for n in names]
    theirs = [rt.alloc(n, 32, I32) for n in names]
    gathered = rt.alloc("CPU:0", 32 * ndevices, I32)
    total = rt.alloc("CPU:0", 32 * ndevices, I32)
    parts = [gathered.view(offset=32 * i, size=32) for i in range(ndevices)]
    items: list[Item] = []
    for i in range(ndevices):
        items.append(ag.Launch(ADD1, [mine[i], src[i]]))
    for i in range(ndevices):
        items.append(ag.Copy(dst=theirs[(i + 1) % ndevices], src=mine[i]))
    for i in range(ndevices):
        items.append(ag.Launch(XOR, [src[i], mine[i], theirs[i]]))
        items.append(ag.Copy(dst=parts[i], src=src[i]))
    items.append(ag.Launch(TIMES3, [total, gathered]))

    def reference(h: HostArrays, _: object) -> None:
        for i in range(ndevices):
            h[mine[i]][:] = h[src[i]] + 1
        for i in range(ndevices):
            h[theirs[(i + 1) % ndevices]][:] = h[mine[i]]
        for i in range(ndevices):
            h[src[i]][:] = h[mine[i]] ^ h[theirs[i]]
            h[parts[i]][:] = h[src[i]]
        h[total][:] = h[gathered] * 3

    compiled = await check_replays(rt, items, src, reference, rng)
    assert set(compiled.graph.plan.devices) == set(names)


async def test_offset_views_disjoint_do_not_wait(rt: ag.Runtime, rng: np.random.Generator) -> None:
    x, a, y = (rt.alloc("CPU:0", 64, I32) for _ in range(3))
    low, high = x.view(offset=0, size=32), x.view(offset=32, size=32)
    items = [
        ag.Launch(ADD1, [low, a.view(offset=8, size=32)]),  # CPU:0 compute
        ag.Copy(dst=high, src=y.view(offset=32, size=32)),  # CPU:0 copy: other half of x
    ]

    def reference(h: HostArrays, _: object) -> None:
        h[low][:] = h[a][8:40] + 1
        h[high][:] = h[y][32:]

    compiled = await check_replays(rt, items, [a], reference, rng)
    plan = compiled.graph.plan
    assert plan.item_queue[0] != plan.item_queue[1]
    assert plan.wait_count == 0, f"disjoint views of one buffer must not wait:\n{plan}"


async def test_offset_views_overlapping_wait(rt: ag.Runtime, rng: np.random.Generator) -> None:
    x, a, y = (rt.alloc("CPU:0", 64, I32) for _ in range(3))
    low, middle = x.view(offset=0, size=32), x.view(offset=16, size=32)
    tail = x.view(offset=40, size=24)
    out = rt.alloc("CPU:1", 24, I32)
    items = [
        ag.Launch(ADD1, [low, a.view(offset=8, size=32)]),
        ag.Copy(dst=middle, src=y.view(offset=32, size=32)),  # overlaps low in [16, 32)
        ag.Copy(dst=out, src=tail),  # reads [40, 64): overlaps middle, not low
    ]

    def reference(h: HostArrays, _: object) -> None:
        h[low][:] = h[a][8:40] + 1
        h[middle][:] = h[y][32:]
        h[out][:] = h[x][40:]

    compiled = await check_replays(rt, items, [a, y], reference, rng)
    plan = compiled.graph.plan
    assert waits_between(plan, 0, 1), f"overlapping views must wait:\n{plan}"
    assert waits_between(plan, 1, 2), f"a read of an overlapping view must wait:\n{plan}"
    assert not waits_between(plan, 0, 2), f"tail does not overlap low:\n{plan}"


async def test_replays_back_to_back_from_tasks_with_eager_work_interleaved(
    rt: ag.Runtime, rng: np.random.Generator
) -> None:
    graphs, _ = await _shared_graphs(rt)
    shared_c = graphs[0].items[0].bufs[0]  # written by graph 0, read by graph 2
    shared_d = graphs[1].items[0].bufs[0]  # CPU:1, written by graphs 0 and 1
    bases = bases_of(item for g in graphs for item in g.items)
    host = HostArrays()
    await random_fill(rt, host, bases, rng)
    before = host.copy()

    # Every submission is recorded just before the call that makes it: each of these
    # calls submits synchronously, before its first checkpoint.
    log: list[tuple[Any, ...]] = []
    fresh: list[ag.Buffer] = []

    async def replays(which: int) -> None:
        for _ in range(4):
            inputs = fresh_like(rt, graphs[which].inputs)
            fresh.extend(inputs)
            for buf in inputs:
                data = random_contents(rng, buf)
                log.append(("copyin", buf, data))
                await rt.copyin(buf, data)
            log.append(("graph", which, inputs))
            await graphs[which].graph(inputs)

    async def eager() -> None:
        for step in range(6):
            if step % 3 == 0:
                data = random_contents(rng, shared_c)
                log.append(("copyin", shared_c, data))
                await rt.copyin(shared_c, data)
            elif step % 3 == 1:
                item = ag.Launch(INC, [shared_d])
                log.append(("run", item))
                await rt.run([item])
            else:
                index = len(log)
                log.append(("copyout", shared_d))
                seen[index] = await rt.copyout(shared_d)

    seen: dict[int, np.ndarray] = {}
    async with trio.open_nursery() as nursery:
        for which in (0, 1, 2, 0):
            nursery.start_soon(replays, which)
        nursery.start_soon(eager)
    final = await snapshot(rt, bases + fresh)

    expected_out: dict[int, np.ndarray] = {}

    def model_step(index: int, entry: tuple[Any, ...]) -> None:
        kind = entry[0]
        if kind == "copyin":
            buf, data = entry[1], entry[2]
            if buf.alloc_id not in {b.alloc_id for b in bases}:
                host.load(buf, data)
            else:
                host[buf][...] = data
        elif kind == "graph":
            compiled = graphs[entry[1]]
            compiled.reference(host.rebound(dict(zip(compiled.inputs, entry[2]))), None)
        elif kind == "run":
            host[shared_d][:] += 1
        else:
            expected_out[index] = host[shared_d].copy()

    for index, entry in enumerate(log):
        model_step(index, entry)
    assert seen.keys() == expected_out.keys()
    for index, array in seen.items():
        np.testing.assert_array_equal(array, expected_out[index], err_msg=f"copyout {index}")
    want = {b.alloc_id: host.base_array(b) for b in bases + fresh}
    assert_same("concurrent replays and eager work vs numpy", final, want)

    # Eager, in the recorded order, from the same start.
    for base in bases:
        await rt.copyin(base, before.base_array(base))
    for index, entry in enumerate(log):
        kind = entry[0]
        if kind == "copyin":
            await rt.copyin(entry[1], entry[2])
        elif kind == "graph":
            compiled = graphs[entry[1]]
            await rt.run(rebind_items(compiled.items, dict(zip(compiled.inputs, entry[2]))))
        elif kind == "run":
            await rt.run([entry[1]])
        else:
            np.testing.assert_array_equal(await rt.copyout(shared_d), expected_out[index])
    assert_same("eager in the same order vs numpy", await snapshot(rt, bases + fresh), want)


# -- per-call binding: launch dims, var values, fixedvars -----------------------------------

N = ag.Var("n", 1, 64)
M = ag.Var("m", 0, 1000)


def _dims(out: np.ndarray, n: int, m: int, *, global_size: Any, local_size: Any) -> None:
    out[:] = -1
    out[0:3] = global_size
    out[3:6] = local_size
    out[6] = n
    out[7] = m
    out[8 : 8 + n] = n + m


DIMS = ag.Kernel("dims", cpu=_dims, outs=(0,), pass_dims=True)


async def test_symbolic_dims_and_vars_are_bound_per_call(
    rt: ag.Runtime, rng: np.random.Generator
) -> None:
    first, second = rt.alloc("CPU:0", 80, I32), rt.alloc("CPU:0", 80, I32)
    moved = rt.alloc("CPU:1", 80, I32)
    items = [
        # m fixed here: its launch takes n from the call and 7 for m.
        ag.Launch(
            DIMS,
            [first],
            vars=(N, M),
            fixedvars={M: 7},
            global_size=(ag.cdiv(N, 4), N * 2, 3),
            local_size=(4, (N + 1) // 2),
        ),
        # n fixed here: its launch takes m from the call; dims mix a fixed and a free var.
        ag.Launch(
            DIMS,
            [second],
            vars=(N, M),
            fixedvars={N: 3},
            global_size=(M + N, 1),
            local_size=N - 2,
        ),
        ag.Copy(dst=moved, src=first),
    ]
    values = [(1, 0), (5, 999), (64, 12), (17, 12), (17, 13), (33, 500)]

    def expected(n: int, m: int, gs: Sequence[int], ls: Sequence[int]) -> np.ndarray:
        out = np.full(80, -1, I32)
        out[0:3], out[3:6], out[6], out[7] = gs, ls, n, m
        out[8 : 8 + n] = n + m
        return out

    def reference(h: HostArrays, vals: dict[ag.Var, int] | None) -> None:
        assert vals is not None
        n, m = vals[N], vals[M]
        h[first][:] = expected(n, 7, (-(-n // 4), n * 2, 3), (4, (n + 1) // 2, 1))
        h[second][:] = expected(3, m, (m + 3, 1, 1), (1, 1, 1))
        h[moved][:] = h[first]

    await check_replays(
        rt,
        items,
        [second],
        reference,
        rng,
        replays=len(values),
        var_vals=lambda r: {N: values[r][0], M: values[r][1]},
    )


async def test_same_inputs_new_var_values_relaunch(rt: ag.Runtime) -> None:
    # The replay path that reuses the previous call's bindings must still see new values.
    out = rt.alloc("CPU:0", 80, I32)
    graph = await rt.compile(
        [ag.Launch(DIMS, [out], vars=(N, M), global_size=ag.cdiv(N, 8))], inputs=[out]
    )
    for n, m in [(3, 1), (3, 1), (40, 1), (40, 2), (3, 1)]:
        await graph([out], var_vals={N: n, M: m})
        got = await rt.copyout(out)
        assert got[0] == -(-n // 8) and got[6] == n and got[7] == m
        assert (got[8 : 8 + n] == n + m).all() and (got[8 + n :] == -1).all()


# -- inputs given as views, and views derived from a base input -----------------------------


async def test_input_given_as_a_view(rt: ag.Runtime, rng: np.random.Generator) -> None:
    big = rt.alloc("CPU:0", 100, I32)
    window = big.view(offset=10, size=32)
    other = rt.alloc("CPU:0", 32, I32)
    out = rt.alloc("CPU:1", 32, I32)
    items = [
        ag.Launch(INC, [window]),
        ag.Launch(XOR, [other, window, other]),
        ag.Copy(dst=out, src=window),
    ]

    def reference(h: HostArrays, _: object) -> None:
        h[window][:] += 1
        h[other][:] = h[window] ^ h[other]
        h[out][:] = h[window]

    def make_inputs(r: int) -> list[ag.Buffer]:
        # New inputs are windows at other offsets of new, larger buffers; the rest of
        # each new buffer must come out untouched (the check compares whole buffers).
        return [rt.alloc("CPU:0", 64 + r, I32).view(offset=3 * r + 1, size=32)]

    await check_replays(rt, items, [window], reference, rng, make_inputs=make_inputs)


async def test_views_derived_from_a_base_input_follow_it(
    rt: ag.Runtime, rng: np.random.Generator
) -> None:
    a = rt.alloc("CPU:0", 64, I32)
    low, high, inner = (
        a.view(offset=0, size=32),
        a.view(offset=32, size=32),
        a.view(offset=16, size=32),
    )
    d = rt.alloc("CPU:1", 32, I32)
    e = rt.alloc("CPU:1", 64, I32)
    items = [
        ag.Launch(XOR, [low, high, inner]),  # reads [16, 64), writes [0, 32): in one kernel
        ag.Copy(dst=d, src=inner),
        ag.Copy(dst=e, src=a),
        ag.Launch(INC, [high]),
    ]

    def reference(h: HostArrays, _: object) -> None:
        h[low][:] = h[high] ^ h[inner]
        h[d][:] = h[inner]
        h[e][:] = h[a]
        h[high][:] += 1

    def make_inputs(r: int) -> list[ag.Buffer]:
        if r % 2:
            return [rt.alloc("CPU:0", 100, I32).view(offset=r, size=64)]  # a view as the base
        return [rt.alloc("CPU:0", 64, I32)]

    await check_replays(rt, items, [a], reference, rng, make_inputs=make_inputs)


def test_rebinding_helper_matches_the_runtime_rule() -> None:
    # The tests' own rebinding (used for eager) follows views of a base input only.
    async def main() -> None:
        async with ag.open_runtime(["CPU:0"]) as rt:
            a, b = rt.alloc("CPU:0", 64, I32), rt.alloc("CPU:0", 64, I32)
            v = a.view(offset=5, size=10)
            moved = rebind_buffer(v, {a: b})
            assert moved.alloc_id == b.alloc_id and moved.offset == 5 and moved.shape == (10,)
            assert rebind_buffer(a, {a: b}) is b
            assert rebind_buffer(v, {}) is v

    trio.run(main)
