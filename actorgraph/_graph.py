"""Graph: a compiled plan that replays with `await graph(inputs, var_vals=...)`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from actorgraph.devices import NOT_RUN
from actorgraph.scheduler import Plan

from . import _capture
from ._await import Hinted, described, listed
from ._buffer import Buffer
from ._errors import ClosedError, InputError, UsageError, VarError
from ._foreign import TimelinePoints, check_points
from ._graphviz import plan_to_svg
from ._profile import Profile, ReplayRecord, build_profile, new_records
from ._program import Program, plan_item, raise_failure, raise_item_failure
from ._vars import Var

if TYPE_CHECKING:
    from actorgraph.devices import LinearRun, Submission

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
    bytes its Copy items moved."""

    items: int
    queues: int
    replays: int
    in_flight: int
    replays_done: int = 0
    waits_parked: int = 0
    time_blocked: float = 0.0
    bytes_copied: int = 0


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
        self._aliased: dict[tuple[int, ...], tuple[tuple[Buffer, ...], Program]] = {}
        self._runtime = runtime
        self._program = program
        self._inputs = program.inputs
        self._closed = False
        # Op lists bound for recently seen input sets (double buffering, rotating
        # inputs): inputs -> (inputs, var values, ops, their LinearRun or None). Keyed
        # by the Buffers themselves, which hash and compare by identity, so a hit means
        # the very same buffers; only checked inputs (Buffers) are stored. Cleared when
        # anything is freed.
        self._bound: dict[
            tuple[Buffer, ...],
            tuple[tuple[Buffer, ...], dict[Var, int], Any, LinearRun | None],
        ] = {}
        self._frees_seen = runtime.frees
        # The inputs of the last call run here without var values -> (their LinearRun,
        # runtime.frees then); one entry at most, keyed like _bound. A call with the very
        # same inputs while nothing was freed runs it with no more checks.
        self._here: dict[tuple[Buffer, ...], tuple[LinearRun, int]] = {}
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
        # see replay_off_thread): every queue runs the plain loop, on CPU devices, whose
        # items are numpy-level calls with no state bound to a thread.
        self.runs_off_thread = program.runs_inline and all(
            device.kind == "CPU" for device in program.devices
        )
        # One buffer per internal allocation: checked on every call, as a buffer may be
        # freed between two calls with the same inputs.
        self._internal_roots = tuple(bufs[0] for bufs in self._internal.values())
        # The byte ranges of those buffers, worked out once: every new input set is
        # checked against them (_check_inputs), and wrapped memory puts every wrapped
        # buffer of a device in one allocation, so there may be many.
        self._internal_spans = {
            alloc: tuple((*buf.byte_range, buf) for buf in bufs if buf.nbytes)
            for alloc, bufs in self._internal.items()
        }
        # Replays submitted / finished / bytes their copies moved, less those run here
        # as one loop (`_runs_here`), which add to all three at once (see the properties).
        self._replays = 0
        self._replays_done = 0
        self._bytes_copied = 0
        self._runs_here = 0
        self.waits_parked = 0
        self.time_blocked = 0.0
        self._copy_bytes = sum(program.copy_bytes)
        # Numbers this graph in its runtime's profiles.
        self.number = runtime.graphs_compiled
        runtime.graphs_compiled += 1
        self._last_record: ReplayRecord | None = None
        self._in_flight: set[Submission] = set()  # replays submitted and not done

    @property
    def plan(self) -> Plan:
        return self._program.plan

    @property
    def replays(self) -> int:
        """Replays submitted."""
        return self._replays + self._runs_here

    @property
    def replays_done(self) -> int:
        """Replays finished."""
        return self._replays_done + self._runs_here

    @property
    def bytes_copied(self) -> int:
        """Bytes the Copy items of finished replays moved."""
        return self._bytes_copied + self._runs_here * self._copy_bytes

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
        """
        if after or then:
            replay = await self.submit(inputs, var_vals, profile=profile, after=after, then=then)
            await replay.wait()
            return
        # submit() and Replay.wait() without the Replay: the common call, kept short.
        if _scope() is not None:
            _capture.check_graph_call()
        # The call's cancel point comes first (cancelled there, it submits nothing), and
        # the submission before any yield, so calls submit in the order they are made.
        await _checkpoint_if_cancelled()
        runtime = self._runtime
        failure = NOT_HERE
        if profile is None and var_vals is None:
            # The call a replay loop makes: the very inputs of the last call run here
            # (`_here`), nothing freed since (so every buffer it uses is still live),
            # the runtime usable, no profile asked for.
            try:
                here = self._here.get(tuple(inputs))
            except TypeError:  # an input that cannot be hashed is no Buffer: bind checks
                here = None
            if (
                here is not None
                and runtime.frees == here[1]
                and runtime.usable
                and not runtime.profiling
            ):
                failure = here[0].run()
                if failure is NOT_RUN:
                    failure = NOT_HERE
                else:
                    # Submitted and done where it was made (see the counts' properties).
                    self._runs_here += 1
                    runtime.runs_here += 1
                    await _cancel_shielded_checkpoint()
                    if failure is not None:
                        raise_item_failure(self._program, failure)
                    return
            if (
                failure is NOT_HERE
                and runtime.usable
                and runtime.frees == self._frees_seen
                and not (runtime.profiling or self._closed or self._aliased)
            ):
                # Inputs bound before (the cache entry holds their LinearRun).
                try:
                    key = tuple(inputs)
                    hit = self._bound.get(key)
                except TypeError:  # an input that cannot be hashed is no Buffer: bind checks
                    hit = None
                if hit is not None and hit[3] is not None and not hit[1]:
                    failure = hit[3].run()
                    if failure is NOT_RUN:
                        failure = NOT_HERE
                    else:
                        self._runs_here += 1
                        runtime.runs_here += 1
                        self._here = {key: (hit[3], runtime.frees)}
        elif (
            runtime.usable
            and runtime.frees == self._frees_seen
            and not (runtime.profiling or self._closed or self._aliased)
            and profile is None
        ):
            # Inputs and var values bound before (the cache entry holds their LinearRun).
            try:
                hit = self._bound.get(tuple(inputs))
            except TypeError:  # an input that cannot be hashed is no Buffer: bind checks
                hit = None
            if hit is not None and hit[3] is not None and var_vals == hit[1]:
                failure = hit[3].run()
                if failure is NOT_RUN:
                    failure = NOT_HERE
                else:
                    self._runs_here += 1
                    runtime.runs_here += 1
        if failure is NOT_HERE:
            program, ops = self._bind(inputs, var_vals)
            failure = self.run_here(program, ops, profile)
        else:
            program = self._program
        if failure is not NOT_HERE:
            # Done already (one loop on idle queues). The call's schedule point comes
            # after the work and is shielded, as with trio's own operations that
            # complete: a replay that ran is reported, never lost to a cancellation.
            await _cancel_shielded_checkpoint()
            if failure is not None:
                raise_item_failure(program, failure)
            return
        await self._runtime.admit()
        if self._closed:
            raise ClosedError(f"{self!r} was closed with aclose(); compile a new graph")
        reader = program.end_reader
        if reader is None:
            sub = self._start(program, ops, inputs, profile)
            await sub.done.wait()
        else:
            # A graph living on one worker: this task reads its end (see its connection).
            reader.coming()
            try:
                sub = self._start(program, ops, inputs, profile)
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
        program, ops = self._bind(inputs, var_vals)
        waits = [(tl, v) for tl, v in check_points(after, "after") if not tl.reached(v)]
        then = check_points(then, "then")
        runtime = self._runtime
        await runtime.admit()
        for timeline, value in waits:
            # Cancelling abandons the wait (nothing is submitted); the thread polls on
            # until the timeline moves or its timeout.
            await trio.to_thread.run_sync(timeline.wait_for, value, abandon_on_cancel=True)
        if self._closed:
            raise ClosedError(f"{self!r} was closed with aclose(); compile a new graph")
        return self._post(program, ops, inputs, profile, then)

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
        program, ops = self._bind(inputs, var_vals)
        then = check_points(then, "then")
        for timeline, value in check_points(after, "after"):
            if not timeline.reached(value):
                raise trio.WouldBlock
        runtime = self._runtime
        runtime.check_open()
        if runtime.in_flight >= runtime.max_in_flight:
            raise trio.WouldBlock
        if self._closed:
            raise ClosedError(f"{self!r} was closed with aclose(); compile a new graph")
        return self._post(program, ops, inputs, profile, then)

    def _post(
        self,
        program: Program,
        ops: Any,
        inputs: Sequence[Buffer],
        profile: bool | None,
        then: TimelinePoints,
    ) -> Replay:
        sub = self._start(program, ops, inputs, profile)
        if then:
            _advance_when_done(sub, then)
        return Replay(self, program, sub, self.replays)

    def replay_off_thread(
        self, inputs: Sequence[Buffer], var_vals: Mapping[Var, int] | None
    ) -> Any:
        """A call run by a thread other than the runtime's, while the runtime's trio
        run is stopped (a background runtime's caller holding its loop lock): bind,
        then `run_here` if the replay moves no signal a task waits on (waking one is
        for the run's own thread). Return (program, failure) with the failure or None,
        or NOT_HERE, having run nothing. Raises what binding raises."""
        program, ops = self._bind(inputs, var_vals)
        failure = self.run_here(program, ops, None, quiet=True)
        return NOT_HERE if failure is NOT_HERE else (program, failure)

    def run_here(
        self, program: Program, ops: Any, profile: bool | None, *, quiet: bool = False
    ) -> Any:
        """Run a bound replay here and now as one loop (devices.LinearRun), when its
        items all run inline, its queues are idle, its devices done with earlier work
        and nothing asks for a profile. Return its
        failure, None if it succeeded, or NOT_HERE (having done nothing) when it cannot
        run so: then it is submitted as usual. `quiet`: only if it moves no signal that
        a task waits on. It takes no room in the in-flight window
        (it is never in flight), so a full window does not hold it back."""
        runtime = self._runtime
        if profile or (profile is None and runtime.profiling):
            return NOT_HERE
        linear = program.linear_run(ops)
        if linear is None or (quiet and not linear.quiet()):
            return NOT_HERE
        failure = linear.run()
        if failure is NOT_RUN:
            return NOT_HERE
        # A replay submitted and done where it was made (see the counts' properties).
        self._runs_here += 1
        runtime.runs_here += 1
        return failure

    def _start(
        self, program: Program, ops: Any, inputs: Sequence[Buffer], profile: bool | None
    ) -> Submission:
        runtime = self._runtime
        if profile or (profile is None and runtime.profiling):
            sub = self._submit_profiled(program, ops, inputs)
        else:
            sub = program.submit(ops, then=self._count)
        if not sub.done.is_set():
            self._in_flight.add(sub)
        self._replays += 1
        runtime.count_replay()
        return sub

    def _submit_profiled(self, program: Program, ops: Any, inputs: Sequence[Buffer]) -> Submission:
        jobs = new_records(program)
        submitted = program.actors[0]._now()
        sub = program.submit(ops, jobs, then=self._count)
        # Numbered like the Replay that submit() returns: 1, 2, ...
        record = ReplayRecord(
            program, self.number, self.replays + 1, tuple(inputs), jobs, submitted
        )
        self._last_record = record
        self._runtime.keep_profile(record)
        return sub

    def _count(self, sub: Submission) -> None:
        """A replay of this graph finished (the runtime calls this once per replay)."""
        self._in_flight.discard(sub)
        self._replays_done += 1
        self.waits_parked += sub.waits_parked
        self.time_blocked += sub.time_blocked
        self._bytes_copied += self._copy_bytes

    def _bind(self, inputs: Sequence[Buffer], var_vals: Mapping[Var, int] | None) -> Any:
        if self._closed:
            raise ClosedError(f"{self!r} was closed with aclose(); compile a new graph")
        self._runtime.check_open()
        inputs = listed(
            inputs,
            "a graph call takes its inputs as a list of Buffers, one per input in compile() order",
            "`await graph([x, ...])`",
            InputError,
        )
        runtime = self._runtime
        if runtime.frees != self._frees_seen:
            # Before any cache: a buffer was freed somewhere since the last call.
            for buf in self._internal_roots:
                if buf.freed:
                    buf.check_live("this graph's buffer ")
            # Cached input sets and replanned programs may hold a freed buffer: forget
            # them, so the next call checks its inputs as a first call does.
            self._bound.clear()
            self._aliased.clear()
            self._frees_seen = runtime.frees
        if self._aliased:
            # It holds the input sets it is keyed by, so their buffers stay alive and
            # equal ids mean the very same buffers.
            aliased = self._aliased.get(tuple(map(id, inputs)))
            if aliased is not None:
                program = aliased[1]
                checked = check_var_vals(program.free_vars, var_vals or {}, "this graph")
                return program, program.bind(inputs, checked)
        values = var_vals if var_vals is not None else {}
        try:
            hit = self._bound.get(inputs)
        except TypeError:  # an input that cannot be hashed is no Buffer: checked below
            hit = None
        if hit is not None and values == hit[1]:
            return self._program, hit[2]
        if hit is None:
            overlap = self._check_inputs(inputs)
            if overlap is not None:
                return self._replan(inputs, overlap, var_vals)
        checked = check_var_vals(self._program.free_vars, values, "this graph")
        ops = self._program.bind(inputs, checked)
        if len(self._bound) >= _BOUND_CACHE:
            self._bound.pop(next(iter(self._bound)))
        self._bound[inputs] = (inputs, dict(values), ops, self._program.linear_run(ops))
        return self._program, ops

    def _replan(
        self, inputs: tuple[Buffer, ...], overlap: str, var_vals: Mapping[Var, int] | None
    ) -> Any:
        """Inputs alias each other or the graph's own buffers: the captured plan's
        dependencies would be wrong for them. Refuse, or plan again for this aliasing."""
        if self._aliasing != "replan":
            raise InputError(
                f"{overlap}; the plan assumes distinct memory: pass separate buffers, or "
                f"compile with aliasing='replan' to plan again for aliased inputs"
            )
        from actorgraph.scheduler import build_plan

        program = self._program
        items = []
        for j, item in enumerate(program.items):
            bufs = list(item.bufs)
            for slot, source in program.item_inputs[j]:
                bufs[slot] = bufs[slot].rebased(program.inputs[source], inputs[source])
            items.append(item.with_buffers(bufs))
        plan = build_plan([plan_item(item) for item in items], self._runtime.caps)
        if self._runtime.verify_plans:
            plan.verify()
        # Cached by the inputs' identity, so its items keep these very buffers: it has no
        # inputs to rebind (which is what lets inputs be views of one region, or overlap).
        replanned = Program(self._runtime, items, (), plan)
        if len(self._aliased) >= 8:
            self._aliased.pop(next(iter(self._aliased)))
        self._aliased[tuple(map(id, inputs))] = (inputs, replanned)
        self._here = {}
        checked = check_var_vals(replanned.free_vars, var_vals or {}, "this graph")
        return replanned, replanned.bind(inputs, checked)

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
                    f"input {i} has dtype {new.dtype} but the graph was compiled for {old.dtype}"
                )
            limit = self._program.max_sizes.get(i)
            if limit is not None:
                if new.size > limit:
                    raise InputError(
                        f"input {i} holds {new.size} elements but the graph was compiled "
                        f"for at most {limit} (max_sizes); compile with a larger maximum"
                    )
            elif new.shape != old.shape:
                raise InputError(
                    f"input {i} has shape {new.shape} but the graph was compiled for {old.shape}"
                )
            for j, other in by_alloc.get(new.alloc_id, ()):
                if new.overlaps(other) and overlap is None:
                    overlap = f"inputs {j} and {i} share memory ({other!r} and {new!r})"
            by_alloc.setdefault(new.alloc_id, []).append((i, new))
            spans = self._internal_spans.get(new.alloc_id)
            if spans and overlap is None:
                a0, a1 = new.byte_range
                for b0, b1, internal in spans:
                    if a0 < b1 and b0 < a1 and a0 < a1:  # (as Buffer.overlaps)
                        overlap = (
                            f"input {i} {new!r} shares memory with {internal!r}, which the "
                            f"graph uses internally"
                        )
                        break
        return overlap

    async def aclose(self) -> None:
        """Refuse further calls, then wait for the replays already submitted."""
        self._closed = True
        self._here = {}
        for sub in list(self._in_flight):
            await sub.done.wait()

    async def __aenter__(self) -> Graph:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
