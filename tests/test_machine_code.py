"""Shipped programs on a worker (`--allow-programs`, actorgraph/worker/_machine_code.py and
devices/remote/machine.py): compiled C shipped once per content hash and called by id,
kept per session, bounded, refused without the flag or for a CPU the worker cannot run,
and a worker that a shipped program crashes fails its clients' calls, naming it.

The programs are compiled here with clang, as tinygrad's CPU compiler compiles its
kernels (a relocatable ELF object); real workers run them in subprocesses on loopback.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import trio
from _workers import GUARD, TOKEN, handshake
from actorgraph.devices.remote.frames import FrameStream, encode
from actorgraph.devices.remote.wire import (
    Batch,
    CodeEntry,
    Limits,
    SignalEntry,
    as_meta,
    decode,
)

import actorgraph as ag
from actorgraph.remote import MachineCode, WorkerCPU
from actorgraph.testing import Worker, start_worker
from actorgraph.worker._machine_code import loader_problem

if shutil.which("clang") is None:
    pytest.skip(
        "clang is not installed: the test programs are compiled with it", allow_module_level=True
    )
if loader_problem() is not None:
    pytest.skip(
        f"this machine cannot load shipped programs ({loader_problem()}): "
        f'pip install -e ".[test,tinygrad]"',
        allow_module_level=True,
    )

HOST = WorkerCPU.of_this_host(programs=True)
_TARGETS = {"x86_64": "x86_64", "arm64": "aarch64"}
if HOST.machine not in _TARGETS:
    pytest.skip(f"no test programs for a {HOST.machine} host", allow_module_level=True)

ADD = r"""
void add_k(float *restrict out, const float *restrict a, const float *restrict b,
           unsigned long n, unsigned long core) {
  for (unsigned long i = core * n; i < (core + 1) * n; i++) out[i] = a[i] + b[i] * 2.0f;
}
"""
CRASH = r"""
void crash_k(float *out) { *(volatile float *)0 = out[0]; }
"""


def _compile(source: str, machine: str = HOST.machine) -> bytes:
    """What tinygrad's CPU compiler makes of `source`: a relocatable ELF object."""
    target = _TARGETS[machine]
    command = ["clang", "-c", "-x", "c", "-O2", "-fPIC", "-ffreestanding", "-nostdlib"]
    command += ["-fno-ident", f"--target={target}-none-unknown-elf", "-", "-o", "-"]
    return subprocess.run(command, input=source.encode(), capture_output=True, check=True).stdout


def _add_kernel(**options: Any) -> ag.Kernel:
    code = MachineCode("add_k", _compile(ADD), HOST.machine, buffers=3, values=2, core_id=1)
    return ag.Kernel("add_k", code=code, outs=(0,), ins=(1, 2), **options)


N = ag.Var("n", 0, 1 << 20)


def _program_worker(*extra: str) -> Worker:
    return start_worker(["CPU:0", "CPU:1"], token=TOKEN, extra_args=["--allow-programs", *extra])


async def _run_add(rt: Any, kernel: ag.Kernel, device: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(64, dtype=np.float32) for _ in range(2))
    bufs = [rt.alloc(device, 64, np.float32) for _ in range(3)]
    await rt.copyin(bufs[1], a)
    await rt.copyin(bufs[2], b)
    # 4 cores of 16 elements each: the function is called once per core.
    launch = ag.Launch(kernel, bufs, vars=[N], global_size=(4, 1, 1))
    await rt.run([launch], {N: 16})
    got = await rt.copyout(bufs[0])
    np.testing.assert_array_equal(got, a + b * np.float32(2))


@pytest.fixture(scope="module")
def program_worker() -> Any:
    worker = _program_worker()
    yield worker
    worker.kill()


async def test_a_shipped_program_runs_once_per_core_and_ships_once(program_worker: Worker) -> None:
    kernel = _add_kernel()
    same_bytes = ag.Kernel("again", code=kernel.code, outs=(0,), ins=(1, 2))
    with trio.fail_after(GUARD):
        async with ag.open_runtime(program_worker.devices, remote_token=TOKEN) as rt:
            for seed, device in enumerate(program_worker.devices):
                await _run_add(rt, kernel, device, seed)
                await _run_add(rt, same_bytes, device, seed + 10)
            stats = rt.device(program_worker.devices[0]).connection.statistics()
            # Four launches on two devices of one worker, two kernels of one content.
            assert stats.programs_shipped == 1
            assert stats.worker_cpu == HOST


async def test_a_worker_without_allow_programs_refuses_them_naming_the_flag(
    ag_worker: Any,
) -> None:
    device = ag_worker.devices[0]
    with trio.fail_after(GUARD):
        async with ag.open_runtime([device], remote_token=ag_worker.token) as rt:
            bufs = [rt.alloc(device, 64, np.float32) for _ in range(3)]
            with pytest.raises(
                ag.DeviceError,
                match=re.escape(
                    f"worker {ag_worker.name('')[1:]} (of {device}) does not run shipped "
                    f"programs; start it with `actorgraph worker --allow-programs ...` to run "
                    f"program 'add_k' there"
                ),
            ):
                await rt.run([ag.Launch(_add_kernel(), bufs, vars=[N])], {N: 16})
    # The worker refuses them itself too, whatever a client says.
    with trio.fail_after(GUARD):
        stream = await _session(ag_worker.port, ag_worker.token)
        await _send_code(stream, 7, _compile(ADD))
        meta, _ = await stream.receive()
        assert meta[:3] == ["error", "code", 7], meta
        assert (
            "does not run shipped programs; start it with `actorgraph worker --allow-programs"
            in meta[3]
        )


async def _session(port: int, token: bytes = TOKEN) -> FrameStream:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    stream = FrameStream(sock, Limits())
    welcome = await handshake(stream, "client", ["CPU:0"], token)
    assert welcome[0] == "welcome", welcome
    return stream


async def _send_code(
    stream: FrameStream,
    code_id: int,
    image: bytes,
    machine: str = HOST.machine,
    features: tuple[str, ...] = (),
    digest: bytes | None = None,
    name: str = "add_k",
) -> None:
    import hashlib

    digest = hashlib.sha256(image).digest() if digest is None else digest
    message = ["code", code_id, digest, name, machine, list(features), 3, 2, 1]
    await stream.send([encode(message, len(image)), image])


def test_a_machine_code_with_a_core_id_outside_its_values_is_refused() -> None:
    with pytest.raises(ValueError, match="core_id 2 is not one of its 2 values"):
        MachineCode("k", b"x", "x86_64", buffers=1, values=2, core_id=2)
    with pytest.raises(ag.UsageError, match="code= takes an ag.remote.MachineCode"):
        ag.Kernel("k", code=b"bytes", outs=(0,))  # type: ignore[arg-type]


async def _reply(stream: FrameStream) -> list[Any]:
    meta, tail = await stream.receive()
    assert not tail
    return meta  # type: ignore[no-any-return]


async def _call(stream: FrameStream, prog_id: int, code_id: int) -> list[Any]:
    """Allocate three buffers, call program `code_id` on them: the batch's report."""
    for handle in (1, 2, 3):
        await stream.send([encode(["alloc", prog_id * 10 + handle, "CPU:0", 64, "<f4"])])
    refs = [[prog_id * 10 + handle, 0, []] for handle in (1, 2, 3)]
    entries = [
        as_meta(CodeEntry(0, code_id, refs, [4, 1, 1], [1, 1, 1])),
        as_meta(SignalEntry(2, 1)),
    ]
    await stream.send([encode(["prog", prog_id, "CPU:0", entries, False])])
    batch = Batch(prog_id, [0, 0, 0], [prog_id], [], values=[[16]])  # the call's n
    await stream.send([encode(as_meta(batch))])
    return await _reply(stream)


async def test_a_programs_var_values_come_with_each_batch(program_worker: Worker) -> None:
    image = _compile(ADD)
    with trio.fail_after(GUARD):
        stream = await _session(program_worker.port)
        await _send_code(stream, 5, image)
        for handle in (1, 2, 3):
            await stream.send([encode(["alloc", handle, "CPU:0", 64, "<f4"])])
        refs = [[handle, 0, []] for handle in (1, 2, 3)]
        entries = [
            as_meta(CodeEntry(0, 5, refs, [4, 1, 1], [1, 1, 1])),
            as_meta(SignalEntry(2, 1)),
        ]
        await stream.send([encode(["prog", 1, "CPU:0", entries, True])])  # kept
        await stream.send([encode(as_meta(Batch(1, [0, 0, 0], [1], [], values=[[16]])))])
        assert await _reply(stream) == ["done", 1, 2, None]
        for values, why in (
            ([], "none"),
            ([[16, 1]], r"\[2\]"),
            ([[]], r"\[0\]"),
        ):
            await stream.send([encode(as_meta(Batch(2, [0, 0, 0], [1], [], values=values)))])
            refused = await _reply(stream)
            assert refused[:3] == ["error", "batch", 2], refused
            assert re.fullmatch(
                rf"batch 2: its programs' calls of shipped code take \[1\] var values and it "
                rf"sends {why}; a batch sends the var values of each of its programs' calls, "
                rf"in order",
                refused[3],
            ), refused
        # The program kept runs with each batch's own value.
        await stream.send([encode(as_meta(Batch(3, [0, 0, 0], [1], [], values=[[4]])))])
        assert await _reply(stream) == ["done", 3, 2, None]


async def test_a_graph_bound_to_new_var_values_names_its_kept_program_unless_dims_change(
    program_worker: Worker,
) -> None:
    # ADD over g cores of n elements each: new n alone is the same program on the worker
    # (its value goes with the batch); a new g is a launch of other dims, another program.
    g = ag.Var("g", 1, 4)
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal(64, dtype=np.float32) for _ in range(2))
    device = program_worker.devices[0]
    with trio.fail_after(GUARD):
        async with ag.open_runtime([device], remote_token=TOKEN) as rt:
            out, x, y = (rt.alloc(device, 64, np.float32) for _ in range(3))
            await rt.copyin(x, a)
            await rt.copyin(y, b)
            launch = ag.Launch(_add_kernel(), [out, x, y], vars=[N], global_size=(g, 1, 1))
            graph = await rt.compile([launch])
            stats = rt.device(device).connection.statistics
            sent = []
            for cores, n in ((4, 16), (4, 8), (4, 2), (2, 16), (2, 4), (4, 4)):
                await rt.copyin(out, np.full(64, -1, np.float32))
                await graph(var_vals={g: cores, N: n})
                want = np.full(64, -1, np.float32)
                want[: cores * n] = (a + b * np.float32(2))[: cores * n]
                np.testing.assert_array_equal(await rt.copyout(out), want)
                sent.append(stats().programs_sent)
            # The graph's program for 4 cores, then for 2, then the first again (kept).
            assert [s - sent[0] for s in sent] == [0, 0, 0, 1, 1, 1], sent


async def test_programs_are_kept_per_session_and_checked_before_they_load(
    program_worker: Worker,
) -> None:
    image = _compile(ADD)
    with trio.fail_after(GUARD):
        first = await _session(program_worker.port)
        await _send_code(first, 5, image)
        assert await _call(first, 1, 5) == ["done", 1, 2, None]
        # Another client does not know the first one's program ids.
        second = await _session(program_worker.port)
        done = await _call(second, 1, 5)
        assert done[:3] == ["done", 1, 2], done
        assert "unknown program id 5 (not shipped by this client)" in done[3][2]
        # Bytes that are not what their digest says, and a CPU this worker is not.
        await _send_code(second, 6, image, digest=b"\0" * 32)
        assert "its bytes do not match its digest" in (await _reply(second))[3]
        await _send_code(second, 7, image, features=("avx2", "no_such_feature"))
        why = (await _reply(second))[3]
        assert "needs CPU features no_such_feature that this worker" in why, why
        other = "arm64" if HOST.machine == "x86_64" else "x86_64"
        await _send_code(second, 8, image, machine=other)
        why = (await _reply(second))[3]
        assert f"was compiled for {other}, but this worker runs on {HOST.machine}" in why
        await _send_code(second, 9, _compile(ADD, other))  # says this host's, is not
        why = (await _reply(second))[3]
        assert f"is not a 64-bit little-endian ELF object for {HOST.machine}" in why, why
        # A refused program cannot be called: the batch says why it was refused.
        done = await _call(second, 2, 8)
        assert f"program id 8 was refused: program 'add_k' was compiled for {other}" in done[3][2]
        # And the refused client's own program still works.
        await _send_code(second, 10, image)
        assert await _call(second, 3, 10) == ["done", 3, 2, None]


async def test_a_client_cannot_ship_past_the_workers_program_limits() -> None:
    image = _compile(ADD)
    other = _compile(ADD.replace("2.0f", "3.0f"))
    worker = _program_worker("--max-programs", "1", "--max-program-bytes", str(2 * len(image)))
    try:
        with trio.fail_after(GUARD):
            async with ag.open_runtime(worker.devices, remote_token=TOKEN) as rt:
                await _run_add(rt, _add_kernel(), worker.devices[0], 1)
                code = MachineCode("add3", other, HOST.machine, buffers=3, values=2, core_id=1)
                kernel = ag.Kernel("add3", code=code, outs=(0,), ins=(1, 2))
                bufs = [rt.alloc(worker.devices[0], 64, np.float32) for _ in range(3)]
                with pytest.raises(
                    ag.DeviceError,
                    match=re.escape(
                        "keeps at most 1 programs per client, and this one ('add3') would be "
                        "one more; raise its --max-programs"
                    ),
                ):
                    await rt.run([ag.Launch(kernel, bufs, vars=[N])], {N: 16})
            # The worker holds its clients to the limits itself.
            stream = await _session(worker.port)
            await _send_code(stream, 1, image)
            await _send_code(stream, 2, other)
            why = (await _reply(stream))[3]
            assert (
                "this client has 1 programs on this worker, its limit; start the worker with a larger --max-programs"
                in why
            )
            stream = await _session(worker.port)
            await _send_code(stream, 1, image * 3)
            why = (await _reply(stream))[3]
            assert (
                "bytes of programs on this worker; start the worker with a larger --max-program-bytes"
                in why
            )
    finally:
        worker.kill()


async def test_a_worker_a_program_crashes_fails_the_call_naming_it() -> None:
    crash = MachineCode("crash_k", _compile(CRASH), HOST.machine, buffers=1)
    kernel = ag.Kernel("crash_k", code=crash, outs=(0,))
    worker = _program_worker()
    try:
        with trio.fail_after(GUARD):
            async with ag.open_runtime(["CPU:0", *worker.devices], remote_token=TOKEN) as rt:
                here = rt.alloc("CPU:0", 4, np.float32)
                there = rt.alloc(worker.devices[0], 4, np.float32)
                with pytest.raises(
                    ag.ClosedError, match=re.escape(f"worker 127.0.0.1:{worker.port}")
                ):
                    await rt.run([ag.Launch(kernel, [there]), ag.Copy(dst=here, src=there)])
                # Local devices go on; the worker's refuse every later call the same way.
                await rt.copyin(here, np.ones(4, np.float32))
                np.testing.assert_array_equal(await rt.copyout(here), np.ones(4))
                with pytest.raises(ag.ClosedError, match=re.escape(f"127.0.0.1:{worker.port}")):
                    await rt.copyout(there)
        assert worker.process.wait(GUARD) != 0
    finally:
        worker.kill()


async def test_a_departed_clients_programs_give_their_memory_back_at_once() -> None:
    # A session's shipped programs live in executable memory of its own: when its client
    # leaves, that memory goes at once, whatever still refers to the session (a frame a
    # reference cycle keeps until the collector runs), not when the collector runs.
    import gc
    import weakref

    with trio.fail_after(GUARD):
        async with _session_calling_add_k(store=False) as (session, replies):
            loaded = session.codes.get(5)
            memory = weakref.ref(loaded.kernel.cpu.memory)  # type: ignore[attr-defined]
            del loaded
            session.handle(decode(as_meta(Batch(1, [0, 0, 0], [1], [], values=[[16]]))))
            assert await replies.wait_for(1) == [["done", 1, 2, None]]
            gc.disable()
            try:
                session.close()
                assert memory() is None  # unmapped: nothing refers to it
            finally:
                gc.enable()


async def test_a_kept_program_runs_each_batch_with_its_var_values_as_one_shape() -> None:
    # One program, kept, called with n = 4, 8, 2 by three batches: each fills 4n floats
    # (4 cores, n each), and the worker sees one kernel shape, not one per value (a value
    # never seen does not send the call to the thread to be timed again).
    from actorgraph.devices.remote.wire import Ref

    with trio.fail_after(GUARD):
        async with _session_calling_add_k(store=True) as (session, replies):
            out, a, b = (session.buffer(Ref(h, 0, []), "test").host_view() for h in (1, 2, 3))
            a[:] = np.arange(64)
            b[:] = 100
            for batch, n in enumerate((4, 8, 2), 1):
                out[:] = -1
                session.handle(decode(as_meta(Batch(batch, [0, 0, 0], [1], [], values=[[n]]))))
                assert (await replies.wait_for(batch))[-1] == ["done", batch, 2, None]
                want = np.full(64, -1, np.float32)
                want[: 4 * n] = np.arange(4 * n) + 200
                np.testing.assert_array_equal(out, want)
            assert [key[0] for key in session.worker.times.shapes] == ["add_k#5"]
            session.close()


@contextlib.asynccontextmanager
async def _session_calling_add_k(store: bool) -> AsyncIterator[tuple[Any, Any]]:
    """A worker's session in this process (on CPU:0, shipped programs allowed) with ADD
    loaded as code 5, three buffers of 64 floats (1: out, 2 and 3: its inputs), and
    program 1 calling it on them (kept if `store`), its value n from each batch; and
    what the session sends, kept in a list. Its tasks end with it."""
    import hashlib

    from _workers import Replies
    from actorgraph.devices.remote.wire import Code

    from actorgraph.worker._server import Worker as WorkerServer
    from actorgraph.worker._session import Session

    image = _compile(ADD)
    code = Code(5, hashlib.sha256(image).digest(), "add_k", HOST.machine, [], 3, 2, 1)
    async with ag.open_runtime(["CPU:0"]) as rt, trio.open_nursery() as nursery:
        server = WorkerServer(rt, {}, None, Limits(), allow_programs=True)
        replies = Replies()
        session = Session(server, 1, replies, nursery)  # type: ignore[arg-type]
        session.codes.add(code, image)
        for handle in (1, 2, 3):
            session.handle(decode(["alloc", handle, "CPU:0", 64, "<f4"]))
        refs = [[handle, 0, []] for handle in (1, 2, 3)]
        call = as_meta(CodeEntry(0, 5, refs, [4, 1, 1], [1, 1, 1]))
        session.handle(decode(["prog", 1, "CPU:0", [call, as_meta(SignalEntry(2, 1))], store]))
        yield session, replies
        nursery.cancel_scope.cancel()


ZEROED_STATE = r"""
static unsigned long calls;
void zeroed_k(float *out, const float *a) { out[0] = a[0] + (float)(calls++); }
"""


async def test_a_program_with_zero_initialized_static_data_is_refused_by_both_sides(
    program_worker: Worker,
) -> None:
    # The loader lays out what an object's bytes hold; zero-initialized statics (.bss)
    # hold none, and a kernel writing them would write over its own code and kill the
    # worker with every client's work on it.
    image = _compile(ZEROED_STATE)
    why = (
        "program 'zeroed_k' has zero-initialized static data (.bss), which is not laid "
        "out with its code: give each static variable a nonzero initial value, or pass "
        "the memory as a buffer"
    )
    device = program_worker.devices[0]
    code = MachineCode("zeroed_k", image, HOST.machine, buffers=2)
    kernel = ag.Kernel("zeroed_k", code=code, outs=(0,), ins=(1,))
    with trio.fail_after(GUARD):
        async with ag.open_runtime([device], remote_token=TOKEN) as rt:
            bufs = [rt.alloc(device, 4, np.float32) for _ in range(2)]
            with pytest.raises(ag.DeviceError, match=re.escape(why)):
                await rt.run([ag.Launch(kernel, bufs)])
        stream = await _session(program_worker.port)  # the worker checks it itself too
        await _send_code(stream, 3, image, name="zeroed_k")
        assert why in (await _reply(stream))[3]
        assert await _call(stream, 1, 3) != ["done", 1, 2, None]
        await _send_code(stream, 4, _compile(ADD))
        assert await _call(stream, 2, 4) == ["done", 2, 2, None]  # the worker goes on


STATEFUL = r"""
static unsigned long calls = 1;  /* in .data: laid out with its code */
void stateful_k(float *out, const float *a) {
  out[0] = a[0] + (float)(calls++);  /* a kernel that keeps state between calls */
}
"""


async def test_checked_replays_run_shipped_programs_on_their_worker_too(
    program_worker: Worker,
) -> None:
    # open_runtime(check_replays=N) runs a replay's items again on shadows, on the same
    # devices: a shipped program runs on its worker for the check as for the replay.
    device = program_worker.devices[0]
    stateful = ag.Kernel(
        "stateful_k",
        code=MachineCode("stateful_k", _compile(STATEFUL), HOST.machine, buffers=2),
        outs=(0,),
        ins=(1,),
    )
    with trio.fail_after(GUARD):
        async with ag.open_runtime([device], remote_token=TOKEN, check_replays=2) as rt:
            bufs = [rt.alloc(device, 64, np.float32) for _ in range(3)]
            await rt.copyin(bufs[1], np.arange(64, dtype=np.float32))
            await rt.copyin(bufs[2], np.ones(64, np.float32))
            add = ag.Launch(_add_kernel(), bufs, vars=[N], global_size=(4, 1, 1))
            graph = await rt.compile([add])
            for _ in range(3):
                await graph(var_vals={N: 16})
            assert graph.statistics().checked == 2
            np.testing.assert_array_equal(await rt.copyout(bufs[0]), np.arange(64) + 2)
            out = rt.alloc(device, 1, np.float32)
            kept = await rt.compile([ag.Launch(stateful, [out, bufs[1]])])
            with pytest.raises(ag.ReplayMismatchError, match=r"item 0 \(stateful_k\).*element 0 "):
                await kept()
