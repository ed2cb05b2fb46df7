"""REMOTE devices against real worker subprocesses on loopback.

Two workers serve the whole module (A: CPU:0 and CPU:1, B: CPU:0), both with a token;
the basic tests use the pytest plugin's session worker (`ag_worker`, `ag_remote_runtime`).
Tests that kill or restart a worker start their own (`actorgraph.testing.start_worker`). Real sockets cannot run on trio's
mock clock, so every test guards against hangs with a generous trio.fail_after.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import trio
import trio.testing
from _model import DTYPE, SALT, ProgramSpec, build_items, check_program, random_programs
from _op_samples import OpSampler
from actorgraph.devices import Op
from actorgraph.scheduler import QueueKind, Run, Wait
from hypothesis import given, settings
from hypothesis import strategies as st

import actorgraph as ag
from actorgraph import _runtime, devices, remote
from actorgraph._program import Program
from actorgraph.remote._wire import HEADER, FrameStream, Limits, auth_mac, encode
from actorgraph.testing import Worker, start_worker

sys.path.insert(0, str(Path(__file__).parent))
from remote_kernels import ADD, GATED, INC, SCALE, SLEEPY, XOR

LOCAL_INC = ag.Kernel("local_inc", cpu=lambda x: np.add(x, 1, out=x), outs=(0,), ins=(0,))
HERE = Path(__file__).parent
GUARD = 30  # seconds: a hang guard only; every test finishes far sooner
TOKEN = b"test-token-0123456789"


def start(devices: str, **options: Any) -> Worker:
    """A worker of the test kernels, with the shared test token."""
    return start_worker(devices.split(","), kernels=["remote_kernels"], token=TOKEN, **options)


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[Worker, Worker]]:
    a = start("CPU:0,CPU:1")
    b = start("CPU:0")
    yield a, b
    a.kill()
    b.kill()


def runtime(names: list[str], **options: object) -> object:
    return ag.open_runtime(names, remote_token=TOKEN, **options)


# -- names --


def test_remote_names_parse() -> None:
    assert devices.parse_device_name("CPU:1@127.0.0.1:7000") == ("REMOTE", 1)
    assert devices.parse_device_name("CPU:0@[::1]:7000") == ("REMOTE", 0)
    with pytest.raises(ag.DeviceError, match=r"KIND:N@HOST:PORT"):
        devices.parse_device_name("CPU:0@127.0.0.1")


async def test_no_worker_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with (
        trio.fail_after(GUARD),
        pytest.raises(
            remote.RemoteConnectionError, match=r"cannot connect to the worker at 127.0.0.1:\d+"
        ),
    ):
        async with ag.open_runtime([f"CPU:0@127.0.0.1:{port}"]):
            pass


# -- the basics work as for local devices --


@pytest.mark.actorgraph(devices=1)
async def test_remote_alloc_starts_zeroed_and_counts_elements(ag_remote_runtime: ag.Runtime) -> None:
    rt = ag_remote_runtime
    (r0,) = rt.devices
    with trio.fail_after(GUARD):
        used = rt.alloc(r0, 64, np.int32)
        await rt.copyin(used, np.full(64, 7, np.int32))
        rt.free(used)
        buf = rt.alloc(r0, (4, 4), np.int32)
        assert (buf.size, buf.nbytes) == (16, 64)
        np.testing.assert_array_equal(await rt.copyout(buf), np.zeros((4, 4), np.int32))
        await rt.copyin(buf.view(4, 4), np.arange(4, dtype=np.int32))
        np.testing.assert_array_equal((await rt.copyout(buf))[1], np.arange(4))


@pytest.mark.actorgraph(devices=1)
async def test_alloc_copy_run_graph(ag_remote_runtime: ag.Runtime) -> None:
    # The plugin's session worker (ag_worker) serves the test kernels: see pyproject.toml.
    rt = ag_remote_runtime
    (r0,) = rt.devices
    with trio.fail_after(GUARD):
        a, b, c = (rt.alloc(r0, 64, np.int32) for _ in range(3))
        await rt.copyin(a, np.arange(64, dtype=np.int32))
        await rt.copyin(b, np.full(64, 5, np.int32))
        await rt.run([ag.Launch(XOR, [c, a, b])])
        np.testing.assert_array_equal(await rt.copyout(c), np.arange(64) ^ 5)
        graph = await rt.compile(
            [ag.Launch(ADD, [c, a, b]), ag.Launch(INC, [c, c])], inputs=[a]
        )
        a2 = rt.alloc(r0, 64, np.int32)
        await rt.copyin(a2, np.full(64, 100, np.int32))
        for src, want in (
            (a, np.arange(64) + 6),
            (a2, np.full(64, 106)),
            (a, np.arange(64) + 6),
        ):
            await graph([src])
            np.testing.assert_array_equal(await rt.copyout(c), want)
        view = a.view(offset=8, size=4)
        np.testing.assert_array_equal(await rt.copyout(view), [8, 9, 10, 11])


async def test_one_round_trip_per_replay(ag_remote_runtime: ag.Runtime) -> None:
    rt = ag_remote_runtime
    r0, r1 = rt.devices
    with trio.fail_after(GUARD):
        x = rt.alloc(r0, 16, np.int32)
        y = rt.alloc(r1, 16, np.int32)
        items = [ag.Launch(INC, [x, x]) for _ in range(50)] + [ag.Copy(dst=y, src=x)]
        items += [ag.Launch(INC, [y, y]) for _ in range(49)]
        graph = await rt.compile(items)
        conn = rt.device(r0).connection
        await graph()
        await graph()
        sent, received = conn.batches_sent, conn.frames_received
        await graph()
        # One batch out; back: one "done" per queue (plus the signal the copy waits on).
        assert conn.batches_sent == sent + 1
        assert conn.frames_received - received <= 3
        np.testing.assert_array_equal(await rt.copyout(y), np.full(16, 3 * 50 + 49))


async def test_ordering_local_remote_chain(workers: tuple[Worker, Worker]) -> None:
    # local -> A -> B -> local, with kernels between: every hop waits for the one before.
    a_worker, b_worker = workers
    ra, rb = a_worker.name("CPU:1"), b_worker.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime(["CPU:0", ra, rb], verify_plans=True) as rt:
            src = rt.alloc("CPU:0", 256, np.int32)
            at_a = rt.alloc(ra, 256, np.int32)
            at_b = rt.alloc(rb, 256, np.int32)
            back = rt.alloc("CPU:0", 256, np.int32)
            items = [
                ag.Launch(INC, [src, src]),
                ag.Copy(dst=at_a, src=src),
                ag.Launch(INC, [at_a, at_a]),
                ag.Copy(dst=at_b, src=at_a),
                ag.Launch(INC, [at_b, at_b]),
                ag.Copy(dst=back, src=at_b),
                ag.Launch(INC, [src, back]),  # overwrites src only after A read it
            ]
            graph = await rt.compile(items)
            await rt.copyin(src, np.zeros(256, np.int32))
            model = np.zeros(256, np.int64)
            for _ in range(3):
                await graph()
                model = model + 1  # src += 1; a = src + 1; b = a + 1; back = b; src = back + 1
                model = model + 3
            np.testing.assert_array_equal(await rt.copyout(src), model)
            np.testing.assert_array_equal(await rt.copyout(back), model - 1)


async def test_worker_to_worker_copy_skips_the_client(
    workers: tuple[Worker, Worker],
) -> None:
    a_worker, b_worker = workers
    ra, rb = a_worker.name("CPU:0"), b_worker.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([ra, rb]) as rt:
            x = rt.alloc(ra, 1 << 16, np.int32)
            y = rt.alloc(rb, 1 << 16, np.int32)
            await rt.copyin(x, np.arange(1 << 16, dtype=np.int32))
            graph = await rt.compile([ag.Copy(dst=y, src=x), ag.Launch(INC, [y, y])])
            conn_a, conn_b = rt.device(ra).connection, rt.device(rb).connection
            before = (conn_a.bytes_received, conn_b.bytes_received)
            await graph()
            assert (conn_a.bytes_received, conn_b.bytes_received) == before  # no data came here
            np.testing.assert_array_equal(await rt.copyout(y), np.arange(1 << 16) + 1)


async def test_concurrent_replays_and_eager_work_keep_order(
    workers: tuple[Worker, Worker],
) -> None:
    # Replays issued at once go out before their predecessors finish, so their waits on
    # device timelines cross hosts through forwarders rather than being already met.
    a_worker, b_worker = workers
    ra, rb = a_worker.name("CPU:0"), b_worker.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime(["CPU:0", ra, rb]) as rt:
            x = rt.alloc("CPU:0", 64, np.int32)
            y = rt.alloc(ra, 64, np.int32)
            z = rt.alloc(rb, 64, np.int32)
            items = [
                ag.Launch(INC, [x, x]),
                ag.Copy(dst=y, src=x),
                ag.Launch(INC, [y, y]),
                ag.Copy(dst=z, src=y),
                ag.Launch(INC, [z, z]),
                ag.Copy(dst=x, src=z),
            ]
            graph = await rt.compile(items)
            await rt.copyin(x, np.zeros(64, np.int32))
            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(graph)
                    nursery.start_soon(rt.run, [ag.Launch(INC, [x, x])])
            # Every replay adds 3 to x and every eager item 1, in whatever order the
            # tasks got in: a lost update (a race) would show as less.
            np.testing.assert_array_equal(await rt.copyout(x), np.full(64, 6 * 3 + 6))
            stats = rt.device(ra).connection.statistics()
            assert stats.batches_in_flight == 0 and stats.connected


async def test_vars_and_launch_dims_go_per_call(
    workers: tuple[Worker, Worker],
) -> None:
    a_worker, _ = workers
    r0 = a_worker.name("CPU:0")
    k = ag.Var("k", 1, 100)
    with trio.fail_after(GUARD):
        async with runtime([r0]) as rt:
            a, c = rt.alloc(r0, 16, np.int32), rt.alloc(r0, 16, np.int32)
            await rt.copyin(a, np.arange(16, dtype=np.int32))
            graph = await rt.compile([ag.Launch(SCALE, [c, a], vars=[k], global_size=k * 2)])
            for value in (3, 7, 3):
                await graph(var_vals={k: value})
                np.testing.assert_array_equal(await rt.copyout(c), np.arange(16) * value)


async def test_item_failure_on_worker_names_the_item(
    workers: tuple[Worker, Worker],
) -> None:
    a_worker, _ = workers
    r0 = a_worker.name("CPU:0")
    boom = ag.Kernel("boom", cpu=lambda out, a: None, outs=(0,), ins=(1,))
    with trio.fail_after(GUARD):
        async with runtime(["CPU:0", r0]) as rt:
            x = rt.alloc(r0, 8, np.int32)
            y = rt.alloc("CPU:0", 8, np.int32)
            graph = await rt.compile(
                [ag.Launch(INC, [x, x]), ag.Launch(boom, [x, x]), ag.Copy(dst=y, src=x)]
            )
            with pytest.raises(
                ag.ItemError, match=r"item 1 \(boom\).*ZeroDivisionError: boom on purpose"
            ):
                await graph()
            nope = ag.Kernel("nope", cpu=lambda out: None, outs=(0,))
            with pytest.raises(ag.ItemError, match=r"unknown kernel 'nope'.*--kernels MODULE"):
                await rt.run([ag.Launch(nope, [x])])
            await rt.run([ag.Launch(INC, [x, x])])  # the session goes on
            assert (await rt.copyout(x)).shape == (8,)


@pytest.mark.parametrize("profiled", [False, True], ids=["plain", "profiled"])
async def test_every_code_of_a_remote_queue_runs_in_both_loops(
    workers: tuple[Worker, Worker], profiled: bool
) -> None:
    name = workers[0].name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([name]) as rt:
            device = rt.device(name)
            buf = rt.alloc(name, 4, np.int32)
            data = np.arange(4, dtype=np.int32) + 7

            def wire() -> Op:
                return device.lower_host_write(buf, data, QueueKind.COMPUTE)

            sampler = OpSampler(device.queues[QueueKind.COMPUTE])
            for code in sorted(sampler.actor.op_codes):
                await sampler.run(code, profiled, wire)
            np.testing.assert_array_equal(await rt.copyout(buf), data)


async def test_profiled_replay_copies_between_local_and_remote(
    workers: tuple[Worker, Worker],
) -> None:
    # The local queue's side of such a copy is an AWAIT op, in the profiled loop too.
    r0 = workers[0].name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime(["CPU:0", r0]) as rt:
            x, z = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
            y = rt.alloc(r0, 8, np.int32)
            await rt.copyin(x, np.arange(8, dtype=np.int32))
            items = [ag.Copy(dst=y, src=x), ag.Launch(INC, [y, y]), ag.Copy(dst=z, src=y)]
            graph = await rt.compile(items)
            await graph(profile=True)
            np.testing.assert_array_equal(await rt.copyout(z), np.arange(8) + 1)
            profile = graph.last_profile
    assert profile is not None
    copies = sorted(e.item for e in profile.events if e.actor == "CPU:0/copy")
    assert copies == [0, 2]


# -- the fuzzer: random graphs over local and remote devices, against a numpy model --

_KERNELS = {"xor": (XOR, np.bitwise_xor), "add": (ADD, np.add)}


@st.composite
def _graphs(draw: st.DrawFn) -> tuple[list[tuple[object, ...]], int]:
    nitems = draw(st.integers(1, 12))
    items: list[tuple[object, ...]] = []
    for _ in range(nitems):
        if draw(st.booleans()):
            dev = draw(st.integers(0, 3))
            items.append(
                (
                    "k",
                    draw(st.sampled_from(sorted(_KERNELS))),
                    dev,
                    draw(st.integers(0, 2)),
                    draw(st.integers(0, 2)),
                    draw(st.integers(0, 2)),
                )
            )
        else:
            # A copy of whole buffers, or of one half-sized view into another.
            halves = draw(st.none() | st.tuples(st.integers(0, 16), st.integers(0, 16)))
            items.append(
                (
                    "c",
                    draw(st.integers(0, 3)),
                    draw(st.integers(0, 2)),
                    draw(st.integers(0, 3)),
                    draw(st.integers(0, 2)),
                    halves,
                )
            )
    return items, draw(st.integers(0, 2**31 - 1))


@given(_graphs())
def test_fuzz_graphs_match_a_numpy_model(
    workers: tuple[Worker, Worker], case: tuple[list[tuple[object, ...]], int]
) -> None:
    spec, seed = case
    a_worker, b_worker = workers
    names = ["CPU:0", a_worker.name("CPU:0"), a_worker.name("CPU:1"), b_worker.name("CPU:0")]
    n = 32
    rng = np.random.default_rng(seed)

    async def main() -> None:
        with trio.fail_after(GUARD):
            async with runtime(names, verify_plans=True) as rt:
                bufs = [[rt.alloc(d, n, np.int32) for _ in range(3)] for d in names]
                spare = rt.alloc(names[1], n, np.int32)  # the graph input's second binding
                host = {}
                for row in bufs + [[spare]]:
                    for buf in row:
                        host[buf] = rng.integers(0, 1000, n, dtype=np.int32)
                        await rt.copyin(buf, host[buf])
                items = []
                for it in spec:
                    if it[0] == "k":
                        _, kname, dev, o, i1, i2 = it
                        row = bufs[dev]
                        items.append(ag.Launch(_KERNELS[kname][0], [row[o], row[i1], row[i2]]))
                    else:
                        _, dd, di, sd, si, halves = it
                        dst, src = bufs[dd][di], bufs[sd][si]
                        if halves is not None:
                            dst = dst.view(offset=halves[0], size=n // 2)
                            src = src.view(offset=halves[1], size=n // 2)
                        if dst.overlaps(src) or dst is src:
                            continue
                        items.append(ag.Copy(dst=dst, src=src))
                if not items:
                    return
                graph = await rt.compile(items, inputs=[bufs[1][0]])
                for binding in (bufs[1][0], spare, bufs[1][0]):
                    await graph([binding])

                    def real(b: ag.Buffer, binding: ag.Buffer = binding) -> ag.Buffer:
                        return binding if b is bufs[1][0] else b

                    for item in items:
                        if isinstance(item, ag.Launch):
                            out, a, b = (real(x) for x in item.bufs)
                            fn = _KERNELS[item.kernel.name][1]
                            host[out] = fn(host[a], host[b]).astype(np.int32)
                        else:
                            dst, src = real(item.dst.base), real(item.src.base)
                            d0, s0 = item.dst.offset, item.src.offset
                            size = item.dst.size
                            host[dst][d0 : d0 + size] = host[src][s0 : s0 + size].copy()
                for buf, want in host.items():
                    np.testing.assert_array_equal(await rt.copyout(buf), want, err_msg=repr(buf))

    trio.run(main)


async def test_bulk_data_goes_in_frames_the_worker_accepts(
    workers: tuple[Worker, Worker]
) -> None:
    small = start("CPU:0", extra_args=("--max-frame", "65536"))
    _, big = workers
    try:
        rs, rb = small.name("CPU:0"), big.name("CPU:0")
        data = np.arange(1 << 18, dtype=np.int32)  # 1 MiB: 16 frames into `small`
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", rs, rb]) as rt:
                x, y = rt.alloc(rs, data.size, np.int32), rt.alloc(rs, data.size, np.int32)
                z, local = rt.alloc(rb, data.size, np.int32), rt.alloc("CPU:0", data.size, np.int32)
                await rt.copyin(x, data)
                await rt.copyin(local, data + 1)
                await rt.run(
                    [ag.Copy(dst=y, src=local), ag.Copy(dst=z, src=x), ag.Copy(dst=x, src=z)]
                )
                np.testing.assert_array_equal(await rt.copyout(x), data)
                np.testing.assert_array_equal(await rt.copyout(y), data + 1)
    finally:
        small.kill()


# -- faults --


async def test_worker_killed_mid_replay() -> None:
    worker = start("CPU:0")
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", r0]) as rt:
                x = rt.alloc(r0, 8, np.int32)
                y = rt.alloc("CPU:0", 8, np.int32)
                z = rt.alloc("CPU:0", 8, np.int32)
                # The local copy waits for the remote kernel: it must not hang either.
                graph = await rt.compile([ag.Launch(SLEEPY, [x, x]), ag.Copy(dst=y, src=x)])
                errors = []

                async def replay() -> None:
                    try:
                        await graph()
                    except ag.ActorGraphError as exc:
                        errors.append(exc)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(replay)
                    await trio.testing.wait_all_tasks_blocked()  # the batch is on the wire
                    worker.kill()
                assert len(errors) == 1 and isinstance(errors[0], ag.ClosedError)
                assert re.search(r"connection to worker 127.0.0.1:\d+ lost", str(errors[0]))
                # Local devices go on working; the remote one says what happened.
                await rt.copyin(z, np.arange(8, dtype=np.int32))
                await rt.run([ag.Launch(INC, [z, z]), ag.Copy(dst=y, src=z)])
                np.testing.assert_array_equal(await rt.copyout(y), np.arange(8) + 1)
                with pytest.raises(ag.ActorGraphError, match="connection to worker"):
                    await rt.run([ag.Launch(INC, [x, x])])
                with pytest.raises(ag.ClosedError, match=r"alloc on CPU:0@127.0.0.1:\d+: connection"):
                    rt.alloc(r0, 8, np.int32)
    finally:
        worker.kill()


async def test_every_call_on_a_dead_workers_devices_raises_closed_error() -> None:
    """After its worker dies, every call that touches its devices raises ag.ClosedError
    (copies to and from local devices too, and compiling for them); local devices keep
    working, and leaving the block raises nothing."""
    worker = start("CPU:0,CPU:1")
    r0, r1 = worker.name("CPU:0"), worker.name("CPU:1")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", r0, r1]) as rt:
                x, x1 = rt.alloc(r0, 8, np.int32), rt.alloc(r1, 8, np.int32)
                y = rt.alloc("CPU:0", 8, np.int32)
                pull = await rt.compile([ag.Launch(INC, [x, x]), ag.Copy(dst=y, src=x)])
                between = await rt.compile([ag.Copy(dst=x1, src=x)])
                await pull()
                slow = await rt.compile([ag.Launch(SLEEPY, [x, x]), ag.Copy(dst=y, src=x)])
                in_flight = await slow.submit()
                await trio.testing.wait_all_tasks_blocked()
                worker.kill()
                with pytest.raises(ag.ClosedError, match="connection to worker"):
                    await in_flight.wait()
                calls = {
                    "replay": pull,
                    "replay between workers": between,
                    "submit_nowait": lambda: pull.submit_nowait().wait(),
                    "run": lambda: rt.run([ag.Launch(INC, [x, x])]),
                    "copy to a local device": lambda: rt.run([ag.Copy(dst=y, src=x)]),
                    "copy from a local device": lambda: rt.run([ag.Copy(dst=x, src=y)]),
                    "copyin": lambda: rt.copyin(x, np.zeros(8, np.int32)),
                    "copyout": lambda: rt.copyout(x),
                    "compile": lambda: rt.compile([ag.Launch(INC, [x, x])]),
                    "launch": lambda: rt.launch(INC, [x1, x1]),
                }
                for name, call in calls.items():
                    with pytest.raises(ag.ClosedError, match=r"connection to worker 127.0.0.1:\d+ lost"):
                        await call()
                        pytest.fail(f"{name} did not raise")
                with pytest.raises(ag.ClosedError, match=r"alloc on CPU:0@127.0.0.1:\d+: connection"):
                    rt.alloc(r0, 8, np.int32)
                rt.free(x1)  # its memory went with the worker: nothing to give back
                await rt.copyin(y, np.arange(8, dtype=np.int32))
                await rt.run([ag.Launch(INC, [y, y])])
                np.testing.assert_array_equal(await rt.copyout(y), np.arange(8) + 1)
    finally:
        worker.kill()


async def test_slow_remote_kernels_are_progress_not_a_deadlock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work in flight on a worker is progress: while remote kernels run, nothing changes on
    the client for many deadlock checks, and the monitor must not call that a deadlock."""
    gate = tmp_path / "gate"
    monkeypatch.setenv("ACTORGRAPH_TEST_GATE", str(gate))
    checked = trio.Event()
    checks = []
    real = _runtime.find_deadlock

    def counting(actors: Any) -> Any:
        found = real(actors)
        checks.append(found)
        if len(checks) >= 5 or found:
            checked.set()
        return found

    monkeypatch.setattr(_runtime, "find_deadlock", counting)
    worker = start("CPU:0")
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", r0], deadlock_check=0.01) as rt:
                x, y = rt.alloc(r0, 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
                await rt.copyin(x, np.arange(8, dtype=np.int32))
                graph = await rt.compile([
                    ag.Launch(GATED, [x, x]), ag.Launch(INC, [x, x]), ag.Launch(INC, [x, x]),
                    ag.Copy(dst=y, src=x),
                ])
                replay = await graph.submit()
                await checked.wait()  # the monitor looked at the stalled replay 5 times
                assert checks == [None] * len(checks)
                gate.touch()
                await replay.wait()
                np.testing.assert_array_equal(await rt.copyout(y), np.arange(8) + 2)
                await graph()
                np.testing.assert_array_equal(await rt.copyout(y), np.arange(8) + 4)
                # A real deadlock through the worker is still found: a hand-edited plan
                # where the remote queue and a local one wait on each other.
                items = [ag.Launch(INC, [x, x]), ag.Launch(LOCAL_INC, [y])]
                plan = (await rt.compile(items)).plan
                queues = plan.queues
                programs = []
                for program, other in zip(plan.programs, (queues[1], queues[0])):
                    out: list[Any] = []
                    for msg in program:
                        if isinstance(msg, Run):
                            out.append(Wait(other, 1))
                        out.append(msg)
                    programs.append(tuple(out))
                bad = attrs.evolve(plan, programs=tuple(programs))
                stuck = ag.Graph(rt, Program(rt, items, [], bad))
                with pytest.raises(ag.DeadlockError, match=r"CPU:0@127.0.0.1:\d+/compute waits for CPU:0/compute >= 1"):
                    await stuck()
    finally:
        worker.kill()


@settings(max_examples=4)
@given(
    random_programs(max_devices=4, max_items=12),
    random_programs(max_devices=2, max_items=8),
    st.integers(0, 40),
)
def test_chaos_a_worker_killed_mid_replay(
    spec: ProgramSpec, local_spec: ProgramSpec, checkpoints: int
) -> None:
    """Random graphs over two local devices and two of a worker, checked against the host
    model; then the worker is killed after a random number of checkpoints while every
    graph is being replayed. Nothing hangs, every call returns or raises ClosedError, and
    the runtime goes on working on its local devices."""

    async def main() -> None:
        # A gate that never opens: the worker is surely killed while a replay runs there.
        os.environ["ACTORGRAPH_TEST_GATE"] = str(Path(tempfile.mkdtemp()) / "never")
        try:
            worker = start_worker(["CPU:0", "CPU:1"], kernels=["_model", "remote_kernels"], token=TOKEN)
        finally:
            del os.environ["ACTORGRAPH_TEST_GATE"]
        names = ["CPU:0", "CPU:1", worker.name("CPU:0"), worker.name("CPU:1")]
        try:
            with trio.fail_after(GUARD):
                async with runtime(names) as rt:
                    await check_program(rt, names, spec, replays=1)
                    buffers = [rt.alloc(names[d], spec.buffer_size, DTYPE) for d in spec.buffer_devices]
                    items = build_items(spec, buffers)
                    graphs = [await rt.compile(items[lo:hi]) for lo, hi in spec.chunks()]
                    held = rt.alloc(names[2], 4, np.uint32)
                    local = rt.alloc("CPU:0", 4, np.uint32)
                    graphs.insert(0, await rt.compile(
                        [ag.Launch(GATED, [held, held]), ag.Copy(dst=local, src=held)]
                    ))
                    outcomes: list[BaseException | None] = []

                    async def call(graph: ag.Graph) -> None:
                        try:
                            await call_raising(graph)
                            outcomes.append(None)
                        except ag.ClosedError as error:
                            outcomes.append(error)

                    async def kill() -> None:
                        for _ in range(checkpoints):
                            await trio.lowlevel.checkpoint()
                        worker.kill()

                    async with trio.open_nursery() as nursery:
                        for graph in graphs:
                            nursery.start_soon(call, graph)
                        nursery.start_soon(kill)
                    assert len(outcomes) == len(graphs)  # every call ended: none raised another error
                    assert any(isinstance(o, ag.ClosedError) for o in outcomes)  # the gated one
                    await check_program(rt, ["CPU:0", "CPU:1"], local_spec, replays=1)
                    touches_worker = [
                        g for g in graphs if any("@" in q.device for q in g.plan.queues)
                    ]
                    for graph in touches_worker[:1]:
                        with pytest.raises(ag.ClosedError, match="connection to worker"):
                            await call_raising(graph)
                    assert rt.in_flight == 0
        finally:
            worker.kill()

    trio.run(main)


def _uses_salt(graph: ag.Graph) -> bool:
    return SALT in graph._program.free_vars


async def call_raising(graph: ag.Graph) -> None:
    await graph(var_vals={SALT: 1} if _uses_salt(graph) else None)


async def test_reconnect_to_a_restarted_worker() -> None:
    worker = start("CPU:0")
    port = worker.port
    try:
        with trio.fail_after(GUARD):
            async with runtime([worker.name("CPU:0")]) as rt:
                x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
                await rt.copyin(x, np.ones(4, np.int32))
            worker.kill()
            worker = start("CPU:0", port=port)
            async with runtime([worker.name("CPU:0")]) as rt:
                x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
                await rt.copyin(x, np.full(4, 7, np.int32))
                await rt.run([ag.Launch(INC, [x, x])])
                np.testing.assert_array_equal(await rt.copyout(x), np.full(4, 8))
    finally:
        worker.kill()


# -- security: every refusal is an error reply, and the worker keeps serving --


async def _raw(port: int, limits: Limits | None = None) -> tuple[FrameStream, bytes]:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    stream = FrameStream(sock, limits or Limits())
    meta, _ = await stream.receive()
    assert meta[0] == "challenge" and meta[2] is True
    return stream, meta[1]


async def _session(port: int) -> FrameStream:
    stream, nonce = await _raw(port)
    await stream.send([encode(["auth", "client", auth_mac(TOKEN, nonce), ["CPU:0"]])])
    meta, _ = await stream.receive()
    assert meta[0] == "welcome"
    return stream


async def _still_serves(worker: Worker) -> None:
    async with runtime([worker.name("CPU:0")]) as rt:
        x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
        await rt.copyin(x, np.arange(4, dtype=np.int32))
        np.testing.assert_array_equal(await rt.copyout(x), np.arange(4))


async def test_refuses_missing_and_wrong_tokens(
    workers: tuple[Worker, Worker],
) -> None:
    worker, _ = workers
    with trio.fail_after(GUARD):
        with pytest.raises(remote.RemoteConnectionError, match=re.escape(
            f"cannot connect to the worker at 127.0.0.1:{worker.port}: the worker is running and "
            f"requires a token; pass open_runtime(..., remote_token_file=PATH) naming its --token-file"
        )) as info:
            async with ag.open_runtime([worker.name("CPU:0")]):
                pass
        assert "start one" not in str(info.value)  # it runs: starting another is no help
        with pytest.raises(remote.RemoteConnectionError, match=re.escape(
            f"cannot connect to the worker at 127.0.0.1:{worker.port}: the worker is running but "
            f"refused this client's token (authentication failed: wrong or missing token); check "
            f"that remote_token= or remote_token_file= holds the token in the worker's --token-file"
        )) as info:
            async with ag.open_runtime([worker.name("CPU:0")], remote_token=b"wrong"):
                pass
        assert "start one" not in str(info.value)
        stream, _ = await _raw(worker.port)
        await stream.send([encode(["auth", "client", b"", ["CPU:0"]])])
        meta, _ = await stream.receive()
        assert meta[0] == "error" and "authentication failed" in meta[-1]
        await _still_serves(worker)


async def test_refuses_malformed_and_oversized_frames(
    workers: tuple[Worker, Worker],
) -> None:
    worker, _ = workers
    bad_frames = [
        b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 16,  # not our magic
        HEADER.pack(b"AG", 99, 4, 0) + b"\x91\xa1x\0",  # unknown version
        HEADER.pack(b"AG", 1, 3, 0) + b"\xc1\xc1\xc1",  # not msgpack
        HEADER.pack(b"AG", 1, 1 << 30, 0),  # meta over the limit: refused unread
        HEADER.pack(b"AG", 1, 2, 1 << 40) + b"\x91\x00",  # tail over the limit
    ]
    with trio.fail_after(GUARD):
        for frame in bad_frames:
            stream = await _session(worker.port)
            await stream.send([frame])
            meta, _ = await stream.receive()
            assert meta[0] == "error" and meta[1] == "frame", meta
            assert await stream.sock.recv(1) == b""  # and that connection is closed
        await _still_serves(worker)


async def test_refuses_bad_requests_and_keeps_the_session(
    workers: tuple[Worker, Worker],
) -> None:
    worker, _ = workers
    with trio.fail_after(GUARD):
        async with runtime([worker.name("CPU:0")]) as rt:
            # Another client's buffer: it exists on the worker, but not in our session.
            theirs = rt.alloc(worker.name("CPU:0"), 4, np.int32)
            await rt.copyin(theirs, np.arange(4, dtype=np.int32))
            handle = theirs.memory.handle
            stream = await _session(worker.port)
            requests = [
                (["get", 1, [handle, 0, [4]]], "unknown buffer id"),
                (["alloc", "x", "CPU:0", 4, "int32"], "must be an int"),
                (["alloc", 1, "CPU:0", 1 << 40, "int8"], "over the limit"),
                (["alloc", 2, "CPU:0", 4, "object"], "is not one of"),
                (["alloc", 3, "GPU:7", 4, "int32"], "no device 'GPU:7'"),
                (["batch", 9, [0, 0, 0], [12345], []], "unknown program id 12345"),
                (["frobnicate", 1], "unknown request 'frobnicate'"),
                (["free"], "has 1 fields, got 0"),
            ]
            for request, message in requests:
                await stream.send([encode(request)])
                meta, _ = await stream.receive()
                assert meta[0] == "error" and message in meta[-1], (request, meta)
            # Base slots: KICK, BATCH, then the queues' own (from 2; devices/_ops.py).
            bases = [0, 0, 0]
            # A program naming an unknown kernel is refused when a batch runs it.
            await stream.send([encode(["alloc", 5, "CPU:0", 4, "int32"])])
            prog = [["k", 0, "nope", [[5, 0, [4]]], [], [1, 1, 1], [1, 1, 1]], ["s", 2, 1]]
            await stream.send(
                [encode(["prog", 1, "CPU:0", prog, False]), encode(["batch", 2, bases, [1], []])]
            )
            meta, _ = await stream.receive()
            assert meta[:3] == ["done", 2, 2] and "unknown kernel 'nope'" in meta[3][2]
            # The session still works: a valid program runs.
            inc = ["k", 0, "inc", [[5, 0, [4]], [5, 0, [4]]], [], [1, 1, 1], [1, 1, 1]]
            await stream.send(
                [
                    encode(["prog", 3, "CPU:0", [inc, ["s", 2, 1]], False]),
                    encode(["batch", 4, bases, [3], []]),
                ]
            )
            meta, _ = await stream.receive()
            assert meta == ["done", 4, 2, None]
            # A program may not signal past its own range on the shared queue, nor on the
            # slots of KICK and BATCH.
            for prog_id, prog, message in [
                (5, [["s", 2, 1000]], "signals must rise to its item count"),
                (7, [inc, ["s", 1, 1]], "signals on base slot 1, which is KICK or BATCH"),
            ]:
                await stream.send(
                    [
                        encode(["prog", prog_id, "CPU:0", prog, False]),
                        encode(["batch", prog_id + 1, bases, [prog_id], []]),
                    ]
                )
                meta, _ = await stream.receive()
                assert meta[0] == "done" and message in meta[3][2], meta
            # A batch carries the KICK and BATCH slots at least.
            await stream.send([encode(["batch", 9, [0], [], []])])
            meta, _ = await stream.receive()
            assert meta[0] == "error" and "a batch has KICK and BATCH first" in meta[-1]
            stream.sock.close()
            np.testing.assert_array_equal(await rt.copyout(theirs), np.arange(4))


async def test_a_replaced_pending_write_gives_its_bytes_back() -> None:
    """The pending host-write limit counts what is pending now: a blob sent again under
    the same id replaces the first, whose bytes stop counting."""
    worker = start("CPU:0", extra_args=("--max-pending-writes", "65536"))
    try:
        with trio.fail_after(GUARD):
            stream = await _session(worker.port)
            big = b"x" * 40000
            for _ in range(6):  # 240000 bytes sent, never more than 40000 pending
                await stream.send([encode(["blob", 1], len(big)), big])
            await stream.send([encode(["blob", 2], 16), b"y" * 16])
            await stream.send([encode(["frobnicate", 1])])
            meta, _ = await stream.receive()  # the first reply: no blob was refused
            assert meta[:2] == ["error", "frobnicate"], meta
            # The limit still holds for bytes really pending: 40016 + 40000 > 65536.
            await stream.send([encode(["blob", 3], len(big)), big])
            meta, _ = await stream.receive()
            assert meta[:2] == ["error", "blob"] and "too many bytes of pending host writes" in meta[-1]
            stream.sock.close()
            await _still_serves(worker)
    finally:
        worker.kill()


async def test_one_client_cannot_stall_another_on_a_shared_device() -> None:
    """Client A's job on the worker's CPU:0 waits on a signal A never sets; client B's
    work on the same device still runs: sessions do not queue behind each other."""
    worker = start("CPU:0")
    try:
        with trio.fail_after(GUARD):
            stream = await _session(worker.port)
            bases = [0, 0, 0]  # KICK, BATCH, then A's queue slot
            inc = ["k", 0, "inc", [[5, 0, [4]], [5, 0, [4]]], [], [1, 1, 1], [1, 1, 1]]
            stuck = [["w", 77, 0, 1], inc, ["s", 2, 1]]  # mirror 77 >= 1: only A sets it
            await stream.send([
                encode(["alloc", 5, "CPU:0", 4, "int32"]),
                encode(["prog", 1, "CPU:0", stuck, False]),
                encode(["batch", 2, bases, [1], []]),
                encode(["frobnicate", 3]),
            ])
            meta, _ = await stream.receive()  # the batch is posted: the request after it got its answer
            assert meta[:2] == ["error", "frobnicate"], meta
            with trio.fail_after(10):
                async with runtime([worker.name("CPU:0")]) as rt:
                    x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
                    graph = await rt.compile([ag.Launch(INC, [x, x])])
                    for _ in range(3):
                        await graph()
                    np.testing.assert_array_equal(await rt.copyout(x), np.full(4, 3))
            await stream.send([encode(["ext", [[77, 1]]])])  # A lets its own job go
            meta, _ = await stream.receive()
            assert meta == ["done", 2, 2, None]
            stream.sock.close()
    finally:
        worker.kill()


async def test_a_slow_kernel_of_one_client_does_not_freeze_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client A's kernel runs until A's test opens its gate; meanwhile client B's work on
    the same worker device runs, when kernels run on threads (`--thread-bytes 0`)."""
    gate = tmp_path / "gate"
    monkeypatch.setenv("ACTORGRAPH_TEST_GATE", str(gate))
    worker = start("CPU:0", extra_args=("--thread-bytes", "0"))
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime([r0]) as rt_a, runtime([r0]) as rt_b:
                x = rt_a.alloc(r0, 8, np.int32)
                slow = await (await rt_a.compile([ag.Launch(GATED, [x, x])])).submit()
                y = rt_b.alloc(r0, 8, np.int32)
                with trio.fail_after(10):
                    await rt_b.run([ag.Launch(INC, [y, y])])
                    np.testing.assert_array_equal(await rt_b.copyout(y), np.ones(8))
                assert not slow.done
                gate.touch()
                await slow.wait()
    finally:
        worker.kill()


async def test_peer_reads_need_a_valid_ticket(workers: tuple[Worker, Worker]) -> None:
    worker, _ = workers
    with trio.fail_after(GUARD):
        async with runtime([worker.name("CPU:0")]) as rt:
            x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
            await rt.copyin(x, np.arange(4, dtype=np.int32))
            conn = rt.device(worker.name("CPU:0")).connection
            stream, _ = await _raw(worker.port)
            await stream.send([encode(["auth", "peer", b"", []])])
            ref = [x.memory.handle, 0, [4]]
            for ticket in (b"0" * 16, conn.ticket(x.memory.handle + 1)):
                await stream.send([encode(["pread", 1, conn.session_id, ref, ticket])])
                meta, _ = await stream.receive()
                assert meta[0] == "error" and "bad read ticket" in meta[-1]
            await stream.send([encode(["get", 1, ref])])  # a peer may do nothing else
            meta, _ = await stream.receive()
            assert meta[0] == "error" and "can only read" in meta[-1]
            await stream.send([encode(["pread", 2, conn.session_id, ref, conn.ticket(ref[0])])])
            meta, tail = await stream.receive()
            assert meta[:2] == ["data", 2] and tail == 16
            stream.sock.close()


def test_worker_refuses_to_serve_other_hosts_without_a_token(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from actorgraph._cli import main

    assert main(["worker", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "refusing to serve 0.0.0.0 without a token; pass --token-file" in capsys.readouterr().err


async def test_a_client_that_leaves_mid_job_does_not_block_others(
    workers: tuple[Worker, Worker],
) -> None:
    worker, _ = workers
    with trio.fail_after(GUARD):
        stream = await _session(worker.port)
        # A job that waits for a signal of this client, which then goes away: the job
        # sits on the worker's shared CPU:0 queue until the worker lets it go.
        await stream.send([encode(["alloc", 1, "CPU:0", 4, "int32"])])
        prog = [
            ["w", 1, 0, 5],
            ["k", 0, "inc", [[1, 0, [4]], [1, 0, [4]]], [], [1, 1, 1], [1, 1, 1]],
            ["s", 2, 1],
        ]
        await stream.send(
            [encode(["prog", 1, "CPU:0", prog, False]), encode(["batch", 2, [0, 0, 0], [1], []])]
        )
        stream.sock.close()
        await _still_serves(worker)


async def test_a_copy_between_a_gpu_and_a_remote_device_is_refused_clearly(ag_worker: Any) -> None:
    remote_name = ag_worker.devices[0]
    async with ag.open_runtime(
        ["CUDA:0", remote_name], remote_token=ag_worker.token, cuda_driver="fake"
    ) as rt:
        with trio.fail_after(GUARD):
            gpu = rt.alloc("CUDA:0", 16, np.int32)
            far = rt.alloc(remote_name, 16, np.int32)
            for dst, src in ((far, gpu), (gpu, far)):
                with pytest.raises(ag.DeviceError, match=re.escape(
                    f"copy {src.device}->{dst.device}: a copy between a remote device and CUDA:0 "
                    f"is not supported (CUDA:0's memory is not host memory, and the bytes go to "
                    f"the worker from host memory); copy through a CPU device"
                )):
                    await rt.compile([ag.Copy(dst=dst, src=src)])
