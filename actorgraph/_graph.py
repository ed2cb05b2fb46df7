"""Graph: a compiled plan that replays with `await graph(inputs, var_vals=...)`."""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from actorgraph.devices import NOT_RUN
from actorgraph.scheduler import Plan

from . import _capture
from ._await import Hinted, described, listed
from ._buffer import Allocation, Buffer, dtype_text
from ._errors import ClosedError, InputError, UsageError, VarError
from ._foreign import TimelinePoints, check_points
from ._graphviz import plan_to_svg
from ._profile import Profile, ReplayRecord, build_profile, new_records
from ._program import Bound, Program, plan_item, raise_failure, raise_item_failure
from ._vars import Var

if TYPE_CHECKING:
    from actorgraph.devices import Submission

    from ._runtime import Runtime


def check_var_vals(
    needed: frozenset[Var], var_vals: Mapping[Any, int] | None, what: str
) -> dict[Var, int]:
    values = dict(var_vals or {})
    for var, value in values.items():
        if not isinstance(var, Var):
            raise VarError(f"{what}: var_vals keys must be ag.Var objects, got {var!r}")
        if var not in needed:
            names = sorted(v.name for v in needed) or "none"
            raise VarError(f"{what} does not use Var {var.name!r} (it uses: {names}); drop it")
        var.check(value)
    missing = sorted(v.name for v in needed if v not in values)
    if missing:
        raise VarError(f"{what} needs values for Vars {missing}; pass var_vals={{var: value}}")
    return values


_BOUND_CACHE = 8

# What Graph.run_here returns when the replay cannot run where it was called.
NOT_HERE: Any = object()

# Looked up once: Graph.__call__ is the path every replay loop takes.
_scope = _capture.scope_get
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_cancel_shielded_checkpoint = trio.lowlevel.cancel_shielded_checkpoint


def _advance_when_done(sub: Submission, then: TimelinePoints) -> None:
    """Advance external timelines once `sub` is complete, failed or not."""

    def advance() -> None:
        for timeline, value in then:
            try:
                timeline.advance(value)
            except Exception as error:  # the other runtime's problem: report, go on
                from ._log import logger

                logger.error("could not advance timeline %s to %d: %s", timeline.name, value, error)

    if sub.done.is_set():
        advance()
        return
    chained = sub.on_done

    def on_done(done: Submission) -> None:
        if chained is not None:
            chained(done)
        advance()

    sub.on_done = on_done


class Spans:
    """Byte ranges [start, stop) of buffers, each non-empty, asked which overlaps a
    range in a binary search: sorted by start, with the farthest stop reached by each
    prefix, so only ranges that start before the asked one stops and reach past where
    it starts are looked at."""

    __slots__ = ("_reach", "_spans", "_starts")

    def __init__(self, spans: Sequence[tuple[int, int, Buffer]]) -> None:
        self._spans = sorted(spans, key=lambda span: span[0])
        self._starts = [start for start, _, _ in self._spans]
        self._reach = list(itertools.accumulate((stop for _, stop, _ in self._spans), max))

    def overlapping(self, start: int, stop: int) -> Buffer | None:
        """A buffer whose range shares a byte with [start, stop), or None."""
        before = bisect.bisect_left(self._starts, stop)  # these start before `stop`
        if start >= stop or before == 0 or self._reach[before - 1] <= start:
            return None
        for _, end, buf in self._spans[:before]:
            if end > start:
                return buf
        return None  # (unreachable: some range reaches past `start`)


class ReplayCounts:
    """A graph's replays as they happen: those finished (`done`, whether they ran where
    they were called or were posted) and the submissions of those in flight. Its runtime
    keeps every graph's, and adds them up for its own statistics."""

    __slots__ = ("done", "in_flight")

    def __init__(self) -> None:
        self.done = 0
        self.in_flight: set[Submission] = set()


class Replay:
    """A submitted replay. `await replay.wait()` returns when it is complete (or raises
    its failure)."""

    __slots__ = ("_program", "_sub", "graph", "number")

    def __init__(self, graph: Graph, program: Program, sub: Any, number: int) -> None:
        self.graph = graph
        self._program = program
        self._sub = sub
        self.number = number

    def __repr__(self) -> str:
        return f"<Replay {self.number} {'done' if self.done else 'in flight'}>"

    @property
    def done(self) -> bool:
        return bool(self._sub.done.is_set())

    async def wait(self) -> None:
        await self._sub.done.wait()
        raise_failure(self._program, self._sub)

    def finish(self) -> None:
        """Raise the failure of a replay that is done (nothing if it succeeded)."""
        raise_failure(self._program, self._sub)


@attrs.frozen
class GraphStatistics:
    """`replays` counts calls submitted; `replays_done` those finished. `waits_parked` and
    `time_blocked` (seconds) add up the waits its queues parked on; `bytes_copied` the
    bytes its Copy items moved; `checked` the replays checked against eager
    (`open_runtime(check_replays=N)`: its first N)."""

    items: int
    queues: int
    replays: int
    in_flight: int
    replays_done: int = 0
    waits_parked: int = 0
    time_blocked: float = 0.0
    bytes_copied: int = 0
    checked: int = 0


def check_graph(value: object, what: str) -> None:
    """Refuse anything but a Graph, naming a forgotten await."""
    if not isinstance(value, Graph):
        raise UsageError(f"{what} takes a Graph, got {described(value)}")


class Graph(Hinted):
    """A jit cache planned once. Replays are ordered with all other work on its devices."""

    def argument_hint(self) -> str:
        return (
            f"{self!r}, a Graph: a graph's call writes into its buffers; pass those "
            f"(`await graph(inputs)`, then use the output Buffer)"
        )

    def __init__(self, runtime: Runtime, program: Program, *, aliasing: str = "refuse") -> None:
        if aliasing not in ("refuse", "replan"):
            raise InputError(f"aliasing must be 'refuse' or 'replan', got {aliasing!r}")
        self._aliasing = aliasing
        # Replanned programs of aliased input sets, by those inputs (which they hold, so
        # the Buffers, hashing by identity, stay the very same ones). Cleared on a free.
        self._aliased: dict[tuple[Buffer, ...], Program] = {}
        self._runtime = runtime
        self._program = program
        self._inputs = program.inputs
        self._closed = False
        # The bindings of recently seen input sets (double buffering, rotating inputs):
        # inputs -> Bound (it holds the var values it was bound with, its Scripts and its
        # LinearRun). Keyed by the Buffers themselves, which hash and compare by
        # identity, so a hit means the very same buffers; only checked inputs (Buffers)
        # are stored. Cleared when anything is freed, and when the graph closes.
        self._bound: dict[tuple[Buffer, ...], Bound] = {}
        self._frees_seen = runtime.frees
        # The runtime's epoch when the kept bindings were last checked good to use as
        # they are (-1: never, as while the runtime profiles every replay).
        self._epoch_seen = -1
        self._internal: dict[int, list[Buffer]] = {}
        internal = self._internal
        for j, item in enumerate(program.items):
            from_inputs = program.item_inputs[j]
            bound = {slot for slot, _ in from_inputs} if from_inputs else ()
            for slot, buf in enumerate(item.bufs):
                if slot not in bound:
                    alloc = buf.alloc_id
                    bufs = internal.get(alloc)
                    if bufs is None:
                        internal[alloc] = [buf]
                    else:
                        bufs.append(buf)
        # Whether a call may run off the runtime's thread (a background runtime's caller,
        # see replay_off_thread): every queue runs jobs as QueueActor does, on CPU
        # devices, whose items are numpy-level calls with no state bound to a thread.
        self.runs_off_thread = program.runs_inline and all(
            device.kind == "CPU" for device in program.devices
        )
        # One buffer per internal allocation, checked on every call after a free, as a
        # buffer may be freed between two calls with the same inputs. Per allocation,
        # not per address space: every wrapper on a device shares one (`alloc_id`), and
        # each is freed on its own.
        roots: dict[Allocation, Buffer] = {}
        for bufs in internal.values():
            for buf in bufs:
                roots.setdefault(buf.allocation, buf)
        self._internal_roots = tuple(roots.values())
        # The byte ranges of those buffers by allocation, worked out the first time an
        # input is in that allocation (most never are): every new input set is checked
        # against them (_overlap), and wrapped memory puts every wrapped buffer of a
        # device in one allocation, so there may be many.
        self._internal_spans: dict[int, Spans] = {}
        # Replays finished and in flight, counted as they happen.
        self._counts = ReplayCounts()
        self._in_flight = self._counts.in_flight  # replays submitted and not done
        self.waits_parked = 0
        self.time_blocked = 0.0
        self._copy_bytes = sum(program.copy_bytes)
        # Numbers this graph in its runtime's profiles.
        self.number = runtime.adopt(self._counts)
        self._profiling = runtime.profiling
        self._last_record: ReplayRecord | None = None
        # Replays checked against eager (see _checker.CheckedGraph, which counts them).
        self.checked = 0

    @property
    def plan(self) -> Plan:
        return self._program.plan

    @property
    def replays(self) -> int:
        """Replays submitted: those finished and those in flight."""
        return self._counts.done + len(self._in_flight)

    @property
    def replays_done(self) -> int:
        """Replays finished."""
        return self._counts.done

    @property
    def bytes_copied(self) -> int:
        """Bytes the Copy items of finished replays moved."""
        return self._counts.done * self._copy_bytes

    def to_svg(self, path: str | os.PathLike[str] | None = None) -> str:
        """This graph's plan drawn as SVG by Graphviz's `dot` (GraphvizError if it is
        missing); written to `path` too when given. `graph.plan.to_dot()` is the text."""
        return plan_to_svg(self.plan, path)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<Graph {len(self._program.items)} items on {len(self.plan.queues)} queues, "
            f"{len(self._inputs)} inputs, {state}>"
        )

    def statistics(self) -> GraphStatistics:
        return GraphStatistics(
            items=len(self._program.items),
            queues=len(self.plan.queues),
            replays=self.replays,
            in_flight=len(self._in_flight),
            replays_done=self.replays_done,
            waits_parked=self.waits_parked,
            time_blocked=self.time_blocked,
            bytes_copied=self.bytes_copied,
            checked=self.checked,
        )

    @property
    def last_profile(self) -> Profile | None:
        """The Profile of this graph's latest profiled replay (None if none was profiled)."""
        record = self._last_record
        if record is None:
            return None
        return build_profile(self._runtime.actor_names(), [record])

    async def __call__(
        self,
        inputs: Sequence[Buffer] = (),
        var_vals: Mapping[Var, int] | None = None,
        *,
        profile: bool | None = None,
        after: TimelinePoints = (),
        then: TimelinePoints = (),
    ) -> None:
        """Replay with these inputs and var values; return when the replay is complete.

        `profile=True` records this replay's item times (see `graph.last_profile`,
        `rt.profile()`); None follows `open_runtime(..., profile=...)`.
        Cancelling the call before the replay is submitted submits nothing; cancelling it
        after abandons only the waiting: the replay completes in order on the devices.
        `after=[(timeline, v)]` starts the replay only once that ag.ExternalTimeline has
        reached v; `then=[(timeline, w)]` advances it to w when the replay is complete.

        As trio's `send`: a cancel point first, then the replay run here and now if it
        can be (`run_here`: it then takes one cancel-shielded scheduler pass, so a replay
        that ran is never lost to a cancellation), else submitted and waited for.
        """
        if after or then:
            replay = await self.submit(inputs, var_vals, profile=profile, after=after, then=then)
            await replay.wait()
            return
        if _scope() is not None:
            _capture.check_graph_call()
        # The call's cancel point comes first (cancelled there, it submits nothing), and
        # the submission before any yield, so calls submit in the order they are made.
        await _checkpoint_if_cancelled()
        # The binding kept for these very inputs and values is used as it is while the
        # runtime's epoch has not moved since it was checked (no buffer freed, the
        # runtime usable; never while it profiles every replay); else `bind` checks them
        # (and raises what the call raises for them).
        try:
            bound = self._bound.get(tuple(inputs))
        except TypeError:  # an input that cannot be hashed is no Buffer: bind says so
            bound = None
        if (
            bound is None
            or profile is not None
            or var_vals != bound.var_vals
            or self._runtime.epoch != self._epoch_seen
        ):
            bound = self.bind(inputs, var_vals)
            failure = self.run_here(bound, profile)
        elif bound.linear is None:
            failure = NOT_HERE
        else:  # run_here, for a binding known to run here unless its queues are busy
            failure = bound.linear.run()
            if failure is NOT_RUN:
                failure = NOT_HERE
            else:
                self._counts.done += 1  # a replay submitted and done where it was made
        if failure is NOT_HERE:
            await self._submit_and_wait(bound, inputs, profile)
            return
        await _cancel_shielded_checkpoint()
        if failure is not None:
            raise_item_failure(bound.program, failure)

    async def _submit_and_wait(
        self, bound: Bound, inputs: Sequence[Buffer], profile: bool | None
    ) -> None:
        """The replay, submitted once the in-flight window has room, and waited for."""
        await self._runtime.admit()
        self._check_not_closed()
        program = bound.program
        reader = program.end_reader
        if reader is None:
            sub = self._start(bound, inputs, profile)
            await sub.done.wait()
        else:
            # A graph living on one worker: this task reads its end (see its connection).
            reader.coming()
            try:
                sub = self._start(bound, inputs, profile)
            except BaseException:
                reader.not_coming()
                raise
            await reader.wait_done(sub)
        if sub.error is not None:
            raise_failure(program, sub)

    async def submit(
        self,
        inputs: Sequence[Buffer] = (),
        var_vals: Mapping[Var, int] | None = None,
        *,
        profile: bool | None = None,
        after: TimelinePoints = (),
        then: TimelinePoints = (),
    ) -> Replay:
        """Submit a replay without waiting for it; blocks only while the runtime's
        in-flight window (`max_in_flight`) is full, or (on a worker thread) until the
        external timelines in `after` are reached. Replays complete in submission order."""
        _capture.check_graph_call()
        bound = self.bind(inputs, var_vals)
        waits = [(tl, v) for tl, v in check_points(after, "after") if not tl.reached(v)]
        then = check_points(then, "then")
        runtime = self._runtime
        if not waits:
            await runtime.admit()
            self._check_not_closed()
            return self._post(bound, inputs, profile, then)
        # Its place in the window is held while it waits for the timelines: replays that
        # wait so must not all be posted at once when what they wait for comes.
        await runtime.reserve()
        try:
            for timeline, value in waits:
                # Cancelling ends the wait at once (nothing is submitted).
                await runtime.wait_timeline(timeline, value)
            self._check_not_closed()
            return self._post(bound, inputs, profile, then)
        finally:
            runtime.unreserve()

    def submit_nowait(
        self,
        inputs: Sequence[Buffer] = (),
        var_vals: Mapping[Var, int] | None = None,
        *,
        profile: bool | None = None,
        after: TimelinePoints = (),
        then: TimelinePoints = (),
    ) -> Replay:
        """`submit` that never blocks: raises trio.WouldBlock (submitting nothing) when the
        in-flight window is full or a timeline in `after` is not reached yet."""
        _capture.check_graph_call()
        bound = self.bind(inputs, var_vals)
        then = check_points(then, "then")
        for timeline, value in check_points(after, "after"):
            if not timeline.reached(value):
                raise trio.WouldBlock
        runtime = self._runtime
        runtime.check_open()
        if not runtime.has_room():
            raise trio.WouldBlock
        self._check_not_closed()
        return self._post(bound, inputs, profile, then)

    def _post(
        self,
        bound: Bound,
        inputs: Sequence[Buffer],
        profile: bool | None,
        then: TimelinePoints,
    ) -> Replay:
        sub = self._start(bound, inputs, profile)
        if then:
            _advance_when_done(sub, then)
        return Replay(self, bound.program, sub, self.replays)

    def replay_off_thread(
        self, inputs: Sequence[Buffer], var_vals: Mapping[Var, int] | None
    ) -> Any:
        """A call run by a thread other than the runtime's, while the runtime's trio
        run is stopped (a background runtime's caller holding its loop lock): bind,
        then `run_here` if the replay moves no signal a task waits on (waking one is
        for the run's own thread). Return (program, failure) with the failure or None,
        or NOT_HERE, having run nothing. Raises what binding raises."""
        bound = self.bind(inputs, var_vals)
        failure = self.run_here(bound, None, quiet=True)
        return NOT_HERE if failure is NOT_HERE else (bound.program, failure)

    def run_here(self, bound: Bound, profile: bool | None, *, quiet: bool = False) -> Any:
        """Run a bound replay here and now as one run of calls (its LinearRun), when its
        items all run inline, its queues are idle, its devices done with earlier work
        and nothing asks for a profile. Return its failure, None if it succeeded, or
        NOT_HERE (having done nothing) when it cannot run so: then it is submitted as
        usual. `quiet`: only if it moves no signal that a task waits on. It takes no
        room in the in-flight window (it is never in flight), so a full window does not
        hold it back. (A call's hot path does this for a binding it kept.)"""
        linear = bound.linear
        if linear is None or profile or (profile is None and self._profiling):
            return NOT_HERE
        if quiet and not linear.quiet():
            return NOT_HERE
        failure = linear.run()
        if failure is NOT_RUN:
            return NOT_HERE
        self._counts.done += 1  # a replay submitted and done where it was made
        return failure

    def _start(self, bound: Bound, inputs: Sequence[Buffer], profile: bool | None) -> Submission:
        failure = self.run_here(bound, profile)
        if failure is not NOT_HERE:
            return bound.program.done_submission(failure)
        if profile or (profile is None and self._profiling):
            sub = self._submit_profiled(bound, inputs)
        else:
            sub = bound.program.submit(bound, then=self._count)
        if not sub.done.is_set():
            self._in_flight.add(sub)
        return sub

    def _submit_profiled(self, bound: Bound, inputs: Sequence[Buffer]) -> Submission:
        program = bound.program
        jobs = new_records(program)
        submitted = program.actors[0].clock()
        # Numbered like the Replay that submit() returns: 1, 2, ...
        number = self.replays + 1
        sub = program.submit(bound, jobs, then=self._count)
        record = ReplayRecord(program, self.number, number, tuple(inputs), jobs, submitted)
        self._last_record = record
        self._runtime.keep_profile(record)
        return sub

    def _count(self, sub: Submission) -> None:
        """A replay of this graph finished (the runtime calls this once per replay)."""
        self._in_flight.discard(sub)
        self._counts.done += 1
        self.waits_parked += sub.waits_parked
        self.time_blocked += sub.time_blocked

    def bind(self, inputs: Sequence[Buffer], var_vals: Mapping[Var, int] | None) -> Bound:
        """The binding a call with these inputs and var values runs: the one kept for
        these very inputs (and values) if there is one, else checked and made (and
        kept). Raises what the call would raise for them."""
        self._check_not_closed()
        runtime = self._runtime
        if not runtime.usable:
            runtime.check_open()
        inputs = listed(
            inputs,
            "a graph call takes its inputs as a list of Buffers, one per input in compile() order",
            "`await graph([x, ...])`",
            InputError,
        )
        if runtime.frees != self._frees_seen:
            self._freed_since()
        try:
            bound = self._bound.get(inputs)
        except TypeError:  # an input that cannot be hashed is no Buffer: checked below
            bound = None
        if bound is not None and (var_vals or None) == bound.var_vals:
            return bound
        if self._aliased:
            replanned = self._aliased.get(inputs)
            if replanned is not None:
                checked = check_var_vals(replanned.free_vars, var_vals or {}, "this graph")
                return replanned.bind(inputs, checked)
        if bound is None:
            overlap = self._check_inputs(inputs)
            if overlap is not None:
                return self._replan(inputs, overlap, var_vals)
        checked = check_var_vals(self._program.free_vars, var_vals or {}, "this graph")
        # Made from the binding kept for these inputs (new var values only), else from
        # the latest one: what the change leaves alone is taken from it (Program.bind).
        bound = self._program.bind(inputs, checked, bound or self._latest())
        if len(self._bound) >= _BOUND_CACHE:
            self._bound.pop(next(iter(self._bound)))
        self._bound[inputs] = bound
        if not self._profiling:
            self._epoch_seen = runtime.epoch  # the runtime is usable, its frees seen
        return bound

    def _latest(self) -> Bound | None:
        """The binding kept last, if any."""
        return next(reversed(self._bound.values())) if self._bound else None

    def _freed_since(self) -> None:
        """A buffer was freed somewhere since the last call: before any kept binding is
        used, check this graph's own buffers, and forget the kept bindings and replanned
        programs (they may hold a freed buffer), so the next call checks its inputs as a
        first call does."""
        for buf in self._internal_roots:
            if buf.freed:
                buf.check_live("this graph's buffer ")
        self._bound.clear()
        self._aliased.clear()
        self._frees_seen = self._runtime.frees

    def _replan(
        self, inputs: tuple[Buffer, ...], overlap: str, var_vals: Mapping[Var, int] | None
    ) -> Bound:
        """Inputs alias each other or the graph's own buffers: the captured plan's
        dependencies would be wrong for them. Refuse, or plan again for this aliasing."""
        if self._aliasing != "replan":
            raise InputError(
                f"{overlap}; the plan assumes distinct memory: pass separate buffers, or "
                f"compile with aliasing='replan' to plan again for aliased inputs"
            )
        from actorgraph.scheduler import build_plan

        items = self._program.call_items(inputs)
        plan = build_plan([plan_item(item) for item in items], self._runtime.caps)
        if self._runtime.verify_plans:
            plan.verify()
        # Cached by the inputs' identity, so its items keep these very buffers: it has no
        # inputs to rebind (which is what lets inputs be views of one region, or overlap).
        replanned = Program(self._runtime, items, (), plan)
        if len(self._aliased) >= 8:
            self._aliased.pop(next(iter(self._aliased)))
        self._aliased[inputs] = replanned
        checked = check_var_vals(replanned.free_vars, var_vals or {}, "this graph")
        return replanned.bind(inputs, checked)

    def _check_inputs(self, inputs: tuple[Buffer, ...]) -> str | None:
        """Check count, type, device, dtype, shape, liveness; return a description of
        the first aliasing found (inputs sharing memory), or None."""
        expected = self._inputs
        if len(inputs) != len(expected):
            raise InputError(
                f"graph was compiled with {len(expected)} inputs but was called with "
                f"{len(inputs)}; pass one buffer per input, in compile() order"
            )
        by_alloc: dict[int, list[tuple[int, Buffer]]] = {}
        overlap: str | None = None
        for i, (new, old) in enumerate(zip(inputs, expected)):
            self._check_input(i, new, old)
            overlap = overlap or self._overlap(i, new, by_alloc)
            by_alloc.setdefault(new.alloc_id, []).append((i, new))
        return overlap

    def _check_input(self, i: int, new: object, old: Buffer) -> None:
        """Input i may stand for `old`, the buffer the graph was compiled with."""
        if not isinstance(new, Buffer):
            raise InputError(f"input {i} must be a Buffer, got {described(new)}")
        self._runtime.check_own(new, f"input {i}: ", InputError)
        new.check_live(f"input {i}: ")
        if new.device != old.device:
            raise InputError(
                f"input {i} is on {new.device} but the graph was compiled for one on "
                f"{old.device}; copy it to {old.device} first"
            )
        if new.dtype != old.dtype:
            raise InputError(
                f"input {i} has dtype {dtype_text(new.dtype)} but the graph was compiled for "
                f"{dtype_text(old.dtype)}; pass a buffer of that dtype"
            )
        limit = self._program.max_sizes.get(i)
        if limit is None:
            if new.shape != old.shape:
                raise InputError(
                    f"input {i} has shape {new.shape} but the graph was compiled for {old.shape}"
                )
        elif new.size > limit:
            raise InputError(
                f"input {i} holds {new.size} elements but the graph was compiled "
                f"for at most {limit} (max_sizes); compile with a larger maximum"
            )

    def _overlap(
        self, i: int, new: Buffer, by_alloc: Mapping[int, list[tuple[int, Buffer]]]
    ) -> str | None:
        """How input i shares memory with an earlier input or a buffer the graph uses
        internally, or None."""
        for j, other in by_alloc.get(new.alloc_id, ()):
            if new.overlaps(other):
                return f"inputs {j} and {i} share memory ({other!r} and {new!r})"
        alloc = new.alloc_id
        spans = self._internal_spans.get(alloc)
        if spans is None:
            bufs = self._internal.get(alloc)
            if bufs is None:
                return None
            spans = Spans([(*buf.byte_range, buf) for buf in bufs if buf.nbytes])
            self._internal_spans[alloc] = spans
        internal = spans.overlapping(*new.byte_range)
        if internal is not None:
            return (
                f"input {i} {new!r} shares memory with {internal!r}, which the graph "
                f"uses internally"
            )
        return None

    def _check_not_closed(self) -> None:
        if self._closed:
            raise ClosedError(f"{self!r} was closed with aclose(); compile a new graph")

    async def aclose(self) -> None:
        """Refuse further calls, then wait for the replays already submitted."""
        self._closed = True
        self._bound.clear()
        for sub in list(self._in_flight):
            await sub.done.wait()

    async def __aenter__(self) -> Graph:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
