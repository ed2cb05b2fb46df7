"""Program (actorgraph/_program.py): a Plan lowered onto a runtime's actors.

The op lists' base slots follow devices/_ops.py; op lists are lowered once and reused
when nothing in a call changes them; signals say whether the trio side waits on them.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from actorgraph.devices import FIRST_QUEUE_SLOT, KICK, SIGNAL, WAIT, Op, RunOp, SignalOp, WaitOp

import actorgraph as ag
from actorgraph._program import Program

INC = ag.Kernel("inc", cpu=lambda x: np.add(x, 1, out=x), outs=(0,), ins=(0,))


async def _program(rt: ag.Runtime, inputs: bool) -> tuple[Program, ag.Buffer]:
    a, b = rt.alloc("CPU:0", 4, np.int32), rt.alloc("CPU:1", 4, np.int32)
    graph = await rt.compile(
        [ag.Launch(INC, [a]), ag.Copy(dst=b, src=a)], inputs=[a] if inputs else []
    )
    return graph._program, a


async def test_waits_and_signals_name_the_slots_of_ops() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        program, _ = await _program(rt, inputs=False)
        nqueues = len(program.actors)
        assert program.nbases == FIRST_QUEUE_SLOT + nqueues + len(program.devices)
        ops = [op for t in program.templates for op in t]
        kick_waits = [op for op in ops if isinstance(op, WaitOp) and op.slot == KICK]
        assert len(kick_waits) == nqueues and all(op.signal is rt.kick for op in kick_waits)
        for qi, template in enumerate(program.templates):
            signals = [op for op in template if isinstance(op, SignalOp)]
            assert signals and all(op.slot == FIRST_QUEUE_SLOT + qi for op in signals)
            assert all(op.signal is program.actors[qi].signal for op in signals)
        assert {op.code for op in ops} >= {WAIT, SIGNAL}


async def test_a_signal_says_whether_the_trio_side_waits_on_it() -> None:
    # CPU:1's copy queue waits on CPU:0's compute signal: that signal must reach the trio
    # side; the copy queue's own signal has no waiter in the plan.
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        program, _ = await _program(rt, inputs=False)
        waited = {
            op.slot - FIRST_QUEUE_SLOT
            for t in program.templates
            for op in t
            if isinstance(op, WaitOp)
            and op.slot >= FIRST_QUEUE_SLOT
            and op.slot - FIRST_QUEUE_SLOT < len(program.actors)
        }
        for qi, template in enumerate(program.templates):
            for op in template:
                if isinstance(op, SignalOp):
                    assert op.host == (qi in waited), (qi, op)


async def test_op_lists_are_lowered_once_and_rebound_only_where_inputs_go() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        static, _ = await _program(rt, inputs=False)
        assert static.bind([], {}) is static.bind([], {}) is static.static_bound
        dynamic, a = await _program(rt, inputs=True)
        assert dynamic.static_bound is None
        other = rt.alloc("CPU:0", 4, np.int32)
        first, second = dynamic.bind([a], {}), dynamic.bind([other], {})
        assert sorted(dynamic.dynamic) == [0, 1]  # both items touch the input
        qi, pos = dynamic.where[0]  # the launch: lowered per call, onto that call's input
        launches = first[qi][pos], second[qi][pos]
        assert isinstance(launches[0], RunOp) and isinstance(launches[1], RunOp)
        assert np.shares_memory(launches[0].args[0], a.host_view())
        assert np.shares_memory(launches[1].args[0], other.host_view())
        assert dynamic.bind([a], {})[qi][pos] is not first[qi][pos]  # (Graph caches, not Program)


ADD_N = ag.Kernel("add_n", cpu=lambda x, n: np.add(x, n, out=x), outs=(0,), ins=(0,))
COPY = ag.Kernel("copy", cpu=lambda out, x: np.copyto(out, x), outs=(0,), ins=(1,))
TIMES_N = ag.Kernel("times_n", cpu=lambda x, n: np.multiply(x, n, out=x), outs=(0,), ins=(0,))
DIMS = ag.Kernel(  # y = w + n * global_size[0]: a body that takes its launch dims
    "dims",
    cpu=lambda y, w, n, global_size, local_size: np.add(w, n * global_size[0], out=y),
    outs=(0,),
    ins=(1,),
    pass_dims=True,
)


def _items(x: ag.Buffer, w: ag.Buffer, y: ag.Buffer, n: ag.Var) -> list[Any]:
    return [
        ag.Launch(ADD_N, [x], vars=[n]),  # on the input, reads n
        ag.Launch(COPY, [w, x]),  # reads the input, no var
        ag.Launch(TIMES_N, [w], vars=[n]),  # on the graph's own buffer, reads n
        ag.Launch(DIMS, [y, w], vars=[n], global_size=(n,)),
    ]


def _same_op(got: Op, want: Op) -> bool:
    """Two lowered CPU ops call the same body on the same memory with the same values."""
    assert isinstance(got, RunOp) and isinstance(want, RunOp)  # what CPU devices lower to
    if got.code != want.code or got.item != want.item or len(got.args) != len(want.args):
        return False
    if got.fn != want.fn and not (  # a body given its dims is a new partial per lowering
        isinstance(got.fn, functools.partial)
        and isinstance(want.fn, functools.partial)
        and (got.fn.func, got.fn.keywords) == (want.fn.func, want.fn.keywords)
    ):
        return False
    for a, b in zip(got.args, want.args):
        if isinstance(b, np.ndarray):
            if not (isinstance(a, np.ndarray) and a.shape == b.shape and np.shares_memory(a, b)):
                return False
        elif a != b:
            return False
    return True


async def test_a_binding_made_from_a_kept_one_lowers_only_what_the_change_touches() -> None:
    n = ag.Var("n", 1, 8)
    async with ag.open_runtime(["CPU:0"]) as rt:
        x, w, y, other = (rt.alloc("CPU:0", 4, np.int64) for _ in range(4))
        program = (await rt.compile(_items(x, w, y, n), inputs=[x]))._program
        first = program.bind([x], {n: 2})
        for inputs, value in (([x], 5), ([other], 2), ([other], 7), ([x], 2)):
            kept = program.bind(inputs, {n: value}, first)
            fresh = program.bind(inputs, {n: value})
            for j in range(4):
                qi, pos = program.where[j]
                assert _same_op(kept[qi][pos], fresh[qi][pos]), (inputs, value, j)
            qi, pos = program.where[1]
            # The copy reads no var: on the same input it is the kept op itself.
            assert (kept[qi][pos] is first[qi][pos]) == (inputs[0] is x)


async def test_replays_with_new_inputs_and_values_match_eager_runs() -> None:
    n = ag.Var("n", 1, 8)
    async with ag.open_runtime(["CPU:0"]) as rt:
        pool = [rt.alloc("CPU:0", 4, np.int64) for _ in range(3)]
        w, y = rt.alloc("CPU:0", 4, np.int64), rt.alloc("CPU:0", 4, np.int64)
        graph = await rt.compile(_items(pool[0], w, y, n), inputs=[pool[0]])
        # New inputs, the same inputs with new values, and back again.
        for call in range(12):
            x, value = pool[call % len(pool)], 1 + (call * 5) % 8
            start = np.arange(4, dtype=np.int64) * (call + 1)
            await rt.copyin(x, start)
            await graph([x], {n: value})
            got = [(await rt.copyout(b)).tolist() for b in (x, w, y)]
            await rt.copyin(x, start)
            await rt.run(_items(x, w, y, n), {n: value})
            assert got == [(await rt.copyout(b)).tolist() for b in (x, w, y)]
            assert got[2] == [(s + value) * value + value * value for s in start.tolist()]
