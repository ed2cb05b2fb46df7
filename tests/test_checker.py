"""Checked replays: `open_runtime(check_replays=N)` runs the first N replays of every graph
eagerly too, on shadow copies of its memory, and compares bitwise; `install(check_replays=N)`
compares with tinygrad running the batch itself. Pure graphs pass on every device kind
and path (awaited, submitted, background, @ag.jit, aliased inputs, remote workers);
kernels with hidden state, and a runner that skips a kernel, are caught and named."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import trio
from _cuda_kernels import inc, xor
from hypothesis import given
from hypothesis import strategies as st

import actorgraph as ag
from actorgraph._compare import Compared, Written, clusters, first_mismatch, shadow_offset
from actorgraph._program import Program
from actorgraph.testing import Worker, open_test_runtime

GUARD = 30  # seconds: a hang guard only

XOR = ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,), ins=(1, 2))
INC_IN_PLACE = ag.Kernel("inc", cpu=lambda buf: np.add(buf, 1, out=buf), outs=(0,), ins=(0,))


def counter(name: str = "counter", at: int = 3, cuda: bool = False) -> ag.Kernel:
    """A kernel with hidden state: out = a, plus its call count at element `at`. Two runs
    of the same work differ there."""
    calls = [0]

    def body(out: np.ndarray[Any, Any], a: np.ndarray[Any, Any], *values: int) -> None:
        calls[0] += 1
        np.copyto(out, a)
        out.reshape(-1)[at] += calls[0]

    source = f'extern "C" __global__ void {name}(int *out, const int *a, int n) {{}}'
    return ag.Kernel(name, cpu=body, cuda=source if cuda else None, outs=(0,), ins=(1,))


def ints(n: int, seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).integers(0, 1 << 20, n, dtype=np.int32)


async def test_a_pure_graph_passes_its_checked_replays_and_later_ones_are_unchecked() -> None:
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0", "CPU:1"], check_replays=3) as rt:
            a, b, c = (rt.alloc("CPU:0", 64, np.int32) for _ in range(3))
            d = rt.alloc("CPU:1", 64, np.int32)
            items = [ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c), ag.Launch(INC_IN_PLACE, [d])]
            graph = await rt.compile(items, inputs=[a, b])
            assert isinstance(graph, ag.Graph)
            extra = []
            for i in range(6):
                x, y = ints(64, i), ints(64, 100 + i)
                await rt.copyin(a, x)
                await rt.copyin(b, y)
                before = rt.submissions
                await graph([a, b])
                extra.append(rt.submissions - before)
                np.testing.assert_array_equal(await rt.copyout(d), (x ^ y) + 1)
            stats = graph.statistics()
            assert (stats.checked, stats.replays_done) == (3, 6)
            # A checked replay is several submissions (snapshot, replay, reads, eager
            # items); an unchecked one is the replay alone.
            assert all(n > 1 for n in extra[:3]) and extra[3:] == [1, 1, 1]
            assert type(graph) is ag.Graph  # a plain graph again: no cost after its checks


async def test_a_kernel_with_hidden_state_is_caught_naming_graph_item_buffer_and_index() -> None:
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0", "CPU:1"], check_replays=2) as rt:
            a, b, c, d = (rt.alloc("CPU:0", 16, np.int32) for _ in range(4))
            e = rt.alloc("CPU:1", 16, np.int32)
            items = [
                ag.Launch(XOR, [c, a, b]),
                ag.Launch(counter(at=5), [d, c]),  # differs at d[5]
                ag.Copy(dst=e, src=d),  # so does e[5], but item 1 comes first
            ]
            graph = await rt.compile(items, inputs=[a, b])
            await rt.copyin(a, np.arange(16, dtype=np.int32))
            name = f"replay 1 of graph {graph.number} {graph!r}"
            with pytest.raises(ag.ReplayMismatchError) as caught:
                await graph([a, b])
            error = caught.value
            message = str(error)
            assert message.startswith(name)
            assert re.search(
                rf"item 1 \(counter\) is the first item, in program order, whose output "
                rf"differs; it writes {re.escape(repr(d))}, whose element 5 is 6 after the "
                rf"replay but 7 by the reference",
                message,
            )
            assert "no state kept between calls" in message  # the fix
            assert (error.graph, error.item, error.label) == (name, 1, "counter")
            assert (error.buffer, error.index, error.got, error.expected) == (repr(d), 5, 6, 7)
            # The replay itself ran and stands; the runtime goes on.
            np.testing.assert_array_equal((await rt.copyout(e))[5], 5 + 1)
            with pytest.raises(ag.ReplayMismatchError, match="replay 2 of graph"):
                await graph([a, b])
            await graph([a, b])  # unchecked now: the hidden state goes unnoticed
            assert graph.statistics().checked == 2
            await rt.run([ag.Copy(dst=e, src=a)])
            np.testing.assert_array_equal(await rt.copyout(e), np.arange(16))
            assert rt.frees_pending == 0 and rt.in_flight == 0


async def test_an_input_that_is_also_an_output_is_checked_right() -> None:
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"], check_replays=3) as rt:
            x, y = rt.alloc("CPU:0", 32, np.int32), rt.alloc("CPU:0", 32, np.int32)
            await rt.copyin(x, np.arange(32, dtype=np.int32))
            await rt.copyin(y, np.full(32, 5, np.int32))
            # x is read and written in place by the graph: its snapshot must be the state
            # before the replay, or the eager run would start from the replay's result.
            graph = await rt.compile(
                [ag.Launch(INC_IN_PLACE, [x]), ag.Launch(XOR, [x, x, y])], inputs=[x, y]
            )
            expected = np.arange(32, dtype=np.int32)
            for _ in range(4):
                await graph([x, y])
                expected = (expected + 1) ^ 5
                np.testing.assert_array_equal(await rt.copyout(x), expected)
            assert graph.statistics().checked == 3
            hidden = await rt.compile([ag.Launch(counter(at=7), [x, x])], inputs=[x])
            with pytest.raises(ag.ReplayMismatchError, match=r"item 0 \(counter\).*element 7"):
                await hidden([x])


async def test_aliased_inputs_of_a_replanned_graph_are_checked_right() -> None:
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"], check_replays=4) as rt:
            base = rt.alloc("CPU:0", 24, np.int32)
            p, q = rt.alloc("CPU:0", 16, np.int32), rt.alloc("CPU:0", 16, np.int32)
            graph = await rt.compile(
                [ag.Launch(XOR, [p, p, q]), ag.Launch(INC_IN_PLACE, [q])],
                inputs=[p, q],
                aliasing="replan",
            )
            start = np.arange(24, dtype=np.int32) * 3
            await rt.copyin(base, start)
            expected = start.copy()
            for _ in range(3):
                # Overlapping inputs: a view of base and another view overlapping it.
                await graph([base.view(0, 16), base.view(8, 16)])
                expected[0:16] ^= expected[8:24].copy()
                expected[8:24] += 1
                np.testing.assert_array_equal(await rt.copyout(base), expected)
            assert graph.statistics().checked == 3
            hidden = await rt.compile(
                [ag.Launch(counter(at=2), [p, q])], inputs=[p, q], aliasing="replan"
            )
            first = base.view(0, 16)
            with pytest.raises(ag.ReplayMismatchError) as caught:
                await hidden([first, base.view(4, 16)])
            assert (caught.value.item, caught.value.index) == (0, 2)
            assert caught.value.buffer == repr(first)


async def check_devices(rt: ag.Runtime, at: int = 9) -> None:
    """Two devices, copies both ways, an input view, then a hidden-state kernel."""
    d0, d1 = rt.devices[:2]
    a, b, c = (rt.alloc(d0, 64, np.int32) for _ in range(3))
    big = rt.alloc(d0, 96, np.int32)
    d = rt.alloc(d1, 64, np.int32)
    items = [xor(c, a, b), ag.Copy(dst=d, src=c), inc(d), ag.Copy(dst=big.view(32, 64), src=d)]
    graph = await rt.compile(items, inputs=[a, b])
    for i in range(3):
        x, y = ints(64, i), ints(64, 7 + i)
        await rt.copyin(a, x)
        await rt.copyin(b.view(0, 64), y)
        await graph([a, b])
        np.testing.assert_array_equal((await rt.copyout(big))[32:], (x ^ y) + 1)
    assert graph.statistics().checked == 2
    e = rt.alloc(d1, 64, np.int32)
    hidden = await rt.compile(
        [ag.Copy(dst=d, src=c), ag.Launch(counter("counter_k", at, cuda=True), [e, d])]
    )
    with pytest.raises(ag.ReplayMismatchError, match=rf"item 1 \(counter_k\).*element {at} "):
        await hidden()


@pytest.mark.parametrize("kind", ["CPU", "CUDA"])
async def test_graphs_over_devices_with_copies(kind: str) -> None:
    with trio.fail_after(GUARD):
        async with open_test_runtime(kind, 2, {"check_replays": 2}) as rt:
            await check_devices(rt)


async def test_graphs_over_sim_devices_with_copies(autojump_clock: object) -> None:
    with trio.fail_after(GUARD):
        async with open_test_runtime("SIM", 2, {"check_replays": 2}) as rt:
            await check_devices(rt)


async def test_a_remote_worker_device(ag_worker: Worker) -> None:
    import remote_kernels as rk

    with trio.fail_after(GUARD):
        names = [ag_worker.devices[0], "CPU:0"]
        async with ag.open_runtime(names, remote_token=ag_worker.token, check_replays=2) as rt:
            far, near = names
            a, b = rt.alloc(far, 32, np.int32), rt.alloc(far, 32, np.int32)
            c = rt.alloc(near, 32, np.int32)
            items = [ag.Launch(rk.INC, [b, a]), ag.Copy(dst=c, src=b), ag.Launch(XOR, [c, c, c])]
            graph = await rt.compile(items + [ag.Copy(dst=a, src=c)], inputs=[a])
            await rt.copyin(a, np.arange(32, dtype=np.int32))
            for _ in range(3):
                await graph([a])
            np.testing.assert_array_equal(await rt.copyout(a), np.zeros(32))
            assert graph.statistics().checked == 2
            hidden = await rt.compile([ag.Launch(rk.COUNTER, [b, a]), ag.Copy(dst=c, src=b)])
            with pytest.raises(ag.ReplayMismatchError, match=r"item 0 \(counter\).*element 0 "):
                await hidden()


async def test_jitted_functions_are_checked() -> None:
    hidden = counter(at=1)

    @ag.jit
    async def step(rt: ag.Runtime, x: ag.Buffer, y: ag.Buffer, kernel: ag.Kernel) -> None:
        await rt.launch(kernel, [y, x])

    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"], check_replays=2) as rt:
            x, y = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
            copy = ag.Kernel("copy", cpu=lambda out, a: np.copyto(out, a), outs=(0,), ins=(1,))
            for _ in range(5):  # calls 1, 2 eager; 3, 4 checked; 5 not
                await step(rt, x, y, copy)
            assert step.graph is not None and step.graph.statistics().checked == 2
            step.reset()
            await step(rt, x, y, hidden)
            await step(rt, x, y, hidden)
            with pytest.raises(ag.ReplayMismatchError, match=r"item 0 \(counter\).*element 1 "):
                await step(rt, x, y, hidden)


async def test_submitted_replays_are_checked_and_fail_when_waited_for() -> None:
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"], check_replays=3) as rt:
            x, y = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
            graph = await rt.compile([ag.Launch(counter(at=4), [y, x])])
            replay = await graph.submit()
            with pytest.raises(ag.ReplayMismatchError, match="replay 1 of graph"):
                await replay.wait()
            replay = graph.submit_nowait()
            with pytest.raises(ag.ReplayMismatchError, match="replay 2 of graph"):
                await replay.wait()
            seen = [0]
            then = ag.ExternalTimeline("then", lambda: seen[0], lambda v: seen.__setitem__(0, v))
            with pytest.raises(ag.ReplayMismatchError, match="replay 3 of graph"):
                await graph(then=[(then, 1)])
            assert seen == [1]  # advanced once the check was done, failed or not
            await graph()  # unchecked
            assert graph.statistics().checked == 3


async def test_a_failure_of_the_replay_comes_first_and_one_of_eager_alone_is_a_mismatch() -> None:
    calls = [0]

    def every_other(out: np.ndarray[Any, Any], a: np.ndarray[Any, Any]) -> None:
        calls[0] += 1
        if calls[0] % 2:
            raise ZeroDivisionError(f"call {calls[0]}")
        np.copyto(out, a)

    kernel = ag.Kernel("flaky", cpu=every_other, outs=(0,), ins=(1,))
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"], check_replays=2) as rt:
            x, y = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
            graph = await rt.compile([ag.Launch(XOR, [y, x, x]), ag.Launch(kernel, [y, x])])
            with pytest.raises(ag.ItemError, match=r"item 1 \(flaky\).*call 1"):
                await graph()  # the replay's call 1 raises: the replay's own error
            calls[0] = 1
            with pytest.raises(ag.ReplayMismatchError) as caught:
                await graph()  # the replay's call 2 runs, eager's call 3 raises
            assert re.search(
                r"item 1 \(flaky\) raised ZeroDivisionError: call 3 when run", str(caught.value)
            )
            assert isinstance(caught.value.__cause__, ZeroDivisionError)


async def test_var_values_max_sizes_and_profiles() -> None:
    n = ag.Var("n", 1, 64)

    def head_xor(out: Any, a: Any, b: Any, count: int) -> None:
        np.bitwise_xor(a[:count], b[:count], out=out[:count])

    kernel = ag.Kernel("head_xor", cpu=head_xor, outs=(0,), ins=(1, 2))
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"], check_replays=4, profile=True) as rt:
            a, b = rt.alloc("CPU:0", 64, np.int32), rt.alloc("CPU:0", 64, np.int32)
            out = rt.alloc("CPU:0", 64, np.int32)
            graph = await rt.compile(
                [ag.Launch(kernel, [out, a, b], vars=[n])], inputs=[a, b], max_sizes=[64, None]
            )
            for size, count in [(64, 64), (40, 17), (8, 8)]:
                small = rt.alloc("CPU:0", size, np.int32)
                await rt.copyin(small, ints(size, size))
                await graph([small, b], var_vals={n: count})
            assert graph.statistics().checked == 3
            assert graph.last_profile is not None  # a checked replay is profiled as asked
            with pytest.raises(ag.VarError):
                await graph([a, b], var_vals={n: 0})
            assert graph.statistics().checked == 3  # a call refused before it ran counts not


async def test_a_cancelled_checked_replay_still_runs_and_is_checked() -> None:
    with trio.fail_after(GUARD):
        # Kernels on the devices' worker threads: the call waits for them, cancellably.
        async with ag.open_runtime(["CPU:0"], check_replays=2, cpu_thread_bytes=1) as rt:
            x = rt.alloc("CPU:0", 8, np.int32)
            graph = await rt.compile([ag.Launch(INC_IN_PLACE, [x])], inputs=[x])
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(graph, [x])
                    await trio.testing.wait_all_tasks_blocked()
                    scope.cancel()
            assert scope.cancelled_caught
            await graph([x])  # ordered after the abandoned one, which ran
            np.testing.assert_array_equal(await rt.copyout(x), np.full(8, 2))
            assert graph.statistics().checked == 2


def test_a_background_runtime_checks_calls_from_plain_code() -> None:
    with ag.start_runtime(["CPU:0"], check_replays=2) as rt:
        x, y = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
        rt.copyin(x, np.arange(8, dtype=np.int32)).result()
        graph = rt.compile([ag.Launch(XOR, [y, x, x])], inputs=[x]).result()
        for _ in range(4):
            graph([x]).result()
        assert graph.statistics().checked == 2
        assert graph.graph.runs_off_thread  # later calls run on this thread again
        hidden = rt.compile([ag.Launch(counter(at=6), [y, x])]).result()
        with pytest.raises(ag.ReplayMismatchError, match="element 6 is 7 after the replay"):
            hidden().result()
        with pytest.raises(ag.ReplayMismatchError, match="element 6 is 9 after the replay"):
            hidden().result()  # its second checked replay (the eager run was call 2)
        hidden().result()  # unchecked: the runtime goes on
        np.testing.assert_array_equal(rt.copyout(y).result()[6], 6 + 5)


@pytest.mark.parametrize("value", [-1, True, 1.5, "2"])
async def test_check_replays_must_be_a_count(value: object) -> None:
    with pytest.raises(ag.UsageError, match="check_replays must be an int >= 0"):
        async with ag.open_runtime(["CPU:0"], check_replays=value):
            pass


@pytest.mark.parametrize("value", [-1, True, 1.5])
async def test_a_graph_refuses_a_check_count_that_is_no_count(value: object) -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        x, y = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
        items = [ag.Launch(XOR, [y, x, x])]
        program = Program(rt, items, [], (await rt.compile(items)).plan)
        with pytest.raises(ag.InputError, match=r"checks is how many replays .* int >= 0; got"):
            ag.Graph(rt, program, checks=value)  # type: ignore[arg-type]


async def test_a_misspelled_check_replays_names_it() -> None:
    with pytest.raises(ag.UsageError, match="did you mean 'check_replays'"):
        async with ag.open_runtime(["CPU:0"], check_replay=2):
            pass


# -- the comparison's rule, on its own --


def _written(item: int, start: int, stop: int, dtype: Any = np.uint8) -> Written:
    return Written(item, f"k{item}", f"buf{item}", "m", start, stop, np.dtype(dtype))


def _compared(got: list[int], expected: list[int], start: int = 0) -> Compared:
    return Compared("m", start, np.array(got, np.uint8), np.array(expected, np.uint8), "m")


def test_the_item_blamed_is_the_first_whose_output_the_final_state_shows() -> None:
    same = _compared([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8])
    assert first_mismatch([_written(0, 0, 8)], [same]) is None
    # Bytes 2 and 6 differ. Item 0 wrote 0..4 but item 2 wrote 2..4 after it: byte 2
    # shows item 2's output; byte 6 shows item 1's (4..8). Item 1 is the first shown.
    region = _compared([1, 2, 9, 4, 5, 6, 9, 8], [1, 2, 3, 4, 5, 6, 7, 8])
    writes = [_written(0, 0, 4), _written(1, 4, 8), _written(2, 2, 4)]
    found = first_mismatch(writes, [region])
    assert found is not None and found.written == writes[1]
    assert (found.index, found.got, found.expected) == (2, 9, 7)
    # As int16 elements: byte 6 is element 1 of item 1's buffer, bytes 6..8 read as one.
    wide = [_written(0, 4, 8, np.int16), _written(1, 0, 2)]
    found = first_mismatch(wide, [region])
    assert found is not None and found.written == wide[0] and found.index == 1
    assert (found.got, found.expected) == (9 + 8 * 256, 7 + 8 * 256)
    # A byte no item writes.
    found = first_mismatch([_written(0, 0, 2)], [region])
    assert found is not None and found.written is None and found.index == 2


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12)), min_size=1, max_size=12))
def test_clusters_join_overlapping_ranges_and_their_cover_spans_them(
    ranges: list[tuple[int, int]],
) -> None:
    spans = [("m", start, start + size, k) for k, (start, size) in enumerate(ranges)]
    found = clusters(spans)
    members = sorted(k for cluster in found for _, _, k in cluster.members)
    assert members == [k for k, (_, size) in enumerate(ranges) if size]
    for cluster in found:
        covered = np.zeros(80, bool)
        for k in cluster.cover():
            start, size = ranges[k]
            covered[start : start + size] = True
        assert covered[cluster.start : cluster.stop].all()
        assert not covered[: cluster.start].any() and not covered[cluster.stop :].any()
        for other in found:  # clusters share no byte
            if other is not cluster:
                assert other.stop <= cluster.start or cluster.stop <= other.start


def test_a_shadow_offset_fits_every_member_or_there_is_none() -> None:
    (cluster,) = clusters([("m", 100, 112, "a"), ("m", 104, 108, "b")])
    assert shadow_offset(cluster, [4, 4], 64, 12) == 12
    assert shadow_offset(cluster, [4, 4], 64, 13) == 0  # 13 misplaces both: the lowest fits
    (odd,) = clusters([("m", 0, 12, "a"), ("m", 6, 9, "b")])
    at = shadow_offset(odd, [4, 3], 64, 0)
    assert at is not None and at % 4 == 0 and (at + 6) % 3 == 0
    (clash,) = clusters([("m", 0, 8, "a"), ("m", 1, 9, "b")])
    assert shadow_offset(clash, [2, 2], 64, 0) is None


# -- tinygrad: install(check_replays=N) checks against tinygrad running the batch --

os.environ.setdefault("DEV", "CPU")  # before tinygrad picks its default device


def _tinygrad() -> Any:
    tinygrad = pytest.importorskip("tinygrad", reason="tinygrad is not installed")
    if shutil.which(os.environ.get("CC", "clang")) is None:
        pytest.skip("clang is not installed: tinygrad's CPU devices compile with it")
    from actorgraph import tinygrad as agt

    if agt.TINYGRAD_VERSION == "0.11.0":
        tinygrad.Device.DEFAULT = "CPU"
    else:
        from tinygrad.helpers import DEV

        DEV.value = "CPU"
    return tinygrad


@pytest.fixture
def mlp() -> Iterator[tuple[Callable[[], Any], list[Any]]]:
    """A fresh two-layer jit (one per test: a jit captured while installed is the
    runtime's) and inputs for it."""
    tinygrad = _tinygrad()
    from actorgraph import tinygrad as agt

    Tensor = tinygrad.Tensor
    w1, w2 = Tensor.randn(16, 32).realize(), Tensor.randn(32, 4).realize()

    def make() -> Any:
        return tinygrad.TinyJit(lambda x: ((x @ w1).relu() @ w2).realize())

    xs = [Tensor.randn(8, 16).realize() for _ in range(6)]
    yield make, xs
    agt.uninstall()


def test_tinygrad_install_checks_its_replays_on_a_real_model(
    mlp: tuple[Callable[[], Any], list[Any]],
) -> None:
    from actorgraph import tinygrad as agt

    make, xs = mlp
    alone = make()
    want = [alone(x).numpy() for x in xs]
    agt.install(check_replays=2)
    jit = make()
    got = [jit(x).numpy() for x in xs]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    stats = agt.statistics()
    assert stats.checked == 2 and stats.replays > 2


def test_tinygrad_install_catches_a_replay_that_skips_a_kernel(
    mlp: tuple[Callable[[], Any], list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from actorgraph import tinygrad as agt
    from actorgraph.tinygrad import _batch

    build = _batch.build_items

    def without_the_last(*args: Any) -> list[Any]:
        return build(*args)[:-1]  # the runner forgets the batch's last kernel

    monkeypatch.setattr(_batch, "build_items", without_the_last)
    make, xs = mlp
    agt.install(check_replays=1)
    jit = make()
    with pytest.raises(ag.ReplayMismatchError) as caught:
        for x in xs:
            jit(x)
    message = str(caught.value)
    assert message.startswith("checked replay 1 of a tinygrad batch of 2 calls")
    assert re.search(r"call 1 \(\w+\) is the first call, in program order, whose output", message)
    assert caught.value.item == 1 and caught.value.index == 0
    assert "bug of actorgraph.tinygrad" in message


def test_tinygrad_install_refuses_a_bad_check_replays() -> None:
    _tinygrad()
    from actorgraph import tinygrad as agt

    with pytest.raises(ag.UsageError, match=r"install\(check_replays=N\) needs an int N >= 0"):
        agt.install(check_replays=-1)
    assert not agt.installed()


async def test_tinygrad_jit_graph_checked_on_a_runtime(
    mlp: tuple[Callable[[], Any], list[Any]],
) -> None:
    from actorgraph import tinygrad as agt

    make, xs = mlp
    jit = make()
    want = [jit(x).numpy() for x in xs]  # it captures on its second call
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["CPU:0"], check_replays=3) as rt:
            graph = await agt.graph_from_jit(rt, jit)
            for x, expected in zip(xs, want):
                out = await graph(x)
                np.testing.assert_array_equal(out.numpy(), expected)
            assert graph.graph.statistics().checked == 3
