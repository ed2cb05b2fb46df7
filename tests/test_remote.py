"""REMOTE devices against real worker subprocesses on loopback.

Two workers serve the whole module (A: CPU:0 and CPU:1, B: CPU:0), both with a token;
the basic tests use the pytest plugin's session worker (`ag_worker`, `ag_remote_runtime`).
Faults of the connection are in test_connection.py, the worker's refusals in
test_session.py. Real sockets cannot run on trio's
mock clock, so every test guards against hangs with a generous trio.fail_after.
"""

from __future__ import annotations

import gc
import socket
import sys
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from _op_samples import OpSampler
from _workers import GUARD, chain, handshake, replay_chain_rounds, runtime, start
from actorgraph.devices import Op
from actorgraph.devices.remote import _connection as remote_connection
from actorgraph.devices.remote import _programs as remote_programs
from actorgraph.devices.remote.frames import FrameStream, encode
from actorgraph.devices.remote.wire import Batch, Get, Limits, Put, as_meta
from actorgraph.scheduler import QueueId, QueueKind
from hypothesis import given
from hypothesis import strategies as st

import actorgraph as ag
from actorgraph import devices, remote
from actorgraph.testing import Worker

sys.path.insert(0, str(Path(__file__).parent))
from remote_kernels import ADD, GATED, INC, SCALE, XOR

# -- names --


def _record_sent(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The messages connections encode from here on, in order (`encode` spied on)."""
    sent: list[Any] = []
    encode_frame = remote_connection.encode

    def recorded(message: Any, tail_len: int = 0) -> bytes:
        sent.append(message)
        return encode_frame(message, tail_len)

    monkeypatch.setattr(remote_connection, "encode", recorded)
    return sent


def _count(sent: list[Any], kind: type) -> int:
    return sum(type(message) is kind for message in sent)


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
async def test_remote_alloc_starts_zeroed_and_counts_elements(
    ag_remote_runtime: ag.Runtime,
) -> None:
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
        graph = await rt.compile([ag.Launch(ADD, [c, a, b]), ag.Launch(INC, [c, c])], inputs=[a])
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


@pytest.mark.actorgraph(devices=1)
async def test_a_dtype_holds_the_same_numbers_on_a_worker(ag_remote_runtime: ag.Runtime) -> None:
    # A dtype goes to the worker with its byte order: a big-endian buffer's numbers are
    # the same numbers there, and a view with a dtype of its own reads its own bytes.
    rt = ag_remote_runtime
    (r0,) = rt.devices
    with trio.fail_after(GUARD):
        for dtype in (">i4", "<i4", ">u2", ">f8", "<f2", ">c8", "|u1"):
            buf = rt.alloc(r0, 4, dtype)
            await rt.copyin(buf, np.arange(4, dtype=dtype))
            await rt.run([ag.Launch(INC, [buf, buf])])
            got = await rt.copyout(buf)
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got, np.arange(4) + 1)
        host = np.arange(8, dtype=">i4")
        buf = rt.alloc(r0, 8, ">i4")
        await rt.copyin(buf, host)
        # Bytes 8..16 as four big-endian uint16, and all 32 bytes as little-endian int64.
        halves = buf.view(byte_offset=8, dtype=">u2", shape=4)
        longs = buf.view(dtype="<i8")
        await rt.run([ag.Launch(INC, [halves, halves])])
        host.view(np.uint8)[8:16].view(">u2")[:] += 1
        np.testing.assert_array_equal(
            await rt.copyout(halves), host.view(np.uint8)[8:16].view(">u2")
        )
        await rt.run([ag.Launch(INC, [longs, longs])])
        host.view("<i8")[:] += 1
        np.testing.assert_array_equal(await rt.copyout(buf), host)
        with pytest.raises(ag.DeviceError, match=r"dtype >f16 \(>f16\) cannot live on a worker"):
            rt.alloc(r0, 4, ">f16")


async def test_copies_of_a_view_with_its_own_dtype_move_its_own_bytes(
    workers: tuple[Worker, Worker],
) -> None:
    # A view whose dtype is not its allocation's, copied between a worker and this host
    # and within the worker: each copy moves the view's own bytes (a reference to it
    # without its dtype once left such a pull waiting forever).
    r0 = workers[0].name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime(["CPU:0", r0]) as rt:
            host = np.arange(64, dtype=np.uint8)
            raw = rt.alloc(r0, 64, np.uint8)
            await rt.copyin(raw, host)
            ints = raw.view(byte_offset=8, dtype=np.int32, shape=4)
            local = rt.alloc("CPU:0", 4, np.int32)
            await rt.run([ag.Copy(dst=local, src=ints)])
            np.testing.assert_array_equal(await rt.copyout(local), host[8:24].view(np.int32))
            await rt.copyin(local, np.array([-1, 7, 1 << 20, 3], np.int32))
            back = raw.view(byte_offset=32, dtype=np.int32, shape=4)
            await rt.run([ag.Copy(dst=back, src=local)])
            want = host.copy()
            want[32:48] = np.array([-1, 7, 1 << 20, 3], np.int32).view(np.uint8)
            np.testing.assert_array_equal(await rt.copyout(raw), want)
            same = rt.alloc(r0, 4, np.int32)
            await rt.run([ag.Copy(dst=same, src=ints)])
            np.testing.assert_array_equal(await rt.copyout(same), host[8:24].view(np.int32))


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
        # One batch out; back: one "done" per queue (r0's compute, r1's copy and compute).
        # The copy waits on r0 there, on the worker: that signal is never reported here.
        assert [str(q) for q in graph.plan.queues] == [
            f"{r0}/compute",
            f"{r1}/compute",
            f"{r1}/copy",
        ]
        assert conn.batches_sent == sent + 1
        assert conn.frames_received - received == 3
        np.testing.assert_array_equal(await rt.copyout(y), np.full(16, 3 * 50 + 49))


async def test_a_replay_and_a_read_of_its_result_go_as_one_batch(
    ag_remote_runtime: ag.Runtime,
) -> None:
    """graph.submit_reading: the read is part of the replay's batch (the worker sends its
    bytes with the report of the job it ends), not a second batch; its program is the one
    the worker kept, with each call's input and array."""
    rt = ag_remote_runtime
    r0, r1 = rt.devices
    n = ag.Var("n", 1, 10)
    with trio.fail_after(GUARD):
        x, x2, y = (rt.alloc(r0, 64, np.int32) for _ in range(3))
        z, w = rt.alloc(r1, 64, np.int32), rt.alloc(r1, 64, np.int32)
        items = [
            ag.Launch(ADD, [y, x, x]),
            ag.Copy(dst=z, src=y),
            ag.Launch(INC, [z, z]),
            ag.Launch(SCALE, [w, z], vars=[n]),  # a value per call
        ]
        graph = await rt.compile(items, inputs=[x])
        conn = rt.device(r0).connection
        rng = np.random.default_rng(11)
        for k in range(12):
            given = rng.integers(-(1 << 20), 1 << 20, 64, dtype=np.int32)
            src, value = (x, x2)[k % 2], 1 + k % 3
            await rt.copyin(src, given)
            out = np.empty(64, np.int32)  # a new array every call, as tinygrad's
            batches, programs = conn.batches_sent, conn.programs.sent
            replay = await graph.submit_reading([src], {n: value}, w, out)
            assert replay is not None
            await replay.wait()
            assert conn.batches_sent == batches + 1
            if k >= 6:  # each input with each value seen: the worker's programs serve them
                assert conn.programs.sent == programs
            np.testing.assert_array_equal(out, (2 * given + 1) * value)


async def test_submit_reading_declines_what_cannot_go_with_the_replay(
    workers: tuple[Worker, Worker],
) -> None:
    """None, submitting nothing, where the read cannot be an item of the replay's plan:
    a buffer that is (or overlaps) an input, inputs replanned for aliasing, a buffer of
    this host, a replay to be checked or profiled; the caller then submits and copies
    out on its own."""
    r = workers[0].name("CPU:0")
    out = np.empty(8, np.int32)
    with trio.fail_after(GUARD):
        async with runtime([r, "CPU:0"], verify_plans=True) as rt:
            a, b, tmp = (rt.alloc(r, 16, np.int32).view(0, 8) for _ in range(3))
            items = [ag.Launch(ADD, [tmp, a, b]), ag.Launch(ADD, [b, tmp, a])]
            graph = await rt.compile(items, inputs=[a, b], aliasing="replan")
            here = rt.alloc("CPU:0", 8, np.int32)
            conn = rt.device(r).connection
            batches = conn.batches_sent
            assert await graph.submit_reading([a, b], None, a, out) is None
            assert await graph.submit_reading([a, b], None, a.base.view(4, 8), out) is None
            assert await graph.submit_reading([a, a], None, tmp, out) is None  # replanned
            assert await graph.submit_reading([a, b], None, here, out) is None
            assert conn.batches_sent == batches
            await rt.copyin(a, np.arange(8, dtype=np.int32))
            await rt.copyin(b, np.full(8, 10, np.int32))
            replay = await graph.submit_reading([a, b], None, tmp, out)
            assert replay is not None
            await replay.wait()
            np.testing.assert_array_equal(out, np.arange(8) + 10)
        for options in ({"check_replays": 1}, {"profile": True}):
            async with runtime([r], **options) as rt:
                x = rt.alloc(r, 8, np.int32)
                graph = await rt.compile([ag.Launch(INC, [x, x])])
                assert await graph.submit_reading([], None, x, out) is None
                if options.get("check_replays"):
                    await graph()  # its one checked replay: then the read goes with one
                    replay = await graph.submit_reading([], None, x, out)
                    assert replay is not None
                    await replay.wait()
                    np.testing.assert_array_equal(out, np.full(8, 2))


async def test_the_programs_a_worker_keeps_are_bounded_and_a_forgotten_one_is_sent_again(
    ag_remote_runtime: ag.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_programs, "PROGRAM_CACHE", 2)
    rt = ag_remote_runtime
    r0, _ = rt.devices
    with trio.fail_after(GUARD):
        x = rt.alloc(r0, 16, np.int32)
        # Three graphs of one queue each, with op lists of their own: the worker keeps two.
        graphs = [await rt.compile([ag.Launch(INC, [x, x]) for _ in range(n)]) for n in (1, 2, 3)]
        programs = rt.device(r0).connection.programs
        for _ in range(4):
            for graph in graphs:
                await graph()
                assert len(programs) <= 2
        assert len(programs) == 2
        np.testing.assert_array_equal(await rt.copyout(x), np.full(16, 4 * (1 + 2 + 3)))


async def test_copies_to_and_from_a_buffer_are_defined_on_the_worker_once(
    ag_remote_runtime: ag.Runtime,
) -> None:
    """A copy into or out of a worker's buffer, done again and again, is a program the
    worker keeps from the first: each later one names it, with the bytes it
    sends or the read they go to, and lands or reads the buffer as it is then."""
    rt = ag_remote_runtime
    r0, _ = rt.devices
    with trio.fail_after(GUARD):
        x = rt.alloc(r0, 37, np.int32)  # an odd size
        y = rt.alloc(r0, 37, np.int32)
        conn = rt.device(r0).connection
        for k in range(12):
            if k == 2:
                sent = conn.statistics().programs_sent
            await rt.copyin(x, np.arange(37, dtype=np.int32) * k)
            np.testing.assert_array_equal(await rt.copyout(x), np.arange(37) * k)
            # In flight together: two copies in, three out, in the order submitted.
            writes = [await rt.submit_copyin(y, np.full(37, v, np.int32)) for v in (k, -k)]
            reads = [await rt.submit_copyout(b) for b in (x, y, x)]
            for copy in [*writes, *reads]:
                await copy.wait()
            for got, expected in zip(
                reads, (np.arange(37) * k, np.full(37, -k), np.arange(37) * k)
            ):
                np.testing.assert_array_equal(got.array, expected)
        assert conn.statistics().programs_sent == sent


async def test_copies_to_and_from_buffers_find_their_programs_without_writing_them(
    ag_remote_runtime: ag.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies in and out of two buffers of one size (one host program per direction
    there), again and again, find the worker's program for each buffer by what the copy
    before left, without writing it again; the program keeps none of the caller's
    arrays, and what each copy reads is the buffer as it is then."""
    rt = ag_remote_runtime
    r0, _ = rt.devices
    written: list[str] = []
    entries = remote_programs._Writer.entries

    def counting(self: Any, ops: Any) -> Any:
        written.extend(type(getattr(op, "entry", None)).__name__ for op in ops if op.code == 18)
        return entries(self, ops)

    monkeypatch.setattr(remote_programs._Writer, "entries", counting)
    with trio.fail_after(GUARD):
        x, y = rt.alloc(r0, 1000, np.float32), rt.alloc(r0, 1000, np.float32)
        for k in range(6):
            if k == 1:
                # One program written per buffer and direction, the first time.
                assert sorted(written) == ["HostReadEntry"] * 2 + ["HostWriteEntry"] * 2
                written.clear()
            for j, buf in enumerate((x, y)):
                data = np.full(1000, 10 * k + j, np.float32)
                gone = weakref.ref(data)
                await rt.copyin(buf, data)
                del data
                gc.collect()
                assert gone() is None  # not kept by the copy's program
                out = await rt.copyout(buf)
                np.testing.assert_array_equal(out, np.full(1000, 10 * k + j, np.float32))
                gone = weakref.ref(out)
                del out
                gc.collect()
                assert gone() is None
        assert written == []


async def test_a_graph_bound_again_to_inputs_it_had_runs_the_programs_the_worker_kept(
    ag_remote_runtime: ag.Runtime,
) -> None:
    """A graph called with more inputs in turn than it keeps bindings for binds each
    again: written as before, its programs are found kept on the worker, not sent."""
    rt = ag_remote_runtime
    r0, _ = rt.devices
    with trio.fail_after(GUARD):
        xs = [rt.alloc(r0, 16, np.int32) for _ in range(12)]
        out = rt.alloc(r0, 16, np.int32)
        graph = await rt.compile([ag.Launch(ADD, [out, xs[0], xs[0]])], inputs=[xs[0]])
        conn = rt.device(r0).connection
        for k, x in enumerate(xs):
            await rt.copyin(x, np.full(16, k, np.int32))
        for round in range(3):
            if round == 2:
                sent = conn.statistics().programs_sent
            for k, x in enumerate(xs):
                await graph([x])
                np.testing.assert_array_equal(await rt.copyout(out), np.full(16, 2 * k))
        assert conn.statistics().programs_sent == sent


async def test_a_graph_bound_to_inputs_it_had_finds_its_programs_without_writing_them(
    ag_remote_runtime: ag.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph bound anew to an input it had (more inputs in turn than it keeps bindings
    for) finds the worker's program for it by what changed from the binding before (the
    calls that name the input), without writing the program again to look it up; each
    call reads its own input, also once the worker forgot the programs of some."""
    rt = ag_remote_runtime
    r0, _ = rt.devices
    written: list[int] = []  # graph programs written (not the copyouts' one-op programs)
    entries = remote_programs._Writer.entries

    def counting(self: Any, ops: Any) -> Any:
        if any(type(getattr(op, "entry", None)).__name__ == "KernelEntry" for op in ops):
            written.append(len(ops))
        return entries(self, ops)

    monkeypatch.setattr(remote_programs._Writer, "entries", counting)
    with trio.fail_after(GUARD):
        xs = [rt.alloc(r0, 16, np.int32) for _ in range(12)]
        out, twice = rt.alloc(r0, 16, np.int32), rt.alloc(r0, 16, np.int32)
        graph = await rt.compile(
            [ag.Launch(ADD, [out, xs[0], xs[0]]), ag.Launch(ADD, [twice, out, xs[0]])],
            inputs=[xs[0]],
        )
        conn = rt.device(r0).connection
        for k, x in enumerate(xs):
            await rt.copyin(x, np.full(16, k, np.int32))
        for round in range(5):
            if round == 1:
                assert len(written) == len(xs)  # one program an input
                sent = conn.statistics().programs_sent
            if round == 2:
                # (Round 1's first call was bound from the last input's binding, where
                # round 0's first had none: found once by its entries, then by that.)
                written.clear()
            if round == 3:
                assert written == [] and conn.statistics().programs_sent == sent
                # Programs for new inputs push the others out of a cache of 3.
                monkeypatch.setattr(remote_programs, "PROGRAM_CACHE", 3)
                for k in range(len(xs), len(xs) + 4):
                    xs.append(rt.alloc(r0, 16, np.int32))
                    await rt.copyin(xs[k], np.full(16, k, np.int32))
            for k, x in enumerate(xs):
                await graph([x])
                np.testing.assert_array_equal(await rt.copyout(twice), np.full(16, 3 * k))
        # Forgotten by the worker, the programs were written and sent again: still right.
        assert written and conn.statistics().programs_sent > sent


async def test_a_chain_inside_one_worker_reports_only_its_ends(
    ag_remote_runtime: ag.Runtime,
) -> None:
    # Kernel, copy to the other device, kernel, copy back...: every step waits on another
    # queue, on the worker; the client hears of each queue once, at its end.
    rt = ag_remote_runtime
    r0, r1 = rt.devices
    with trio.fail_after(GUARD):
        xs = [rt.alloc(r0, 16, np.int32), rt.alloc(r1, 16, np.int32)]
        graph = await rt.compile(chain(INC, xs, 20))
        conn = rt.device(r0).connection
        await rt.copyin(xs[0], np.arange(16, dtype=np.int32))
        await graph()
        received = conn.frames_received
        await graph()
        assert len(graph.plan.queues) == 4  # the compute and the copy queue of each device
        assert conn.frames_received - received == 4
        np.testing.assert_array_equal(await rt.copyout(xs[0]), np.arange(16) + 40)


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


async def test_a_copy_to_a_worker_lands_before_another_worker_reads_it(
    workers: tuple[Worker, Worker],
) -> None:
    # The copy from this host to A is done here once its bytes are sent, and B reads them
    # from A over a link of its own, which can arrive first: B's read must wait until A
    # has taken what the client sent it before (the buffer's alloc, then its bytes).
    a_worker, b_worker = workers
    ra, rb = a_worker.name("CPU:0"), b_worker.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime(["CPU:0", ra, rb]) as rt:
            for k, n in enumerate([1 << 14] * 30 + [1 << 20] * 3):
                x = rt.alloc("CPU:0", n, np.int32)
                await rt.copyin(x, np.arange(n, dtype=np.int32) + k)
                y = rt.alloc(ra, n, np.int32)  # new each time: its alloc races the read too
                z = rt.alloc(rb, n, np.int32)
                graph = await rt.compile([ag.Copy(dst=y, src=x), ag.Copy(dst=z, src=y)])
                await graph()
                got = await rt.copyout(z)
                np.testing.assert_array_equal(got, np.arange(n) + k, err_msg=f"copy {k}")
                for buf in (x, y, z):
                    rt.free(buf)


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


# -- profiles: a worker's queues timed there, put on the client's clock --


def _assert_ordered_by_waits(profile: ag.Profile) -> int:
    """Every item starts after each item it waited for ended, within the two events'
    clock errors; returns how many such waits cross hosts."""
    by_item = {(e.graph, e.replay, e.item): e for e in profile.events}
    crossing = 0
    for event in profile.events:
        for wait in event.waits:
            if wait.kind is not ag.WaitKind.QUEUE or wait.item is None:
                continue
            source = by_item[(event.graph, event.replay, wait.item)]
            bound = event.clock_error + source.clock_error
            assert event.start >= source.end - bound, (source, event)
            crossing += _host(event.actor) != _host(source.actor)
    return crossing


def _host(actor: str) -> str:
    device = actor.split("/")[0]
    return device.partition("@")[2] or "client"


async def test_a_profiled_replay_shows_the_work_of_its_workers_in_order(
    workers: tuple[Worker, Worker],
) -> None:
    """A replay over this host and two workers, profiled: every remote queue that ran
    items has their events, on the client's clock; no item starts before one it waited
    for ended (within the clock errors the events state), across hosts too; the trace's
    flow arrows cross hosts and the summary counts the remote items."""
    a, b = workers
    a0, a1, b0 = a.name("CPU:0"), a.name("CPU:1"), b.name("CPU:0")
    devices = ["CPU:0", a0, a1, b0]
    with trio.fail_after(GUARD):
        async with runtime(devices) as rt:
            bufs = [rt.alloc(d, 64, np.int32) for d in devices]
            items: list[Any] = []
            for i, buf in enumerate(bufs):  # round the ring, back to CPU:0
                nxt = bufs[(i + 1) % len(bufs)]
                items += [ag.Launch(INC, [buf, buf]), ag.Copy(dst=nxt, src=buf)]
            graph = await rt.compile(items)
            await rt.copyin(bufs[0], np.zeros(64, np.int32))
            await graph()  # not profiled: not in the profile
            for _ in range(8):
                await graph(profile=True)
            np.testing.assert_array_equal(await rt.copyout(bufs[0]), np.full(64, 36))
            profile = rt.profile()
            trace = profile.to_chrome_trace()
            summary = profile.summary()
    assert len(profile.replays) == 8
    assert len(profile.events) == 8 * len(items)
    ran = {e.actor for e in profile.events}
    assert {f"{d}/compute" for d in devices} <= ran
    assert {f"{d}/copy" for d in (a1, b0)} <= ran  # copies into a worker device from another
    for event in profile.events:
        remote = "@" in event.actor
        assert (event.clock_error > 0) == remote, event
        assert event.clock_error < 0.5  # a bound measured on loopback, not a guess
        assert event.end >= event.start
    assert _assert_ordered_by_waits(profile) >= 8 * 3  # CPU:0 -> A, A -> B, B -> CPU:0
    # Each replay's critical path runs through the workers' queues.
    path_actors = {e.actor for e in profile.critical_path()}
    assert {f"{a0}/compute", f"{b0}/compute"} <= path_actors
    # The trace: a process per device, worker devices included, and arrows between hosts.
    pids = {
        e["pid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    starts = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "s"}
    hosts_crossed = {
        (_host(pids[starts[e["id"]]["pid"]]), _host(pids[e["pid"]]))
        for e in trace["traceEvents"]
        if e["ph"] == "f"
    }
    here, at_a, at_b = "client", _host(a0), _host(b0)
    assert {(here, at_a), (at_a, at_b), (at_b, here)} <= hosts_crossed
    errors = trace["otherData"]["clock_error_us"]
    assert set(errors) == {a for a in ran if "@" in a}
    remote_slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and "@" in pids[e["pid"]]]
    assert remote_slices and all(e["args"]["clock_error_us"] > 0 for e in remote_slices)
    # The summary counts the workers' items, and says how far off their clocks may be.
    lines = {line.split()[0]: line for line in summary.splitlines()[1:-1]}
    assert " 8 items" in lines[f"{a0}/compute"] and "clock +-" in lines[f"{a0}/compute"]
    assert " 8 items" in lines[f"{b0}/copy"] and "clock +-" in lines[f"{b0}/copy"]
    assert "clock +-" not in lines["CPU:0/compute"]


async def test_a_workers_queue_with_a_clock_of_its_own_is_put_on_the_clients_clock() -> None:
    # A SIM queue's actor times with trio's clock: the worker puts its times on its
    # perf_counter before they go, so they order with the client's like a CPU queue's.
    worker = start("SIM:0")
    try:
        name = worker.name("SIM:0")
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", name]) as rt:
                x, y = rt.alloc("CPU:0", 8, np.int32), rt.alloc(name, 8, np.int32)
                items = [ag.Copy(dst=y, src=x), ag.Launch(INC, [y, y]), ag.Copy(dst=x, src=y)]
                graph = await rt.compile(items)
                for _ in range(3):
                    await graph(profile=True)
                profile = rt.profile()
                np.testing.assert_array_equal(await rt.copyout(x), np.full(8, 3))
    finally:
        worker.kill()
    assert [e.actor for e in profile.events if "@" in e.actor] == [f"{name}/compute"] * 3
    assert _assert_ordered_by_waits(profile) == 3 * 2  # there and back, each replay


async def test_submissions_after_one_another_on_a_worker_need_no_word_from_the_client(
    workers: tuple[Worker, Worker],
) -> None:
    """A device's next submission starts once its last one is done. On a worker, where
    only the worker's own jobs of that submission touch the device, the worker moves its
    mirror of the device's timeline itself, so the next one goes on without the client
    forwarding it (a round trip each); one that a queue off the worker touched (a copy
    to another worker) still waits for the client's word. Held and released, the whole
    chain is one message to each worker, and nothing more goes out until it is done."""
    a, b = workers
    a0, a1, b0 = a.name("CPU:0"), a.name("CPU:1"), b.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([a0, a1, b0]) as rt:
            x0, x1 = rt.alloc(a0, 16, np.int32), rt.alloc(a1, 16, np.int32)
            y0 = rt.alloc(b0, 16, np.int32)
            await rt.copyin(x0, np.arange(16, dtype=np.int32))
            connections = [rt.device(a0).connection, rt.device(b0).connection]
            sent = [c.statistics().messages_sent for c in connections]
            fanout = await rt.compile([ag.Copy(dst=y0, src=x0), ag.Copy(dst=x1, src=x0)])
            back = await rt.compile([ag.Launch(INC, [x1, x1]), ag.Copy(dst=x0, src=x1)])
            for connection in connections:
                connection.hold_sends()
            chain = [await fanout.submit()]  # touches x0 from A and from B
            chain.append(await rt.submit_copyin(x0, np.full(16, 7, np.int32)))
            chain.append(await rt.submit_copyin(x1, np.full(16, 5, np.int32)))
            chain.append(await back.submit())
            chain.append(await rt.submit_copyout(x1))
            chain.append(await rt.submit_copyout(y0))
            for connection in connections:
                connection.release_sends()
            for step in chain:
                await step.wait()
            np.testing.assert_array_equal(chain[-2].array, np.full(16, 6))
            np.testing.assert_array_equal(chain[-1].array, np.arange(16))
            np.testing.assert_array_equal(await rt.copyout(x0), np.full(16, 6))
            # The chain was one message to each worker; the client forwarded only x0's
            # move after the fan-out (B's copy read x0), then came the last copyout.
            got = [c.statistics().messages_sent - n for c, n in zip(connections, sent)]
            assert got == [1 + 1 + 1, 1], got


async def test_only_a_profiled_replay_has_its_worker_send_times(
    workers: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unprofiled replay's batch does not ask for times and its worker sends none; a profiled one asks (profile: true),
    and each of its jobs' times come back before the job's done."""
    batches: list[list[Any]] = []
    received: list[str] = []
    real_encode = remote_connection.encode
    real_handlers = remote_connection.Connection.handlers

    def encode_spy(message: Any, tail_len: int = 0) -> bytes:
        if type(message) is Batch:
            batches.append(as_meta(message))
        return real_encode(message, tail_len)

    def spied(handler: Any) -> Any:
        async def spy(message: Any, tail: int) -> None:
            received.append(type(message).__name__)
            await handler(message, tail)

        return spy

    def handlers_spy(self: Any) -> dict[type, Any]:
        return {kind: spied(handler) for kind, handler in real_handlers(self).items()}

    monkeypatch.setattr(remote_connection, "encode", encode_spy)
    monkeypatch.setattr(remote_connection.Connection, "handlers", handlers_spy)
    name = workers[0].name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([name]) as rt:
            x = rt.alloc(name, 8, np.int32)
            graph = await rt.compile([ag.Launch(INC, [x, x])])  # lives on the worker alone
            for _ in range(3):
                await graph()
            # Not profiled (its profile field, when a later field is sent, is false).
            assert [meta[5] if len(meta) > 5 else False for meta in batches] == [False] * 3
            assert "JobTimes" not in received and "Pong" not in received
            assert len(rt.profile().replays) == 0
            del batches[:], received[:]
            await graph(profile=True)
            assert [meta[5] for meta in batches] == [True]
            assert received.index("JobTimes") < received.index("Done")
            profile = graph.last_profile
            assert profile is not None
            (event,) = profile.events
            assert event.actor == f"{name}/compute" and event.clock_error > 0
            del batches[:], received[:]
            await graph()
            assert [meta[5] if len(meta) > 5 else False for meta in batches] == [False]
            assert "JobTimes" not in received
            np.testing.assert_array_equal(await rt.copyout(x), np.full(8, 5))
            assert rt.device(name).connection.statistics().clock_error is not None


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


async def test_bulk_data_goes_in_frames_the_worker_accepts(workers: tuple[Worker, Worker]) -> None:
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


@pytest.mark.parametrize("profiled", [False, True], ids=["plain", "profiled"])
@pytest.mark.parametrize("hops", [2, 3])
async def test_chains_across_workers_equal_numpy(
    workers: tuple[Worker, Worker], hops: int, profiled: bool
) -> None:
    # A kernel on each device, then a copy to the next, round a ring of `hops` workers and
    # the local CPU device: every dependency but one (between two devices of one worker)
    # crosses a host. Copies between a worker's devices or two workers run on the
    # destination's copy queue, those to or from the local device on its copy queue.
    a_worker, b_worker = workers
    extra = start("CPU:0") if hops == 3 else None
    try:
        names = [a_worker.name("CPU:0"), a_worker.name("CPU:1"), b_worker.name("CPU:0")]
        if extra is not None:
            names.append(extra.name("CPU:0"))
        ring = ["CPU:0", *names]
        with trio.fail_after(GUARD):
            async with runtime(ring, verify_plans=True) as rt:
                bufs = [rt.alloc(d, 64, np.int32) for d in ring]
                keys = [rt.alloc(d, 64, np.int32) for d in ring]
                items: list[Any] = []
                for step in range(2 * len(ring)):
                    i, j = step % len(ring), (step + 1) % len(ring)
                    items += [
                        ag.Launch(XOR, [bufs[i], bufs[i], keys[i]]),
                        ag.Copy(dst=bufs[j], src=bufs[i]),
                    ]
                graph = await rt.compile(items)
                plan = graph.plan
                for j, item in enumerate(items):
                    queue = plan.queues[plan.item_queue[j]]
                    if isinstance(item, ag.Launch):
                        assert queue == QueueId(item.bufs[0].device, QueueKind.COMPUTE)
                    else:
                        local = "CPU:0" in (item.src.device, item.dst.device)
                        assert queue == QueueId(
                            "CPU:0" if local else item.dst.device, QueueKind.COPY
                        )
                rng = np.random.default_rng(hops)
                key_values = [rng.integers(0, 1 << 30, 64, dtype=np.int32) for _ in ring]
                for key, value in zip(keys, key_values):
                    await rt.copyin(key, value)
                start_value = rng.integers(0, 1 << 30, 64, dtype=np.int32)
                await rt.copyin(bufs[0], start_value)
                model = start_value.copy()
                for _ in range(3):
                    await graph(profile=profiled)
                    for step in range(2 * len(ring)):
                        model = model ^ key_values[step % len(ring)]
                    np.testing.assert_array_equal(await rt.copyout(bufs[0]), model)
                if profiled:
                    profile = graph.last_profile
                    assert profile is not None
                    # Every copy queue that ran a copy shows it: the local one's pushes and
                    # pulls, and the copies into each worker device the ring reaches from
                    # another worker device (timed on its worker).
                    copies = {e.actor for e in profile.events if e.kind is ag.EventKind.COPY}
                    assert copies == {f"{d}/copy" for d in ["CPU:0", *ring[2:]]}
                    assert len(profile.events) == len(items)
    finally:
        if extra is not None:
            extra.kill()


async def test_waits_between_workers_travel_between_the_workers(
    workers: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client never forwards a signal here: each copy from worker to worker still runs
    # as soon as its source is ready, because the source's worker sends the bytes (and
    # with them the news) to the destination's worker directly.
    async def no_forwarding(*args: Any) -> None:
        pass

    monkeypatch.setattr(remote_connection.Connection, "_forward", no_forwarding)
    a_worker, b_worker = workers
    ra, rb = a_worker.name("CPU:0"), b_worker.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([ra, rb]) as rt:
            xs = [rt.alloc(ra, 64, np.int32), rt.alloc(rb, 64, np.int32)]
            graph = await rt.compile(chain(INC, xs, 6))
            await rt.copyin(xs[0], np.arange(64, dtype=np.int32))
            for n in range(1, 4):
                await graph()
                np.testing.assert_array_equal(await rt.copyout(xs[0]), np.arange(64) + 6 * n)


async def test_a_copy_between_workers_after_a_copy_waits_on_the_source_copy_queue(
    workers: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A -> A' -> B -> A' -> A, copies only: each copy between workers follows a copy on
    # the source's copy queue, and B's worker hears of it from A's, by that queue's name
    # (DEVICE/copy), with the client forwarding nothing.
    async def no_forwarding(*args: Any) -> None:
        pass

    monkeypatch.setattr(remote_connection.Connection, "_forward", no_forwarding)
    a_worker, b_worker = workers
    ra, ra1, rb = a_worker.name("CPU:0"), a_worker.name("CPU:1"), b_worker.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([ra, ra1, rb], verify_plans=True) as rt:
            x, y, z = (
                rt.alloc(ra, 64, np.int32),
                rt.alloc(ra1, 64, np.int32),
                rt.alloc(rb, 64, np.int32),
            )
            items = [
                ag.Copy(dst=y, src=x),
                ag.Copy(dst=z, src=y),
                ag.Launch(INC, [z, z]),
                ag.Copy(dst=y, src=z),
                ag.Copy(dst=x, src=y),
            ]
            graph = await rt.compile(items)
            plan = graph.plan
            assert [str(plan.queues[q]) for q in plan.item_queue] == [
                f"{ra1}/copy",
                f"{rb}/copy",
                f"{rb}/compute",
                f"{ra1}/copy",
                f"{ra}/copy",
            ]
            await rt.copyin(x, np.arange(64, dtype=np.int32))
            for n in range(1, 4):
                await graph()
                np.testing.assert_array_equal(await rt.copyout(x), np.arange(64) + n)


async def _told_when(port: int, conn: Any, queue: str, value: int) -> None:
    """Return once the worker at `port` says `conn`'s queue `queue` reached `value`: over
    a worker-to-worker link, as a worker waiting on that queue asks."""
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    stream = FrameStream(sock, Limits())
    assert (await handshake(stream, "peer"))[0] == "welcome"
    await stream.send(
        [encode(["pwatch", 1, conn.session_id, queue, value, conn.watch_ticket(queue)])]
    )
    assert await stream.receive() == (["data", 1, 0, None], 0)
    stream.sock.close()


async def test_a_copy_between_workers_is_read_ahead_only_after_its_own_wait(
    gate: Path, monkeypatch: pytest.MonkeyPatch, workers: tuple[Worker, Worker]
) -> None:
    # B copies A0's x twice: first before a gated kernel rewrites x, then after. The
    # second copy's need for that kernel is known through A1 (it follows a copy from A1
    # that waited on it), yet the plan keeps its own wait on it, since the copy's bytes
    # are asked for ahead on its own wait: on the kernel's, not on the first copy's,
    # which A0 passes before the kernel runs (that read would send x as it was).
    ahead: list[list[Any]] = []
    with_source_wait = remote_programs._with_source_wait

    def spy(entry: Any, waits: Any) -> Any:
        out = with_source_wait(entry, waits)
        if out is not entry:
            ahead.append(out)
        return out

    monkeypatch.setattr(remote_programs, "_with_source_wait", spy)
    a_worker = start("CPU:0,CPU:1", extra_args=("--thread-bytes", "0"))
    _, b_worker = workers
    ra, ra1, rb = a_worker.name("CPU:0"), a_worker.name("CPU:1"), b_worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime([ra, ra1, rb], verify_plans=True) as rt:
                x0, x, y = (rt.alloc(ra, 16, np.int32) for _ in range(3))
                z = rt.alloc(ra1, 16, np.int32)
                u, w, v = (rt.alloc(rb, 16, np.int32) for _ in range(3))
                await rt.copyin(x, np.full(16, 1, np.int32))
                await rt.copyin(y, np.full(16, 7, np.int32))
                graph = await rt.compile(
                    [
                        ag.Launch(INC, [x0, x0]),
                        ag.Copy(dst=u, src=x0),
                        ag.Launch(GATED, [x, y]),
                        ag.Copy(dst=z, src=x),
                        ag.Copy(dst=w, src=z),
                        ag.Copy(dst=v, src=x),
                    ]
                )
                compute = rt.device(ra).queues[QueueKind.COMPUTE]
                inc_done = compute.next_value + 1
                replay = await graph.submit()
                # Each copy into B is asked for ahead, the second from A0 after the kernel:
                # on A0's compute queue reaching 2 (the base slot, the value, the mirror).
                assert [entry.item for entry in ahead] == [1, 4, 5]
                assert [entry.follows[1] for entry in ahead] == [1, 1, 2]
                # Only B waits on A0's queue: A0's worker tells B, not the client. Ask it
                # as B does, to know that INC is done.
                await _told_when(a_worker.port, rt.device(ra).connection, "CPU:0", inc_done)
                await trio.testing.wait_all_tasks_blocked()
                gate.touch()
                await replay.wait()
                np.testing.assert_array_equal(await rt.copyout(v), np.full(16, 7))
                np.testing.assert_array_equal(await rt.copyout(w), np.full(16, 7))
                np.testing.assert_array_equal(await rt.copyout(u), np.ones(16))
    finally:
        a_worker.kill()


async def test_a_copy_from_a_worker_written_by_both_its_queues_is_read_when_it_runs(
    workers: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # x on A0 is written half by a kernel (A0's compute queue), half by a copy from A1
    # (A0's copy queue); the copy of x to the local device waits on both, and neither
    # alone says x is ready: it is not asked for ahead on one of them. y, written by the
    # kernel only, is.
    ahead: list[int] = []

    class Spy(remote_programs.LocalPlan):
        def __init__(self, conn: Any, ops: Any) -> None:
            super().__init__(conn, ops)
            ahead.extend(int(ref[0]) for ref, *_ in self.pulls)

    monkeypatch.setattr(remote_programs, "LocalPlan", Spy)
    a_worker, _ = workers
    ra, ra1 = a_worker.name("CPU:0"), a_worker.name("CPU:1")
    with trio.fail_after(GUARD):
        async with runtime(["CPU:0", ra, ra1], verify_plans=True) as rt:
            x, y = rt.alloc(ra, 16, np.int32), rt.alloc(ra, 16, np.int32)
            z = rt.alloc(ra1, 8, np.int32)
            out_x, out_y = rt.alloc("CPU:0", 16, np.int32), rt.alloc("CPU:0", 16, np.int32)
            await rt.copyin(x, np.arange(16, dtype=np.int32))
            await rt.copyin(z, np.full(8, 50, np.int32))
            graph = await rt.compile(
                [
                    ag.Launch(INC, [x.view(offset=0, size=8), x.view(offset=0, size=8)]),
                    ag.Copy(dst=x.view(offset=8, size=8), src=z),
                    ag.Launch(INC, [y, y]),
                    ag.Copy(dst=out_x, src=x),
                    ag.Copy(dst=out_y, src=y),
                ]
            )
            for n in range(1, 3):
                await graph()
                want_x = np.concatenate([np.arange(8) + n, np.full(8, 50)])
                np.testing.assert_array_equal(await rt.copyout(out_x), want_x)
                np.testing.assert_array_equal(await rt.copyout(out_y), np.full(16, n))
            assert ahead and set(ahead) == {y.memory.handle}


async def test_copies_on_a_worker_overlap_its_compute(
    gate: Path, workers: tuple[Worker, Worker]
) -> None:
    # A kernel on A's CPU:0 runs until the test opens its gate; meanwhile copies into that
    # device, from A's other device and from worker B, run on its copy queue (this
    # client's copy actor on A) and end. Were they on the compute queue, behind the
    # kernel, the wait for them would never return and the guard would fail the test.
    # Kernels on their actor's thread: the gated one holds only its own queue.
    a_worker = start("CPU:0,CPU:1", extra_args=("--thread-bytes", "0"))
    _, b_worker = workers
    ra, ra1, rb = a_worker.name("CPU:0"), a_worker.name("CPU:1"), b_worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", ra, ra1, rb], verify_plans=True) as rt:
                held, near, far = (rt.alloc(ra, 16, np.int32) for _ in range(3))
                from_a1, from_b = rt.alloc(ra1, 16, np.int32), rt.alloc(rb, 16, np.int32)
                await rt.copyin(held, np.arange(16, dtype=np.int32))
                await rt.copyin(from_a1, np.full(16, 5, np.int32))
                await rt.copyin(from_b, np.full(16, 9, np.int32))
                graph = await rt.compile(
                    [
                        ag.Launch(GATED, [held, held]),
                        ag.Copy(dst=near, src=from_a1),
                        ag.Copy(dst=far, src=from_b),
                        ag.Launch(INC, [held, held]),
                    ]
                )
                copy_queue = rt.device(ra).queues[QueueKind.COPY]
                assert graph.plan.item_queue[1] == graph.plan.item_queue[2]
                assert graph.plan.queues[graph.plan.item_queue[1]] == QueueId(ra, QueueKind.COPY)
                replay = await graph.submit()
                assert copy_queue.busy
                while copy_queue.busy:  # its job ends with its "done", the kernel still held
                    await copy_queue.signal.wait_value(copy_queue.signal.value + 1)
                assert not replay.done and rt.device(ra).queues[QueueKind.COMPUTE].busy
                assert not gate.exists()
                gate.touch()
                await replay.wait()
                np.testing.assert_array_equal(await rt.copyout(near), np.full(16, 5))
                np.testing.assert_array_equal(await rt.copyout(far), np.full(16, 9))
                np.testing.assert_array_equal(await rt.copyout(held), np.arange(16) + 1)
    finally:
        a_worker.kill()


async def test_copies_from_a_worker_are_asked_for_ahead(
    workers: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A chain between the local device and a worker: each copy back from the worker
    # follows a wait on the worker's queue, so the client asks for its bytes when the job
    # begins and reads none when the copy runs; the results still equal numpy.
    name = workers[0].name("CPU:0")
    sent = _record_sent(monkeypatch)
    with trio.fail_after(GUARD):
        async with runtime(["CPU:0", name], verify_plans=True) as rt:
            xs = [rt.alloc("CPU:0", 32, np.int32), rt.alloc(name, 32, np.int32)]
            graph = await rt.compile(chain(INC, xs, 8))

            def none_asked_as_it_ran() -> None:
                assert _count(sent, Get) == 0  # no copy's bytes asked for as it runs

            await replay_chain_rounds(rt, graph, xs[0], 8, 3, 5, sent.clear, none_asked_as_it_ran)


async def test_a_job_asks_for_its_copies_ahead_once_whatever_follows_them(
    workers: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The local copy queue's job pushes, pulls (asked for ahead), then pushes again: the
    # last push must not ask for the pulled bytes a second time. Asked again, they would
    # come to staging nobody takes, kept with the job for as long as the connection
    # lives, and count against the bytes a connection asks for ahead until it asks for
    # none. Every replay ends with nothing kept, also where a transfer is tried twice
    # (one of a long run done at once is left to its actor, which tries it again): and
    # each transfer goes once, its bytes asked for ahead, none read as it runs.
    name = workers[0].name("CPU:0")
    sent = _record_sent(monkeypatch)
    with trio.fail_after(GUARD):
        async with runtime(["CPU:0", name], verify_plans=True) as rt:
            here, there = rt.alloc("CPU:0", 64, np.int32), rt.alloc(name, 64, np.int32)
            graph = await rt.compile(chain(INC, [here, there], 3))  # push, pull, push
            ahead = rt.device(name).connection.ahead
            start_value = np.arange(64, dtype=np.int32)
            await rt.copyin(here, start_value)
            for n in range(1, 2 * remote_connection._EAGER_MAX // 3 + 2):
                del sent[:]
                await graph()
                assert (ahead.bytes, ahead.jobs) == (0, 0)
                assert (_count(sent, Put), _count(sent, Get)) == (2, 0)
                np.testing.assert_array_equal(await rt.copyout(there), start_value + 3 * n)


async def test_a_long_run_of_copies_to_a_worker_lets_other_tasks_run(
    workers: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 200 copies to a worker in a row on one local queue, each sent at once: another
    # task still runs between every _EAGER_MAX of them. (It looks between its own
    # steps, and trio runs the tasks of one pass in a random order: two runs of
    # _EAGER_MAX may fall between two of its looks.)
    name = workers[0].name("CPU:0")
    sent = _record_sent(monkeypatch)
    with trio.fail_after(GUARD):
        async with runtime(["CPU:0", name]) as rt:
            here = rt.alloc("CPU:0", 200, np.int32)
            there = rt.alloc(name, 200, np.int32)
            graph = await rt.compile(
                [
                    ag.Copy(dst=there.view(offset=i, size=1), src=here.view(offset=i, size=1))
                    for i in range(200)
                ]
            )
            await graph()
            seen: list[int] = []
            done = False

            async def other_task() -> None:
                while not done:
                    seen.append(_count(sent, Put))
                    await trio.lowlevel.checkpoint()

            await rt.copyin(here, np.arange(200, dtype=np.int32))
            del sent[:]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(other_task)
                while not seen:
                    await trio.lowlevel.checkpoint()
                await graph()
                done = True
            seen.append(_count(sent, Put))
            runs = [b - a for a, b in zip(seen, seen[1:])]
            assert sum(runs) == 200 and max(runs) <= 2 * remote_connection._EAGER_MAX
            np.testing.assert_array_equal(await rt.copyout(there), np.arange(200))


async def test_a_local_item_failing_before_a_push_lets_the_worker_go_on(
    workers: tuple[Worker, Worker],
) -> None:
    # The worker's kernel waits for the local copy queue's push; the push carries that
    # wait's value with its bytes. A failed local item skips the push's transfer: the
    # value then goes from the local queue's signal as it moves, and nothing hangs.
    name = workers[0].name("CPU:0")
    failing = [True]

    def maybe_fail(out: Any, a: Any) -> None:
        if failing[0]:
            raise ValueError("failed on purpose")
        np.add(a, 1, out=out)

    flaky = ag.Kernel("flaky", cpu=maybe_fail, outs=(0,), ins=(1,))
    with trio.fail_after(GUARD):
        async with runtime(["CPU:0", name], verify_plans=True) as rt:
            here, there = rt.alloc("CPU:0", 16, np.int32), rt.alloc(name, 16, np.int32)
            graph = await rt.compile(
                [
                    ag.Launch(flaky, [here, here]),
                    ag.Copy(dst=there, src=here),
                    ag.Launch(INC, [there, there]),
                    ag.Copy(dst=here, src=there),
                ]
            )
            await rt.copyin(here, np.arange(16, dtype=np.int32))
            for _ in range(2):
                with pytest.raises(ag.ItemError, match=r"item 0 \(flaky\).*failed on purpose"):
                    await graph()
            failing[0] = False
            await graph()
            np.testing.assert_array_equal(await rt.copyout(here), np.arange(16) + 2)


async def test_a_chain_between_two_workers_reports_only_its_ends(
    workers: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kernel on A, copy to B, kernel on B, copy back...: each copy waits for the other
    # worker's kernel, and each kernel for the other worker's copy to have read its
    # buffer (a wait with no bytes). The workers tell each other; the client hears of
    # each queue once, at its end, and forwards nothing: it watches a batch's waits
    # between workers with one task, which hands none over to a forwarder of its own.
    from actorgraph.devices.remote import Connection

    forwarded: list[int] = []
    forward = Connection._forward

    async def spy(self: Any, signal: Any, target: int, ext_id: int, direct: Any) -> None:
        forwarded.append(ext_id)
        await forward(self, signal, target, ext_id, direct)

    monkeypatch.setattr(Connection, "_forward", spy)
    a, b = workers[0].name("CPU:0"), workers[1].name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([a, b], verify_plans=True) as rt:
            xs = [rt.alloc(a, 16, np.int32), rt.alloc(b, 16, np.int32)]
            graph = await rt.compile(chain(INC, xs, 12))
            conns = [rt.device(a).connection, rt.device(b).connection]
            start_value = np.arange(16, dtype=np.int32)
            for replay in range(3):
                await rt.copyin(xs[0], start_value + replay)
                received = [c.frames_received for c in conns]
                await graph()
                # The compute and the copy queue of each worker: one "done" each.
                assert [c.frames_received - r for c, r in zip(conns, received)] == [2, 2]
                np.testing.assert_array_equal(await rt.copyout(xs[0]), start_value + replay + 12)
                await trio.testing.wait_all_tasks_blocked()
            assert forwarded == []


async def test_a_round_trip_to_a_worker_is_measured_with_a_ping(
    workers: tuple[Worker, Worker],
) -> None:
    name = workers[0].name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([name]) as rt:
            connection = rt.device(name).connection
            seconds = [await connection.round_trip() for _ in range(3)]
            assert all(0 < s < GUARD for s in seconds)
            connection.close()
            with pytest.raises(remote.RemoteConnectionError, match="was closed"):
                await connection.round_trip()
