"""Random jit caches over up to 6 CPU devices, split into several graphs.

Every plan must verify, and every round of graph calls (fresh inputs, fresh contents,
issued concurrently) must equal eager `rt.run` and the host model (tests/_model.py).
"""

from __future__ import annotations

import trio
from _model import ProgramSpec, check_program, random_programs
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
