"""CUDA queue actors: a trio task per stream that turns plan messages into stream work.

How a queue's timeline signal lives on both sides (the bridge)
---------------------------------------------------------------
Each CUDA queue owns one 64-bit word in pinned host memory mapped into every device's
address space (`MappedSignal.word`). The GPU is the only writer: a plan's `Signal`
becomes cuStreamWriteValue64 on the queue's stream, so the word holds how far the GPU
really got. Another CUDA queue waits on it with cuStreamWaitValue64 (GEQ) on its own
stream: cross-queue and cross-device order costs the host nothing, and a replay runs
on the GPUs without the host in the loop.

The trio side sees the same timeline through the `Signal` base class that `MappedSignal`
extends: its `value` is a mirror of the word, moved forward only from the word itself.
After each write the stream runs a host function that asks the trio thread (through the
trio token) to copy the word into the mirror; that wakes CPU actors (and anything else
on the trio side) waiting for the value. So the mirror never runs ahead of the GPU, and
a satisfied mirror proves the word is satisfied too.

In the other direction, a CUDA queue waiting on a signal that only the trio side sets (a
CPU actor's queue, a device timeline) waits on a *mirror word*: mapped memory that the
device keeps equal to that signal (`CUDADevice.mirror`: one trio task per mirrored
signal, woken once per advance of it, stores the new value with a host write). The
stream waits on the mirror as on any GPU queue's word, so the whole job, waits
included, is on the stream before its first item runs: back-to-back replays and mixed
CPU/GPU plans queue up on the GPU. The runtime's KICK is set before any job runs and is
the only signal still checked on the host (for free: it is always reached).

Without CAN_USE_64_BIT_STREAM_MEM_OPS a stream can neither write nor wait on a word:
each signal point records an event (and a host function writes the word for the trio
mirror); a CUDA waiter, once that record has been enqueued, waits on the event, and
waits on trio-side signals go back to the host (awaited before the rest is enqueued).

Job completion: the last command of every job is a host function that tells the trio
thread to finish the oldest job in flight (streams are in order, so completions come
in submission order). Until then the submission is not done and the device timeline
does not move, so eager work and later replays stay ordered after it.

A job goes on the stream command by command (`_stream_job`) or as a CUDA graph
(`_graph_job`); both take its commands from one translation of its ops (_translate.py).
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import functools
import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import trio
from actorgraph.devices._actor import QueueActor
from actorgraph.devices._ops import (
    AWAIT,
    CUDA_ITEM,
    EXEC,
    EXEC_THREAD,
    KICK,
    SIGNAL,
    WAIT,
    ActorClosedError,
    Job,
    OpCodeError,
    Script,
    Submission,
    WaitOp,
)
from actorgraph.devices._signal import Signal
from actorgraph.devices._step import step

from . import _commands as C
from ._driver import CudaDriver, CudaError
from ._translate import HOST_STEPS, Translation

if TYPE_CHECKING:
    from ._device import CUDADevice

# Jobs with at least this many items replay as a CUDA graph (see `_graph_job`).
DEFAULT_GRAPH_MIN_ITEMS = 2
_GRAPH_CACHE = 8
_u64 = ctypes.c_uint64
_RECORD = -1  # (_RECORD, event, value): event fallback, handled in `_flush`


class OnStream(NamedTuple):
    """What a queue keeps with an op list (`Script.keep`) that it runs on its stream
    rather than as a CUDA graph, and why (where it runs one as a graph, it keeps the
    serial of that graph in its cache instead)."""

    why: str


class MappedSignal(Signal):
    """A queue's timeline: the GPU-written word in mapped memory plus its trio mirror."""

    __slots__ = ("device_pointer", "owner", "word")

    def __init__(
        self,
        name: str,
        value: int,
        word: np.ndarray[Any, Any],
        device_pointer: int,
        owner: CudaQueueActor,
    ) -> None:
        super().__init__(name, value)
        self.word = word
        self.device_pointer = device_pointer
        self.owner = owner
        word[0] = value

    def gpu_value(self) -> int:
        return int(self.word[0])

    def write_word(self, value: int) -> None:
        """Write `value` into the word, as the GPU would (the host does it where the
        stream cannot write memory: the event fallback)."""
        self.word[0] = value


class _GraphEntry:
    """One job shape of this queue, built into a CUDA graph and instantiated once; the
    queue's graph cache (`CudaQueueActor._graphs`) is its one owner."""

    __slots__ = (
        "cmds",
        "exec",
        "graph",
        "host_waits",
        "items",
        "nodes",
        "notify",
        "reports",
        "value_nodes",
    )

    def __init__(self, translation: Translation) -> None:
        self.graph: Any = None
        self.exec: Any = None
        self.nodes: list[Any] = []
        self.cmds = translation.cmds
        # (node index, op): the mem-op values bound per replay, each its op's wait target
        # or signal value.
        self.value_nodes = translation.values
        # (op, op index): host-side waits (on KICK), before launch.
        self.host_waits = translation.host_waits
        self.items = translation.items
        # A graph with no host work of its own (no staging copies, no host bodies) tells
        # the host from a side stream, so its stream never stops for a callback:
        # `notify`, and the signals to report.
        self.notify = translation.notify
        self.reports = translation.reports

    def built(self, graph: Any, nodes: list[Any], graph_exec: Any) -> None:
        """Its commands were built into `graph` (`nodes`, one per command) and
        instantiated as `graph_exec`."""
        self.graph, self.nodes, self.exec = graph, nodes, graph_exec

    def runs(self, other: _GraphEntry) -> None:
        """Its graph, its nodes updated to `other`'s commands (of the same shape), runs
        `other`'s op list from now on: take `other`'s commands and bookkeeping, keeping
        this graph, its nodes and its instance."""
        self.cmds = other.cmds
        self.value_nodes = other.value_nodes
        self.host_waits = other.host_waits
        self.items = other.items
        self.notify = other.notify
        self.reports = other.reports


class CudaQueueActor(QueueActor):
    """A compute or copy queue of one GPU: owns a non-blocking stream and a mapped word."""

    op_codes = frozenset([WAIT, SIGNAL, CUDA_ITEM, EXEC, EXEC_THREAD, AWAIT])

    def __init__(self, name: str, device: CUDADevice, timeline_start: int = 0) -> None:
        super().__init__(name, timeline_start)
        self.device = device
        self.driver: CudaDriver = device.driver
        self.context = device.context
        self.stream = self.driver.stream_create()
        self.mem_ops = device.mem_ops
        host_pointer, device_pointer = self.driver.host_alloc_mapped(8)
        self._word_host_pointer = host_pointer
        word = np.ctypeslib.as_array((_u64 * 1).from_address(host_pointer))
        self.signal: MappedSignal = MappedSignal(name, timeline_start, word, device_pointer, self)
        # Event fallback: (value, event) per signal point whose record was enqueued.
        self.enqueued = Signal(f"{name}/enqueued", timeline_start)
        self._event_values: list[int] = []
        self._events: list[Any] = []
        self._event_pool: list[Any] = []
        self._in_flight: collections.deque[Job] = collections.deque()
        self._gpu_jobs_done = 0  # counted on the stream's thread
        self._host_jobs_done = 0  # counted on the trio thread
        self._faults: list[tuple[int, int, BaseException]] = []
        self._faults_lock = threading.Lock()
        # The graphs built, by serial number, least recently used first: their one owner.
        # A Script keeps the serial of the one it was last run as, or why it runs on the
        # stream (OnStream; `_graph_entry`). A graph updated for another op list is filed
        # under a new serial, so the serial an op list keeps names its graph or none.
        self._graphs: collections.OrderedDict[int, _GraphEntry] = collections.OrderedDict()
        self._serials = itertools.count()
        self.graph_min_items = int(
            device.options.get("cuda_graph_min_items", DEFAULT_GRAPH_MIN_ITEMS)
        )
        self.use_graphs = bool(device.options.get("cuda_graphs", True))
        self.graph_launches = 0
        self.graph_builds = 0
        self.graph_refusals = 0  # jobs the driver would not build as a graph (run on the stream)
        # Bound once: host functions and graph host nodes keep the same identity.
        self.host_signal: Callable[[], None] = self._on_signal_written
        self._host_job_end: Callable[[], None] = self._on_job_end
        self._host_notified_end: Callable[[], None] = self._on_notified_end
        # The side stream that reports graph jobs' signals and ends (created when needed),
        # and (job, event) for each such job in flight, oldest first.
        self._notify: Any = None
        self._notified: collections.deque[tuple[Job, Any]] = collections.deque()
        self._end_events: list[Any] = []
        self._stamp_start = 0.0  # profiling: when the stream reached the current item
        # A host step waits for the stream to get to it (`_drain`): the stream is busy
        # meanwhile, though no job of this queue is in flight on it.
        self._draining = False
        self._left_busy = False  # abandoned with work still on the stream

    # -- host functions: these run on the stream's (driver's) thread --

    def run_body(self, item: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """A kernel's CPU body, run by a driver without a GPU; a raise fails the item."""
        try:
            fn(*args)
        except Exception as exc:  # handed to the submission in `_finish_oldest`
            self._fault(item, exc)

    def copy_on_host(self, item: int, dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
        try:
            np.copyto(dst, src, casting="no")
        except Exception as exc:
            self._fault(item, exc)

    def _fault(self, item: int, exc: BaseException) -> None:
        # Tagged with the index of the job the stream is in (jobs end in order).
        with self._faults_lock:
            self._faults.append((self._gpu_jobs_done, item, exc))

    def _on_signal_written(self) -> None:
        self._to_trio(self._sync_mirror)

    def _on_job_end(self) -> None:
        self._gpu_jobs_done += 1
        self._to_trio(self._finish_oldest)

    def _on_notified_end(self) -> None:
        # A job with no host work of its own: it has no faults to match, so it is not
        # counted with the jobs whose faults are (see `_fault`).
        self._to_trio(self._finish_oldest)

    def _to_trio(self, fn: Callable[[], None]) -> None:
        token = self._token
        if token is None:
            return
        try:
            token.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass  # the runtime is gone; nobody waits any more

    # -- trio side of the bridge --

    def _sync_mirror(self) -> None:
        value = self.signal.gpu_value()
        self.signal.set(value)
        # Events of signal points the GPU has passed are never waited on again.
        if self._event_values and self._event_values[0] <= value:
            cut = bisect.bisect_right(self._event_values, value)
            self._event_pool.extend(self._events[:cut])
            del self._events[:cut], self._event_values[:cut]

    def _finish_oldest(self) -> None:
        self._sync_mirror()
        if not self._in_flight:
            return
        job = self._in_flight.popleft()
        if self._notified and self._notified[0][0] is job:
            self._end_events.append(self._notified.popleft()[1])
            job.submission.job_done(job.slot)
            return
        index = self._host_jobs_done
        self._host_jobs_done += 1
        if self._faults:  # a fault of this job was recorded before its end marker ran
            with self._faults_lock:
                mine = [f for f in self._faults if f[0] == index]
                self._faults = [f for f in self._faults if f[0] > index]
            for _, item, exc in mine:
                job.submission.fail(item, self.name, exc)
        job.submission.job_done(job.slot)

    def _abandon(self) -> None:
        self._left_busy = self.gpu_busy
        super()._abandon()
        self._notified.clear()
        while self._in_flight:
            self._in_flight.popleft().submission.abandon(
                self.name,
                ActorClosedError(f"{self.name} was shut down while the GPU still ran this work"),
            )

    def waits_without_host(self, other: QueueActor) -> bool:
        # Words (both with stream memory operations) or events (both without).
        return isinstance(other, CudaQueueActor) and other.mem_ops == self.mem_ops

    # -- what the deadlock monitor sees: work on the GPU is pending work too --

    @property
    def busy(self) -> bool:
        return self._current is not None or bool(self._inbox) or bool(self._in_flight)

    @property
    def gpu_busy(self) -> bool:
        return bool(self._in_flight) or self._draining or self._left_busy

    def pending(self) -> list[tuple[Job, int]]:
        # From op 0: replaying an enqueued part again in the monitor's abstract run is
        # harmless (signals only move forward), and its GPU waits may still be pending.
        out = [(job, 0) for job in self._in_flight]
        if self._current is not None:
            out.append((self._current, 0))
        out.extend((job, 0) for job in self._inbox)
        return out

    # -- running a job --

    # EXEC, EXEC_THREAD and AWAIT are host steps: they run once the stream has run all
    # that comes before them (a worker's programs report to their client this way).
    runs_inline = False

    async def _run_job(self, job: Job) -> None:
        # The job goes onto the stream (as a CUDA graph where it can); it ends when the
        # stream gets through it (`_finish_oldest`). Counted as taken now.
        self.counted(job)
        observer = job.observer
        if observer is not None:
            observer.use_clock(self.clock)
        if self._refuse_lost(job):
            return
        if observer is None and self.use_graphs and self.mem_ops:
            try:
                entry = self._graph_entry(job)
            except CudaError as exc:
                if exc.sticky:  # the context is gone: the stream would fail the same way
                    self._fail_unsent(job, exc)
                    return
                # The driver would not take this job as a graph: the same commands go on
                # the stream instead, and this op list is not offered as a graph again.
                job.script.keep(self, OnStream(f"the driver refused it as a graph: {exc}"))
                self.graph_refusals += 1
                entry = None
            if entry is not None:
                await self._graph_job(job, entry)
                return
        await self._stream_job(job, profiled=observer is not None)

    def _flush(self, cmds: list[C.Command]) -> None:
        if not cmds:
            return
        driver, stream = self.driver, self.stream
        driver.set_context(self.context)
        for cmd in cmds:
            if cmd[0] == _RECORD:
                driver.event_record(cmd[1], stream)
                self._events.append(cmd[1])
                self._event_values.append(cmd[2])
                self.enqueued.set(cmd[2])
            else:
                C.enqueue(driver, stream, cmd)
        cmds.clear()

    def stamp(self, job: Job, index: int, at_start: bool) -> None:
        """A profiled job's time, run by the stream as a host function: its start or end
        (`index` -1), or the start or end of op `index`."""
        now = self.clock()
        record = job.observer
        if record is None:
            return
        if index < 0:
            if at_start:
                record.began(now)
            else:
                record.finished(now)
        elif at_start:
            self._stamp_start = now
        else:
            record.span(index, self._stamp_start, now)

    async def _stream_job(self, job: Job, profiled: bool = False) -> None:
        """Put a job's work on the stream command by command (eager work, short jobs):
        the commands of its ops (`Translation`), with what cannot be a command (a wait
        with no word to wait on, host steps) done here where the walk stops."""
        ops = job.ops
        translation = Translation(self, job, graph=False)
        cmds = translation.cmds
        try:
            if profiled:
                cmds.append((C.HOST, functools.partial(self.stamp, job, -1, True)))
            index = translation.walk(ops, job.at)
            while index < len(ops):
                op = ops[index]
                if op.code == WAIT:
                    await self._wait_off_stream(cmds, job, op, index)
                    index += 1
                else:  # host steps
                    self._flush(cmds)
                    await self._drain(job, index)
                    index = await self._host_steps(job, index)
                index = translation.walk(ops, index)
            if profiled:
                cmds.append((C.HOST, functools.partial(self.stamp, job, -1, False)))
            cmds.append((C.HOST, self._host_job_end))
            self._in_flight.append(job)
            self._flush(cmds)
        except Exception as exc:  # a driver call refused: fail the job, never hang
            self._fail_unsent(job, exc)

    def wait_word(self, signal: Signal, slot: int) -> int | None:
        """The word a wait on `signal` (relative to base `slot`) waits on on this queue's
        stream: a GPU queue's own (when both signal the same way), or a mapped word that
        follows a trio-side signal; None where there is neither (KICK is set before any
        job runs: it never needs a word)."""
        if isinstance(signal, MappedSignal) and signal.owner.mem_ops == self.mem_ops:
            return signal.device_pointer if self.mem_ops else None
        if not self.mem_ops or slot == KICK:
            return None
        return self.device.mirror(signal)

    async def _wait_off_stream(
        self, cmds: list[C.Command], job: Job, op: WaitOp, index: int
    ) -> None:
        """A WAIT, op `index`, with no word to wait on: on the event of a GPU queue that
        signals with events too, else on the host."""
        signal = op.signal
        target = op.target(job.bases)
        if isinstance(signal, MappedSignal) and signal.owner.mem_ops == self.mem_ops:
            await self._wait_event(cmds, signal, target, job.submission, index)
        else:
            self._flush(cmds)
            await self._park(signal, target, job.submission, index)

    async def _host_steps(self, job: Job, at: int) -> int:
        """The host steps from op `at` on (EXEC, EXEC_THREAD, AWAIT), once the stream has
        got to them: run as any actor runs them (`step`, then what it stopped at).
        Return the index after them."""
        ops = job.ops
        end = at
        while end < len(ops) and ops[end].code in HOST_STEPS:
            end += 1
        while at < end:
            at = step(job, at, self.name, end)
            if at < end:
                at = await self._stopped(job, at)
        return end

    async def _drain(self, job: Job, index: int) -> None:
        """Wait until the stream has run everything put on it so far; then hand the faults
        its host work recorded for `job` to the submission, so a host step sees them."""
        reached = trio.Event()
        self._draining = True
        self.driver.set_context(self.context)
        self.driver.launch_host_func(self.stream, functools.partial(self._to_trio, reached.set))
        self.parked_on = None
        start = self.clock()
        await reached.wait()  # cancelled: `_abandon` sees the stream still busy
        blocked = self.clock() - start
        self.time_blocked += blocked
        job.submission.blocked(blocked)
        self._draining = False
        # The jobs before this one have ended (their ends came first): its faults carry
        # the count of jobs the stream has ended.
        if self._faults:
            with self._faults_lock:
                mine = [f for f in self._faults if f[0] == self._gpu_jobs_done]
                self._faults = [f for f in self._faults if f[0] != self._gpu_jobs_done]
            for _, item, exc in mine:
                job.submission.fail(item, self.name, exc)

    def _fail_unsent(self, job: Job, exc: Exception) -> None:
        # A driver call refused: name the job's first item (which one is not known).
        if job in self._in_flight:
            # Its end marker may not be on the stream: finish it here, after what was sent.
            self._in_flight.remove(job)
        job.fail(self.name, exc)
        if isinstance(exc, CudaError) and exc.sticky:
            self.device.lose(exc)

    def fail_in_flight(self, exc: BaseException) -> None:
        """The context is lost: no completion will come for the work on the GPU."""
        self._notified.clear()
        while self._in_flight:
            self._in_flight.popleft().fail(self.name, exc, item=-1)

    def _refuse_lost(self, job: Job) -> bool:
        lost = self.device.lost
        if lost is None:
            return False
        job.fail(self.name, lost)
        return True

    def event_signal(self, value: int) -> list[C.Command]:
        """Without stream memory operations, a signal of `value`: an event recorded on
        the stream, and host functions that write the word and tell the trio side."""
        event = self._event_pool.pop() if self._event_pool else self.driver.event_create()
        return [
            (_RECORD, event, value),
            (C.HOST, _host_word_writer(self, value)),
            (C.HOST, self.host_signal),
        ]

    async def _wait_event(
        self, cmds: list[C.Command], signal: MappedSignal, target: int, sub: Submission, index: int
    ) -> None:
        owner = signal.owner
        if owner.enqueued.value < target:
            self._flush(cmds)
            await self._park(owner.enqueued, target, sub, index)
        if signal.value >= target:
            return
        # Enqueue now: the event is only ours while its value is ahead of the mirror.
        self._flush(cmds)
        event = owner.event_for(target)
        self.driver.set_context(self.context)
        self.driver.stream_wait_event(self.stream, event)

    def event_for(self, value: int) -> Any:
        """Event fallback: the event recorded on this queue's stream where its signal
        reaches `value`, the first at or past it (one is enqueued: see `enqueued`)."""
        return self._events[bisect.bisect_left(self._event_values, value)]

    # -- the fast path: a job as a CUDA graph --

    def _graph_entry(self, job: Job) -> _GraphEntry | None:
        """The graph for this job's op list: the one its Script names for this queue (a
        replay with the same inputs and var values reuses its Scripts), else one of the
        same shape (new inputs: the nodes whose pointers or values changed are updated
        in place), else built. None: the op list runs on the stream (and its Script
        keeps why)."""
        script = job.script
        if len(script.ops) < self.graph_min_items:
            return None
        kept: int | OnStream | None = script.kept(self)
        if isinstance(kept, OnStream):
            return None
        graphs = self._graphs
        if kept is not None:
            entry = graphs.get(kept)
            if entry is not None:
                graphs.move_to_end(kept)
                return entry
        entry = self._plan_graph(job)
        if entry is None:
            why = (
                "its ops are not all graph nodes (a host step, a wait on no mapped word, few items)"
            )
            script.keep(self, OnStream(why))
            return None
        for serial, old in list(graphs.items()):
            if _same_shape(old.cmds, entry.cmds):
                del graphs[serial]
                try:
                    self._update_graph(old, entry)
                except Exception:
                    self.driver.graph_destroy(old.graph, old.exec)  # half updated
                    raise
                self._file(script, old)
                return old
        self._build_graph(entry)
        self._file(script, entry)
        while len(graphs) > _GRAPH_CACHE:
            _, dropped = graphs.popitem(last=False)
            self.driver.graph_destroy(dropped.graph, dropped.exec)
        return entry

    def _file(self, script: Script, entry: _GraphEntry) -> None:
        """Keep `entry` in the cache under a new serial, the one `script` keeps."""
        serial = next(self._serials)
        self._graphs[serial] = entry
        script.keep(self, serial)

    def _plan_graph(self, job: Job) -> _GraphEntry | None:
        """Commands for a graph of this job, or None if it must run on the stream."""
        translation = Translation(self, job, graph=True)
        try:
            if translation.walk(job.ops) < len(job.ops):
                return None  # a host step, or a wait with no word to wait on
        except OpCodeError:
            return None  # the stream path refuses the job, naming the op
        if translation.items < self.graph_min_items:
            return None
        if not translation.notify:
            translation.cmds.append((C.HOST, self._host_job_end))
        return _GraphEntry(translation)

    def _build_graph(self, entry: _GraphEntry) -> None:
        driver = self.driver
        driver.set_context(self.context)
        graph = driver.graph_create()
        node = None
        nodes = []
        try:
            for cmd in entry.cmds:
                node = C.add_node(driver, graph, node, self.context, cmd)
                nodes.append(node)
            graph_exec = driver.graph_instantiate(graph)
        except Exception:
            driver.graph_destroy(graph, None)
            raise
        entry.built(graph, nodes, graph_exec)
        self.graph_builds += 1

    def _update_graph(self, old: _GraphEntry, new: _GraphEntry) -> None:
        """Reuse `old`'s instantiated graph for `new`'s commands: update changed nodes."""
        driver = self.driver
        driver.set_context(self.context)
        cmds = new.cmds
        for i, (was, now) in enumerate(zip(old.cmds, cmds)):
            if now[0] == C.WAIT_VALUE or now[0] == C.WRITE_VALUE:
                # Values are bound per replay (`_graph_job`): keep the node's current one.
                now = cmds[i] = (now[0], now[1], was[2])
            C.update_node(driver, old.exec, old.nodes[i], self.context, was, now)
        old.runs(new)

    async def _graph_job(self, job: Job, entry: _GraphEntry) -> None:
        bases, sub = job.bases, job.submission
        for wait, index in entry.host_waits:
            target = wait.target(bases)
            if wait.signal.value < target:
                await self._park(wait.signal, target, sub, index)
        try:
            driver = self.driver
            driver.set_context(self.context)
            cmds = entry.cmds
            for index, op in entry.value_nodes:
                cmd = cmds[index]
                if op.code == WAIT:
                    value = op.target(bases)
                    if op.signal.value >= value:
                        # Already reached: the node's older (lower) target passes at once,
                        # so it needs no update (targets on one word only grow, and stay
                        # within 2**63 of it, as the cyclic comparison needs).
                        continue
                else:
                    value = op.value(bases)
                if cmd[2] != value:
                    new = (cmd[0], cmd[1], value)
                    C.update_node(driver, entry.exec, entry.nodes[index], self.context, cmd, new)
                    cmds[index] = new
            self._in_flight.append(job)
            driver.graph_launch(entry.exec, self.stream)
            self.graph_launches += 1
            if entry.notify:
                self._notify_from_side(job, [op.value(bases) for op in entry.reports])
        except Exception as exc:
            self._fail_unsent(job, exc)

    def _notify_from_side(self, job: Job, reports: list[int]) -> None:
        """Tell the host about `job`'s reported signals and its end from the side stream:
        it waits on the word (each report) and on an event recorded after the job (the
        end), so the job's own stream never waits for a host callback."""
        driver = self.driver
        if self._notify is None:
            self._notify = driver.stream_create()
        notify = self._notify
        for value in reports:
            driver.stream_wait_value64(notify, self.signal.device_pointer, value)
            driver.launch_host_func(notify, self.host_signal)
        event = self._end_events.pop() if self._end_events else driver.event_create()
        driver.event_record(event, self.stream)
        driver.stream_wait_event(notify, event)
        driver.launch_host_func(notify, self._host_notified_end)
        self._notified.append((job, event))

    # -- teardown --

    def close(self) -> None:
        driver = self.driver
        streams = [self.stream] + ([self._notify] if self._notify is not None else [])
        if self._in_flight or self._draining or self._left_busy:
            # The GPU may still wait on words nobody will write: leave its resources be.
            for stream in streams:
                driver.stream_destroy(stream)
            return
        driver.set_context(self.context)
        for stream in streams:
            driver.stream_synchronize(stream)
        for entry in self._graphs.values():
            driver.graph_destroy(entry.graph, entry.exec)
        self._graphs.clear()
        for event in self._events + self._event_pool + self._end_events:
            driver.event_destroy(event)
        for stream in streams:
            driver.stream_destroy(stream)
        driver.host_free(self._word_host_pointer)


def _host_word_writer(actor: CudaQueueActor, value: int) -> Callable[[], None]:
    """Event fallback: no stream writes, so the stream's host function writes the word."""

    def write() -> None:
        actor.signal.write_word(value)

    return write


def _same_shape(old: list[C.Command], new: list[C.Command]) -> bool:
    return len(old) == len(new) and all(C.shape_of(a) == C.shape_of(b) for a, b in zip(old, new))
