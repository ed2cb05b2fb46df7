"""@ag.jit: eager first call, capture on the second, replay after; every mismatch is loud."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import trio

import actorgraph as ag

ADD = ag.Kernel("add", cpu=lambda o, a, b: np.add(a, b, out=o), outs=(0,), ins=(1, 2))
XOR = ag.Kernel("xor", cpu=lambda o, a, b: np.bitwise_xor(a, b, out=o), outs=(0,), ins=(1, 2))
N = ag.Var("n", 1, 64)


def _double_first(
    out: np.ndarray, a: np.ndarray, n: int, *, global_size: Any, local_size: Any
) -> None:
    # The launch covers global_size[0] blocks of 4 elements, clipped to n.
    count = min(n, global_size[0] * 4)
    out[:count] = a[:count] * 2


DOUBLE = ag.Kernel("double", cpu=_double_first, outs=(0,), ins=(1,), pass_dims=True)


async def filled(rt: ag.Runtime, device: str, values: Any, dtype: Any = np.int32) -> ag.Buffer:
    data = np.asarray(values, dtype=dtype)
    buf = rt.alloc(device, data.shape, dtype)
    await rt.copyin(buf, data)
    return buf


async def test_first_call_eager_second_captures_later_calls_replay() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        out = rt.alloc("CPU:1", 16, np.int32)
        body_runs = []

        @ag.jit
        async def step(rt: ag.Runtime, a: ag.Buffer, b: ag.Buffer) -> ag.Buffer:
            body_runs.append(1)
            tmp = rt.alloc("CPU:0", 16, np.int32)
            await rt.launch(XOR, [tmp, a, b])
            await rt.copy(out, tmp)
            return out

        rng = np.random.default_rng(1)
        states = []
        for _ in range(6):
            a_host, b_host = (rng.integers(0, 1 << 20, 16, dtype=np.int32) for _ in range(2))
            a, b = await filled(rt, "CPU:0", a_host), await filled(rt, "CPU:0", b_host)
            result = await step(rt, a, b)
            states.append(step.statistics().state)
            np.testing.assert_array_equal(await rt.copyout(result), a_host ^ b_host)
        assert len(body_runs) == 2  # calls 3..6 replayed without running the function
        assert states[:3] == [ag._jit.State.WARM, ag._jit.State.CAPTURED, ag._jit.State.CAPTURED]
        stats = step.statistics()
        assert (stats.calls, stats.eager_calls, stats.captures, stats.replays) == (6, 1, 1, 4)
        assert step.graph is not None and len(step.graph.plan.queues) >= 2


async def test_symbolic_sizes_follow_each_calls_var_values() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        a = await filled(rt, "CPU:0", np.arange(64))
        out = rt.alloc("CPU:0", 64, np.int32)

        @ag.jit
        async def head(rt: ag.Runtime, a: ag.Buffer, out: ag.Buffer) -> None:
            await rt.launch(DOUBLE, [out, a], vars=[N], global_size=ag.cdiv(N, 4))

        for n in (3, 9, 17, 5, 64, 1):
            await rt.copyin(out, np.zeros(64, np.int32))
            await head(rt, a, out, var_vals={N: n})
            want = np.zeros(64, np.int32)
            want[:n] = np.arange(n) * 2
            np.testing.assert_array_equal(await rt.copyout(out), want)
        assert head.statistics().replays == 4

        with pytest.raises(ag.VarError, match=r"Var 'n' = 65 is outside its bounds \[1, 64\]"):
            await head(rt, a, out, var_vals={N: 65})
        with pytest.raises(
            ag.InputError, match=r"captured with values for Vars \['n'\] but got values for \[\]"
        ):
            await head(rt, a, out)


async def test_missing_var_value_on_eager_call_names_the_var() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        a, out = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)

        @ag.jit
        async def head(rt: ag.Runtime, a: ag.Buffer, out: ag.Buffer) -> None:
            await rt.launch(DOUBLE, [out, a], vars=[N], global_size=ag.cdiv(N, 4))

        with pytest.raises(
            ag.VarError,
            match=r"head\(\) issued double, which uses Vars \['n'\].*var_vals=\{n: \.\.\.\}",
        ):
            await head(rt, a, out)


async def test_returned_buffers_inside_an_input_follow_the_call() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        ones = await filled(rt, "CPU:0", np.ones(8))

        @ag.jit
        async def bump_tail(rt: ag.Runtime, x: ag.Buffer) -> tuple[ag.Buffer, dict[str, Any]]:
            tail = x.view(offset=4, size=4)
            await rt.launch(ADD, [tail, tail, ones.view(offset=0, size=4)])
            return tail, {"whole": x, "label": "tail"}

        for i in range(4):
            x = await filled(rt, "CPU:0", np.arange(8) * (i + 1))
            tail, extra = await bump_tail(rt, x)
            assert extra["whole"] is x and extra["label"] == "tail"
            assert tail.base is x and tail.offset == 4 and tail.shape == (4,)
            np.testing.assert_array_equal(await rt.copyout(tail), np.arange(4, 8) * (i + 1) + 1)


async def test_returned_internal_buffer_is_the_captures_own_and_rewritten_each_replay() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:

        @ag.jit
        async def double(rt: ag.Runtime, x: ag.Buffer) -> ag.Buffer:
            out = rt.alloc("CPU:0", x.shape, x.dtype)
            await rt.launch(ADD, [out, x, x])
            return out

        results = []
        for i in range(4):
            x = await filled(rt, "CPU:0", np.full(4, i))
            out = await double(rt, x)
            results.append(out)
            np.testing.assert_array_equal(await rt.copyout(out), np.full(4, 2 * i))
        # Calls 2, 3 and 4 return the capture's buffer: each replay writes it again.
        assert results[1] is results[2] is results[3] and results[0] is not results[1]


async def test_two_captured_functions_sharing_a_buffer_match_eager() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        shared = rt.alloc("CPU:1", 8, np.int32)
        acc = await filled(rt, "CPU:1", np.zeros(8))

        @ag.jit
        async def produce(rt: ag.Runtime, x: ag.Buffer) -> None:
            await rt.copy(shared, x)

        @ag.jit
        async def consume(rt: ag.Runtime) -> ag.Buffer:
            await rt.launch(ADD, [acc, acc, shared])
            return acc

        want = np.zeros(8, np.int32)
        for i in range(6):
            x_host = np.arange(8, dtype=np.int32) + i
            x = await filled(rt, "CPU:0", x_host)
            await produce(rt, x)
            got = await consume(rt)
            want += x_host
            np.testing.assert_array_equal(await rt.copyout(got), want)
        assert produce.statistics().replays == consume.statistics().replays == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("shape", r"step\(\): argument a has shape \(12,\) but the capture used \(8,\)"),
        ("dtype", r"step\(\): argument a has dtype float32 but the capture used int32"),
        ("device", r"step\(\): argument a has device CPU:1 but the capture used CPU:0"),
        ("count", r"step\(\) got arguments shaped differently from its capture"),
        ("const", r"step\(\): argument scale is 3 but was 2 when captured; non-Buffer arguments"),
        ("alias", r"step\(\): the Buffer arguments repeat differently from the capture"),
    ],
)
async def test_calls_unlike_the_capture_raise_input_error(change: str, message: str) -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        out = rt.alloc("CPU:0", 8, np.int32)

        @ag.jit
        async def step(rt: ag.Runtime, a: ag.Buffer, *more: ag.Buffer, scale: int = 2) -> None:
            await rt.launch(ADD, [out, a, more[0] if more else a])

        a, b = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
        for _ in range(2):
            await step(rt, a, b)
        call: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
            "shape": ((rt, rt.alloc("CPU:0", 12, np.int32), b), {}),
            "dtype": ((rt, rt.alloc("CPU:0", 8, np.float32), b), {}),
            "device": ((rt, rt.alloc("CPU:1", 8, np.int32), b), {}),
            "count": ((rt, a), {}),
            "const": ((rt, a, b), {"scale": 3}),
            "alias": ((rt, a, a), {}),
        }
        args, kwargs = call[change]
        with pytest.raises(ag.InputError, match=message):
            await step(*args, **kwargs)
        await step(rt, a, b)  # the capture still replays
        assert step.statistics().replays == 1


async def test_recapture_keeps_one_graph_per_signature() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        body_runs = []

        @ag.jit(recapture=True, max_captures=2)
        async def double(rt: ag.Runtime, x: ag.Buffer, out: ag.Buffer) -> None:
            body_runs.append(x.shape)
            await rt.launch(ADD, [out, x, x])

        async def check(size: int) -> None:
            x = await filled(rt, "CPU:0", np.arange(size))
            out = rt.alloc("CPU:0", size, np.int32)
            await double(rt, x, out)
            np.testing.assert_array_equal(await rt.copyout(out), np.arange(size) * 2)

        for size in (4, 4, 4, 8, 8, 4, 8, 16, 4):
            await check(size)
        # Eager 4, capture 4, replay 4, capture 8, replay 8, replay 4, replay 8,
        # capture 16 (drops 4, least recently used), capture 4 again.
        assert body_runs == [(4,), (4,), (8,), (16,), (4,)]
        assert double.statistics().graphs == 2


async def test_host_transfers_inside_a_capture_raise_but_the_first_call_may_do_setup() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        weights = rt.alloc("CPU:0", 4, np.int32)
        out = rt.alloc("CPU:0", 4, np.int32)
        loaded = []

        @ag.jit
        async def apply(rt: ag.Runtime, x: ag.Buffer) -> None:
            if not loaded:  # one-time setup on the eager first call
                await rt.copyin(weights, np.full(4, 10, np.int32))
                loaded.append(True)
            await rt.launch(ADD, [out, x, weights])

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # same work on calls 1 and 2: no JitWarning
            for i in range(3):
                await apply(rt, await filled(rt, "CPU:0", np.full(4, i)))
                np.testing.assert_array_equal(await rt.copyout(out), np.full(4, 10 + i))

        @ag.jit
        async def peek(rt: ag.Runtime, x: ag.Buffer) -> Any:
            await rt.launch(ADD, [out, x, x])
            return await rt.copyout(out)

        x = rt.alloc("CPU:0", 4, np.int32)
        await peek(rt, x)
        with pytest.raises(
            ag.UsageError,
            match=r"rt.copyout\(\) inside @ag.jit function peek\(\) while it is being captured",
        ):
            await peek(rt, x)


async def test_graph_calls_and_explicit_var_vals_inside_a_capture_raise() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        x, out = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
        graph = await rt.compile([ag.Launch(ADD, [out, x, x])], inputs=[x])

        @ag.jit
        async def uses_graph(rt: ag.Runtime, x: ag.Buffer) -> None:
            await graph([x])

        await uses_graph(rt, x)
        with pytest.raises(
            ag.UsageError, match=r"await graph\(\.\.\.\) inside @ag.jit function uses_graph\(\)"
        ):
            await uses_graph(rt, x)

        @ag.jit
        async def own_vars(rt: ag.Runtime, x: ag.Buffer) -> None:
            await rt.launch(DOUBLE, [out, x], vars=[N], global_size=1, var_vals={N: 4})

        with pytest.raises(
            ag.UsageError, match=r"inside a jitted function var values come from the call"
        ):
            await own_vars(rt, x)


async def test_control_flow_that_differs_between_first_and_capture_call_warns() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        out = rt.alloc("CPU:0", 8, np.int32)
        calls = []

        @ag.jit
        async def moody(rt: ag.Runtime, x: ag.Buffer) -> None:
            calls.append(1)
            kernel = XOR if len(calls) % 2 else ADD
            await rt.launch(kernel, [out, x, x])

        x = rt.alloc("CPU:0", 8, np.int32)
        await moody(rt, x)
        with pytest.warns(
            ag.JitWarning,
            match=r"moody\(\): the capture call issued different work than the first call \(item 0 differs",
        ):
            await moody(rt, x)


async def test_check_trace_catches_control_flow_on_unchecked_state() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        out = rt.alloc("CPU:0", 8, np.int32)
        mode = {"kernel": ADD}

        @ag.jit(check_trace=True)
        async def step(rt: ag.Runtime, x: ag.Buffer) -> None:
            await rt.launch(mode["kernel"], [out, x, x])

        x = await filled(rt, "CPU:0", np.arange(8))
        for _ in range(3):
            await step(rt, x)
        np.testing.assert_array_equal(await rt.copyout(out), np.arange(8) * 2)
        mode["kernel"] = XOR
        with pytest.raises(
            ag.JitTraceError,
            match=r"step\(\) issued different work than its capture \(item 0 differs \(launch add vs launch xor",
        ):
            await step(rt, x)
        step.reset()
        for _ in range(3):
            await step(rt, x)
        np.testing.assert_array_equal(await rt.copyout(out), np.zeros(8))


async def test_check_trace_tells_wrappers_on_one_device_apart() -> None:
    # Every wrapper on a device is in that device's one address space (one alloc_id): a
    # trace names a call's buffers by allocation, so a kernel moved from one wrapper to
    # another is a different trace, as it is for rt.alloc buffers.
    with trio.fail_after(10):
        async with ag.open_runtime(["CPU:0"]) as rt:
            wa = rt.wrap("CPU:0", np.zeros(8, np.int32), dtype=np.int32)
            wb = rt.wrap("CPU:0", np.zeros(8, np.int32), dtype=np.int32)
            target = [wb]

            @ag.jit(check_trace=True)
            async def step(rt: ag.Runtime, x: ag.Buffer) -> None:
                await rt.launch(ADD, [target[0], x, wa])

            x = await filled(rt, "CPU:0", np.arange(8))
            for _ in range(3):
                await step(rt, x)
            target[0] = wa
            with pytest.raises(
                ag.JitTraceError,
                match=r"step\(\) issued different work than its capture \(item 0 differs",
            ):
                await step(rt, x)


async def test_failed_capture_leaves_the_next_call_to_capture() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        out = rt.alloc("CPU:0", 8, np.int32)
        fail = [False]

        @ag.jit
        async def step(rt: ag.Runtime, x: ag.Buffer) -> None:
            await rt.launch(ADD, [out, x, x])
            if fail[0]:
                raise KeyError("boom")

        x = await filled(rt, "CPU:0", np.arange(8))
        await step(rt, x)
        fail[0] = True
        with pytest.raises(KeyError):
            await step(rt, x)
        fail[0] = False
        await step(rt, x)
        await step(rt, x)
        assert step.statistics().captures == 1 and step.statistics().replays == 1


async def test_nested_jit_calls_inline_into_the_outer_capture() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        mid, out = rt.alloc("CPU:0", 4, np.int32), rt.alloc("CPU:0", 4, np.int32)

        @ag.jit
        async def inner(rt: ag.Runtime, x: ag.Buffer) -> None:
            await rt.launch(ADD, [mid, x, x])

        @ag.jit
        async def outer(rt: ag.Runtime, x: ag.Buffer) -> None:
            await inner(rt, x)
            await rt.launch(ADD, [out, mid, x])

        for i in range(4):
            await outer(rt, await filled(rt, "CPU:0", np.full(4, i)))
            np.testing.assert_array_equal(await rt.copyout(out), np.full(4, 3 * i))
        assert inner.statistics().calls == 0
        assert len(outer.graph.plan.item_queue) == 2  # type: ignore[union-attr]


async def test_a_closed_runtime_makes_the_next_call_start_over() -> None:
    @ag.jit
    async def double(rt: ag.Runtime, x: ag.Buffer, out: ag.Buffer) -> None:
        await rt.launch(ADD, [out, x, x])

    for _ in range(2):
        async with ag.open_runtime(["CPU:0"]) as rt:
            x, out = await filled(rt, "CPU:0", np.arange(4)), rt.alloc("CPU:0", 4, np.int32)
            for _ in range(3):
                await double(rt, x, out)
            np.testing.assert_array_equal(await rt.copyout(out), np.arange(4) * 2)
    assert double.statistics().eager_calls == 2 and double.statistics().captures == 2


async def test_bad_uses_raise_clear_errors() -> None:
    with pytest.raises(
        ag.UsageError, match=r"@ag.jit decorates async functions \(async def \.\.\.\)"
    ):
        ag.jit(lambda rt: None)
    with pytest.raises(
        ag.UsageError, match=r"jit\(max_captures=\.\.\.\) must be an int >= 1, got 0"
    ):
        ag.jit(recapture=True, max_captures=0)(test_bad_uses_raise_clear_errors)

    async with ag.open_runtime(["CPU:0"]) as rt, ag.open_runtime(["CPU:0"]) as rt2:

        @ag.jit
        async def nothing(rt: ag.Runtime, x: ag.Buffer) -> None:
            pass

        x = rt.alloc("CPU:0", 4, np.int32)
        await nothing(rt, x)
        with pytest.raises(ag.UsageError, match=r"nothing\(\) issued no work through rt.launch"):
            await nothing(rt, x)

        @ag.jit
        async def two(rt: ag.Runtime, rt2: ag.Runtime) -> None:
            await rt.launch(ADD, [rt.alloc("CPU:0", 2), rt.alloc("CPU:0", 2), rt.alloc("CPU:0", 2)])
            await rt2.launch(
                ADD, [rt2.alloc("CPU:0", 2), rt2.alloc("CPU:0", 2), rt2.alloc("CPU:0", 2)]
            )

        with pytest.raises(ag.UsageError, match=r"two\(\) issued work on two runtimes"):
            await two(rt, rt2)

        @ag.jit
        async def step(rt: ag.Runtime, x: ag.Buffer) -> None:
            await rt.launch(ADD, [x, x, x])

        with pytest.raises(
            ag.VarError, match=r"step\(\): var_vals keys must be ag.Var objects, got 'n'"
        ):
            await step(rt, x, var_vals={"n": 3})  # type: ignore[dict-item]
        freed = rt.alloc("CPU:0", 4, np.int32)
        rt.free(freed)
        with pytest.raises(
            ag.BufferFreedError, match=r"step\(\): argument x <Buffer CPU:0 4 int32 freed"
        ):
            await step(rt, freed)
        await step(rt, x)
        await step(rt, x)
        other = rt2.alloc("CPU:0", 4, np.int32)
        with pytest.raises(
            ag.InputError,
            match=r"argument x <Buffer CPU:0 4 int32 #\d+> belongs to another runtime",
        ):
            await step(rt, other)
        y = rt.alloc("CPU:0", 8, np.int32)

        @ag.jit
        async def halves(rt: ag.Runtime, a: ag.Buffer, b: ag.Buffer) -> None:
            await rt.launch(ADD, [a, a, b])

        await halves(rt, y.view(0, 4), y.view(2, 4))
        with pytest.raises(ag.InputError, match=r"halves\(\): Buffer arguments .* share memory"):
            await halves(rt, y.view(0, 4), y.view(2, 4))


async def test_eager_launch_and_copy_outside_jit_are_plain_eager_calls() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        a = await filled(rt, "CPU:0", np.arange(8))
        b = rt.alloc("CPU:0", 8, np.int32)
        c = rt.alloc("CPU:1", 8, np.int32)
        await rt.launch(ADD, [b, a, a])
        await rt.copy(c, b)
        np.testing.assert_array_equal(await rt.copyout(c), np.arange(8) * 2)
        out = rt.alloc("CPU:0", 8, np.int32)
        await rt.launch(DOUBLE, [out, a], vars=[N], global_size=ag.cdiv(N, 4), var_vals={N: 5})
        np.testing.assert_array_equal(await rt.copyout(out), [0, 2, 4, 6, 8, 0, 0, 0])


async def test_repeating_the_same_argument_objects_still_notices_frees_and_refills() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        out = rt.alloc("CPU:0", 4, np.int32)

        @ag.jit
        async def total(rt: ag.Runtime, xs: list[ag.Buffer]) -> None:
            await rt.launch(ADD, [out, xs[0], xs[1]])

        x, y = await filled(rt, "CPU:0", np.full(4, 1)), await filled(rt, "CPU:0", np.full(4, 2))
        xs = [x, y]
        for _ in range(4):
            await total(rt, xs)
        np.testing.assert_array_equal(await rt.copyout(out), np.full(4, 3))
        xs[1] = await filled(rt, "CPU:0", np.full(4, 5))  # same list object, new contents
        await total(rt, xs)
        np.testing.assert_array_equal(await rt.copyout(out), np.full(4, 6))

        @ag.jit
        async def double(rt: ag.Runtime, x: ag.Buffer) -> None:
            await rt.launch(ADD, [out, x, x])

        for _ in range(4):
            await double(rt, x)
        rt.free(x)
        with pytest.raises(ag.BufferFreedError, match=r"double\(\): argument x .* was freed"):
            await double(rt, x)


async def test_a_function_that_frees_its_scratch_buffer_cannot_be_captured() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        out = rt.alloc("CPU:0", 4, np.int32)

        @ag.jit
        async def step(rt: ag.Runtime, x: ag.Buffer) -> None:
            tmp = rt.alloc("CPU:0", 4, np.int32)
            await rt.launch(ADD, [tmp, x, x])
            await rt.launch(ADD, [out, tmp, x])
            rt.free(tmp)

        x = await filled(rt, "CPU:0", np.arange(4))
        await step(rt, x)
        with pytest.raises(
            ag.BufferFreedError, match=r"item 0 \(add\): buffer <Buffer CPU:0 4 int32 freed"
        ) as info:
            await step(rt, x)
        assert "while planning the work captured from step()" in str(info.value.__notes__)
