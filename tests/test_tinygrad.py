"""tinygrad's captured work on actorgraph: install() (TinyJit replays through our graph
runner) and graph_from_jit (a captured jit as a Graph in a trio program), on whichever
supported tinygrad release is installed (CI runs this file under each). Every result is
compared bitwise with tinygrad's own replay of the same jit, uninstalled."""

from __future__ import annotations

import gc
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from _extras import NO_CLANG, importorskip

import actorgraph as ag

os.environ.setdefault("DEV", "CPU")  # before tinygrad picks its default device
tinygrad = importorskip("tinygrad")
if shutil.which(os.environ.get("CC", "clang")) is None:
    pytest.skip(NO_CLANG, allow_module_level=True)

from tinygrad import Device, Tensor, TinyJit, Variable, dtypes  # noqa: E402

from actorgraph import tinygrad as agt  # noqa: E402

V011 = agt.TINYGRAD_VERSION == "0.11.0"
if V011:
    Device.DEFAULT = "CPU"
else:
    from tinygrad.helpers import DEV

    DEV.value = "CPU"
DEVICES = [f"CPU:{i}" for i in range(4)]


def _data(seed: int, *shape: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _mlp(seed: int = 1) -> Callable[[Tensor], Tensor]:
    w1, b1 = Tensor(_data(seed, 16, 32)).realize(), Tensor(_data(seed + 1, 32)).realize()
    w2 = Tensor(_data(seed + 2, 32, 8)).realize()

    def forward(x: Tensor) -> Tensor:
        return ((x @ w1 + b1).relu() @ w2).softmax().realize()

    return forward


VI = Variable("i", 1, 12)
_A, _B = Tensor(_data(40, 3, 12)).realize(), Tensor(_data(41, 12, 4)).realize()


def _symbolic() -> Callable[[Tensor, Tensor], Tensor]:
    # Two kernels, so tinygrad hands the batch to a graph runner.
    def forward(a: Tensor, b: Tensor) -> Tensor:
        return ((a @ b).relu().realize() * 2).sum(1).realize()

    return forward


def _symbolic_args(seed: int) -> tuple[Tensor, Tensor]:
    n = VI.bind(2 + seed % 9)
    return _A[:, :n], _B[:n, :]


def _view_input() -> Callable[[Tensor], Tensor]:
    def forward(x: Tensor) -> Tensor:  # a view of the input: a shrink of its rows
        return ((x[1:3] * 2).realize() + x[0:2]).sum(0).realize()

    return forward


def _bitcast_input() -> Callable[[Tensor], Tensor]:
    def forward(x: Tensor) -> Tensor:  # the input read through another dtype
        return ((x.bitcast(dtypes.uint32) & 0xFFFF).realize() + 3).realize()

    return forward


def _data_parallel(ndev: int) -> Callable[[Tensor], Tensor]:
    devs = tuple("CPU" if i == 0 else f"CPU:{i}" for i in range(ndev))
    w = Tensor(_data(7, 8, 8)).shard(devs, axis=None).realize()

    def forward(x: Tensor) -> Tensor:
        return (x.shard(devs, axis=0) @ w).relu().sum(0).realize()

    return forward


_DEVS2 = ("CPU", "CPU:1")


def _sharded_input() -> Callable[[Tensor], Tensor]:
    w = Tensor(_data(8, 8, 8)).shard(_DEVS2, axis=None).realize()

    def forward(x: Tensor) -> Tensor:  # x arrives sharded: a MultiBuffer, a lane per device
        return ((x @ w).relu().realize() * 2).realize()

    return forward


VP = Variable("start_pos", 0, 15)
_TOKENS = [Tensor(_data(60 + k, 1, 8)).realize() for k in range(3)]


def _decoder() -> Callable[[Tensor, Any], Tensor]:
    """A decode step: attention over a KV cache it fills at a symbolic position."""
    wq, wk, wv, wo = (Tensor(_data(50 + i, 8, 8)).realize() for i in range(4))
    cache_k = Tensor.zeros(16, 8).contiguous().realize()
    cache_v = Tensor.zeros(16, 8).contiguous().realize()

    def step(x: Tensor, pos: Any) -> Tensor:
        q, k, v = x @ wq, x @ wk, x @ wv
        cache_k[pos : pos + 1].assign(k).realize()
        cache_v[pos : pos + 1].assign(v).realize()
        keys, values = cache_k[0 : pos + 1], cache_v[0 : pos + 1]
        att = ((q @ keys.T) / 8**0.5).softmax(-1) @ values
        return (x + att @ wo).realize()

    return step


def _decoder_args(seed: int) -> tuple[Tensor, Any]:
    # A new position every call; the tokens come round again (a kept binding's inputs
    # with new values) after new ones.
    return _TOKENS[seed % len(_TOKENS)], VP.bind(seed)


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
    "decoder": (_decoder, _decoder_args),
    "symbolic": (_symbolic, _symbolic_args),
    "view_input": (_view_input, lambda s: (Tensor(_data(s, 4, 6)).realize(),)),
    "bitcast_input": (_bitcast_input, lambda s: (Tensor(_data(s, 4, 8)).realize(),)),
    "data_parallel_2": (lambda: _data_parallel(2), lambda s: (Tensor(_data(s, 4, 8)).realize(),)),
    "sharded_input": (
        _sharded_input,
        lambda s: (Tensor(_data(s, 4, 8)).shard(_DEVS2, axis=0).realize(),),
    ),
    "data_parallel_4": (lambda: _data_parallel(4), lambda s: (Tensor(_data(s, 8, 8)).realize(),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_install_replays_tinygrad_jits_bitwise(case: str) -> None:
    make, args_of = CASES[case]
    fn = make()
    calls = [args_of(s) for s in range(9)]
    expected = _reference(fn, calls)
    agt.install(devices=4)
    try:
        before = agt.statistics()
        jit = TinyJit(fn)
        for args, want in zip(calls, expected):
            got = jit(*args).numpy()
            assert got.tobytes() == want.tobytes()
        stats = agt.statistics()
    finally:
        agt.uninstall()
    assert stats.graphs - before.graphs >= 1
    assert stats.replays - before.replays >= len(calls) - 2  # calls 3+ replay
    assert stats.plans - before.plans == stats.graphs - before.graphs  # one plan each


@pytest.mark.parametrize("case", sorted(CASES))
async def test_graph_from_jit_replays_bitwise_in_trio(case: str) -> None:
    make, args_of = CASES[case]
    fn = make()
    calls = [args_of(s) for s in range(9)]
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
            assert jit_graph.graphs == 1  # symbolic shapes too: one plan


def _captured_mlp() -> tuple[Any, Tensor, np.ndarray[Any, Any]]:
    """A jit of the MLP that has captured, an input, and tinygrad's own output for it."""
    fn = _mlp()
    jit = TinyJit(fn)
    x = Tensor(_data(0, 4, 16)).realize()
    want = _reference(fn, [(x,)])[0]
    jit(x), jit(x)
    return jit, x, want


async def test_graph_from_jit_profiles_and_verifies() -> None:
    jit, x, want = _captured_mlp()
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"]) as rt:
            jit_graph = await agt.graph_from_jit(rt, jit)
            graph, inputs, values = await jit_graph.inputs(x)
            graph.plan.verify()
            await graph(inputs, values, profile=True)
            profile = graph.last_profile
            assert profile is not None and len(profile.events) == len(graph.plan.item_queue)
            assert (await jit_graph(x)).numpy().tobytes() == want.tobytes()


async def test_a_cancelled_jit_graph_call_returns_only_once_its_replay_is_done() -> None:
    jit, x, want = _captured_mlp()
    with trio.fail_after(60):
        # Every kernel on a worker thread: a replay is in flight on the actors, not run
        # inline, so a cancellation can land while it runs.
        async with ag.open_runtime(["CPU:0"], cpu_thread_bytes=0) as rt:
            jit_graph = await agt.graph_from_jit(rt, jit)
            await jit_graph(x)
            graph = jit_graph.graph
            cancelled = []
            async with trio.open_nursery() as nursery:

                async def call() -> None:
                    with trio.CancelScope() as scope:
                        nursery.start_soon(cancel, scope)
                        await jit_graph(x)
                    cancelled.append(scope.cancelled_caught)
                    # Returned: whatever happened, no replay of it is still running.
                    assert graph.statistics().in_flight == 0

                async def cancel(scope: trio.CancelScope) -> None:
                    while not graph.statistics().in_flight:
                        await trio.sleep(0)
                    scope.cancel()  # the replay has started: it runs on

                nursery.start_soon(call)
            assert cancelled == [True]
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


def _feedback() -> Callable[[Tensor], Tensor]:
    w = Tensor(_data(5, 8, 8)).realize()

    def forward(x: Tensor) -> Tensor:
        return ((x @ w).relu().realize() * 0.5 + 0.25).realize()

    return forward


def _feed(jit: Callable[[Tensor], Any], calls: int) -> tuple[list[bytes], Tensor]:
    """Each call's output is the next call's input: the jit's own memory passed back in
    (tinygrad 0.14's jit copies such an input before it runs)."""
    x, out = Tensor(_data(0, 4, 8)).realize(), []
    for _ in range(calls):
        x = jit(x)
        out.append(x.numpy().tobytes())
    return out, x


def test_install_replays_a_jit_fed_its_own_output() -> None:
    fn = _feedback()
    expected, _ = _feed(TinyJit(fn), 8)
    agt.install(devices=1)
    try:
        assert _feed(TinyJit(fn), 8)[0] == expected
        assert agt.statistics().replays >= 6
    finally:
        agt.uninstall()


async def test_graph_from_jit_replays_a_jit_fed_its_own_output() -> None:
    fn = _feedback()
    expected, _ = _feed(TinyJit(fn), 8)
    jit = TinyJit(fn)
    got, x = _feed(jit, 2)  # captures; x is the jit's own output buffer
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"]) as rt:
            jit_graph = await agt.graph_from_jit(rt, jit)
            for _ in range(6):
                x = await jit_graph(x)
                got.append(x.numpy().tobytes())
    assert got == expected


def test_install_orders_jits_that_share_buffers() -> None:
    step, read, _ = _shared_jits()
    expected = _run_shared(TinyJit(step), TinyJit(read), 8)
    agt.install(devices=4)
    try:
        step, read, _ = _shared_jits()
        before = agt.statistics().replays
        assert _run_shared(TinyJit(step), TinyJit(read), 8) == expected
        assert agt.statistics().replays - before >= 8
    finally:
        agt.uninstall()


def test_install_orders_replays_with_tinygrads_own_work() -> None:
    # A jit writes a tensor that tinygrad's own (unjitted) kernels then read and write,
    # and whose next replay reads what they wrote: each must see the other's result.
    def run() -> list[bytes]:
        state = Tensor.zeros(16).contiguous().realize()

        @TinyJit
        def step(x: Tensor) -> Tensor:
            state.assign(state * 0.5 + x).realize()
            return (state + 1).realize()

        out = []
        for s in range(8):
            y = step(Tensor(_data(s, 16)).realize())
            state.assign(state + y).realize()  # tinygrad's own kernel, between replays
            out.append(state.numpy().tobytes())
        return out

    expected = run()
    agt.install(devices=4)
    try:
        assert run() == expected
        assert agt.statistics().replays >= 6
    finally:
        agt.uninstall()


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


@pytest.mark.parametrize("captured", [True, False], ids=["captured_first", "capturing_in_threads"])
def test_install_from_several_threads_is_bitwise(captured: bool) -> None:
    # Each thread calls its own jit with new inputs: their replays interleave with each
    # other and with the other threads' tinygrad work (on 0.11, kernels queued on the
    # device's thread, whose timeline the replays join). tinygrad itself is not
    # thread-safe, with or without actorgraph: its capture, its reads of tensors (which
    # schedule) and its own kernels, from several threads at once, raise its errors or,
    # on 0.11, stop its device thread for good. So, as the tinygrad page's "Threads" says, the
    # threads take turns (`tiny`) for tinygrad's own work, and only the replays run at once.
    threads, calls = 3, 40
    fns = [_mlp(seed=10 * t) for t in range(threads)]
    inputs = [
        [Tensor(_data(100 * t + s, 4, 16)).realize() for s in range(calls)] for t in range(threads)
    ]
    outs = [_reference(fn, [(x,) for x in xs]) for fn, xs in zip(fns, inputs)]
    expected = [[o.tobytes() for o in out] for out in outs]
    expected_after = [[(Tensor(o) + 1).numpy().tobytes() for o in out] for out in outs]
    agt.install(devices=4)
    try:
        jits = [TinyJit(fn) for fn in fns]
        tiny = threading.Lock()
        got: list[list[bytes]] = [[] for _ in range(threads)]
        after: list[list[Tensor]] = [[] for _ in range(threads)]
        errors: list[BaseException] = []

        def read(t: int, out: Tensor) -> None:
            # tinygrad's own work: read the output, and queue a kernel over it that the
            # jit's next replay, which overwrites it, must wait for.
            got[t].append(out.numpy().tobytes())
            after[t].append((out + 1).realize())

        if captured:
            for t in range(threads):  # tinygrad captures on the second call
                for x in inputs[t][:2]:
                    read(t, jits[t](x))
        start = threading.Barrier(threads)

        def work(t: int) -> None:
            start.wait(30)
            try:
                for x in inputs[t][len(got[t]) :]:
                    if len(got[t]) < 2:  # the first call and the capture: tinygrad's own work
                        with tiny:
                            read(t, jits[t](x))
                        continue
                    out = jits[t](x)  # a replay, at once with the other threads' work
                    with tiny:
                        read(t, out)
            except Exception as error:  # noqa: BLE001 - checked below
                errors.append(error)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert not any(w.is_alive() for w in workers), "a thread hung"
        assert not errors, errors
        assert got == expected  # every output is tinygrad's own, bitwise
        assert [[a.numpy().tobytes() for a in queued] for queued in after] == expected_after
        assert agt.statistics().replays >= threads * (calls - 2)
    finally:
        agt.uninstall()


VN = Variable("n", 1, 64)
SIZES = [1 + (7 * k) % 60 for k in range(120)]  # cycling through 60 sizes, each twice


def _sized(a: Tensor) -> Tensor:
    return ((a * 2).realize() + 1).sum().realize()


def _installed_statistics(fn: Callable[..., Tensor], calls: list[tuple[Any, ...]]) -> Any:
    """Call a new jit of fn under install() with these arguments, bitwise against tinygrad
    alone; return what install() counted."""
    expected = _reference(fn, calls)
    agt.install(devices=1)
    try:
        jit = TinyJit(fn)
        for args, want in zip(calls, expected):
            assert jit(*args).numpy().tobytes() == want.tobytes()
        return agt.statistics()
    finally:
        agt.uninstall()


def test_symbolic_jit_plans_once_for_every_size() -> None:
    base = Tensor(_data(3, 64)).realize()
    stats = _installed_statistics(_sized, [(base[: VN.bind(n)],) for n in SIZES])
    assert stats.replays >= len(SIZES) - 2
    assert stats.plans == stats.graphs == 1


@pytest.mark.skipif(not V011, reason="tinygrad 0.11 only: its jit inputs may change size")
def test_inputs_that_change_size_plan_once_per_new_high() -> None:
    # tinygrad 0.11 lets a jit input be a buffer of a different size on every call (a
    # tensor reshaped to a bound Variable); its runner is never told the largest size.
    calls = [(Tensor(_data(n, n)).reshape(VN.bind(n)).realize(),) for n in SIZES]
    stats = _installed_statistics(_sized, calls)
    assert stats.replays >= len(SIZES) - 2
    assert stats.plans <= 8  # a new plan only at a new high, for at least twice the old


async def test_graph_from_jit_plans_once_for_inputs_that_change_size() -> None:
    base = Tensor(_data(3, 64)).realize()

    def args(n: int) -> tuple[Tensor]:
        if V011:
            return (Tensor(_data(n, n)).reshape(VN.bind(n)).realize(),)
        return (base[: VN.bind(n)],)

    # Each size twice: checked with tinygrad's own check, then known (Layouts).
    expected = _reference(_sized, [args(n) for n in SIZES])
    jit = TinyJit(_sized)
    jit(*args(1)), jit(*args(2))
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"]) as rt:
            jit_graph = await agt.graph_from_jit(rt, jit)
            for n, want in zip(SIZES, expected):
                assert (await jit_graph(*args(n))).numpy().tobytes() == want.tobytes()
            assert jit_graph.graphs == 1


async def test_bad_input_is_refused_with_its_name() -> None:
    fn = _mlp()

    def forward(x: Tensor) -> Tensor:
        return fn(x)

    jit = TinyJit(forward)
    for s in range(2):
        jit(Tensor(_data(s, 4, 16)).realize())
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"]) as rt:
            with pytest.raises(
                ag.UsageError, match="jit 'forward' has not captured.*call it twice"
            ):
                await agt.graph_from_jit(rt, TinyJit(forward))
            jit_graph = await agt.graph_from_jit(rt, jit)
            with pytest.raises(
                ag.InputError, match=r"tensor argument 0 of jit 'forward' has shape \(4, 8\)"
            ):
                await jit_graph(Tensor(_data(0, 4, 8)).realize())
            with pytest.raises(ag.InputError, match="captured with tensor arguments"):
                await jit_graph(x=Tensor(_data(0, 4, 16)).realize())
            freed = Tensor(_data(0, 4, 16)).realize()
            freed.uop.base.buffer.deallocate()
            with pytest.raises(
                ag.InputError,
                match="tensor argument 0 of jit 'forward': its tinygrad buffer .* was freed",
            ):
                await jit_graph(freed)


def test_install_checks_its_arguments_and_is_idempotent() -> None:
    with pytest.raises(ag.UsageError, match="devices=N"):
        agt.install(devices=0)
    # install's own keyword is among the near names it suggests, beside open_runtime's.
    with pytest.raises(
        ag.UsageError,
        match=r"agt\.install\(\.\.\.\) got an option 'device' that neither agt\.install\(\.\.\.\) "
        r"nor open_runtime\(\.\.\.\) takes; did you mean 'devices'\? the options are ",
    ):
        agt.install(device=4)
    with pytest.raises(ag.UsageError, match=r"got an option 'remotes' .* did you mean 'remote'\?"):
        agt.install(remotes=["CPU:0@127.0.0.1:7000"])
    assert not agt.installed()
    agt.install(devices=4)
    try:
        agt.install()  # already installed: nothing changes
        assert agt.installed() and Device["CPU"].graph is agt.ActorGraph
        assert Device["CPU:1"].graph is agt.ActorGraph  # opened later, patched too
        assert agt.statistics().version == agt.TINYGRAD_VERSION
    finally:
        agt.uninstall()
    assert not agt.installed() and Device["CPU"].graph is not agt.ActorGraph
    assert agt.statistics() == agt.TinygradStatistics(
        False, agt.TINYGRAD_VERSION or "", 0, 0, 0, 0, ()
    )


def test_tinygrad_0_11_refuses_ag_devices_saying_it_has_its_own() -> None:
    if not V011:
        pytest.skip("tinygrad 0.11 only: 0.14 has AG devices")
    with pytest.raises(
        ag.UsageError,
        match=re.escape(
            "actorgraph's AG devices (install(remote=...) or ACTORGRAPH_REMOTE) need tinygrad "
            "0.14.0, and tinygrad 0.11.0 is installed, which has its own REMOTE device"
        ),
    ):
        agt.install(remote=["CPU:0@127.0.0.1:7000"])
    assert not agt.installed()


def test_a_runner_built_before_uninstall_says_so() -> None:
    fn = _mlp()
    jit = TinyJit(fn)
    agt.install(devices=4)
    try:
        for s in range(3):
            jit(Tensor(_data(s, 4, 16)).realize())
    finally:
        agt.uninstall()
    with pytest.raises(ag.ClosedError, match="was uninstalled"):
        jit(Tensor(_data(9, 4, 16)).realize())


def test_devices_that_are_not_cpu_are_refused() -> None:
    from actorgraph.tinygrad._convert import device_name

    assert device_name("CPU") == "CPU:0" and device_name("CPU:3") == "CPU:3"
    with pytest.raises(ag.UsageError, match="'NV' is not a CPU device"):
        device_name("NV")


def _via_python_device() -> Callable[[Tensor], Tensor]:
    w = Tensor(_data(9, 8)).realize()

    def forward(x: Tensor) -> Tensor:
        y = ((x * 2).realize() + 1).realize()  # two kernels: a batch actorgraph takes
        z = (y.to("PYTHON") + 1).realize()  # a device actorgraph does not run
        return ((z.to("CPU") * w).realize() - 1).realize()  # another batch

    return forward


async def test_what_actorgraph_cannot_run_tinygrad_runs_itself() -> None:
    fn = _via_python_device()
    calls = [(Tensor(_data(s, 8)).realize(),) for s in range(6)]
    expected = _reference(fn, calls)
    agt.install(devices=2)
    try:
        jit = TinyJit(fn)
        for args, want in zip(calls, expected):
            assert jit(*args).numpy().tobytes() == want.tobytes()
        stats = agt.statistics()
    finally:
        agt.uninstall()
    assert stats.graphs >= 2 and stats.replays >= 2 * (len(calls) - 2)  # both CPU batches
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"]) as rt:
            with pytest.raises(
                ag.UsageError,
                match=r"(call|item) \d+ of jit 'forward' is an? (call|item) on PYTHON",
            ):
                await agt.graph_from_jit(rt, jit)


def test_a_jit_past_the_opened_devices_runs_on_tinygrad_alone() -> None:
    fn = _data_parallel(4)
    calls = [(Tensor(_data(s, 8, 8)).realize(),) for s in range(5)]
    expected = _reference(fn, calls)
    agt.install(devices=2)  # CPU:2 and CPU:3 are not ours: tinygrad keeps those calls
    try:
        jit = TinyJit(fn)
        for args, want in zip(calls, expected):
            assert jit(*args).numpy().tobytes() == want.tobytes()
    finally:
        agt.uninstall()


@pytest.mark.skipif(not V011, reason="tinygrad 0.11 only: its CPU devices queue work")
async def test_a_replay_between_queued_tinygrad_work_never_deadlocks() -> None:
    # tinygrad work W is queued (held behind a blocker) before a replay R, and work Y after
    # it: R waits for W, Y waits for R. Waiting for W must not wait for Y as well.
    jit, x, want = _captured_mlp()
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


@pytest.mark.skipif(not V011, reason="tinygrad 0.11 only: its CPU devices queue work")
def test_a_replay_waits_for_the_value_taken_just_before_its_own_by_another_thread() -> None:
    # Another thread's tinygrad kernel takes the device's next timeline value just before
    # a replay takes its own. The replay must wait for that value too: waiting for less,
    # it may write its own value first, tinygrad's kernel then writes its earlier one,
    # the timeline goes back and tinygrad's later work waits for good.
    from actorgraph.tinygrad._v011 import ORDERING

    dev: Any = Device["CPU"]
    a = Tensor(_data(1, 8)).realize()
    want = (a + 1).numpy()  # compiled here: tinygrad's compile cache is this thread's
    replaying = threading.current_thread()
    own_take = dev.next_timeline
    out: list[Tensor] = []
    theirs: list[int] = []

    def take() -> int:
        # The replay's take: the other thread's kernel gets in first (a real thread, a
        # real kernel, queued on tinygrad's device thread as its own work is).
        if threading.current_thread() is replaying and not out:
            other = threading.Thread(target=lambda: out.append((a + 1).realize()))
            other.start()
            other.join(30)
        value = int(own_take())
        if threading.current_thread() is not replaying:
            theirs.append(value)
        return value

    dev.next_timeline = take
    try:
        after, then = ORDERING.take(["CPU"])
    finally:
        del dev.next_timeline
    [(timeline, wait)], [(_, own)] = after, then
    try:
        assert theirs, "the other thread's kernel took no timeline value"
        assert wait == own - 1 == max(theirs), (wait, own, theirs)
    finally:  # as a replay does: tinygrad's later work must never wait forever
        timeline.wait_for(wait)
        timeline.advance(own)
    assert out[0].numpy().tobytes() == want.tobytes()
    assert dev.timeline_signal.value == dev.timeline_value - 1


def _weighted() -> tuple[Callable[[Tensor], Tensor], Tensor]:
    # Two kernels, so tinygrad hands the batch to a graph runner.
    w = Tensor((2 * np.eye(4)).astype(np.float32)).realize()

    def forward(x: Tensor) -> Tensor:
        return ((x @ w).realize() + 1).realize()

    return forward, w


def _accumulating() -> tuple[Callable[[Tensor], Tensor], Tensor]:
    acc = Tensor.ones(8).contiguous().realize()

    def step(x: Tensor) -> Tensor:
        acc.assign(acc + x).realize()
        return (acc * 2).realize()

    return step, acc


def _full(value: float, *shape: int) -> Tensor:
    return Tensor(np.full(shape, value, np.float32)).realize()


async def test_graph_from_jit_reads_its_inputs_from_the_jits_own_record() -> None:
    # A first call that passes a tensor the jit itself uses (its weight, or its own state)
    # makes that call's input the same memory as the jit's: only the jit's slots are the
    # input, so later calls with other tensors still read the jit's own memory there.
    # Small whole numbers in float32: the expected values are exact.
    forward, w = _weighted()
    jit = TinyJit(forward)
    for s in range(2):
        jit(_full(s, 4, 4))  # captures
    step, acc = _accumulating()
    jit_state = TinyJit(step)
    for s in range(2):
        jit_state(_full(s, 8))  # captures: acc is 1 + 0 + 1 = 2 now
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"], verify_plans=True) as rt:
            graph = await agt.graph_from_jit(rt, jit)
            np.testing.assert_array_equal((await graph(w)).numpy(), 4 * np.eye(4) + 1)
            for value in (3, 5):
                np.testing.assert_array_equal(
                    (await graph(_full(value, 4, 4))).numpy(), 2 * value + 1
                )
            np.testing.assert_array_equal((await graph(w)).numpy(), 4 * np.eye(4) + 1)
            state = await agt.graph_from_jit(rt, jit_state)
            # acc doubles (it is passed as x: the jit copies it first), then grows by 3.
            np.testing.assert_array_equal((await state(acc)).numpy(), 2 * 4)
            np.testing.assert_array_equal((await state(_full(3, 8))).numpy(), 2 * 7)
            np.testing.assert_array_equal((await state(acc)).numpy(), 2 * 14)


@pytest.mark.skipif(
    V011,
    reason="tinygrad 0.11's TinyJit itself reads a first replay's inputs by identity "
    "(get_input_replace), and install() runs what it hands over",
)
def test_install_reads_inputs_from_the_jits_own_record_when_a_runner_is_rebuilt() -> None:
    # free_intermediates() drops the jit's graph runners: the next call builds them again
    # from its own arguments, here the jit's weight.
    forward, w = _weighted()
    agt.install(devices=1)
    try:
        jit = TinyJit(forward)
        for s in range(2):
            jit(_full(s, 4, 4))
        jit.captured.free_intermediates()
        np.testing.assert_array_equal(jit(w).numpy(), 4 * np.eye(4) + 1)
        np.testing.assert_array_equal(jit(_full(3, 4, 4)).numpy(), 7)
        assert agt.statistics().graphs >= 2
    finally:
        agt.uninstall()


def _doubling() -> Callable[[Tensor], Tensor]:
    def forward(x: Tensor) -> Tensor:  # two kernels: a batch tinygrad hands a runner
        return ((x * 2).realize() + 1).realize()

    return forward


def _blob(memory: np.ndarray[Any, Any], device: str) -> Tensor:
    return Tensor.from_blob(memory.ctypes.data, memory.shape, dtype=dtypes.float32, device=device)


def _captured_on(device: str, n: int = 16) -> Any:
    jit = TinyJit(_doubling())
    for s in range(2):
        jit(Tensor(np.full(n, s, np.float32), device=device).realize())
    return jit


def test_install_forgets_memory_tinygrad_let_go_of() -> None:
    # A tensor over memory tinygrad does not own is gone, and the same memory comes back
    # as a tensor on another device (as an allocator hands out an address again): valid
    # for tinygrad, so for actorgraph too.
    memory = np.zeros(16, np.float32)
    agt.install(devices=2)
    try:
        on_0, on_1 = _captured_on("CPU"), _captured_on("CPU:1")
        for value, device, jit in ((5, "CPU", on_0), (7, "CPU:1", on_1), (9, "CPU", on_0)):
            memory[:] = value
            t = _blob(memory, device)
            np.testing.assert_array_equal(jit(t).numpy(), 2 * value + 1)
            del t  # tinygrad lets go of the memory (its buffer is deallocated)
            gc.collect()
        assert agt.statistics().replays >= 3
    finally:
        agt.uninstall()


async def test_graph_from_jit_forgets_memory_tinygrad_let_go_of() -> None:
    memory = np.zeros(16, np.float32)
    on_0, on_1 = _captured_on("CPU"), _captured_on("CPU:1")
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
            graphs = {"CPU": await agt.graph_from_jit(rt, on_0)}
            graphs["CPU:1"] = await agt.graph_from_jit(rt, on_1)
            for value, device in ((5, "CPU"), (7, "CPU:1"), (9, "CPU")):
                memory[:] = value
                t = _blob(memory, device)
                np.testing.assert_array_equal((await graphs[device](t)).numpy(), 2 * value + 1)
                del t
                gc.collect()


@pytest.mark.skipif(
    V011,
    reason="tinygrad 0.11 under LRU=0 unmaps a buffer's memory while its device thread may "
    "still run a queued kernel on it (a crash of tinygrad's own)",
)
def test_install_forgets_memory_tinygrad_freed_and_handed_out_again() -> None:
    # LRU=0: tinygrad gives a tensor's memory back when it goes; the next tensors may get
    # the same address, here on another device.
    from tinygrad.helpers import Context

    from actorgraph.tinygrad._private import buffer_address

    n = 16384
    agt.install(devices=2)
    try:
        with Context(LRU=0):
            on_0, on_1 = _captured_on("CPU", n), _captured_on("CPU:1", n)
            x = Tensor(np.full(n, 5, np.float32), device="CPU").realize()
            address = buffer_address(x.uop.base.buffer)
            np.testing.assert_array_equal(on_0(x).numpy(), 11)
            del x
            gc.collect()
            kept = []  # tensors that got other memory, kept so the next tries get new memory
            for _ in range(64):
                y = Tensor(np.full(n, 7, np.float32), device="CPU:1").realize()
                if buffer_address(y.uop.base.buffer) == address:
                    break
                kept.append(y)
            else:
                pytest.fail("tinygrad never handed the freed memory out again")
            np.testing.assert_array_equal(on_1(y).numpy(), 15)
    finally:
        agt.uninstall()


async def test_graph_from_jit_reads_the_jit_again_once_tinygrad_freed_its_memory() -> None:
    # free_intermediates() deallocates the jit's own memory (its arena, its outputs):
    # the graph over that memory never runs again; the next call reads the jit anew, as
    # tinygrad's own next call allocates that memory anew.
    jit = _captured_on("CPU", 64)
    with trio.fail_after(60):
        async with ag.open_runtime(["CPU:0"]) as rt:
            jit_graph = await agt.graph_from_jit(rt, jit)
            x = Tensor(np.full(64, 3, np.float32)).realize()
            np.testing.assert_array_equal((await jit_graph(x)).numpy(), 7)
            first = jit_graph.graph
            jit.captured.free_intermediates()
            gc.collect()
            # Tensors of that size may get the jit's old memory: the replay must leave them be.
            others = [Tensor(np.full(64, 42, np.float32)).realize() for _ in range(4)]
            np.testing.assert_array_equal((await jit_graph(x)).numpy(), 7)
            assert jit_graph.graph is not first
            for other in others:
                np.testing.assert_array_equal(other.numpy(), 42)
            np.testing.assert_array_equal((await jit_graph(_full(5, 64))).numpy(), 11)


def test_install_never_runs_a_plan_over_memory_tinygrad_let_go_of() -> None:
    # A buffer the jit holds deallocated while tinygrad keeps the jit's runner: the
    # runner's plan would use memory that is not the jit's any more.
    forward, w = _weighted()
    agt.install(devices=1)
    try:
        jit = TinyJit(forward)
        for s in range(3):
            jit(_full(s, 4, 4))
        w.uop.base.buffer.deallocate()
        with pytest.raises(
            ag.UsageError,
            match=r"tinygrad freed memory this jit's batch holds \(free_intermediates\(\), or "
            r"a buffer of it deallocated\) while its runner stayed: capture the jit again",
        ):
            jit(_full(3, 4, 4))
    finally:
        agt.uninstall()
