"""Random jit caches over up to 6 CPU devices, split into several graphs.

A chaos run replays them with faults injected: kernels that raise at random items, calls
cancelled at random checkpoints (and, in tests/test_connection.py, a worker killed mid-replay).

Every plan must verify, and every round of graph calls (fresh inputs, fresh contents,
issued concurrently) must equal eager `rt.run` and the host model (tests/_model.py).
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import trio
from _model import (
    DTYPE,
    SALT,
    HostArrays,
    ProgramSpec,
    apply_item,
    assert_same,
    build_items,
    check_program,
    random_fill,
    random_programs,
    rebind_items,
    snapshot,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import actorgraph as ag

CPU_DEVICES = [f"CPU:{i}" for i in range(6)]
# Each example takes milliseconds: explore several times the profile's budget.
MANY = settings(max_examples=5 * settings().max_examples)


def run_spec(device_names: list[str], spec: ProgramSpec, **options: object) -> None:
    async def main() -> None:
        async with ag.open_runtime(device_names, **options) as rt:
            await check_program(rt, device_names, spec)

    trio.run(main)


@MANY
@given(random_programs(max_devices=6))
def test_random_graphs_match_eager_and_model(spec: ProgramSpec) -> None:
    run_spec(CPU_DEVICES, spec)


@MANY
@given(random_programs(max_devices=4, max_items=16), st.sampled_from((0, 64, 200)))
def test_random_graphs_on_worker_threads(spec: ProgramSpec, thread_bytes: int) -> None:
    # Items touching at least `thread_bytes` bytes run on their actor's worker thread, so
    # queues really overlap in time and a missing wait or sync shows up as wrong data.
    run_spec(CPU_DEVICES[:4], spec, cpu_thread_bytes=thread_bytes)


@given(random_programs(max_devices=4), st.integers(1, 1 << 40))
def test_random_graphs_with_timelines_near_a_large_start(spec: ProgramSpec, start: int) -> None:
    # Signal values are replay-relative; a timeline that does not start at 0 must not matter.
    run_spec(CPU_DEVICES[:4], spec, timeline_start=start)


# -- chaos: faults and cancellations at random places -----------------------------------------


class ChaosFault(Exception):
    """What an armed chaos kernel raises."""


def _chaos_kernel(kernel: ag.Kernel, index: int, armed: set[int]) -> ag.Kernel:
    """`kernel` with a body that raises while item `index` is armed (same name: the host
    model looks kernels up by name)."""
    body = kernel.cpu
    assert body is not None

    def chaotic(*args: object) -> None:
        if index in armed:
            raise ChaosFault(f"injected into item {index}")
        body(*args)

    return attrs.evolve(kernel, cpu=chaotic)


async def _cancel_after(scope: trio.CancelScope, checkpoints: int) -> None:
    for _ in range(checkpoints):
        await trio.lowlevel.checkpoint()
    scope.cancel()


async def chaos_program(
    rt: ag.Runtime, device_names: list[str], spec: ProgramSpec, seed: int, rounds: int = 5
) -> None:
    """Replay `spec`'s graphs for several rounds, each clean, with a kernel that raises at a
    random item, or with a call cancelled after a random number of checkpoints. Nothing
    may hang; a fault is reported as the ItemError of that very item; no call that
    returns normally leaves a wrong result; afterwards the runtime works."""
    rng = np.random.default_rng(seed)
    armed: set[int] = set()
    buffers = [rt.alloc(device_names[d], spec.buffer_size, DTYPE) for d in spec.buffer_devices]
    items = build_items(spec, buffers)
    items = [
        _chaos_kernel_item(item, j, armed) if isinstance(item, ag.Launch) else item
        for j, item in enumerate(items)
    ]
    graphs = []
    for (lo, hi), input_ids in zip(spec.chunks(), spec.graph_inputs):
        inputs = [buffers[b] for b in input_ids]
        graphs.append((await rt.compile(items[lo:hi], inputs=inputs), lo, hi, inputs))
    host = HostArrays()
    await random_fill(rt, host, buffers, rng)
    actions = ["clean", "fault", "cancel"]
    for round_index in range(rounds):
        action = actions[int(rng.integers(0, 3))] if round_index < rounds - 1 else "clean"
        gi = int(rng.integers(0, len(graphs)))
        graph, lo, hi, inputs = graphs[gi]
        fresh = [rt.alloc(b.device, b.shape, b.dtype) for b in inputs]
        await random_fill(rt, host, fresh, rng)
        tracked = list(buffers) + fresh
        salt = int(rng.integers(0, 1001))
        uses_salt = any(SALT in item.free_vars() for item in items[lo:hi])
        var_vals = {SALT: salt} if uses_salt else None
        bound = rebind_items(items[lo:hi], dict(zip(inputs, fresh)))
        launches = [j for j in range(lo, hi) if isinstance(items[j], ag.Launch)]
        if action == "fault" and launches:
            victim = launches[int(rng.integers(0, len(launches)))]
            armed.add(victim)
            with pytest.raises(ag.ItemError) as info:
                await graph(fresh, var_vals=var_vals)
            armed.clear()
            assert info.value.index == victim - lo, (info.value, victim, lo)
            assert isinstance(info.value.__cause__, ChaosFault)
            # What the failed replay left is undefined: start again from known contents.
            await random_fill(rt, host, tracked, rng)
            continue
        if action == "cancel":
            submitted_before = graph.replays
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_after, scope, int(rng.integers(0, 6)))
                    await graph(fresh, var_vals=var_vals)
            if graph.replays == submitted_before:
                bound = []  # cancelled before it submitted: it submitted nothing
        else:
            await graph(fresh, var_vals=var_vals)
        for item in bound:
            apply_item(host, item, var_vals or {})
        # Host copies come after the (possibly abandoned) replay on every device.
        got = await snapshot(rt, tracked)
        want = {b.alloc_id: host.base_array(b) for b in tracked}
        assert_same(f"round {round_index} ({action})", got, want)
    assert not armed


def _chaos_kernel_item(item: ag.Launch, index: int, armed: set[int]) -> ag.Launch:
    return ag.Launch(
        _chaos_kernel(item.kernel, index, armed),
        item.bufs,
        vars=item.vars,
        fixedvars=item.fixedvars,
        global_size=item.global_size,
        local_size=item.local_size,
    )


@given(
    random_programs(max_devices=4, max_items=12),
    st.integers(0, 2**32 - 1),
    st.sampled_from((0, 1 << 20)),
)
def test_chaos_faults_and_cancellations(spec: ProgramSpec, seed: int, thread_bytes: int) -> None:
    async def main() -> None:
        with trio.fail_after(60):  # a hang fails instead of stalling
            async with ag.open_runtime(CPU_DEVICES[:4], cpu_thread_bytes=thread_bytes) as rt:
                await chaos_program(rt, CPU_DEVICES[:4], spec, seed)
                assert rt.in_flight == 0

    trio.run(main)
