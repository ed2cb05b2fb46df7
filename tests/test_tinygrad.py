"""tinygrad's captured work on actorgraph: install() (TinyJit replays through our graph
runner) and graph_from_jit (a captured jit as a Graph in a trio program). Every result is
compared bitwise with tinygrad's own replay of the same jit."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

import actorgraph as ag

tinygrad = pytest.importorskip(
    "tinygrad", reason="tinygrad is not installed (actorgraph[tinygrad])"
)
if shutil.which(os.environ.get("CC", "clang")) is None:
    pytest.skip(
        "clang is not installed: tinygrad's CPU devices compile with it", allow_module_level=True
    )

from tinygrad import Device, Tensor, TinyJit, Variable  # noqa: E402
from tinygrad.engine.realize import ExecItem, Runner  # noqa: E402

from actorgraph import tinygrad as agt  # noqa: E402

Device.DEFAULT = "CPU"
DEVICES = [f"CPU:{i}" for i in range(4)]


def _data(seed: int, *shape: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _mlp() -> Callable[[Tensor], Tensor]:
    w1, b1 = Tensor(_data(1, 16, 32)).realize(), Tensor(_data(2, 32)).realize()
    w2 = Tensor(_data(3, 32, 8)).realize()

    def forward(x: Tensor) -> Tensor:
        return ((x @ w1 + b1).relu() @ w2).softmax().realize()

    return forward


def _symbolic() -> Callable[[Tensor, Tensor], Tensor]:
    def forward(a: Tensor, b: Tensor) -> Tensor:
        return (a @ b).relu().sum(1).realize()

    return forward


VI = Variable("i", 1, 12)


def _symbolic_args(seed: int) -> tuple[Tensor, Tensor]:
    n = 2 + seed % 9
    a = Tensor(_data(seed, 3, n)).reshape(3, VI.bind(n))
    b = Tensor(_data(seed + 100, n, 4)).reshape(VI.bind(n), 4)
    return a.realize(), b.realize()


def _data_parallel(ndev: int) -> Callable[[Tensor], Tensor]:
    devs = tuple("CPU" if i == 0 else f"CPU:{i}" for i in range(ndev))
    w = Tensor(_data(7, 8, 8)).shard(devs, axis=None).realize()

    def forward(x: Tensor) -> Tensor:
        return (x.shard(devs, axis=0) @ w).relu().sum(0).realize()

    return forward


def _reference(
    fn: Callable[..., Tensor], calls: Sequence[tuple[Any, ...]]
) -> list[np.ndarray[Any, Any]]:
    """What tinygrad's own TinyJit (its own graph runner) returns for each call."""
    assert not agt.installed()
    jit = TinyJit(fn)
    return [jit(*args).numpy() for args in calls]


@pytest.fixture
def installed() -> Iterator[None]:
    agt.install(devices=4)
    try:
        yield
    finally:
        agt.uninstall()


CASES: dict[str, tuple[Callable[[], Callable[..., Tensor]], Callable[[int], tuple[Any, ...]]]] = {
    "mlp": (_mlp, lambda s: (Tensor(_data(s, 4, 16)).realize(),)),
    "symbolic": (_symbolic, _symbolic_args),
    "data_parallel_2": (lambda: _data_parallel(2), lambda s: (Tensor(_data(s, 4, 8)).realize(),)),
    "data_parallel_4": (lambda: _data_parallel(4), lambda s: (Tensor(_data(s, 8, 8)).realize(),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_install_replays_tinygrad_jits_bitwise(case: str, installed: None) -> None:
    make, args_of = CASES[case]
    fn = make()
    calls = [args_of(s) for s in range(7)]
    agt.uninstall()
    expected = _reference(fn, calls)
    agt.install(devices=4)
    before = agt.statistics()
    jit = TinyJit(fn)
    for args, want in zip(calls, expected):
        got = jit(*args).numpy()
        assert got.tobytes() == want.tobytes()
    stats = agt.statistics()
    assert stats.graphs - before.graphs >= 1
    assert stats.replays - before.replays >= len(calls) - 2  # calls 3+ replay
    if case == "symbolic":
        assert stats.plans - before.plans >= 2  # a plan per input size


@pytest.mark.parametrize("case", sorted(CASES))
async def test_graph_from_jit_replays_bitwise_in_trio(case: str) -> None:
    make, args_of = CASES[case]
    fn = make()
    calls = [args_of(s) for s in range(7)]
    expected = _reference(fn, calls)
    jit = TinyJit(fn)
    for args in calls[:2]:
        jit(*args)  # capture
    with trio.fail_after(60):
        async with ag.open_runtime(DEVICES, verify_plans=True) as rt:
            jit_graph = await agt.graph_from_jit(rt, jit)
            for args, want in zip(calls, expected):
                out = await jit_graph(*args)
                assert out.numpy().tobytes() == want.tobytes()
            assert jit_graph.graph.statistics().replays >= 1
            if case == "symbolic":
                assert jit_graph.graphs >= 2


async def test_graph_from_jit_profiles_and_verifies() -> None:
    fn = _mlp()
    jit = TinyJit(fn)
    x = Tensor(_data(0, 4, 16)).realize()
    want = _reference(fn, [(x,)])[0]
    jit(x), jit(x)
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"]) as rt:
            jit_graph = await agt.graph_from_jit(rt, jit)
            graph, inputs, values = await jit_graph.inputs(x)
            graph.plan.verify()
            await graph(inputs, values, profile=True)
            profile = graph.last_profile
            assert profile is not None and len(profile.events) == len(graph.plan.item_queue)
            assert (await jit_graph(x)).numpy().tobytes() == want.tobytes()


def _shared_jits() -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor], Tensor]:
    acc = Tensor.zeros(8).contiguous().realize()

    # Two kernels each: tinygrad graphs no batch of one kernel.
    def step(x: Tensor) -> Tensor:
        acc.assign(acc + x).realize()
        return (acc * 2).realize()

    def read(y: Tensor) -> Tensor:
        return (acc * y).realize().sum().realize()

    return step, read, acc


def _run_shared(step: Any, read: Any, calls: int) -> list[bytes]:
    out = []
    for s in range(calls):
        step(Tensor(_data(s, 8)).realize())
        out.append(read(Tensor(_data(s + 50, 8)).realize()).numpy().tobytes())
    return out


def test_install_defers_replays_past_a_full_window() -> None:
    fn = _mlp()
    calls = [(Tensor(_data(s, 4, 16)).realize(),) for s in range(12)]
    expected = _reference(fn, calls)
    agt.install(devices=1, max_in_flight=1)
    try:
        jit = TinyJit(fn)
        outs = [jit(*args) for args in calls]  # no synchronize between calls
        got = [out.numpy().tobytes() for out in outs[-1:]]
        assert got == [expected[-1].tobytes()]
        assert agt.statistics().replays == len(calls) - 2
    finally:
        agt.uninstall()


def test_install_orders_jits_that_share_buffers(installed: None) -> None:
    agt.uninstall()
    step, read, _ = _shared_jits()
    expected = _run_shared(TinyJit(step), TinyJit(read), 6)
    agt.install(devices=4)
    step, read, _ = _shared_jits()
    before = agt.statistics().replays
    assert _run_shared(TinyJit(step), TinyJit(read), 6) == expected
    assert agt.statistics().replays - before >= 6


async def test_graph_from_jit_orders_jits_that_share_buffers() -> None:
    step, read, _ = _shared_jits()
    expected = _run_shared(TinyJit(step), TinyJit(read), 6)
    step, read, _ = _shared_jits()
    jit_step, jit_read = TinyJit(step), TinyJit(read)
    got = _run_shared(jit_step, jit_read, 2)  # tinygrad captures
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"]) as rt:
            graphs = [await agt.graph_from_jit(rt, j) for j in (jit_step, jit_read)]
            for s in range(2, 6):
                await graphs[0](Tensor(_data(s, 8)).realize())
                got.append((await graphs[1](Tensor(_data(s + 50, 8)).realize())).numpy().tobytes())
    assert got == expected


async def test_bad_input_is_refused_with_its_name() -> None:
    fn = _mlp()
    jit = TinyJit(fn)
    for s in range(2):
        jit(Tensor(_data(s, 4, 16)).realize())
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"]) as rt:
            with pytest.raises(ag.UsageError, match="call it twice first"):
                await agt.graph_from_jit(rt, TinyJit(fn))
            jit_graph = await agt.graph_from_jit(rt, jit)
            with pytest.raises(ag.InputError, match=r"tensor argument 0 has shape \(4, 8\)"):
                await jit_graph(Tensor(_data(0, 4, 8)).realize())
            freed = Tensor(_data(0, 4, 16)).realize()
            freed.uop.base.buffer.deallocate()
            with pytest.raises(
                ag.InputError, match="tensor argument 0: its tinygrad buffer .* was freed"
            ):
                await jit_graph(freed)

            class Mystery(Runner):
                def __init__(self) -> None:
                    super().__init__("mystery", "CPU")

            assert jit.captured is not None
            jit.captured.jit_cache.append(ExecItem(Mystery(), []))
            with pytest.raises(ag.UsageError, match=r"jit cache item \d+ is a Mystery \(mystery\)"):
                await agt.graph_from_jit(rt, jit)


async def test_devices_that_are_not_cpu_are_refused() -> None:
    from actorgraph.tinygrad._convert import device_name

    assert device_name("CPU") == "CPU:0" and device_name("CPU:3") == "CPU:3"
    with pytest.raises(ag.UsageError, match="'NV' is not a CPU device"):
        device_name("NV")


def test_install_is_idempotent_and_uninstall_restores(installed: None) -> None:
    agt.install()  # already installed: nothing changes
    assert agt.installed() and Device["CPU"].graph is agt.ActorGraph
    assert Device["CPU:1"].graph is agt.ActorGraph  # opened later, patched too
    agt.uninstall()
    assert not agt.installed() and Device["CPU"].graph is not agt.ActorGraph
    assert agt.statistics() == agt.TinygradStatistics(False, 0, 0, 0, 0, ())
    with pytest.raises(ag.UsageError, match="devices=N"):
        agt.install(devices=0)
    with pytest.raises(ag.UsageError, match="max_pending=N"):
        agt.install(max_pending=0)
    agt.install(devices=4)


def test_a_runner_built_before_uninstall_says_so(installed: None) -> None:
    fn = _mlp()
    jit = TinyJit(fn)
    for s in range(3):
        jit(Tensor(_data(s, 4, 16)).realize())
    agt.uninstall()
    with pytest.raises(ag.ClosedError, match="was uninstalled"):
        jit(Tensor(_data(9, 4, 16)).realize())
    agt.install(devices=4)


async def test_a_replay_between_queued_tinygrad_work_never_deadlocks() -> None:
    # tinygrad work W is queued (held behind a blocker) before a replay R, and work Y after
    # it: R waits for W, Y waits for R. Waiting for W must not wait for Y as well.
    import threading

    fn = _mlp()
    jit = TinyJit(fn)
    x = Tensor(_data(0, 4, 16)).realize()
    want = _reference(fn, [(x,)])[0]
    jit(x), jit(x)
    dev: Any = Device["CPU"]
    release = threading.Event()
    a = Tensor(_data(1, 8)).realize()
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"]) as rt:
            jit_graph = await agt.graph_from_jit(rt, jit)
            await jit_graph(x)
            dev.tasks.put([lambda: release.wait(30), 0])  # holds tinygrad's queue
            early = (a + 1).realize()  # W: queued behind the blocker
            result: list[Tensor] = []
            async with trio.open_nursery() as nursery:

                async def replay() -> None:
                    result.append(await jit_graph(x))

                nursery.start_soon(replay)
                await trio.testing.wait_all_tasks_blocked()
                late = (a * 3).realize()  # Y: waits for the replay's timeline value
                release.set()
            assert result[0].numpy().tobytes() == want.tobytes()
            assert (late.numpy() == a.numpy() * 3).all() and (early.numpy() == a.numpy() + 1).all()


async def test_plans_per_input_size_are_bounded() -> None:
    from actorgraph.tinygrad._convert import PLANS_KEPT

    vn = Variable("n", 1, 64)

    def fn(a: Tensor) -> Tensor:
        return (a * 2).realize().sum().realize()

    def args(n: int) -> tuple[Tensor]:
        return (Tensor(_data(n, n)).reshape(vn.bind(n)).realize(),)

    sizes = range(1, PLANS_KEPT + 6)
    expected = _reference(fn, [args(n) for n in sizes])
    jit = TinyJit(fn)
    jit(*args(1)), jit(*args(2))
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"]) as rt:
            jit_graph = await agt.graph_from_jit(rt, jit)
            for n, want in zip(sizes, expected):
                assert (await jit_graph(*args(n))).numpy().tobytes() == want.tobytes()
            assert jit_graph.graphs == PLANS_KEPT
            assert (await jit_graph(*args(1))).numpy().tobytes() == expected[0].tobytes()
