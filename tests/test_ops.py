"""The op format (devices/_ops.py): one table of codes, and every queue runs all of its own.

What the codes mean is one function (`step`, devices/_step.py); every code a kind of queue
says it runs (`op_codes`) goes through each of its drivers: the actor's own task, with a
profiling observer and without, a submission run inline on idle queues (`run_inline`,
which runs what it can in the submitter's task and hands the rest to the actor), and a
job held on a signal and run on by the task that moves it (a worker's), for every device
kind.
(The REMOTE queue's run is in test_remote.py, beside the workers it needs.)
"""

from __future__ import annotations

import pytest
import trio
from _op_samples import OpSampler
from actorgraph.devices import _ops
from actorgraph.devices._actor import QueueActor
from actorgraph.devices._ops import (
    AWAIT,
    EXEC,
    EXEC_THREAD,
    FIRST_QUEUE_SLOT,
    OP_NAMES,
    OP_TYPES,
    SIGNAL,
    WAIT,
    Op,
    OpCodeError,
    cuda_item,
    run_op,
    signal_op,
    sim_run,
    wait_op,
    wire_op,
)
from actorgraph.devices._signal import Signal
from actorgraph.devices.cuda._fake import FakeDriver
from actorgraph.devices.remote.wire import KernelEntry
from actorgraph.scheduler import QueueKind

import actorgraph as ag

GUARD = 30  # seconds: a hang guard only (CUDA runs on the fake driver's threads)


def test_the_table_names_every_code_once() -> None:
    assert set(OP_NAMES) == set(OP_TYPES)
    assert len(set(OP_NAMES.values())) == len(OP_NAMES)  # no two codes share a name
    for code, name in OP_NAMES.items():
        assert getattr(_ops, name) == code
    assert _ops.HOST_OPS <= set(OP_NAMES)


def test_builders_make_the_shape_of_their_code() -> None:
    signal = Signal("s")
    built: list[Op] = [
        wait_op(signal, FIRST_QUEUE_SLOT, 1),
        signal_op(signal, FIRST_QUEUE_SLOT, 1),
        run_op(EXEC, print, (), 0),
        run_op(EXEC_THREAD, print, (), 0),
        run_op(AWAIT, print, (), 0),
        sim_run(print, (), 0, 1.0),
        cuda_item((), 0),
        wire_op(KernelEntry(0, "k", [], [], [1, 1, 1], [1, 1, 1]), 0),
    ]
    assert sorted(op.code for op in built) == sorted(OP_NAMES)
    for op in built:
        assert type(op) is OP_TYPES[op.code]
        if op.code != WAIT and op.code != SIGNAL:
            assert op.item == 0
    assert signal_op(signal, 2, 1).host is True


def test_a_waits_target_and_a_signals_value_are_their_base_plus_rel() -> None:
    signal = Signal("s")
    bases = [7, 0, 100, 200]
    assert wait_op(signal, FIRST_QUEUE_SLOT + 1, 3).target(bases) == 203
    assert signal_op(signal, FIRST_QUEUE_SLOT, 5).value(bases) == 105


def test_ops_are_immutable() -> None:
    op = wait_op(Signal("s"), FIRST_QUEUE_SLOT, 1)
    with pytest.raises(AttributeError):
        op.rel = 2  # type: ignore[misc]


def test_a_queue_given_a_code_it_does_not_run_names_it() -> None:
    actor = QueueActor("q")
    with pytest.raises(
        OpCodeError, match=r"q: op 0 has op code CUDA_ITEM, which a QueueActor does not run"
    ):
        trio.run(actor._run_device_op, cuda_item((), 0), None, 1)


@pytest.mark.parametrize("name", ["CPU:0", "SIM:0", "CUDA:0"])
@pytest.mark.parametrize("loop", ["plain", "profiled", "inline", "held"])
async def test_every_code_of_a_local_queue_runs_in_every_loop(name: str, loop: str) -> None:
    with trio.fail_after(GUARD):
        async with ag.open_runtime([name], cuda_driver=FakeDriver()) as rt:
            device = rt.device(name)
            for kind in (QueueKind.COMPUTE, QueueKind.COPY):
                actor = device.queues.get(kind)
                if actor is None:
                    continue
                sampler = OpSampler(actor)
                for code in sorted(actor.op_codes):
                    if loop in ("inline", "held") and not actor.runs_inline:
                        continue  # its kind runs jobs its own way: never inline
                    await sampler.run(
                        code, loop == "profiled", inline=loop == "inline", held=loop == "held"
                    )
                assert set(actor.op_codes) <= set(OP_NAMES)
