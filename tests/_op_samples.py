"""Sample ops of every code, run as one-op jobs on a queue: for the op-format tests."""

from __future__ import annotations

import functools
from collections.abc import Callable

import trio
import trio.testing
from actorgraph.devices import HoldingSignal, InlineRun, QueueActor, Resumer, run_inline
from actorgraph.devices._ops import (
    AWAIT,
    CUDA_ITEM,
    EXEC,
    EXEC_THREAD,
    FIRST_QUEUE_SLOT,
    OP_NAMES,
    SIGNAL,
    SIM_RUN,
    WAIT,
    WIRE,
    Job,
    JobProfile,
    Op,
    Submission,
    cuda_item,
    run_op,
    signal_op,
    sim_run,
    wait_op,
)
from actorgraph.devices._signal import Signal
from actorgraph.devices.cuda import _commands as C
from actorgraph.devices.remote import RemoteQueue


class OpSampler:
    """The sample ops of one queue: each records its code when it runs."""

    def __init__(self, actor: QueueActor) -> None:
        self.actor = actor
        self.ran: list[int] = []
        self.gate = Signal("gate", 0)  # what the sample WAIT waits on: set after posting

    def note(self, code: int) -> None:
        self.ran.append(code)

    async def note_async(self, job: Job, code: int) -> None:
        await trio.lowlevel.checkpoint()
        self.ran.append(code)

    def op(self, code: int, wire: Callable[[], Op] | None) -> tuple[Op | None, int]:
        """A sample op of `code` (None: the job's own SIGNAL is the sample) and the number
        of items it runs."""
        if code == SIGNAL:
            return None, 0
        if code == WAIT:
            return wait_op(self.gate, FIRST_QUEUE_SLOT + 1, 1), 0
        if code in (EXEC, EXEC_THREAD):
            return run_op(code, self.note, (code,), 0), 1
        if code == AWAIT:
            return run_op(AWAIT, self.note_async, (code,), 0), 1
        if code == SIM_RUN:
            return sim_run(self.note, (code,), 0, 1e-3), 1
        if code == CUDA_ITEM:
            return cuda_item(((C.HOST, functools.partial(self.note, code)),), 0), 1
        if code == WIRE:
            assert wire is not None
            return wire(), 1
        raise AssertionError(f"no sample op for {OP_NAMES[code]}")

    async def run(
        self,
        code: int,
        profiled: bool,
        wire: Callable[[], Op] | None = None,
        inline: bool = False,
        held: bool = False,
    ) -> None:
        """Run a job of the sample op of `code` (and the queue's own SIGNAL): posted to
        the actor (its plain or profiled loop), or with `inline` run in this task as a
        submission on idle queues is (devices.run_inline), handing off what it cannot run,
        or with `held` held on a signal first and run on by the task that moves it (a
        worker's held jobs: devices.InlineRun and Resumer)."""
        actor = self.actor
        sample, count = self.op(code, wire)
        ops: list[Op] = [] if sample is None else [sample]
        ops.append(signal_op(actor.signal, FIRST_QUEUE_SLOT, count))
        holder = HoldingSignal("holder", 0, Resumer())
        if held:
            ops.insert(0, wait_op(holder, FIRST_QUEUE_SLOT + 2, 1))
        base = actor.reserve(count)
        # KICK, BATCH, this queue, the gate, the signal a held job is held on
        bases = [0, 0, base, self.gate.value, 0]
        sub = Submission(1, [], [], [()], [])
        profile = JobProfile() if profiled else None
        job = Job(tuple(ops), bases, sub, 0, profile)
        if inline:
            assert actor.runs_inline and actor.idle
            run_inline([actor], [job])
        elif held:
            assert actor.runs_inline and actor.idle
            holder.resumer.start(InlineRun([actor], [job]))
            assert not sub.done.is_set() and not actor.idle  # held there, on the actor
            holder.set(1)  # runs it on, in this task, as far as it goes without a task
        else:
            actor.post(job)
            actor.flush()  # a submission's posts end so (a REMOTE queue sends them here)
        if code == WAIT:
            await trio.testing.wait_all_tasks_blocked()
            assert not sub.done.is_set()  # parked on the gate
            self.gate.set(self.gate.value + 1)
        await sub.done.wait()
        assert sub.error is None, (OP_NAMES[code], profiled, sub.error)
        assert actor.signal.value == base + count
        if code not in (WAIT, SIGNAL, WIRE):
            assert self.ran[-1] == code
        if profile is not None and not isinstance(actor, RemoteQueue):
            assert profile.start is not None and profile.end is not None
            if count:
                assert [span[0] for span in profile.spans] == [0], OP_NAMES[code]
