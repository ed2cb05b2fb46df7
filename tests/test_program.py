"""Program (actorgraph/_program.py): a Plan lowered onto a runtime's actors.

The op lists' base slots follow devices/_ops.py; op lists are lowered once and reused
when nothing in a call changes them; signals say whether the trio side waits on them.
"""

from __future__ import annotations

import numpy as np
from actorgraph.devices import FIRST_QUEUE_SLOT, KICK, SIGNAL, WAIT, SignalOp, WaitOp

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
        assert {op[0] for op in ops} >= {WAIT, SIGNAL}


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
        assert np.shares_memory(first[qi][pos][2][0], a.host_view())
        assert np.shares_memory(second[qi][pos][2][0], other.host_view())
        assert dynamic.bind([a], {})[qi][pos] is not first[qi][pos]  # (Graph caches, not Program)
