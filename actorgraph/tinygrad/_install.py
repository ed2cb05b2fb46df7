"""install(): actorgraph as the graph runner of every tinygrad CPU device.

What every tinygrad release shares: a background runtime (`ag.start_runtime`) on CPU:0 ..
CPU:N-1 owned by this module, the tinygrad devices patched to use the release's runner
class, the counters of statistics(), and the replay itself (`Installed.replay`).

A replay is synchronous: the runner's call returns once the batch's work is done. It
runs on the caller's own thread as one loop over the kernels' calls whenever it can (a
background runtime runs a replay of inline items on idle CPU queues where it is called,
while its loop is stopped), else it goes to the runtime's thread and the caller waits
for it. So a replay stands where tinygrad would have run the batch's kernels itself,
between the tinygrad work before and after it on the same thread, and ordering against
tinygrad's own work is the caller's program order; where a release queues its own work
asynchronously (0.11's device timelines), its adapter's `Ordering` waits for that work
first and advances the timeline after.

Replays from several threads take one lock, so they run one at a time: a replay takes
the devices' next values of tinygrad's timelines, runs and advances them before the
next replay takes any, and tinygrad's later work never passes a replay. The runtime's
thread never takes it (a replay holding it may wait for that thread): what it does for
a batch on AG devices (their memory, its plan) touches nothing a lock guards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from .._background import BackgroundRuntime, start_runtime
from .._buffer import Buffer
from .._errors import ClosedError, UsageError
from .._graph import Replay
from .._kernel import Item
from .._options import refuse_unknown
from .._runtime import Runtime
from .._vars import Var
from ..remote import WorkerCPU
from ._batch import Batch, ChainKey
from ._check import Reference, TinyCheck
from ._convert import Wrapper
from ._pending import Pending, Reading, ReplayRecord
from ._private import patch_cpu_devices, patched_devices
from ._watch import watched


class Ordering(Protocol):
    """How one release orders a replay with the work tinygrad queues on its own.
    `queues`: whether tinygrad queues work at all (else replays run as they are)."""

    queues: bool

    def replay(self, devices: Sequence[str], run: Callable[[], None]) -> None:
        """Call run() where it is ordered after tinygrad's earlier work on these
        (tinygrad) devices and before its later work."""


class Inline:
    """tinygrad runs its own work inline on the caller's thread (0.14's CPU devices):
    program order is the order; nothing to wait for."""

    queues = False

    def replay(self, devices: Sequence[str], run: Callable[[], None]) -> None:
        run()


@attrs.frozen
class TinygradStatistics:
    """What install() has done, as `agt.statistics()` reports it.

    Attributes:
        installed: whether install() is in effect.
        version: the installed tinygrad release.
        graphs: runners tinygrad built (one per graphed batch of a jit).
        plans: their plans (one per batch, plus one per new largest input size where
            tinygrad does not say the largest).
        replays: runner calls.
        handed_off: replays that ran on the runtime's thread (items on a worker thread, or
            the runtime busy); the rest ran on the caller's thread.
        devices: the CPU devices the runtime opened.
        remote: the worker devices of `AG`, `AG:1`, ... (tinygrad 0.14).
        flushes: submissions of the work recorded on AG devices (each one batch per
            worker).
        checked: replays checked against tinygrad running the batch itself
            (`install(check_replays=N)`).
    """

    installed: bool
    version: str
    graphs: int
    plans: int
    replays: int
    handed_off: int
    devices: tuple[str, ...]
    remote: tuple[str, ...] = ()
    flushes: int = 0
    checked: int = 0


class Installed:
    """What install() owns: the background runtime, the patched devices, the counters."""

    def __init__(
        self,
        runtime: BackgroundRuntime,
        ndevices: int,
        ordering: Ordering,
        version: str,
        restore: Callable[[], None],
        check_replays: int = 0,
        remote: Sequence[str] = (),
        register: Callable[[Installed], Callable[[], None]] | None = None,
    ) -> None:
        """What install() made: `runtime` with `ndevices` CPU devices and the `remote`
        devices that become AG, AG:1, ..., for tinygrad `version` and its `ordering`;
        `restore()` puts tinygrad's own graph runners back; each batch's first
        `check_replays` replays are checked. `register(self)`, called last, makes the AG
        devices tinygrad's and returns what undoes it. Raises what `register` raises."""
        self.runtime = runtime
        self.ndevices = ndevices
        # The worker devices of AG, AG:1, ... (tinygrad 0.14), and their recorded work.
        self.remote = tuple(remote)
        self.pending = Pending(runtime, remote)
        self.ordering = ordering
        self.version = version
        self.wrapper = watched(Wrapper(runtime.runtime, free=runtime.free_now))
        # Held by every replay and plan, and by uninstall(): see the module's docstring.
        self.lock = threading.RLock()
        self.graphs = 0
        self.plans = 0
        self.remote_plans = 0  # plans of batches on AG devices: on the runtime's thread only
        self.replays = 0
        self.handed_off = 0
        self.restore = restore
        # install(check_replays=N): each batch's first N replays are checked, through
        # the release's checked runner (which calls replay_checked); 0: none, and the
        # plain runner, which knows nothing of checks.
        self.check_replays = check_replays
        self.checked = 0
        self.unregister = None if register is None else register(self)

    def graph_made(self) -> None:
        """tinygrad made one more graph runner of actorgraph's."""
        with self.lock:
            self.graphs += 1

    def check_usable(self) -> None:
        if _installed is not self or self.runtime.closed:
            raise ClosedError(
                "actorgraph.tinygrad was uninstalled (or its runtime closed) after this jit "
                "captured; capture it again (jit.reset()) or install() first"
            )

    def replay(
        self,
        batch: Batch,
        places: Sequence[tuple[int, int]],
        given: Mapping[Any, int],
        tiny_devices: Sequence[str],
        wait: bool,
        call: object = None,
    ) -> float | None:
        """Replay `batch` with its roots at these (address, nbytes) places and these
        tinygrad var values; return the seconds it took when `wait`. `call`: the jit
        call the batch is part of (tinygrad's object for it, the same for each of its
        batches), or None: on workers, the batches of one call go as one graph."""
        if batch.remote:
            return self._replay_remote(batch, places, given, wait, call)
        start = time.perf_counter() if wait else 0.0
        with self.lock:
            if _installed is not self:
                self.check_usable()
            wrapper = self.wrapper
            wrapper.forget_freed()
            if wrapper.held_freed and batch.stale():
                raise UsageError(_STALE)
            roots = batch.wrap_roots(places)
            graph = batch.graph_for(roots)
            if graph is None:
                graph = self._plan(batch, roots)
            values = batch.values(given, "this jit") if batch.variables else None
            self.replays += 1
            if self.ordering.queues:
                self.ordering.replay(tiny_devices, lambda: self._run(graph, roots, values))
            else:
                self._run(graph, roots, values)
        return time.perf_counter() - start if wait else None

    def _replay_remote(
        self,
        batch: Batch,
        places: Sequence[tuple[Any, int]],
        given: Mapping[Any, int],
        wait: bool,
        call: object,
    ) -> float | None:
        """A batch on AG devices: recorded with their work, in tinygrad's order, and sent
        with it; waited for only as far as it touches tinygrad's CPU memory too (which
        tinygrad's inline work after it uses: its jobs on this host's devices), or whole
        when the caller asks for its time. This host's memory is wrapped here, under the
        lock; the workers' memory is resolved and the batch planned on the runtime's
        thread (`_submit_remote`)."""
        start = time.perf_counter() if wait else 0.0
        with self.lock:
            if _installed is not self:
                self.check_usable()
            self.wrapper.forget_freed()
            if batch.stale():
                raise UsageError(_STALE)
            partial = batch.wrap_local_roots(places)
            held = batch.hold()
            values = batch.values(given, "this jit") if batch.variables else None
            self.replays += 1
        self.pending.add(ReplayRecord(batch, partial, held, values, call, self._submit_remote))
        if wait:
            self.pending.flush(wait=True)
        elif batch.local:
            self.pending.flush(here=True)
        return time.perf_counter() - start if wait else None

    async def _submit_remote(
        self, run: Sequence[ReplayRecord], runtime: Runtime, reading: Reading | None
    ) -> tuple[list[Replay], bool]:
        """On the runtime's thread: plan the replays of `run` (the batches of one jit
        call, in order) where their roots need it, and submit them: as one graph where
        each batch can be a part of one (Batch.chain_part), else one graph each; the last
        with `reading` (a host read after it) where it can take it, saying whether it
        did. Takes no lock (a caller holding install()'s lock may be waiting for this
        thread)."""
        roots = [record.batch.resolve_roots(record.roots, runtime) for record in run]
        if len(run) > 1:
            chain = await self._chain_graph(run, roots, runtime)
            if chain is not None:
                graph, inputs, values = chain
                replay, read = await _submit(graph, inputs, values, reading)
                return [replay], read
        replays = []
        read = False
        for k, (record, part) in enumerate(zip(run, roots)):
            graph = await self._graph_of(record, part, runtime)
            replay, read = await _submit(
                graph, part, record.values, reading if k == len(run) - 1 else None
            )
            replays.append(replay)
        return replays, read

    async def _graph_of(self, record: ReplayRecord, roots: list[Buffer], runtime: Runtime) -> Any:
        batch = record.batch
        graph = batch.graph_for(roots)
        if graph is None:
            items, inputs, limits = batch.plan(roots, record.held, runtime)
            graph = await runtime.compile(items, inputs=inputs, max_sizes=limits, aliasing="replan")
            batch.keep_plan(graph, limits, runtime)
            self.remote_plans += 1
        return graph

    async def _chain_graph(
        self, run: Sequence[ReplayRecord], roots: list[list[Buffer]], runtime: Runtime
    ) -> tuple[Any, list[Buffer], dict[Var, int] | None] | None:
        """The graph of `run` planned as one, its inputs and var values; None where it
        cannot be one (each batch is then replayed on its own)."""
        # A root in more than one batch (a jit input two parts use) is one input.
        inputs: list[Buffer] = []
        found: dict[int, int] = {}
        slots = []
        for part in roots:
            for buf in part:
                slot = found.setdefault(id(buf), len(inputs))
                if slot == len(inputs):
                    inputs.append(buf)
                slots.append(slot)
        first = run[0].batch
        key: ChainKey = (tuple(record.batch for record in run[1:]), tuple(slots))
        graph = first.chain_for(key, inputs)
        if graph is None:
            graph = await self._plan_chain(run, roots, inputs, key, runtime)
            if graph is None:
                return None
        values: dict[Var, int] | None = None
        for record in run:
            if record.values:
                values = {**(values or {}), **record.values}
        return graph, inputs, values

    async def _plan_chain(
        self,
        run: Sequence[ReplayRecord],
        roots: list[list[Buffer]],
        inputs: list[Buffer],
        key: ChainKey,
        runtime: Runtime,
    ) -> Any:
        """The batches of `run` planned as one graph over `inputs` (each root of theirs
        one of them, as `key` says), kept by the first; None (planning nothing) where
        one of them needs a plan of its own (Batch.chain_part), or two distinct inputs
        share memory (a plan of the batches one by one handles that as before)."""
        for k, buf in enumerate(inputs):
            if any(buf.overlaps(other) for other in inputs[k + 1 :]):
                return None
        if not all(r.batch.joins_chains(part, runtime) for r, part in zip(run, roots)):
            return None
        items: list[Item] = []
        limits = [1] * len(inputs)
        slots = iter(key[1])
        for record, part in zip(run, roots):
            part_items, part_limits = record.batch.chain_part(part, record.held, runtime)
            items += part_items
            for limit, slot in zip(part_limits, slots):
                limits[slot] = max(limits[slot], limit)
        graph = await runtime.compile(items, inputs=inputs, max_sizes=limits, aliasing="replan")
        run[0].batch.keep_chain(key, graph, limits)
        self.remote_plans += 1
        return graph

    def _run(self, graph: Any, roots: Sequence[Any], values: dict[Any, int] | None) -> None:
        # On this thread as one loop where the runtime allows it (the usual case), else on
        # the runtime's thread while this one waits.
        if not graph.call_here(roots, values):
            self.handed_off += 1
            graph(roots, values).result()

    def _plan(self, batch: Batch, roots: Sequence[Any]) -> Any:
        self.check_usable()
        items, inputs, limits = batch.plan(roots)
        graph = self.runtime.compile(items, inputs=inputs, max_sizes=limits, aliasing="replan")
        planned = graph.result()
        batch.keep_plan(planned, limits)
        self.plans += 1
        return planned

    def replay_checked(
        self,
        batch: Batch,
        places: Sequence[tuple[int, int]],
        given: Mapping[Any, int],
        tiny_devices: Sequence[str],
        wait: bool,
        reference: Callable[[], Reference],
    ) -> float | None:
        """`replay`, checked while the batch has had fewer than `check_replays` checked
        replays (see _check): `reference()` is the batch as tinygrad runs it."""
        number = batch.take_check(self.check_replays)
        if not number:
            return self.replay(batch, places, given, tiny_devices, wait)
        start = time.perf_counter() if wait else 0.0
        with self.lock:
            if _installed is not self:
                self.check_usable()
            roots = batch.wrap_roots(places)
            graph = batch.graph_for(roots)
            if graph is None:
                graph = self._plan(batch, roots)
            values = batch.values(given, "this jit") if batch.variables else None
            self.replays += 1
            self.checked += 1
            check = TinyCheck(f"checked replay {number} of a {batch.describe()}", reference())

            def run() -> None:
                check.around(lambda: self._run(graph, roots, values))

            if self.ordering.queues:
                self.ordering.replay(tiny_devices, run)
            else:
                run()
            check.verdict()
        return time.perf_counter() - start if wait else None

    def check_devices(self, devices: Sequence[str]) -> bool:
        """Whether every (actorgraph) device is one this runtime opened."""
        return all(
            name in self.remote if "@" in name else int(name.split(":")[1]) < self.ndevices
            for name in devices
        )

    def worker_cpu(self, name: str) -> WorkerCPU:
        """What the worker of remote device `name` said at connect it runs on."""
        device: Any = self.runtime.runtime.device(name)
        stats = device.connection.statistics()
        cpu: WorkerCPU = stats.worker_cpu
        return cpu


_STALE = (
    "tinygrad freed memory this jit's batch holds (free_intermediates(), or a buffer of it "
    "deallocated) while its runner stayed: capture the jit again (jit.reset())"
)

# cpu_thread_bytes that no kernel reaches: every kernel runs inline.
INLINE_BYTES = 1 << 62

_installed: Installed | None = None
_install_lock = threading.Lock()


def current() -> Installed | None:
    return _installed


def install(
    runners: tuple[Callable[..., Any], Callable[..., Any]],
    ordering: Ordering,
    version: str,
    devices: int,
    options: dict[str, Any],
    remote: Sequence[str] = (),
    register: Callable[[Installed], Callable[[], None]] | None = None,
) -> None:
    """Install `runners[0]` (or `runners[1]`, the checked runner, with a check_replays
    option > 0) as every tinygrad CPU device's graph runner, on a new background
    runtime opened with the other options."""
    global _installed
    with _install_lock:
        if _installed is not None:
            return
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise UsageError(f"install(devices=N) needs an int N >= 1, got {devices!r}")
        refuse_unknown(options, "agt.install(...)", own=["devices", "remote"])
        options = dict(options)
        checks = options.pop("check_replays", 0)
        if isinstance(checks, bool) or not isinstance(checks, int) or checks < 0:
            raise UsageError(
                f"install(check_replays=N) needs an int N >= 0 (how many replays of each "
                f"batch to check against tinygrad running it), got {checks!r}"
            )
        if checks and remote:
            raise UsageError(
                f"install(check_replays={checks}) checks batches against tinygrad running them "
                f"on this host's memory, and the memory of AG devices (install(remote=...) or "
                f"ACTORGRAPH_REMOTE: {', '.join(remote)}) is on workers, so their batches "
                f"cannot be checked; install without remote devices to check jits on CPU "
                f"devices, or without check_replays to run on workers"
            )
        # Every kernel on the caller's thread, as tinygrad runs its own, unless asked
        # otherwise: a kernel on a worker thread sends the whole replay through the
        # runtime's thread, a hop a kernel big enough to need a thread rarely repays
        # unless devices run in parallel (cpu_thread_bytes=N lets them).
        options = {"cpu_thread_bytes": INLINE_BYTES, **options}
        runtime = start_runtime([*(f"CPU:{i}" for i in range(devices)), *remote], **options)
        restore: Callable[[], None] | None = None
        try:
            for i in range(devices):
                # Wrapped memory of each device shares one address space: made once
                # here, on no replay's path.
                runtime.runtime.wrap(f"CPU:{i}", bytearray(1))
            restore = patch_cpu_devices(runners[1] if checks else runners[0])
            _installed = Installed(
                runtime, devices, ordering, version, restore, checks, remote, register
            )
        except BaseException:
            # Nothing of a failed install stays: tinygrad's runners, the runtime.
            if restore is not None:
                restore()
            runtime.close()
            raise


def uninstall(synchronize: Callable[[str], None]) -> None:
    global _installed
    with _install_lock:
        state = _installed
        if state is None:
            return
        with state.lock:  # no replay is running; none starts (check_usable)
            try:
                if state.unregister is not None:
                    state.unregister()
                state.pending.flush(wait=True)  # the AG work tinygrad asked for, done
            finally:
                _installed = None
                devices = patched_devices(state.restore)
                state.restore()
    for name in devices:
        synchronize(name)
    state.runtime.close()


def statistics() -> TinygradStatistics:
    state = _installed
    if state is None:
        from ._version import installed_version

        return TinygradStatistics(False, installed_version() or "", 0, 0, 0, 0, ())
    return TinygradStatistics(
        installed=True,
        version=state.version,
        graphs=state.graphs,
        plans=state.plans + state.remote_plans,
        replays=state.replays,
        handed_off=state.handed_off,
        devices=tuple(patched_devices(state.restore)),
        remote=state.remote,
        flushes=state.pending.flushes,
        checked=state.checked,
    )


async def _submit(
    graph: Any, inputs: Sequence[Buffer], values: dict[Var, int] | None, reading: Reading | None
) -> tuple[Replay, bool]:
    """A replay of `graph`, with the host read `reading` where the graph can take it
    (Graph.submit_reading): the Replay, and whether it took the read."""
    if reading is not None:
        replay: Replay | None = await graph.submit_reading(inputs, values, *reading)
        if replay is not None:
            return replay, True
    replay = await graph.submit(inputs, values)
    assert replay is not None
    return replay, False
