"""install(): actorgraph as the graph runner of every tinygrad CPU device.

tinygrad's TinyJit hands each batch of its jit cache to the device's graph class (a
GraphRunner) once, then calls the runner on every replay with that call's input buffers
and var values. Our runner plans the batch on a background runtime the module owns
(`ag.start_runtime`) and, per call, posts the replay to that runtime's thread without
waiting for it (one `run_sync_soon`): the caller's thread goes on with its next call.

Ordering with tinygrad's own work uses its device timelines (see `Timelines`): the replay
starts once the work tinygrad queued before it is done and takes the next timeline value,
which it writes when it is complete, so tinygrad's later queue work and its synchronize()
(before every copyout) wait for it. A failed replay is raised by the runner's next call
(or by a call with wait=True); its timeline value is written all the same.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence
from typing import Any

import attrs
import trio
from tinygrad.device import Buffer as TinyBuffer
from tinygrad.device import Compiled, Device
from tinygrad.engine.jit import GraphException, MultiGraphRunner
from tinygrad.engine.realize import BufferCopy, BufferXfer, CompiledRunner, ExecItem
from tinygrad.runtime import ops_cpu

from .._background import BackgroundRuntime, start_runtime
from .._buffer import Buffer
from .._errors import ClosedError, UsageError
from .._foreign import ExternalTimeline
from .._graph import Graph, Replay
from .._program import raise_failure
from .._vars import Var
from ._convert import (
    PLANS_KEPT,
    Converter,
    Timelines,
    Wrapper,
    device_name,
    devices_of,
    numpy_dtype,
)

Points = list[tuple[ExternalTimeline, int]]


@attrs.frozen
class TinygradStatistics:
    """`graphs`: runners tinygrad built (one per graphed batch of a jit); `plans`: graphs
    planned (a runner plans one per set of input sizes); `replays`: runner calls;
    `deferred`: replays that could not be submitted at once (tinygrad work still
    pending before them, or the in-flight window full) and went through a task."""

    installed: bool
    graphs: int
    plans: int
    replays: int
    deferred: int
    devices: tuple[str, ...]


class _State:
    """What install() owns: the background runtime, the patched devices, counters."""

    def __init__(self, runtime: BackgroundRuntime, ndevices: int, max_pending: int) -> None:
        self.runtime = runtime
        # Replays posted and not complete; a caller past `max_pending` blocks (releasing
        # the GIL) until one completes. Without this bound a caller's thread that only
        # posts keeps the GIL while the runtime's thread waits for it after every
        # scheduler pass (each pass releases it around epoll): replays then crawl.
        self.pending = threading.Semaphore(max_pending)
        self.ndevices = ndevices
        self.wrapper = Wrapper(runtime.runtime)
        self.timelines = Timelines.of_runtime(runtime.runtime)
        self.graphs = 0
        self.plans = 0
        self.replays = 0
        self.deferred = 0
        self.patched: dict[str, Any] = {}  # tinygrad device -> its own graph class
        self.backlog: collections.deque[tuple[Any, ...]] = collections.deque()
        # Calls posted by tinygrad's threads, not yet taken by the runtime's thread. One
        # wake-up (run_sync_soon) per batch: while one is scheduled, calls only append.
        # Invariant: a job in `posted` is taken by a scheduled `take_posted`, because the
        # runtime's thread clears `scheduled` before it takes.
        self.posted: collections.deque[tuple[Any, ...]] = collections.deque()
        self.scheduled = False

    # -- on tinygrad's side --

    def post(self, job: tuple[Any, ...]) -> None:
        self.pending.acquire()
        self.posted.append(job)
        if not self.scheduled:
            self.scheduled = True
            token = self.runtime._token
            assert token is not None
            token.run_sync_soon(self.take_posted)

    # -- on the runtime's thread --

    def take_posted(self) -> None:
        self.scheduled = False
        posted = self.posted
        while posted:
            self.submit(*posted.popleft())

    def submit(
        self,
        runner: ActorGraph,
        graph: Graph,
        roots: Sequence[Buffer],
        values: dict[Var, int],
        after: Points,
        then: Points,
    ) -> None:
        job = (runner, graph, roots, values, after, then)
        if self.backlog:
            self.backlog.append(job)
            return
        try:
            replay = graph.submit_nowait(roots, values, after=after, then=then)
        except trio.WouldBlock:
            self.deferred += 1
            self.backlog.append(job)
            # A task that submits the backlog in order, waiting where it must (the
            # runtime's own queue of calls: this callback cannot await).
            self.runtime._submit(self._drain, (), {}, "actorgraph.tinygrad replays")
        except BaseException as error:  # noqa: BLE001 - reported by the runner's next call
            runner._fail(error, then)
            self.pending.release()
        else:
            runner._inflight.append(replay)
            self._release_when_done(replay)

    def _release_when_done(self, replay: Replay) -> None:
        sub = replay._sub
        if sub.done.is_set():
            self.pending.release()
            return
        chained = sub.on_done
        release = self.pending.release

        def on_done(done: Any) -> None:
            if chained is not None:
                chained(done)
            release()

        sub.on_done = on_done

    async def _drain(self) -> None:
        while self.backlog:
            runner, graph, roots, values, after, then = self.backlog[0]
            try:
                replay = await graph.submit(roots, values, after=after, then=then)
            except Exception as error:
                runner._fail(error, then)
                self.pending.release()
            else:
                runner._inflight.append(replay)
                self._release_when_done(replay)
            self.backlog.popleft()


_state: _State | None = None
_lock = threading.Lock()


def _cpu_items_only(devs: Sequence[Compiled], ei: ExecItem) -> bool:
    if not all(isinstance(d, ops_cpu.CPUDevice) for d in devs):
        return False
    if isinstance(ei.prg, CompiledRunner):
        return isinstance(Device[ei.prg.device], ops_cpu.CPUDevice)
    if isinstance(ei.prg, (BufferCopy, BufferXfer)):
        return all(
            b is not None and isinstance(Device[b.device], ops_cpu.CPUDevice) for b in ei.bufs
        )
    return False


class ActorGraph(MultiGraphRunner):
    """tinygrad's graph runner for CPU devices, replaying through actorgraph (named like
    tinygrad's own graph classes, HCQGraph, CUDAGraph, which tools recognise by the name).

    Takes compiled kernels and copies between CPU devices (tinygrad's own CPU graph
    splits at copies; this one does not), on any number of CPU devices in one batch.
    """

    def __init__(
        self,
        jit_cache: list[ExecItem],
        input_rawbuffers: list[TinyBuffer],
        var_vals: dict[Any, int],
    ) -> None:
        state = _state
        if state is None:
            raise GraphException("actorgraph.tinygrad is not installed")
        super().__init__(jit_cache, input_rawbuffers, var_vals)
        self._state = state
        self._devices = devices_of(jit_cache, input_rawbuffers)
        for name in self._devices:
            index = int(device_name(name).split(":")[1])
            if index >= state.ndevices:
                raise GraphException(
                    f"{name} is past the {state.ndevices} CPU devices actorgraph.tinygrad "
                    f"opened; install(devices=N) with a larger N"
                )
        # Input k is either a root (a buffer of its own) or a view of a root input.
        rawbufs = list(input_rawbuffers)
        ids = {id(b): k for k, b in enumerate(rawbufs)}
        self._roots: list[int] = []
        self._root_of: dict[int, int] = {}
        self._views: dict[int, tuple[int, int, Any, int]] = {}
        for k, buf in enumerate(rawbufs):
            if buf._base is not None and id(buf._base) in ids:
                self._views[k] = (ids[id(buf._base)], buf.offset, buf.dtype, buf.size)
            else:
                self._root_of[k] = len(self._roots)
                self._roots.append(k)
        self._captured = {
            (j, i): b for j, ei in enumerate(jit_cache) for i, b in enumerate(ei.bufs)
        }
        self._converter = Converter(state.wrapper)
        self._converter.check(jit_cache, self.input_replace)
        self._graphs: dict[tuple[int, ...], Graph] = {}
        self._inflight: collections.deque[Replay] = collections.deque()
        self._failure: BaseException | None = None
        self._graph_for(self._wrap_roots(rawbufs))
        with _lock:
            state.graphs += 1

    @staticmethod
    def supports_exec_item(devs: list[Compiled], ei: ExecItem) -> bool:
        return _cpu_items_only(devs, ei)

    # -- building --

    def _wrap_roots(self, rawbufs: Sequence[TinyBuffer]) -> list[Buffer]:
        wrapper = self._state.wrapper
        return [wrapper.base(rawbufs[k], f"jit input {k}") for k in self._roots]

    def _graph_for(self, roots: list[Buffer]) -> Graph:
        key = tuple(b.nbytes for b in roots)
        graph = self._graphs.get(key)
        if graph is not None:
            return graph

        def slot(j: int, i: int, buf: TinyBuffer | None) -> Buffer:
            k = self.input_replace.get((j, i))
            if k is None:
                captured = self._captured[(j, i)]
                assert captured is not None
                return self._state.wrapper.buffer(captured, f"jit cache item {j} buffer {i}")
            if k in self._views:
                root, offset, dtype, size = self._views[k]
                return roots[self._root_of[root]].view(
                    byte_offset=offset, dtype=numpy_dtype(dtype), shape=(size,)
                )
            return roots[self._root_of[k]]

        items = self._converter.convert(self.jit_cache, slot)
        background = self._state.runtime.compile(items, inputs=roots).result()
        graph = background.graph
        if len(self._graphs) >= PLANS_KEPT:
            self._graphs.pop(next(iter(self._graphs)))  # the oldest; planned again if needed
        self._graphs[key] = graph
        with _lock:
            self._state.plans += 1
        return graph

    # -- per call --

    def _fail(self, error: BaseException, then: Points) -> None:
        if self._failure is None:
            self._failure = error
        for timeline, value in then:  # tinygrad must not wait forever for this replay
            timeline.advance(value)

    def _raise_failures(self) -> None:
        inflight = self._inflight
        while inflight and inflight[0].done:
            replay = inflight.popleft()
            if replay._sub.error is not None and self._failure is None:
                try:
                    raise_failure(replay._program, replay._sub)
                except Exception as error:
                    self._failure = error
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def __call__(
        self, rawbufs: list[TinyBuffer], var_vals: dict[Any, int], wait: bool = False
    ) -> float | None:
        state = self._state
        if _state is not state or state.runtime.closed:
            raise ClosedError(
                "actorgraph.tinygrad was uninstalled (or its runtime closed) after this jit "
                "captured; capture it again (jit.reset()) or install() first"
            )
        self._raise_failures()
        start = time.perf_counter()
        roots = self._wrap_roots(rawbufs)
        graph = self._graph_for(roots)
        values = self._converter.var_values(var_vals, graph._program.free_vars)
        after, then = state.timelines.points(self._devices)
        state.post((self, graph, roots, values, after, then))
        state.replays += 1
        if not wait:
            return None
        for timeline, value in then:
            timeline.wait_for(value)
        self._raise_failures()
        return time.perf_counter() - start


def _patch(dev: Any, state: _State, name: str) -> None:
    if name not in state.patched:
        state.patched[name] = dev.graph
    dev.graph = ActorGraph


_original_init: Any = None


def install(*, devices: int = 16, max_pending: int = 1, **options: Any) -> None:
    """Make actorgraph the graph runner of every tinygrad CPU device, open or opened later.

    Starts a background runtime (`ag.start_runtime`) on CPU:0 ... CPU:devices-1 (options
    go to it); TinyJit then replays through actorgraph's planner and actors with no change
    to the caller's code. A runner call returns once its replay is posted, but waits
    first while `max_pending` replays are posted and not complete. Calling install()
    again while installed does nothing.
    """
    global _state, _original_init
    with _lock:
        if _state is not None:
            return
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise UsageError(f"install(devices=N) needs an int N >= 1, got {devices!r}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise UsageError(f"install(max_pending=N) needs an int N >= 1, got {max_pending!r}")
        runtime = start_runtime([f"CPU:{i}" for i in range(devices)], **options)
        state = _State(runtime, devices, max_pending)
        for name in list(Device._opened_devices):
            dev = Device[name]
            if isinstance(dev, ops_cpu.CPUDevice):
                _patch(dev, state, name)
        original = ops_cpu.CPUDevice.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            current = _state
            if current is not None:
                _patch(self, current, self.device)

        _original_init = original
        ops_cpu.CPUDevice.__init__ = init  # type: ignore[method-assign]
        _state = state


def uninstall() -> None:
    """Give every tinygrad CPU device its own graph runner back and close the runtime
    (after the replays in flight). Jits captured while installed must capture again."""
    global _state, _original_init
    with _lock:
        state = _state
        if state is None:
            return
        _state = None
        if _original_init is not None:
            ops_cpu.CPUDevice.__init__ = _original_init  # type: ignore[method-assign]
            _original_init = None
        for name, graph in state.patched.items():
            Device[name].graph = graph
    for name in state.patched:
        Device[name].synchronize()  # type: ignore[no-untyped-call]  # waits for the replays it has taken values from
    state.runtime.close()


def installed() -> bool:
    return _state is not None


def statistics() -> TinygradStatistics:
    """A snapshot of what install() has done."""
    state = _state
    if state is None:
        return TinygradStatistics(False, 0, 0, 0, 0, ())
    return TinygradStatistics(
        installed=True,
        graphs=state.graphs,
        plans=state.plans,
        replays=state.replays,
        deferred=state.deferred,
        devices=tuple(sorted(state.patched)),
    )
