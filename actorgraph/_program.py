"""A Plan lowered onto a runtime's actors: op lists per queue, bound per call.

Lowering happens once per graph; binding a call (`Program.bind`) only re-lowers the
items whose buffers come from the call's inputs or whose var values / launch dims depend
on the call's vars, and of those, made from a binding kept before, only what changed (an
item on the same buffers has its device lower its new values alone). A binding is a
`Bound`: an op list per queue, a Script per queue (devices/_ops.py), which owns what is
derived from its ops, and the binding's linear schedule. A graph keeps the Bound of each
input set it sees, so a replay with the same bindings finds all of it made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

from actorgraph.devices import (
    EXEC,
    FIRST_QUEUE_SLOT,
    KICK,
    Device,
    Failure,
    Job,
    JobProfile,
    LaunchRequest,
    LinearRun,
    Op,
    QueueActor,
    RemoteConnectionError,
    Schedule,
    Script,
    Submission,
    run_inline,
    signal_op,
    wait_op,
    without_bytes,
)
from actorgraph.devices import Signal as DeviceSignal
from actorgraph.scheduler import (
    Access,
    DeviceCaps,
    ItemKind,
    Message,
    Plan,
    PlanItem,
    QueueId,
    QueueKind,
    Run,
    Signal,
    SyncDevice,
    Wait,
    WaitKick,
    build_plan,
)

from ._buffer import Buffer
from ._errors import ClosedError, DeadlockError, ItemError, ReplayMismatchError, UsageError
from ._kernel import Copy, Item, Launch
from ._templates import linear_order, mark_host_signals
from ._vars import Var, evaluate


class Tracker(Protocol):
    """What keeps a runtime's submissions in flight (its Window)."""

    def track(self, sub: Submission) -> None: ...


class Host(Protocol):
    """What a Program needs of the runtime it runs on (a `Runtime` is one): its devices,
    its KICK signal, and its window, told of each submission a program posts."""

    @property
    def kick(self) -> DeviceSignal: ...

    @property
    def window(self) -> Tracker: ...

    def device(self, name: str) -> Device: ...


_new_request = tuple.__new__


class Bound:
    """A program's op lists bound to one call's inputs and var values (`Program.bind`):
    `ops`, one op list per queue; one Script per queue, each owning what is derived from
    its ops (its runs of calls, what the queue that runs them made of them), made when
    first asked for (a submission posted to the actors runs them; a LinearRun does
    not); and the binding's linear schedule (`linear`: the whole submission as one run
    of calls, or None where some item does not run inline), worked out when it is
    bound. `var_vals` are the values it was bound with, None for none; `inputs` the
    input buffers."""

    __slots__ = ("_from", "_scripts", "inputs", "linear", "ops", "program", "var_vals")

    def __init__(
        self,
        program: Program,
        ops: tuple[tuple[Op, ...], ...],
        var_vals: Mapping[Var, int],
        inputs: Sequence[Buffer] = (),
        made_from: tuple[tuple[Script, ...], Sequence[Sequence[int]]] | None = None,
    ) -> None:
        self.program = program
        self.ops = ops
        self.var_vals: Mapping[Var, int] | None = var_vals or None
        self.inputs = tuple(inputs)
        self._scripts: tuple[Script, ...] | None = None
        # The Scripts of the binding these ops were made from and, per queue, where they
        # differ: until this one's are made (each then has its origin: Script.origin).
        self._from = made_from
        self.linear = program.linear_run(ops)

    @property
    def scripts(self) -> tuple[Script, ...]:
        """One Script per queue (the same ones every time: queues keep what they make
        of them with them); a queue's ops that are those of the binding they were made
        from are its Script too."""
        scripts = self._scripts
        if scripts is None:
            made_from, self._from = self._from, None
            if made_from is None:
                scripts = tuple(Script(ops) for ops in self.ops)
            else:
                old, changed = made_from
                scripts = tuple(
                    Script(ops, (old[qi], tuple(changed[qi]))) if changed[qi] else old[qi]
                    for qi, ops in enumerate(self.ops)
                )
            self._scripts = scripts
        return scripts

    @property
    def made_scripts(self) -> tuple[Script, ...] | None:
        """Its Scripts if they were made (it was submitted), else None: made from none."""
        return self._scripts

    def __getitem__(self, queue: int) -> tuple[Op, ...]:
        """Queue `queue`'s op list."""
        return self.ops[queue]


def plan_item(item: Item, widen: Mapping[Buffer, int] | None = None) -> PlanItem:
    """The planner's view of an item. `widen` maps a buffer -> bytes for inputs that may
    grow up to that size per call: their accesses cover it all."""
    return plan_items((item,), widen)[0]


def plan_items(items: Sequence[Item], widen: Mapping[Buffer, int] | None = None) -> list[PlanItem]:
    """plan_item of each item. Items share buffers (one writes what several read), so
    each buffer's access is made once, for reading and once for writing."""
    made: dict[tuple[Buffer, bool], Access] = {}
    out: list[PlanItem] = []
    for item in items:
        accesses = []
        for key in item.reads_writes():
            access = made.get(key)
            if access is None:
                buf, write = key
                start, stop = buf.byte_range
                if widen and buf in widen:
                    stop = max(stop, start + widen[buf])
                access = made[key] = Access(buf.device, buf.alloc_id, start, stop, write)
            accesses.append(access)
        if isinstance(item, Launch):
            out.append(PlanItem(item.label, ItemKind.EXEC, item.device, tuple(accesses)))
        else:
            out.append(
                PlanItem(
                    item.label, ItemKind.COPY, item.dst.device, tuple(accesses), item.src.device
                )
            )
    return out


def check_item(item: object, index: int) -> Item:
    if not isinstance(item, (Launch, Copy)):
        raise UsageError(
            f"item {index} is {item!r}; a jit cache holds ag.Launch(...) and ag.Copy(...) items"
        )
    for buf in item.bufs:
        if buf.freed:  # the message is made only when it is needed
            buf.check_live(f"item {index} ({item.label}): buffer ")
    return item


_ONE = (1, 1, 1)  # the launch dims of a launch that gives none


def _dims_of(
    dims: tuple[Any, ...] | None, values: Mapping[Var, int], index: int, item: Launch, which: str
) -> tuple[int, ...]:
    if dims is None:
        return _ONE
    out = tuple(evaluate(d, values) for d in dims)
    for d in out:
        if d < 1:
            raise UsageError(
                f"item {index} ({item.label}): {which} is {out} for these var values; launch "
                f"dims must all be >= 1 (leave out a launch that has no work)"
            )
    return out + (1,) * (3 - len(out))


def _launch_request(
    item: Launch, bufs: Sequence[Buffer], var_vals: Mapping[Var, int], index: int, kind: QueueKind
) -> LaunchRequest:
    """What a device lowers a launch from, for these buffers and var values."""
    values: Mapping[Var, int] = var_vals
    if item.fixedvars:
        values = {**var_vals, **dict(item.fixedvars)}
    try:
        var_values = [values[v] for v in item.vars]
    except KeyError:  # Var.evaluate names the var that has no value
        var_values = [v.evaluate(values) for v in item.vars]
    dims = item.global_size, item.local_size
    # tuple.__new__: half the cost of the NamedTuple constructor, on a per-call path.
    return _new_request(
        LaunchRequest,
        (
            index,
            item.kernel,
            bufs,
            var_values,
            _ONE if dims[0] is None else _dims_of(dims[0], values, index, item, "global_size"),
            _ONE if dims[1] is None else _dims_of(dims[1], values, index, item, "local_size"),
            kind,
        ),
    )


class Program:
    """Plan + runtime -> everything a submission needs, except per-call bindings."""

    def __init__(
        self,
        runtime: Host,
        items: Sequence[Item],
        inputs: Sequence[Buffer],
        plan: Plan,
        *,
        index_offset: int = 0,
        item_numbers: Sequence[int] | None = None,
        max_sizes: Mapping[int, int] | None = None,
        host_bytes: int = 0,
    ) -> None:
        """Lower `plan` (of `items`, whose buffers may come from `inputs` per call) onto
        `runtime`'s actors. `item_numbers`: the number the user knows each item by (its
        place in the list they gave; items are reordered by compile(order="cost")), else
        `index_offset` and on (eager items are planned one by one). `max_sizes`: input
        index -> the most elements that input may hold per call (else its captured shape
        only). `host_bytes`: the bytes its host copy (the plan's item after `items`,
        whose op `bind_host` or `bind(host=...)` fills in) moves. Raises UsageError for
        an item's buffer that overlaps an input without being it."""
        self.runtime = runtime
        self._track = runtime.window.track  # keeps a submission in flight till it is done
        self.items = tuple(items)
        self.inputs = tuple(inputs)
        self.plan = plan
        # Inputs that may vary in size per call: input index -> most elements.
        self.max_sizes: Mapping[int, int] = MappingProxyType(dict(max_sizes or {}))
        self.item_numbers = (
            tuple(item_numbers)
            if item_numbers is not None
            else tuple(range(index_offset, index_offset + len(self.items)))
        )
        self._local = {number: j for j, number in enumerate(self.item_numbers)}
        self._take_actors(runtime, plan)
        self._count_work(plan, host_bytes)
        # Which item slots come from which input: per item, (slot, input index) pairs.
        self.item_inputs = self._find_item_inputs()
        item_vars = [item.free_vars() for item in self.items]
        self.free_vars: frozenset[Var] = frozenset().union(*item_vars)
        self.dynamic = [j for j, free in enumerate(item_vars) if self.item_inputs[j] or free]
        self._lower_templates(plan, item_vars)

    def _take_actors(self, runtime: Host, plan: Plan) -> None:
        """The actors and devices the plan's queues run on, and how they take jobs."""
        self.actors: list[QueueActor] = [
            runtime.device(q.device).queues[q.kind] for q in plan.queues
        ]
        # Every queue's actor runs jobs as QueueActor does: a submission may run inline.
        self.runs_inline = all(actor.runs_inline for actor in self.actors)
        # The queues whose jobs may run inline, and the rest (a worker's, a GPU stream's):
        # with the others posted, those may run here while their actors are idle.
        self._here = [qi for qi, actor in enumerate(self.actors) if actor.runs_inline]
        self._here_actors = [self.actors[qi] for qi in self._here]
        self._elsewhere = [qi for qi, actor in enumerate(self.actors) if not actor.runs_inline]
        # Actors that hold what is posted until told the submission is whole (REMOTE).
        self._flushes = [a.flush for a in self.actors if a.flushes]
        # Where every queue's jobs go to one connection, the caller of a replay may read
        # its end itself (`end_reader.wait_done(sub)`); None: its actors end it.
        readers = {a.end_reader for a in self.actors}
        self.end_reader: Any = next(iter(readers)) if len(readers) == 1 else None
        # Per item: the device that lowers it (its queue's), its number, its queue's kind.
        queue_device = [runtime.device(q.device) for q in plan.queues]
        self._lowered_by = [
            (queue_device[qi], number, plan.queues[qi].kind)
            for qi, number in zip(plan.item_queue, self.item_numbers)
        ]
        self.devices: list[Device] = [runtime.device(d) for d in plan.devices]
        self.timelines = [d.timeline for d in self.devices]

    def _count_work(self, plan: Plan, host_bytes: int) -> None:
        """What a submission's jobs take: items per queue, devices per queue and jobs per
        device, bytes copied per queue, base slots."""
        nqueues = len(plan.queues)
        self.counts = [0] * nqueues
        for qi in plan.item_queue:
            self.counts[qi] += 1
        self.queue_devices = [
            tuple(di for di, qs in enumerate(plan.device_queues) if qi in qs)
            for qi in range(nqueues)
        ]
        self.device_jobs = [len(qs) for qs in plan.device_queues]
        # Bytes each queue copies per submission, for statistics.
        self.copy_bytes = [0] * nqueues
        if host_bytes:
            self.copy_bytes[plan.item_queue[len(self.items)]] += host_bytes
        for j, item in enumerate(self.items):
            if isinstance(item, Copy):
                self.copy_bytes[plan.item_queue[j]] += item.dst.nbytes
        # Base slots (devices/_ops.py): KICK, BATCH, a base per queue, a ticket per device.
        self.nbases = FIRST_QUEUE_SLOT + nqueues + len(self.devices)

    def _find_item_inputs(self) -> list[Sequence[tuple[int, int]]]:
        """Per item, (slot, input index) for each of its buffers that comes from an input.
        A buffer can only be or overlap an input of its own allocation, so each buffer
        looks at those inputs alone (a graph over many devices has many inputs)."""
        by_alloc: dict[int, list[int]] = {}
        for i, root in enumerate(self.inputs):
            by_alloc.setdefault(root.alloc_id, []).append(i)
        none: tuple[tuple[int, int], ...] = ()
        found: list[Sequence[tuple[int, int]]] = [none] * len(self.items)
        for j, item in enumerate(self.items):
            for slot, buf in enumerate(item.bufs):
                candidates = by_alloc.get(buf.alloc_id)
                source = self._input_of(buf, j, candidates) if candidates else None
                if source is not None:
                    found[j] = (*found[j], (slot, source))
        return found

    def _lower_templates(self, plan: Plan, item_vars: Sequence[frozenset[Var]]) -> None:
        """Each queue's ops, with a place left for each item lowered per call; the order a
        LinearRun runs them in; the one binding of a program that binds nothing per call."""
        # Where each item's op is: (queue, op index).
        self.where: dict[int, tuple[int, int]] = {}
        index = (
            {q: i for i, q in enumerate(plan.queues)},
            {d: i for i, d in enumerate(plan.devices)},
        )
        templates = [self._template(qi, p, *index) for qi, p in enumerate(plan.programs)]
        mark_host_signals(self.actors, templates)
        self.templates = templates
        # A host copy's Scripts of its first copy's ops, its op standing in without its
        # bytes, and where that op is: what its later copies are made from (bind_host).
        self._host_origin: tuple[tuple[Script, ...], list[list[int]]] | None = None
        # A LinearRun runs EXEC ops only: a plan with an item op of another kind (a
        # SIM_RUN, a CUDA_ITEM) that no call re-lowers never has one, so needs no order.
        self.linear_order = linear_order(templates) if self._may_run_linear(templates) else None
        # What every binding's LinearRun shares (devices.Schedule), made with the first.
        self._schedule: Schedule | None = None
        self.dynamic_queues = sorted({self.where[j][0] for j in self.dynamic})
        # Per item lowered per call: (item, its queue, its op's place there, whether its
        # buffers come from the inputs, whether its op depends on var values).
        self._dynamic_at = [
            (j, *self.where[j], bool(self.item_inputs[j]), bool(item_vars[j])) for j in self.dynamic
        ]
        # A program with nothing to bind per call has one binding, made once (else None).
        self.static_bound: Bound | None = None
        if all(op is not None for t in templates for op in t):
            ops = tuple(tuple(op for op in t if op is not None) for t in templates)
            self.static_bound = Bound(self, ops, {})

    def _template(
        self,
        qi: int,
        program: Sequence[Message],
        queue_index: Mapping[QueueId, int],
        device_index: Mapping[str, int],
    ) -> list[Op | None]:
        """Queue qi's ops for its plan messages: None where an item's op is lowered per
        call (its buffers or vars come from the call) or filled in later (a host op)."""
        plan, actors = self.plan, self.actors
        nqueues = len(plan.queues)
        dynamic = set(self.dynamic)
        ops: list[Op | None] = []
        for msg in program:
            if isinstance(msg, Run):
                self.where[msg.item] = (qi, len(ops))
                if msg.item in dynamic or msg.item >= len(self.items):
                    ops.append(None)
                else:
                    ops.append(self.lower(msg.item, self.inputs, {}))
            elif isinstance(msg, Wait):
                src = queue_index[msg.queue]
                ops.append(wait_op(actors[src].signal, FIRST_QUEUE_SLOT + src, msg.value))
            elif isinstance(msg, Signal):
                ops.append(signal_op(actors[qi].signal, FIRST_QUEUE_SLOT + qi, msg.value))
            elif isinstance(msg, SyncDevice):
                di = device_index[msg.device]
                slot = FIRST_QUEUE_SLOT + nqueues + di
                ops.append(wait_op(self.devices[di].timeline, slot, 0))
            elif isinstance(msg, WaitKick):
                ops.append(wait_op(self.runtime.kick, KICK, 0))
        return ops

    def _may_run_linear(self, templates: list[list[Op | None]]) -> bool:
        """Whether every queue runs the plain loop and every item op lowered at compile is
        an EXEC (the ops a LinearRun runs)."""
        if not self.runs_inline:
            return False
        for qi, pos in self.where.values():
            op = templates[qi][pos]
            if op is not None and op.code != EXEC:
                return False
        return True

    def linear_run(self, ops: Sequence[Sequence[Op]]) -> LinearRun | None:
        """The bound op lists `ops` (one per queue) as one run of calls in linear_order
        (a LinearRun), or None when some item does not run inline (a worker thread,
        I/O) or a queue's actor does not run jobs as QueueActor does."""
        order = self.linear_order
        if not self.runs_inline or order is None:
            return None
        schedule = self._schedule
        if schedule is None:  # the same for every binding: made from the first
            schedule = self._schedule = Schedule(
                self.runtime.kick,
                self.actors,
                self.devices,
                ops,
                order,
                self.counts,
                self.copy_bytes,
            )
        return LinearRun.of(schedule, ops)

    def _input_of(self, buf: Buffer, index: int, candidates: Sequence[int]) -> int | None:
        """The input `buf` is (or a view of), among the inputs `candidates` (indices, in
        order); a buffer that only overlaps one is refused."""
        for i in candidates:
            root = self.inputs[i]
            if buf is root or (not root.is_view and buf.base is root):
                return i
            if buf.overlaps(root):
                raise UsageError(
                    f"item {index} ({self.items[index].label}) uses {buf!r}, which overlaps "
                    f"input {i} {root!r} without being it; pass the base buffer as the input"
                )
        return None

    def call_items(self, inputs: Sequence[Buffer]) -> list[Item]:
        """The items as a call with these inputs runs them: each item on the call's
        buffers (those that come from an input moved onto the call's input)."""
        items: list[Item] = []
        for j, item in enumerate(self.items):
            from_inputs = self.item_inputs[j]
            if not from_inputs:
                items.append(item)
                continue
            bufs = list(item.bufs)
            for slot, source in from_inputs:
                bufs[slot] = bufs[slot].rebased(self.inputs[source], inputs[source])
            items.append(item.with_buffers(bufs))
        return items

    def describe(self, index: int) -> str:
        item = self.items[index]
        return f"item {self.item_numbers[index]} ({item.label})"

    def local_index(self, number: int) -> int | None:
        """Item j of this program for the number the user knows it by."""
        return self._local.get(number)

    def lower(
        self,
        j: int,
        inputs: Sequence[Buffer],
        var_vals: Mapping[Var, int],
        rebased: dict[tuple[Buffer, int], Buffer] | None = None,
        like: Op | None = None,
    ) -> Op:
        """Lower item j for these inputs and var values. `rebased` memoises, for one
        call, the buffers moved onto the call's inputs (many items share them). `like`:
        the op item j (a launch) was lowered to on these same buffers for other var
        values, from which its device takes what the values do not change
        (`Device.lower_values`)."""
        item = self.items[j]
        bufs = self._call_buffers(j, inputs, rebased) if self.item_inputs[j] else item.bufs
        device, index, kind = self._lowered_by[j]
        if isinstance(item, Launch):
            request = _launch_request(item, bufs, var_vals, index, kind)
            if like is None:
                return device.lower_launch(request)
            return device.lower_values(like, request)
        for buf in bufs:
            owner = buf.device_object
            if owner is not device and owner.lowers_foreign_copies:
                return owner.lower_copy(index, bufs[0], bufs[1], kind)
        return device.lower_copy(index, bufs[0], bufs[1], kind)

    def _call_buffers(
        self,
        j: int,
        inputs: Sequence[Buffer],
        rebased: dict[tuple[Buffer, int], Buffer] | None,
    ) -> list[Buffer]:
        """Item j's buffers for a call with `inputs`: those that come from an input moved
        onto the call's (memoised in `rebased`, when given)."""
        bufs = list(self.items[j].bufs)
        for slot, source in self.item_inputs[j]:
            captured = bufs[slot]
            key = (captured, source)
            moved = rebased.get(key) if rebased is not None else None
            if moved is None:
                moved = captured.rebased(self.inputs[source], inputs[source])
                if rebased is not None:
                    rebased[key] = moved
            bufs[slot] = moved
        return bufs

    def bind(
        self,
        inputs: Sequence[Buffer],
        var_vals: Mapping[Var, int],
        kept: Bound | None = None,
        host: Op | None = None,
    ) -> Bound:
        """The op lists for these inputs and var values, with what is derived from them.

        `kept`, a binding of this program made before (for any inputs and values), saves
        lowering what does not change: an item on the same buffers in both (the
        program's own buffers, or inputs `kept` was bound to as well) takes its op from
        `kept` as it is if it reads no var, else has its device lower only what the new
        values change (a decode step's new position re-lowers only the values of the
        launches that read it). Items on new input buffers are lowered anew. `host`:
        the op of a reading program's host read (`reading`), new at every call."""
        if self.static_bound is not None:
            return self.static_bound
        ops = [t for t in self.templates]
        for qi in self.dynamic_queues:
            ops[qi] = list(ops[qi])
        at: tuple[int, int] | None = None
        if host is not None:
            at = self.where[len(self.items)]
            ops[at[0]] = list(ops[at[0]])
            ops[at[0]][at[1]] = host
        rebased: dict[tuple[Buffer, int], Buffer] = {}
        if kept is None or kept.program is not self:
            for j, qi, pos, _, _ in self._dynamic_at:
                ops[qi][pos] = self.lower(j, inputs, var_vals, rebased)
            return Bound(self, tuple(map(tuple, ops)), dict(var_vals), inputs)  # type: ignore[arg-type]
        old = kept.ops
        same_inputs = kept.inputs == tuple(inputs)  # Buffers compare by identity
        changed: list[list[int]] = [[] for _ in ops]
        for j, qi, pos, on_inputs, reads_vars in self._dynamic_at:
            if same_inputs or not on_inputs:
                like = old[qi][pos]
                if reads_vars:
                    ops[qi][pos] = self.lower(j, inputs, var_vals, rebased, like)
                    changed[qi].append(pos)
                else:
                    ops[qi][pos] = like
            else:
                ops[qi][pos] = self.lower(j, inputs, var_vals, rebased)
                changed[qi].append(pos)
        if at is not None:
            changed[at[0]] = sorted([*changed[at[0]], at[1]])
        bound_ops = tuple(
            tuple(queue_ops) if changed[qi] else old[qi] for qi, queue_ops in enumerate(ops)
        )
        # Made from kept's Scripts where it has them (a binding that was submitted).
        scripts = kept.made_scripts
        made_from = None if scripts is None else (scripts, changed)
        return Bound(self, bound_ops, dict(var_vals), inputs, made_from)  # type: ignore[arg-type]

    def reading(self, buffer: Buffer, caps: Mapping[str, DeviceCaps]) -> Program:
        """This program with a host read of `buffer` (a buffer of no input) after the
        items that write it, on its device's compute queue: a replay and a copy out of
        its result as one submission (on a worker, the read's bytes come back with the
        report of the job it ends). Its op is given per call: `bind(..., host=op)`."""
        read = host_item(buffer, False, QueueKind.COMPUTE)
        return Program(
            self.runtime,
            self.items,
            self.inputs,
            build_plan([*self.plan.items, read], caps),
            item_numbers=self.item_numbers,
            max_sizes=self.max_sizes,
            host_bytes=buffer.nbytes,
        )

    def bind_host(self, op: Op) -> Bound:
        """The op lists of a host copy's program: `op` fills its one item's place. Its
        Scripts are made from those of the program's first copy, with that copy's op
        standing in without its bytes (`without_bytes`): a queue that keeps what it made
        of the ops before finds it again for an op like that one (a worker's program
        for a copy out of the same buffer), and keeps no caller's array."""
        ops = tuple(tuple(op if o is None else o for o in t) for t in self.templates)
        made_from = self._host_origin
        if made_from is None:
            stand_in = without_bytes(op)
            if stand_in is None:
                return Bound(self, ops, {})
            made_from = self._host_origin = (
                tuple(
                    Script(tuple(stand_in if o is None else o for o in t)) for t in self.templates
                ),
                [[i for i, o in enumerate(t) if o is None] for t in self.templates],
            )
        return Bound(self, ops, {}, (), made_from)

    def submit(
        self,
        bound: Bound,
        profiles: Sequence[JobProfile] | None = None,
        then: Callable[[Submission], None] | None = None,
    ) -> Submission:
        """Post one job per queue. Synchronous: no checkpoint between tickets and posts.

        When every queue's actor is idle, the jobs run here instead, in the caller's task
        (devices.run_inline): a replay of inline items on idle queues then costs no task
        switch at all, and what cannot run here goes to its actor as if posted. With
        queues that run no job inline (a worker's, a GPU stream's), theirs are posted
        first, and the rest run here while their actors are idle. With
        `profiles` (one per queue), each job carries its observer. `then(sub)` is called
        once the submission is done (at once if it ran to its end here). (A caller that can
        run the binding here tries that first: `_submitted.run_here`.)
        """
        runtime = self.runtime
        actors = self.actors
        nqueues = len(actors)
        bases = self._reserve()
        kick = runtime.kick.value + 1
        bases[KICK] = kick
        tickets = [bases[FIRST_QUEUE_SLOT + nqueues + di] + 1 for di in range(len(self.devices))]
        sub = Submission(nqueues, self.timelines, tickets, self.queue_devices, self.device_jobs)
        copy_bytes = self.copy_bytes
        scripts = bound.scripts
        if profiles is None and self._here and all(a.idle for a in self._here_actors):
            jobs = [Job(scripts[qi], bases, sub, qi, None, copy_bytes[qi]) for qi in range(nqueues)]
            if self.runs_inline:
                runtime.kick.set(kick)
                run_inline(actors, jobs)
                # Nothing ran in between: a submission done here was never in flight.
                self._track(sub)
            else:
                # The other queues' jobs go first (a worker's as one batch), then these
                # run here: a job waiting on a worker's queue or one of these is held
                # there, and runs on in the task that moves it (the one that takes the
                # worker's report), as a worker runs its own (devices/_inline.py).
                self._track(sub)
                for qi in self._elsewhere:
                    actors[qi].post(jobs[qi])
                runtime.kick.set(kick)
                for flush in self._flushes:
                    flush()
                run_inline(self._here_actors, [jobs[qi] for qi in self._here])
        else:
            self._track(sub)
            for qi in range(nqueues):
                profile = None if profiles is None else profiles[qi]
                actors[qi].post(Job(scripts[qi], bases, sub, qi, profile, copy_bytes[qi]))
            runtime.kick.set(kick)
            for flush in self._flushes:
                flush()
        if then is not None:
            sub.when_done(then)
        return sub

    def _reserve(self) -> list[int]:
        """A submission's bases: each queue's timeline values and each device's ticket,
        all taken or none (a timeline that would pass 2**64-1 raises OverflowError and
        gives back what was taken, so every timeline stays where it was)."""
        actors = self.actors
        nqueues = len(actors)
        bases = [0] * self.nbases
        first_ticket = FIRST_QUEUE_SLOT + nqueues
        reserved = 0
        tickets = 0
        try:
            for qi in range(nqueues):
                bases[FIRST_QUEUE_SLOT + qi] = actors[qi].reserve(self.counts[qi])
                reserved += 1
            for di, device in enumerate(self.devices):
                bases[first_ticket + di] = device.take_ticket()
                tickets += 1
        except OverflowError:
            for qi in range(reserved):
                actors[qi].give_back(bases[FIRST_QUEUE_SLOT + qi])
            for di in range(tickets):
                self.devices[di].give_back(bases[first_ticket + di])
            raise
        return bases


def host_program(
    runtime: Host, caps: Mapping[str, DeviceCaps], buffer: Buffer, write: bool
) -> Program:
    """The one-item program of a host copy into (`write`) or out of `buffer`, on its
    device's copy queue where it has one; its op is filled in by `bind_host`."""
    device = runtime.device(buffer.device)
    kind = QueueKind.COPY if QueueKind.COPY in device.queues else QueueKind.COMPUTE
    item = host_item(buffer, write, kind)
    return Program(runtime, (), (), build_plan([item], caps), host_bytes=buffer.nbytes)


def host_item(buffer: Buffer, write: bool, kind: QueueKind) -> PlanItem:
    """The planner's view of a host copy into (`write`) or out of `buffer`, on its
    device's queue of `kind`."""
    start, stop = buffer.byte_range
    return PlanItem(
        "host write" if write else "host read",
        ItemKind.COPY if kind is QueueKind.COPY else ItemKind.EXEC,
        buffer.device,
        (Access(buffer.device, buffer.alloc_id, start, stop, write),),
    )


async def post_and_wait(reader: Any, post: Callable[[], Submission]) -> Submission:
    """Post a submission (`post()`) and wait for it to end: read by this task where every
    job of it went to one connection (`reader`: the program's `end_reader`, which reads
    a worker's report itself instead of having its reader task wake this one), else
    woken as its actors end it (`reader` None)."""
    if reader is None:
        sub = post()
        await sub.done.wait()
        return sub
    reader.coming()
    try:
        sub = post()
    except BaseException:
        reader.not_coming()
        raise
    await reader.wait_done(sub)
    return sub


def raise_failure(program: Program, sub: Submission) -> None:
    """Raise what a finished submission of `program` failed with, as the user sees it:
    an ItemError naming the item, or ClosedError when no item was at fault."""
    if sub.error is not None:
        raise_item_failure(program, (sub.failed_item, sub.failed_actor, sub.error))


def raise_item_failure(program: Program, failure: Failure) -> None:
    """Raise `failure` ((item, actor name, error) of a run of `program`) as the user sees
    it: an ItemError naming the item, or ClosedError when no item was at fault."""
    failed_item, failed_actor, error = failure
    if failed_item < 0:
        # Not an item's fault: the runtime broke (deadlock) or a device went away.
        if isinstance(error, (ClosedError, DeadlockError, ReplayMismatchError)):
            raise error
        raise ClosedError(str(error)) from error
    if isinstance(error, RemoteConnectionError):
        # A copy between a local device and a worker that is gone: not the item's fault.
        raise ClosedError(str(error)) from error
    index = program.local_index(failed_item)
    item = program.items[index] if index is not None else None
    label = item.label if item is not None else "?"
    raise ItemError(
        f"item {failed_item} ({label}) on {failed_actor} raised {type(error).__name__}: {error}",
        index=failed_item,
        label=label,
        device=failed_actor.split("/")[0],
    ) from error
