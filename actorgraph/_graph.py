"""Graph: a compiled plan that replays with `await graph(inputs, var_vals=...)`."""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np
import trio

from actorgraph.devices import NOT_RUN, NotRun, Op, Ran, without_bytes
from actorgraph.scheduler import Plan, QueueKind

from . import _capture
from ._await import Hinted, described, listed
from ._buffer import Allocation, Buffer, Home, check_out, dtype_text
from ._checker import CheckHost, Checks
from ._errors import ClosedError, InputError, UsageError
from ._foreign import TimelinePoints, check_points
from ._graphviz import plan_to_svg
from ._profile import Profile, Profiles, ReplayRecord, build_profile, new_records
from ._program import (
    Bound,
    Program,
    plan_item,
    post_and_wait,
    raise_failure,
    raise_item_failure,
)
from ._submitted import ReplayCounts, Submitted, check_var_vals, run_here
from ._vars import Var
from ._window import Window

if TYPE_CHECKING:
    from actorgraph.devices import Submission


_BOUND_CACHE = 8

# Looked up once: Graph.__call__ is the path every replay loop takes.
_scope = _capture.scope_get
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_cancel_shielded_checkpoint = trio.lowlevel.cancel_shielded_checkpoint


def _advance(then: TimelinePoints) -> None:
    """Advance external timelines: a replay is complete, failed or not."""
    for timeline, value in then:
        try:
            timeline.advance(value)
        except Exception as error:  # the other runtime's problem: report, go on
            from ._log import logger

            logger.error("could not advance timeline %s to %d: %s", timeline.name, value, error)


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


class Registry(Protocol):
    """Where a runtime keeps its graphs' replay counts (its Graphs)."""

    def adopt(self, counts: ReplayCounts) -> int: ...


class GraphHost(CheckHost, Home, Protocol):
    """What a Graph needs of its runtime (a `Runtime` is one): a Program's host and a
    check's, its parts (the in-flight window, the profiles, the graphs' counts), its
    checks of buffers and of itself, and what says whether a binding kept before may be
    used as it is."""

    @property
    def window(self) -> Window: ...

    @property
    def profiles(self) -> Profiles: ...

    @property
    def graphs(self) -> Registry: ...

    @property
    def verify_plans(self) -> bool: ...

    @property
    def usable(self) -> bool: ...

    @property
    def epoch(self) -> int: ...

    @property
    def frees(self) -> int: ...

    def check_open(self) -> None: ...

    def check_own(
        self, buffer: Buffer, what: str = "", error: type[UsageError] = UsageError
    ) -> None: ...

    def actor_names(self) -> tuple[str, ...]: ...


class Replay(Submitted):
    """A submitted replay: `await replay.wait()` returns when it is complete (or raises
    its failure).

    `graph.submit(...)` returns one. Replays of a runtime complete in submission order.

    Attributes:
        graph: the Graph it replays.
        number: its number among the graph's replays (1, 2, ...), as profiles and
            `plot_timeline(replays=...)` count them.
    """

    __slots__ = ("graph", "number")

    def __init__(
        self, graph: Graph, program: Program, sub: Submission | None, number: int, ran: Ran = None
    ) -> None:
        """Replay `number` of `graph` (of its `program`): posted as `sub`, or (None) run
        where it was submitted, with `ran` its failure or None."""
        super().__init__(program, sub, ran)
        self.graph = graph
        self.number = number

    def __repr__(self) -> str:
        return f"<Replay {self.number} {'done' if self.done else 'in flight'}>"


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
    """Items planned once, replayed with new inputs and Var values by every call.

    Made by `await rt.compile(items, inputs=[...])`; use it as `await graph(inputs)`.
    Replays are ordered with all other work on its devices; `async with graph:` closes it
    at the end of the block.
    """

    def argument_hint(self) -> str:
        return (
            f"{self!r}, a Graph: a graph's call writes into its buffers; pass those "
            f"(`await graph(inputs)`, then use the output Buffer)"
        )

    def __init__(
        self, runtime: GraphHost, program: Program, *, aliasing: str = "refuse", checks: int = 0
    ) -> None:
        if aliasing not in ("refuse", "replan"):
            raise InputError(f"aliasing must be 'refuse' or 'replan', got {aliasing!r}")
        if type(checks) is not int or checks < 0:
            raise InputError(
                f"checks is how many replays to check against eager, an int >= 0; got {checks!r}"
            )
        self._aliasing = aliasing
        # Replanned programs of aliased input sets, by those inputs (which they hold, so
        # the Buffers, hashing by identity, stay the very same ones). Cleared on a free.
        self._aliased: dict[tuple[Buffer, ...], Program] = {}
        self._runtime = runtime
        self._window = runtime.window
        self._profiles = runtime.profiles
        self._program = program
        self._inputs = program.inputs
        self._closed = False
        # The bindings of recently seen input sets (double buffering, rotating inputs):
        # inputs -> Bound (it holds the var values it was bound with, its Scripts and its
        # LinearRun). Keyed by the Buffers themselves, which hash and compare by
        # identity, so a hit means the very same buffers; only checked inputs (Buffers)
        # are stored. Cleared when anything is freed, and when the graph closes.
        self._bound: dict[tuple[Buffer, ...], Bound] = {}
        # By buffer: the program that copies it out after the replay (submit_reading),
        # and its bindings kept by inputs, as `_bound` (see bind). Cleared like `_bound`.
        self._reading: dict[Buffer, tuple[Program, dict[tuple[Buffer, ...], Bound]]] = {}
        self._frees_seen = runtime.frees
        # The runtime's epoch when the kept bindings were last checked good to use as
        # they are (-1: never yet).
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
        # see replay_off_thread): every queue runs jobs as QueueActor does, on devices
        # whose items are host calls with no state bound to a thread.
        self.runs_off_thread = program.runs_inline and all(
            device.runs_host_kernels for device in program.devices
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
        self.number = runtime.graphs.adopt(self._counts)
        self._profiling = self._profiles.every
        self._last_record: ReplayRecord | None = None
        # Replays checked against eager (_checker.py): its first `checks` are, each posted
        # with its check; `checked` counts those under way or done.
        self._checks = Checks(runtime, checks) if checks else None
        self.checked = 0

    @property
    def plan(self) -> Plan:
        """The plan, which holds each queue actor's messages (waits, runs, signals).

        `print(graph.plan)` shows one column per actor; `graph.plan.verify()` proves it
        deadlock-free and race-free; `graph.plan.to_dot()` is Graphviz text.
        """
        return self._program.plan

    @property
    def inputs(self) -> tuple[Buffer, ...]:
        """The buffers it was compiled with as its inputs, in compile() order."""
        return self._inputs

    @property
    def free_vars(self) -> frozenset[Var]:
        """The Vars its items use: a call gives a value for each (`var_vals`)."""
        return self._program.free_vars

    @property
    def replays(self) -> int:
        """Replays submitted, finished or still in flight."""
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
        """This graph's plan drawn as SVG by Graphviz's `dot`.

        `graph.plan.to_dot()` is the text it draws.

        Args:
            path: where to write the SVG too, if given.

        Returns:
            The SVG text.

        Raises:
            GraphvizError: Graphviz's `dot` is not installed or could not draw the plan.
        """
        return plan_to_svg(self.plan, path)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<Graph {len(self._program.items)} items on {len(self.plan.queues)} queues, "
            f"{len(self._inputs)} inputs, {state}>"
        )

    def statistics(self) -> GraphStatistics:
        """A frozen snapshot of the graph's counts.

        Returns:
            Its items and queues, replays submitted, in flight and done, waits parked and the
            seconds blocked on them, and the bytes its Copy items moved.
        """
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
        """Replay with these inputs and Var values; return when the replay is complete.

        As trio's `send`: a cancel point first, then the replay, run here and now where its
        queues are idle, else submitted and waited for. Cancelling the call before the
        replay is submitted submits nothing; cancelling it after abandons only the waiting:
        the replay completes in order on the devices.

        Args:
            inputs: one buffer (or view) per input given to compile, in that order, of the
                same device, dtype and shape (or at most `max_sizes` elements).
            var_vals: the value of every Var the items read, `{n: 1000}`.
            profile: record this replay's item times (see `last_profile`, `rt.profile()`);
                None follows `open_runtime(..., profile=...)`.
            after: `[(timeline, v)]`: start the replay only once that ExternalTimeline has
                reached `v` (waited for on a worker thread).
            then: `[(timeline, w)]`: advance that ExternalTimeline to `w` when the replay is
                complete, failed or not.

        Raises:
            InputError: the inputs do not match the compiled ones (count, type, device,
                dtype, shape), overlap each other or the graph's own buffers, or were freed.
            VarError: a Var has no value, or one outside its bounds.
            ItemError: an item raised; the original error is its `__cause__`.
            ClosedError: the graph or the runtime was closed, or a worker it uses was lost.
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
        # runtime usable); else `bind` checks them (and raises what the call raises).
        try:
            bound = self._bound.get(tuple(inputs))
        except (TypeError, ValueError):  # no Buffer, as it cannot be hashed: bind says so
            bound = None
        if bound is None or var_vals != bound.var_vals or self._runtime.epoch != self._epoch_seen:
            bound = self.bind(inputs, var_vals)
        ran = self._run_here(bound, profile)
        if ran is NOT_RUN:
            await self._submit_and_wait(bound, inputs, profile)
            return
        await _cancel_shielded_checkpoint()
        if ran is not None:
            raise_item_failure(bound.program, ran)

    async def _submit_and_wait(
        self, bound: Bound, inputs: Sequence[Buffer], profile: bool | None
    ) -> None:
        """The replay, posted once the in-flight window has room, and waited for."""
        await self._window.admit()
        self._check_not_closed()
        program = bound.program
        # A checked replay's end is its check's, which no connection reads.
        reader = None if self._checks is not None else program.end_reader
        sub = await post_and_wait(reader, lambda: self._post(bound, inputs, profile))
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
        """Submit a replay without waiting for it.

        It blocks only while the runtime's in-flight window (`max_in_flight`) is full, or
        until the timelines in `after` are reached. Replays complete in submission order.

        Args:
            inputs: as for a call of the graph.
            var_vals: as for a call of the graph.
            profile: as for a call of the graph.
            after: as for a call of the graph.
            then: as for a call of the graph.

        Returns:
            The Replay; `await replay.wait()` for its end.

        Raises:
            InputError: see the call of the graph.
            VarError: see the call of the graph.
            ClosedError: the graph or the runtime was closed.
        """
        _capture.check_graph_call()
        bound = self.bind(inputs, var_vals)
        waits = [(tl, v) for tl, v in check_points(after, "after") if not tl.reached(v)]
        then = check_points(then, "then")
        window = self._window
        if not waits:
            await window.admit()
            self._check_not_closed()
            return self._replay(bound, inputs, profile, then)
        # Its place in the window is held while it waits for the timelines: replays that
        # wait so must not all be posted at once when what they wait for comes.
        await window.reserve()
        try:
            for timeline, value in waits:
                # Cancelling ends the wait at once (nothing is submitted).
                await window.wait_timeline(timeline, value)
            self._check_not_closed()
            return self._replay(bound, inputs, profile, then)
        finally:
            window.unreserve()

    def submit_nowait(
        self,
        inputs: Sequence[Buffer] = (),
        var_vals: Mapping[Var, int] | None = None,
        *,
        profile: bool | None = None,
        after: TimelinePoints = (),
        then: TimelinePoints = (),
    ) -> Replay:
        """`submit` that never blocks.

        Args:
            inputs: as for a call of the graph.
            var_vals: as for a call of the graph.
            profile: as for a call of the graph.
            after: as for a call of the graph.
            then: as for a call of the graph.

        Returns:
            The Replay.

        Raises:
            trio.WouldBlock: the in-flight window is full or a timeline in `after` has not
                been reached; nothing was submitted.
            InputError: see the call of the graph.
            ClosedError: the graph or the runtime was closed.
        """
        _capture.check_graph_call()
        bound = self.bind(inputs, var_vals)
        then = check_points(then, "then")
        for timeline, value in check_points(after, "after"):
            if not timeline.reached(value):
                raise trio.WouldBlock
        self._runtime.check_open()
        if not self._window.has_room():
            raise trio.WouldBlock
        self._check_not_closed()
        return self._replay(bound, inputs, profile, then)

    async def submit_reading(
        self,
        inputs: Sequence[Buffer],
        var_vals: Mapping[Var, int] | None,
        buffer: Buffer,
        out: np.ndarray[Any, Any],
    ) -> Replay | None:
        """`submit`, with a copy of a worker's `buffer` into `out` once the replay has
        written it, as one submission: the copy is one more item of the replay's plan,
        after every item that writes `buffer`, and the worker sends its bytes with the
        report of the job that copies them. `submit` then `rt.submit_copyout` send two
        jobs and take two reports.

        Args:
            inputs: as for a call of the graph.
            var_vals: as for a call of the graph.
            buffer: the Buffer to read, on a worker's device.
            out: the numpy array its bytes go to, of its shape and dtype.

        Returns:
            The Replay (once it is done, `out` holds the bytes); or None, having
            submitted nothing, where the copy cannot go with the replay (then `submit`,
            then `rt.submit_copyout`): a `buffer` of this host (its copy sends no message
            anyway), a replay to be checked or profiled, inputs replanned for aliasing,
            or a `buffer` that is or overlaps an input (the plan orders the graph's own
            memory).

        Raises:
            UsageError: `buffer` is no live Buffer of this runtime, or `out` cannot hold
                its bytes (a writable C-contiguous array of its shape and dtype).
            InputError: see the call of the graph.
            VarError: see the call of the graph.
            ClosedError: the graph or the runtime was closed.
        """
        _capture.check_graph_call()
        runtime = self._runtime
        if not isinstance(buffer, Buffer):
            raise UsageError(f"submit_reading reads a Buffer, got {described(buffer)}")
        runtime.check_own(buffer, "submit_reading: ")
        buffer.check_live("submit_reading: ")
        check_out("submit_reading", buffer, out)
        if self._checks is not None or self._profiling:
            return None
        op = runtime.device(buffer.device).lower_host_read(buffer, out, QueueKind.COMPUTE)
        if without_bytes(op) is None or any(buffer.overlaps(b) for b in self._inputs):
            return None  # not a copy over a connection; a copy of an input
        bound = self.bind(inputs, var_vals, (buffer, op))
        if bound.program is not self._reading[buffer][0] or any(
            buffer.overlaps(b) for b in bound.inputs
        ):
            return None  # inputs replanned for aliasing; a copy of one of them
        await self._window.admit()
        self._check_not_closed()
        return self._replay(bound, inputs, None, ())

    def _replay(
        self,
        bound: Bound,
        inputs: Sequence[Buffer],
        profile: bool | None,
        then: TimelinePoints,
    ) -> Replay:
        ran = self._run_here(bound, profile)
        if ran is NOT_RUN:
            sub = self._post(bound, inputs, profile)
            if then:
                sub.when_done(lambda _: _advance(then))
            return Replay(self, bound.program, sub, self.replays)
        if then:
            _advance(then)
        return Replay(self, bound.program, None, self.replays, ran)

    def replay_off_thread(
        self, inputs: Sequence[Buffer], var_vals: Mapping[Var, int] | None
    ) -> bool:
        """A call run by a thread other than the runtime's, while the runtime's trio
        run is stopped (a background runtime's caller holding its loop lock): bind,
        then run it here if `_run_here` says so for a replay that moves no signal a task
        waits on (waking one is for the run's own thread). Returns True once it ran,
        raising its failure (an ItemError naming the item), or False having run nothing
        (the call goes to the runtime's thread). Raises what binding raises."""
        bound = self.bind(inputs, var_vals)
        ran = self._run_here(bound, None, quiet=True)
        if ran is NOT_RUN:
            return False
        if ran is not None:
            raise_item_failure(bound.program, ran)
        return True

    def _run_here(self, bound: Bound, profile: bool | None, quiet: bool = False) -> Ran | NotRun:
        """Where a replay of this graph runs (`run_here`, which decides it): posted to the
        actors while it is to be checked or profiled (`profile`; None: as the runtime
        profiles), else here and now where it can be. Counts it when it ran."""
        ran = run_here(
            bound,
            self._checks is not None or (self._profiling if profile is None else profile),
            quiet,
        )
        if ran is not NOT_RUN:
            self._counts.done += 1  # a replay submitted and done where it was made
        return ran

    def _post(self, bound: Bound, inputs: Sequence[Buffer], profile: bool | None) -> Submission:
        """The replay posted to the actors: with its check while checks are left (the
        gate of the check stands for it then), else as `_submit` posts it."""
        checks = self._checks
        if checks is None:
            return self._submit(bound, inputs, profile)
        what = f"replay {self.replays + 1} of graph {self.number} {self!r}"
        gate = checks.post(what, bound, lambda: self._submit(bound, inputs, profile))
        self.checked += 1
        if not checks.left:
            self._checks = None  # its later replays are unchecked
        return gate

    def _submit(self, bound: Bound, inputs: Sequence[Buffer], profile: bool | None) -> Submission:
        """The replay posted to its actors, profiled if asked (None: as the runtime)."""
        if self._profiling if profile is None else profile:
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
        self._profiles.keep(record)
        return sub

    def _count(self, sub: Submission) -> None:
        """A replay of this graph finished (the runtime calls this once per replay)."""
        self._in_flight.discard(sub)
        self._counts.done += 1
        self.waits_parked += sub.waits_parked
        self.time_blocked += sub.time_blocked

    def bind(
        self,
        inputs: Sequence[Buffer],
        var_vals: Mapping[Var, int] | None,
        read: tuple[Buffer, Op] | None = None,
    ) -> Bound:
        """The binding a call with these inputs and var values runs: the one kept for
        these very inputs (and values) if there is one, else checked and made (and
        kept). Raises what the call would raise for them.

        With `read` (a worker's buffer that is no input, and the op of a copy of it
        out): the binding of the program that copies it out after the replay
        (`submit_reading`), made with the call's values from the one kept for these
        inputs, whose copy stands in without its bytes; so every call's binding is made
        from it (the worker's program is found through its Scripts), and none keeps a
        caller's array."""
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
        program, kept = (self._program, self._bound) if read is None else self._reading_of(read[0])
        try:
            bound = kept.get(inputs)
        except (TypeError, ValueError):  # no Buffer, as it cannot be hashed: checked below
            bound = None
        if bound is None or (read is None and (var_vals or None) != bound.var_vals):
            bound = self._made(program, kept, inputs, var_vals, bound, read)
            if bound.program is not program:
                return bound  # replanned for aliasing
        if read is None:
            return bound
        values = bound.var_vals or {}
        if (var_vals or None) != bound.var_vals:
            values = check_var_vals(program.free_vars, var_vals or {}, "this graph")
        return program.bind(inputs, values, bound, host=read[1])

    def _made(
        self,
        program: Program,
        kept: dict[tuple[Buffer, ...], Bound],
        inputs: tuple[Buffer, ...],
        var_vals: Mapping[Var, int] | None,
        bound: Bound | None,
        read: tuple[Buffer, Op] | None,
    ) -> Bound:
        """A binding of `program` for these inputs and values, made and kept in `kept`
        (see bind); or, for inputs that alias, one of a program planned for them."""
        if self._aliased:
            replanned = self._aliased.get(inputs)
            if replanned is not None:
                checked = check_var_vals(replanned.free_vars, var_vals or {}, "this graph")
                return replanned.bind(inputs, checked)
        if bound is None:
            overlap = self._check_inputs(inputs)
            if overlap is not None:
                return self._replan(inputs, overlap, var_vals)
        checked = check_var_vals(program.free_vars, var_vals or {}, "this graph")
        # Made from the binding kept for these inputs (new var values only), else from
        # the latest one: what the change leaves alone is taken from it (Program.bind).
        latest = next(reversed(kept.values())) if kept else None
        stand_in = None if read is None else without_bytes(read[1])
        bound = program.bind(inputs, checked, bound or latest, host=stand_in)
        if read is not None:
            bound.scripts  # noqa: B018 - made now, the Scripts each call's are made from
        if len(kept) >= _BOUND_CACHE:
            kept.pop(next(iter(kept)))
        kept[inputs] = bound
        self._epoch_seen = self._runtime.epoch  # the runtime is usable, its frees seen
        return bound

    def _reading_of(self, buffer: Buffer) -> tuple[Program, dict[tuple[Buffer, ...], Bound]]:
        """The program that copies `buffer` out after the replay (Program.reading), and
        the bindings kept for it by inputs; made on first use, kept for a few buffers."""
        found = self._reading.get(buffer)
        if found is None:
            program = self._program.reading(buffer, self._runtime.caps)
            if self._runtime.verify_plans:
                program.plan.verify()
            if len(self._reading) >= _BOUND_CACHE:
                self._reading.pop(next(iter(self._reading)))
            found = self._reading[buffer] = (program, {})
        return found

    def _freed_since(self) -> None:
        """A buffer was freed somewhere since the last call: before any kept binding is
        used, check this graph's own buffers, and forget the kept bindings and replanned
        programs (they may hold a freed buffer), so the next call checks its inputs as a
        first call does."""
        for buf in self._internal_roots:
            if buf.freed:
                buf.check_live("this graph's buffer ")
        self._bound.clear()
        self._reading.clear()
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
        self._reading.clear()
        for sub in list(self._in_flight):
            await sub.done.wait()

    async def __aenter__(self) -> Graph:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
