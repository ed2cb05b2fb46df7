"""An op of no code of the op format is refused, naming it, by everything that reads
job ops: `step`'s drivers (a queue actor's task, a submission run inline), and every
`OpWalker` (devices/_walk.py): the deadlock monitor, a program's linear order and host
signals, a connection's program writer and its reads asked for ahead, the CUDA
translation on both CUDA paths, a worker's check of the ops it lowered a program to,
and its map of a program's ops to their entries. None skips it or reads it as another.
"""

from __future__ import annotations

import ast
import functools

import pytest
import trio
from _paths import ROOT
from _workers import Replies
from actorgraph.devices import (
    EXEC,
    FIRST_QUEUE_SLOT,
    CPUDevice,
    HoldingSignal,
    InlineRun,
    Job,
    Op,
    OpCodeError,
    OpWalker,
    QueueActor,
    Resumer,
    RunOp,
    Script,
    SignalOp,
    Submission,
    WaitOp,
    WorkOp,
    find_deadlock,
    run_inline,
    run_op,
    signal_op,
    wait_op,
)
from actorgraph.devices._ops import cuda_item, refuse_op
from actorgraph.devices._signal import Signal
from actorgraph.devices._sim import SimQueueActor
from actorgraph.devices.cuda import _commands as C
from actorgraph.devices.cuda._fake import FakeDriver
from actorgraph.devices.cuda._translate import Translation
from actorgraph.devices.remote._programs import pulls_after_waits
from actorgraph.devices.remote.wire import Limits, decode
from actorgraph.scheduler import QueueKind

import actorgraph as ag
from actorgraph._templates import linear_order, mark_host_signals
from actorgraph.worker._kernels import load_kernels
from actorgraph.worker._lowered import Program as WorkerProgram
from actorgraph.worker._server import Worker as WorkerServer
from actorgraph.worker._session import Session

GUARD = 30  # seconds: a hang guard only (CUDA runs on the fake driver's threads)
UNKNOWN = 99  # no op code of the table


def _unknown() -> Op:
    """An op of code 99 in RunOp's shape: what a device's lowering gone wrong could make
    (the builders' types refuse it; tuple.__new__ does not)."""
    op: Op = tuple.__new__(RunOp, (UNKNOWN, print, (), 0))
    return op


def _refusal(who: str, index: int = 1) -> str:
    """What a refusal of the unknown op at `index` says, by `who`."""
    return (
        rf"^{who}: op {index} \(RunOp\) has op code 99, which is no op of the op format "
        rf"\(devices/_ops.py: WAIT, SIGNAL, EXEC, EXEC_THREAD, AWAIT, SIM_RUN, CUDA_ITEM, "
        rf"WIRE, each of its own shape\); make ops with the builders there"
    )


def _job(actor: QueueActor, gate: Signal | None = None) -> tuple[Job, Submission]:
    """A job for `actor`: a wait (met, or on `gate`), the unknown op, its own signal."""
    waited = gate if gate is not None else Signal("met", 1)
    ops = (
        wait_op(waited, FIRST_QUEUE_SLOT + 1, 1),
        _unknown(),
        signal_op(actor.signal, FIRST_QUEUE_SLOT, 1),
    )
    sub = Submission(1, [], [], [()], [])
    return Job(ops, [0, 0, actor.reserve(1), 0], sub, 0), sub


@pytest.mark.parametrize("kind", [QueueActor, SimQueueActor])
@pytest.mark.parametrize("how", ["posted", "inline", "held"])
async def test_a_queue_actor_refuses_an_op_of_no_code(kind: type[QueueActor], how: str) -> None:
    # `step` runs WAIT, SIGNAL and the host's calls; at any other op it stops and the
    # driver runs it as an op of its device kind's own: an actor runs the codes its
    # kind runs, and refuses any other, naming it.
    actor = kind("q")
    gate = HoldingSignal("gate", 0, Resumer())
    with trio.fail_after(GUARD):
        with pytest.RaisesGroup(
            pytest.RaisesExc(OpCodeError, match=_refusal("q")), flatten_subgroups=True
        ):
            async with trio.open_nursery() as nursery:
                await nursery.start(actor.serve)
                job, _ = _job(actor, gate if how == "held" else None)
                if how == "posted":
                    actor.post(job)
                elif how == "inline":
                    run_inline([actor], [job])  # steps up to it, then hands it over
                else:
                    # Held on the gate, then run on by the task that moves it.
                    gate.resumer.start(InlineRun([actor], [job]))
                    gate.set(1)
                await trio.sleep_forever()


def test_the_deadlock_monitor_refuses_an_op_of_no_code() -> None:
    actor = QueueActor("q")
    job, _ = _job(actor)
    actor.post(job)  # pending, not served: the monitor walks it from op 0
    with pytest.raises(OpCodeError, match=_refusal("the deadlock check of q's pending work")):
        find_deadlock([actor])


def test_a_programs_template_walks_refuse_an_op_of_no_code() -> None:
    actor = QueueActor("q")
    template: list[Op | None] = [
        wait_op(Signal("other"), FIRST_QUEUE_SLOT + 1, 1),
        _unknown(),
        None,  # an item lowered per call
        signal_op(actor.signal, FIRST_QUEUE_SLOT, 1),
    ]
    with pytest.raises(OpCodeError, match=_refusal("the linear order of a program")):
        linear_order([template])
    with pytest.raises(OpCodeError, match=_refusal("the host waits of a program")):
        mark_host_signals([actor], [template])


def test_a_walk_refuses_what_is_not_an_op_and_a_missing_op_of_a_job() -> None:
    signal = Signal("s")
    walker = OpWalker("a walk")
    for bad, kind in ((("not", "an", "op"), "tuple"), (object(), "object")):
        with pytest.raises(OpCodeError, match=rf"^a walk: op 0 \({kind}\) has op code None"):
            walker.walk([bad])  # type: ignore[list-item]
    # A record of a known code in another code's shape is no op of the format either.
    mixed = tuple.__new__(WaitOp, (EXEC, signal, FIRST_QUEUE_SLOT, 1))
    with pytest.raises(OpCodeError, match=r"^a walk: op 0 \(WaitOp\) has op code EXEC, which"):
        walker.walk([mixed])
    # A job's ops are all lowered: a hole in them is refused, not taken for an item.
    with pytest.raises(OpCodeError, match=r"^a walk: op 1 \(NoneType\) has op code None"):
        walker.walk([signal_op(signal, FIRST_QUEUE_SLOT, 1), None])


def test_a_walk_hands_each_op_to_its_kind_in_order_and_stops_where_told() -> None:
    signal = Signal("s")
    seen: list[tuple[str, int]] = []

    class Seen(OpWalker):
        def wait(self, op: WaitOp, index: int) -> bool:
            seen.append(("wait", index))
            return op.rel < 3  # stops at a wait for 3 or more

        def signal(self, op: SignalOp, index: int) -> None:
            seen.append(("signal", index))

        def work(self, op: WorkOp, index: int) -> bool:
            seen.append(("work", index))
            return True

    ops: list[Op] = [
        wait_op(signal, FIRST_QUEUE_SLOT, 1),
        run_op(EXEC, print, (), 0),
        signal_op(signal, FIRST_QUEUE_SLOT, 1),
        wait_op(signal, FIRST_QUEUE_SLOT, 3),
        _unknown(),  # never reached: the walk stopped before it
    ]
    assert Seen("seen").walk(ops) == 3
    assert seen == [("wait", 0), ("work", 1), ("signal", 2), ("wait", 3)]
    assert Seen("seen").walk(ops, 1) == 3  # from op 1 on


async def test_a_connections_walks_refuse_an_op_of_no_code(ag_remote_runtime: ag.Runtime) -> None:
    rt = ag_remote_runtime
    name = rt.devices[0]
    device = rt.device(name)
    queue = device.queues[QueueKind.COMPUTE]
    job, _ = _job(queue)
    with pytest.raises(OpCodeError, match=_refusal(f"{name}/compute's program for its worker")):
        device.connection.programs.program_of(job, queue, [])
    # The reads a client-local job's copies ask for ahead.
    with pytest.raises(OpCodeError, match=_refusal(r"the transfers of [^ ]+:\d+")):
        pulls_after_waits(device.connection, job.ops)
    # An op of a code another kind of queue runs: refused in the same words.
    job = Job(
        (run_op(EXEC, print, (), 3), signal_op(queue.signal, FIRST_QUEUE_SLOT, 1)),
        [0, 0, 0],
        Submission(1, [], [], [()], []),
        0,
    )
    with pytest.raises(
        OpCodeError,
        match=rf"^{name}/compute's program for its worker: op 0 has op code EXEC, which a "
        rf"worker's program does not run \(it runs WAIT, SIGNAL, WIRE\); the op list was "
        rf"lowered for another kind of queue$",
    ):
        device.connection.programs.program_of(job, queue, [])


@pytest.mark.parametrize("items", [1, 3])  # 3: the graph path looks at it first
async def test_a_cuda_queue_fails_a_job_with_an_op_of_no_code(items: int) -> None:
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CUDA:0"], cuda_driver=FakeDriver()) as rt:
            actor = rt.device("CUDA:0").queues[QueueKind.COMPUTE]
            job, sub = _job(actor)
            ran: list[int] = []
            note = (C.HOST, functools.partial(ran.append, 1))
            cuda_items = [cuda_item((note,), i) for i in range(items - 1)]
            job = Job((*cuda_items, *job.ops), job.bases, sub, 0)  # the unknown op after them
            with pytest.raises(OpCodeError, match=_refusal("CUDA:0/compute", items)):
                Translation(actor, job, graph=items > 1).walk(job.ops)
            actor.post(job)
            await sub.done.wait()
            assert isinstance(sub.error, OpCodeError)
            assert str(sub.error).startswith(f"CUDA:0/compute: op {items} (RunOp) has op code 99")
            assert not ran  # the job failed before any of it went to the stream


async def test_a_worker_refuses_a_program_lowered_to_an_op_its_queue_does_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A device kind whose lowering made an op its queue does not run: the worker refuses
    # the program when it lowers it (its batches fail, naming the op), and serves on.
    monkeypatch.setattr(CPUDevice, "lower_launch", lambda self, launch: _unknown())
    inc = ["k", 0, "inc", [[1, 0, [4]], [1, 0, [4]]], [], [1, 1, 1], [1, 1, 1]]
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"]) as rt, trio.open_nursery() as nursery:
            server = WorkerServer(rt, load_kernels(["remote_kernels"]), None, Limits())
            replies = Replies()
            session = Session(server, 1, replies, nursery)  # type: ignore[arg-type]
            session.handle(decode(["alloc", 1, "CPU:0", 4, "<i4"]))
            session.handle(decode(["prog", 1, "CPU:0", [inc, ["s", 2, 1]], True]))
            session.handle(decode(["batch", 10, [0, 0, 0], [1], []]))
            done = (await replies.wait_for(1))[-1]
            assert done[:2] == ["done", 10] and done[3] is not None
            assert done[3][2].startswith(
                "the program lowered for CPU:0/compute#1: op 0 (RunOp) has op code 99, which is "
                "no op of the op format"
            ), done
            monkeypatch.undo()  # the device lowers as it should again: the worker goes on
            session.handle(decode(["prog", 2, "CPU:0", [inc, ["s", 2, 1]], True]))
            session.handle(decode(["batch", 11, [0, 0, 0], [2], []]))
            assert (await replies.wait_for(2))[-1] == ["done", 11, 2, None]
            nursery.cancel_scope.cancel()


def test_a_workers_map_of_ops_to_entries_refuses_an_op_of_no_code() -> None:
    program = WorkerProgram(store=False, slot=FIRST_QUEUE_SLOT, device="CPU:0")
    signal = Signal("s")
    script = Script([wait_op(signal, FIRST_QUEUE_SLOT, 1), _unknown()])
    with pytest.raises(OpCodeError, match=_refusal("the entries of a program on CPU:0")):
        program.entries_of(script)


def test_a_refusal_of_a_code_another_queue_runs_says_which_it_runs() -> None:
    error = refuse_op("q", cuda_item((), 0), 4, "a QueueActor", QueueActor.op_codes)
    assert str(error) == (
        "q: op 4 has op code CUDA_ITEM, which a QueueActor does not run (it runs WAIT, "
        "SIGNAL, EXEC, EXEC_THREAD, AWAIT); the op list was lowered for another kind of queue"
    )


# Every OpWalker of the package, and the test above that walks an op of no code through it.
_REFUSAL_TESTS = {
    "actorgraph/_templates.py:_LinearOrder": test_a_programs_template_walks_refuse_an_op_of_no_code,
    "actorgraph/_templates.py:_HostWaits": test_a_programs_template_walks_refuse_an_op_of_no_code,
    "actorgraph/worker/_lowered.py:_Entries": (
        test_a_workers_map_of_ops_to_entries_refuses_an_op_of_no_code
    ),
    "actorgraph/worker/_lowering.py:_Runnable": (
        test_a_worker_refuses_a_program_lowered_to_an_op_its_queue_does_not_run
    ),
    "devices/_monitor.py:_JobRun": test_the_deadlock_monitor_refuses_an_op_of_no_code,
    "devices/cuda/_translate.py:Translation": (test_a_cuda_queue_fails_a_job_with_an_op_of_no_code),
    "devices/remote/_programs.py:_Writer": test_a_connections_walks_refuse_an_op_of_no_code,
    "devices/remote/_programs.py:_LocalReader": test_a_connections_walks_refuse_an_op_of_no_code,
}


def _walkers() -> set[str]:
    """Each class of the package's source that is an OpWalker, as "path:name"."""
    classes: dict[str, tuple[str, set[str]]] = {}
    for folder in ("actorgraph", "devices", "scheduler"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = {
                        b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases
                    }
                    classes[f"{where}:{node.name}"] = (node.name, bases)
    walkers: set[str] = set()
    names = {"OpWalker"}
    while True:  # a walker's subclass is one too
        more = {key for key, (_, bases) in classes.items() if bases & names} - walkers
        if not more:
            return walkers
        walkers |= more
        names |= {classes[key][0] for key in more}


def test_every_walker_of_the_package_has_a_test_that_it_refuses_an_op_of_no_code() -> None:
    # A walker added without one is named here: give it a case above and a line in
    # _REFUSAL_TESTS.
    assert _walkers() == set(_REFUSAL_TESTS)
