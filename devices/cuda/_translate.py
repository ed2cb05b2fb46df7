"""A job's ops as stream commands: what both ways a CUDA queue runs a job share.

A CUDA queue (_queue.py) puts a job on its stream command by command (`_stream_job`)
or as a CUDA graph (`_graph_job`); both take the job's commands from a `Translation`,
an `OpWalker` (devices/_walk.py) over its ops:

- CUDA_ITEM: its commands, as they are (on the stream, skipped once the submission has
  failed; a profiled job's are stamped before and after);
- SIGNAL: a write of the queue's word, and a host function where the trio side waits on
  it (`host`), or, in a graph with no host work of its own, a report from the side
  stream; without stream memory operations, an event and a host function that writes
  the word (`CudaQueueActor.event_signal`);
- WAIT: a wait on a word (`CudaQueueActor.wait_word`: a GPU queue's own, or a mirror
  word that follows a trio-side signal); on the stream, a wait already met is dropped.

The walk stops at what cannot go on the stream as a command: a wait with no word to
wait on, and a host step (EXEC, EXEC_THREAD, AWAIT). The stream path deals with it
there and walks on; a graph cannot hold one, so such a job runs on the stream (a wait on
KICK aside: it is reached when the job is posted, and awaited before the launch).
Any other op is refused (OpCodeError, naming it).

The commands whose value is a wait's target or a signal's value are kept with their op
(`values`: command index, op), so a graph's nodes take each replay's values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

from actorgraph.devices._ops import (
    AWAIT,
    CUDA_ITEM,
    EXEC,
    EXEC_THREAD,
    KICK,
    CudaItem,
    Job,
    SignalOp,
    WaitOp,
    WorkOp,
)
from actorgraph.devices._signal import Signal
from actorgraph.devices._walk import OpWalker

from . import _commands as C

HOST_STEPS = frozenset([EXEC, EXEC_THREAD, AWAIT])


class _Word(Protocol):
    @property
    def device_pointer(self) -> int: ...


class StreamQueue(Protocol):
    """What a translation needs of the queue whose stream it is for (a CudaQueueActor,
    _queue.py)."""

    @property
    def name(self) -> str: ...

    @property
    def op_codes(self) -> frozenset[int]: ...

    @property
    def mem_ops(self) -> bool:
        """Whether its stream can write and wait on words (else it signals with events)."""

    @property
    def signal(self) -> _Word:
        """Its timeline, with the word the stream writes."""

    @property
    def host_signal(self) -> Callable[[], None]:
        """The host function that tells the trio side its word moved."""

    def wait_word(self, signal: Signal, slot: int) -> int | None:
        """The word a wait on `signal` waits on on its stream, or None."""

    def event_signal(self, value: int) -> list[C.Command]:
        """Without stream memory operations: the commands of a signal of `value`."""

    def stamp(self, job: Job, index: int, at_start: bool) -> None:
        """A profiled job's time, as a host function on the stream."""


class Translation(OpWalker):
    """One job's ops as commands for `queue`'s stream (`cmds`), for the stream path or
    for a CUDA graph (`graph`); see the module's docstring.

    - `values`: (command index, op) of each command whose value is the op's wait target
      or signal value;
    - `host_waits`: (op, op index) of the waits on KICK a graph awaits before launch;
    - `reports`: the signals a graph reports from the side stream (`notify`: it has no
      host work of its own, so it never stops its stream for a host function);
    - `items`: the CUDA items walked.
    """

    taker = "a CUDA queue"

    def __init__(self, queue: StreamQueue, job: Job, graph: bool) -> None:
        super().__init__(queue.name)
        self.queue = queue
        self.job = job
        self.bases = job.bases
        self.graph = graph
        self.cmds: list[C.Command] = []
        self.values: list[tuple[int, WaitOp | SignalOp]] = []
        self.host_waits: list[tuple[WaitOp, int]] = []
        self.reports: list[SignalOp] = []
        self.items = 0
        self.notify = graph and not any(
            cmd[0] == C.HOST or (cmd[0] == C.KERNEL and cmd[6] is not None)
            for op in job.ops
            if isinstance(op, CudaItem)
            for cmd in op.commands
        )
        self.profiled = not graph and job.observer is not None

    def wait(self, op: WaitOp, index: int) -> bool:
        target = op.target(self.bases)
        if not self.graph and op.signal.value >= target:
            return True  # met: nothing to put on the stream
        word = self.queue.wait_word(op.signal, op.slot)
        if word is None:
            if self.graph and op.slot == KICK:
                # Set when the job was posted: awaiting it first cannot deadlock.
                self.host_waits.append((op, index))
                return True
            return False
        self.values.append((len(self.cmds), op))
        self.cmds.append((C.WAIT_VALUE, word, target))
        return True

    def signal(self, op: SignalOp, index: int) -> None:
        queue = self.queue
        value = op.value(self.bases)
        if not queue.mem_ops:  # never in a graph: those need stream memory operations
            self.cmds += queue.event_signal(value)
            return
        self.values.append((len(self.cmds), op))
        self.cmds.append((C.WRITE_VALUE, queue.signal.device_pointer, value))
        if not op.host:
            return  # only GPU queues wait on it, on the word: no host function
        if self.notify:
            self.reports.append(op)
        else:  # a host function: it stops the stream until it has run
            self.cmds.append((C.HOST, queue.host_signal))

    def work(self, op: WorkOp, index: int) -> bool:
        if op.code in HOST_STEPS:
            return False  # run on the host once the stream gets there
        if op.code != CUDA_ITEM:
            raise self.refuse(op, index, self.queue.op_codes)
        self.items += 1
        if self.graph:
            self.cmds += op.commands
        elif self.job.submission.error is None:
            if self.profiled:
                stamp = self.queue.stamp
                self.cmds.append((C.HOST, functools.partial(stamp, self.job, index, True)))
                self.cmds += op.commands
                self.cmds.append((C.HOST, functools.partial(stamp, self.job, index, False)))
            else:
                self.cmds += op.commands
        return True
