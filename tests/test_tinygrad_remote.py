"""tinygrad's AG devices on actorgraph workers (`install(remote=[...])`, tinygrad 0.14):
eager kernels, copies in and out, between workers and with local CPU devices, sharding
over any mix, the batching of eager work (counted in messages), jits over CPU and AG
devices as one graph, and refusals. Real worker subprocesses on loopback (two workers,
started with --allow-programs); every result is compared bitwise with the same program
on tinygrad's local CPU devices."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("DEV", "CPU")  # before tinygrad picks its default device
tinygrad = pytest.importorskip(
    "tinygrad", reason='tinygrad is not installed: pip install -e ".[test,tinygrad]"'
)
if shutil.which(os.environ.get("CC", "clang")) is None:
    pytest.skip(
        "clang is not installed: tinygrad's CPU devices compile with it", allow_module_level=True
    )

import actorgraph as ag  # noqa: E402
from actorgraph import tinygrad as agt  # noqa: E402
from actorgraph.testing import Worker, start_worker  # noqa: E402

V011 = agt.TINYGRAD_VERSION == "0.11.0"
TOKEN = b"tinygrad-remote-token"


if V011:
    pytest.skip(
        'AG devices need tinygrad 0.14.0 (pip install -e ".[test,tinygrad]")',
        allow_module_level=True,
    )

from tinygrad import Device, Tensor  # noqa: E402
from tinygrad.helpers import DEV  # noqa: E402

from actorgraph.worker._machine_code import loader_problem  # noqa: E402

if loader_problem() is not None:
    pytest.skip(
        f'workers cannot load shipped programs here ({loader_problem()}): pip install -e ".[test,tinygrad]"',
        allow_module_level=True,
    )

DEV.value = "CPU"
GUARD = 60  # seconds: a hang guard for what runs in other processes


def _data(seed: int, *shape: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


@pytest.fixture(scope="module")
def workers_ab() -> Iterator[tuple[Worker, Worker]]:
    """Worker A with CPU:0 and CPU:1, worker B with CPU:0, both running shipped programs."""
    a = start_worker(["CPU:0", "CPU:1"], token=TOKEN, extra_args=["--allow-programs"])
    b = start_worker(["CPU:0"], token=TOKEN, extra_args=["--allow-programs"])
    yield a, b
    a.kill()
    b.kill()


@pytest.fixture
def two_workers(workers_ab: tuple[Worker, Worker]) -> Iterator[tuple[Worker, Worker]]:
    """The two workers installed as AG (A's CPU:0), AG:1 (A's CPU:1), AG:2 (B's CPU:0)."""
    a, b = workers_ab
    agt.install(devices=4, remote=[*a.devices, *b.devices], remote_token=TOKEN)
    try:
        yield a, b
    finally:
        agt.uninstall()


def _connection(name: str) -> Any:
    state = agt._install.current()
    assert state is not None
    return state.runtime.runtime.device(name).connection


def _stats(worker: Worker) -> Any:
    return _connection(worker.devices[0]).statistics()


def test_eager_kernels_on_workers_equal_tinygrad_alone(two_workers: Any) -> None:
    a = _data(1, 8, 64)
    for device in ("AG", "AG:1", "AG:2"):
        x = Tensor(a, device=device)
        got = (x @ x.T).relu().sum(axis=1).numpy()
        local = Tensor(a, device="CPU")
        want = (local @ local.T).relu().sum(axis=1).numpy()
        assert got.tobytes() == want.tobytes(), device
    assert agt.statistics().remote == tuple(
        name for worker in two_workers for name in worker.devices
    )


# The same program on tinygrad's local CPU devices: AG -> CPU, AG:1 -> CPU:1, ...
LOCAL = {"AG": "CPU", "AG:1": "CPU:1", "AG:2": "CPU:2"}


def test_copies_between_workers_go_worker_to_worker(two_workers: Any) -> None:
    a, b = two_workers

    def program(names: dict[str, str]) -> tuple[Tensor, Tensor]:
        x = (Tensor(_data(2, 1024), device=names["AG"]) * 3).realize()
        return x, x.to(names["AG:2"]) + 1  # worker A to worker B, then a kernel on B

    x, y = program({name: name for name in LOCAL})
    Device["AG"].synchronize()
    before = _stats(a).bytes_received, _stats(b).bytes_received
    z = y.to("AG:1") * 2  # and back to A's other device
    Device["AG:1"].synchronize()
    # Nothing of it came through this host.
    assert (_stats(a).bytes_received, _stats(b).bytes_received) == before
    _, want = program(LOCAL)
    assert z.numpy().tobytes() == (want.to("CPU:1") * 2).numpy().tobytes()


def test_copies_between_ag_and_local_cpu_devices(two_workers: Any) -> None:
    def program(remote: str) -> Tensor:
        x = Tensor(_data(3, 16, 16), device="CPU:1").exp()
        return x.to(remote).sqrt().to("CPU:2") + x.to("CPU:2")

    assert program("AG:2").numpy().tobytes() == program("CPU:3").numpy().tobytes()


def test_shard_over_any_mix_of_ag_and_cpu_devices(two_workers: Any) -> None:
    a, w = _data(4, 8, 32), _data(5, 32, 16)
    mixed = ("AG", "CPU:1", "AG:2", "AG:1")
    local = ("CPU", "CPU:1", "CPU:2", "CPU:3")
    got = (Tensor(a).shard(mixed, axis=0) @ Tensor(w).shard(mixed)).relu().sum(axis=0)
    want = (Tensor(a).shard(local, axis=0) @ Tensor(w).shard(local)).relu().sum(axis=0)
    assert got.numpy().tobytes() == want.numpy().tobytes()


def test_eager_work_waits_until_a_result_is_needed_then_goes_as_one_message(
    two_workers: Any,
) -> None:
    a, b = two_workers
    x = Tensor(_data(6, 32, 32), device="AG").realize()
    y = Tensor(_data(7, 32, 32), device="AG:2").realize()
    Device["AG"].synchronize()
    sent = _stats(a).messages_sent, _stats(b).messages_sent
    batches = _stats(a).batches_sent, _stats(b).batches_sent
    for _ in range(4):
        x = (x @ x).tanh().realize()  # kernels whose results nothing reads yet
        y = (y * 2 + 1).realize()
    z = (x.to("AG:2") + y).realize()
    # Nothing has gone to either worker: no result was needed.
    assert (_stats(a).messages_sent, _stats(b).messages_sent) == sent
    got = z.numpy()
    # Then all of it (kernels, the copy between the workers, the read) as one message
    # to each worker: a batch each, and the read's on B.
    assert _stats(a).messages_sent == sent[0] + 1
    assert _stats(b).messages_sent == sent[1] + 1
    assert (_stats(a).batches_sent, _stats(b).batches_sent) == (batches[0] + 1, batches[1] + 2)
    lx, ly = Tensor(_data(6, 32, 32)).realize(), Tensor(_data(7, 32, 32), device="CPU:2")
    for _ in range(4):
        lx = (lx @ lx).tanh().realize()
        ly = (ly.realize() * 2 + 1).realize()
    assert got.tobytes() == (lx.to("CPU:2") + ly).numpy().tobytes()


def test_bad_uses_of_ag_devices_are_refused_clearly(two_workers: Any) -> None:
    with pytest.raises(
        ag.UsageError,
        match=re.escape(
            "tinygrad device AG:7 is not one of the 3 worker devices install(remote=...) "
            "opened (AG, AG:1, AG:2); name more devices there"
        ),
    ):
        Tensor(np.ones(4, np.float32), device="AG:7").realize()
    cpu = Tensor(np.arange(4, dtype=np.int32)).realize()
    address = cpu.uop.base.buffer._buf.va_addr
    with pytest.raises(
        ag.UsageError,
        match=re.escape(
            "tinygrad device AG holds memory on a worker, and Tensor.from_blob (an external "
            "pointer) names host memory; make the tensor on a CPU device and move it with "
            ".to('AG')"
        ),
    ):
        Tensor.from_blob(address, (4,), dtype=cpu.dtype, device="AG").realize()


async def _guarded(body: Any) -> Any:
    """Run `body` (a wait for work on workers, no more of tinygrad than that: tinygrad is
    not thread-safe) on a thread, failing the test if it hangs."""
    import trio

    with trio.fail_after(GUARD):
        return await trio.to_thread.run_sync(body, abandon_on_cancel=True)


async def test_eager_work_past_the_in_flight_window_is_sent_not_held() -> None:
    # A flush submits what tinygrad queued as one message per worker, holding what it
    # sends until its end; past the runtime's in-flight window a submission waits for
    # room, which only the held ones completing make: they must go first (it hung).
    worker = start_worker(["CPU:0"], token=TOKEN, extra_args=["--allow-programs"])
    agt.install(devices=1, remote=worker.devices, remote_token=TOKEN, max_in_flight=8)
    try:
        tensors = [Tensor(np.full(16, k, np.float32), device="AG").realize() for k in range(40)]
        twice = [(t * 2).realize() for t in tensors[:20]]
        await _guarded(Device["AG"].synchronize)
        got = await _guarded(lambda: [t.numpy() for t in (*tensors, *twice)])
        want = [np.full(16, k, np.float32) for k in (*range(40), *range(0, 40, 2))]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
    finally:
        worker.kill()  # first: a flush stuck on it fails, so uninstall cannot hang
        agt.uninstall()


async def test_a_worker_lost_mid_call_fails_the_read_naming_it() -> None:
    worker = start_worker(["CPU:0"], token=TOKEN, extra_args=["--allow-programs"])
    agt.install(devices=2, remote=worker.devices, remote_token=TOKEN)
    try:
        x = Tensor(_data(8, 64, 64), device="AG").realize()
        await _guarded(Device["AG"].synchronize)
        y = (x @ x).exp().realize()  # recorded; goes with the next read
        worker.kill()
        with pytest.raises(ag.ClosedError, match=re.escape(f"127.0.0.1:{worker.port}")):
            await _guarded(Device["AG"].synchronize)
        with pytest.raises(ag.ClosedError, match=re.escape(f"127.0.0.1:{worker.port}")):
            y.numpy()  # and every later use, at once
        # Local devices go on.
        assert (Tensor([1.0, 2.0]) * 2).tolist() == [2.0, 4.0]
    finally:
        worker.kill()
        agt.uninstall()


def test_install_refuses_workers_that_cannot_be_ag_devices(ag_worker: Any) -> None:
    from tinygrad import Device

    cpu = Device["CPU"]
    own_runner, own_init = cpu.graph, type(cpu).__init__
    # The session's worker runs no shipped programs.
    with pytest.raises(
        ag.UsageError,
        match=re.escape(
            f"worker device {ag_worker.devices[0]} cannot be a tinygrad AG device: its worker "
            f"does not run shipped programs (tinygrad's kernels); start it with `actorgraph "
            f"worker --allow-programs ...`"
        ),
    ):
        agt.install(remote=ag_worker.devices[:1], remote_token=ag_worker.token)
    assert not agt.installed()
    # Nothing of the refused install stays: tinygrad's CPU devices run their own graphs.
    assert (cpu.graph, type(cpu).__init__) == (own_runner, own_init)
    with pytest.raises(ag.remote.RemoteConnectionError, match="refused this client's token"):
        agt.install(remote=ag_worker.devices[:1], remote_token=b"wrong")
    assert not agt.installed()
    with pytest.raises(
        ag.UsageError,
        match=re.escape(
            "install(remote=...) takes worker device names like 'CPU:0@10.0.0.5:7000', got "
            "'CPU:0'; name each worker device as KIND:N@HOST:PORT"
        ),
    ):
        agt.install(remote=["CPU:0"])
    with pytest.raises(ag.UsageError, match=re.escape("write remote=['CPU:0@h:1']")):
        agt.install(remote="CPU:0@h:1")  # type: ignore[arg-type]
    assert not agt.installed()


def test_checked_replays_are_refused_with_ag_devices(workers_ab: Any) -> None:
    # A check runs the batch as tinygrad does on shadows of this host's memory; a batch
    # on workers would have replayed unchecked, saying nothing.
    a, _ = workers_ab
    with pytest.raises(
        ag.UsageError,
        match=re.escape(
            f"install(check_replays=2) checks batches against tinygrad running them on this "
            f"host's memory, and the memory of AG devices (install(remote=...) or "
            f"ACTORGRAPH_REMOTE: {a.devices[0]}) is on workers, so their batches cannot be "
            f"checked; install without remote devices to check jits on CPU devices, or "
            f"without check_replays to run on workers"
        ),
    ):
        agt.install(devices=1, remote=a.devices[:1], remote_token=TOKEN, check_replays=2)
    assert not agt.installed()


def test_memory_of_an_earlier_install_is_refused_clearly(workers_ab: Any) -> None:
    a, _ = workers_ab
    agt.install(devices=2, remote=a.devices, remote_token=TOKEN)
    try:
        x = Tensor(_data(9, 16), device="AG").realize()
        x.numpy()
    finally:
        agt.uninstall()
    agt.install(devices=2, remote=a.devices, remote_token=TOKEN)
    try:
        with pytest.raises(
            ag.ClosedError,
            match=re.escape("was made while actorgraph.tinygrad was installed before"),
        ):
            (x + 1).numpy()
        # Memory made now works, whatever tinygrad cached before.
        assert (Tensor(_data(9, 16), device="AG") + 1).numpy().tobytes() == (
            Tensor(_data(9, 16)) + 1
        ).numpy().tobytes()
    finally:
        agt.uninstall()


def test_an_unmodified_script_runs_on_the_first_worker_device(
    workers_ab: Any, tmp_path: Path
) -> None:
    a, b = workers_ab
    script = tmp_path / "model.py"
    script.write_text(
        "import sys\n"
        "import numpy as np\n"
        "from tinygrad import Device, Tensor\n"
        "x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))\n"
        "print(Device.DEFAULT, x.device, (x @ x.T).relu().sum().item(), sys.argv[1:])\n"
    )
    token = tmp_path / "token"
    token.write_bytes(TOKEN)
    env = dict(
        os.environ,
        DEV="AG",
        ACTORGRAPH_REMOTE=f"{b.devices[0]},{a.devices[0]}",
        ACTORGRAPH_TOKEN_FILE=str(token),
        PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    )
    done = subprocess.run(
        [sys.executable, "-m", "actorgraph.tinygrad", str(script), "--flag"],
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    want = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert done.stdout.split() == [
        "AG",
        "AG",
        str(float(np.maximum(want @ want.T, 0).sum())),
        "['--flag']",
    ]


# -- jits over AG devices --


def _two_worker_jit(names: dict[str, str]) -> Any:
    """A jit with kernels on AG (worker A) and AG:2 (worker B) and a copy between them,
    on these tinygrad devices (LOCAL for the same program on local CPU devices)."""
    from tinygrad import TinyJit

    w = Tensor(_data(20, 16, 16), device=names["AG"]).realize()
    v = Tensor(_data(21, 16), device=names["AG:2"]).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        h = (x @ w).relu().realize()
        return (h.to(names["AG:2"]) * v).sum(axis=1).realize()

    return step


def test_a_jit_over_workers_replays_as_one_batch_per_worker(two_workers: Any) -> None:
    a, b = two_workers
    remote, local = _two_worker_jit({n: n for n in LOCAL}), _two_worker_jit(LOCAL)
    for seed in range(3):  # capture (tinygrad 0.14 replays from its second call)
        remote(Tensor(_data(seed, 4, 16), device="AG")).numpy()
        local(Tensor(_data(seed, 4, 16), device="CPU")).numpy()
    assert agt.statistics().graphs >= 1
    inputs = [Tensor(_data(30 + k, 4, 16), device="AG").realize() for k in range(3)]
    Device["AG"].synchronize()
    stats = agt.statistics()
    batches = _stats(a).batches_sent, _stats(b).batches_sent
    sent = _stats(a).messages_sent, _stats(b).messages_sent
    outs = [remote(x) for x in inputs]  # three replays, nothing read yet
    assert agt.statistics().replays == stats.replays + 3
    assert (_stats(a).messages_sent, _stats(b).messages_sent) == sent  # recorded
    got = outs[-1].numpy()
    # One batch per worker per replay, B's read in the last one's (Graph.submit_reading),
    # all in one message to each. A's next replay overwrites what B's copy of the last one
    # read: the client tells A when B is done with it (the two forwards A gets besides).
    assert (_stats(a).batches_sent, _stats(b).batches_sent) == (batches[0] + 3, batches[1] + 3)
    assert (_stats(a).messages_sent, _stats(b).messages_sent) == (sent[0] + 1 + 2, sent[1] + 1)
    assert agt.statistics().plans == stats.plans  # planned once, at capture
    want = local(Tensor(_data(32, 4, 16), device="CPU")).numpy()
    assert got.tobytes() == want.tobytes()


def test_a_jit_tinygrad_cuts_into_parts_replays_as_one_batch_per_worker(
    two_workers: Any,
) -> None:
    """tinygrad cuts a jit's work into graphs of 32, 64, ... calls (JIT_BATCH_SIZE),
    each replayed on its own; the parts of one call over workers still go as one graph:
    one batch per worker per replay, planned once."""
    from tinygrad import TinyJit
    from tinygrad.helpers import Context

    def make(names: dict[str, str]) -> Any:
        w = Tensor(_data(22, 16, 16), device=names["AG"]).realize()
        v = Tensor(_data(23, 16, 16), device=names["AG:2"]).realize()

        @TinyJit
        def step(x: Tensor) -> Tensor:
            for _ in range(2):
                x = (x @ w).relu().realize()
            x = x.to(names["AG:2"]).realize()
            for _ in range(3):
                x = (x @ v - 0.5).relu().realize()
            return x

        return step

    a, b = two_workers
    remote, local = make({n: n for n in LOCAL}), make(LOCAL)
    graphs, plans = agt.statistics().graphs, agt.statistics().plans
    with Context(JIT_BATCH_SIZE=2):  # six calls: graphs of 2 and 4
        for seed in range(3):  # capture (tinygrad 0.14 replays from its second call)
            remote(Tensor(_data(seed, 4, 16), device="AG")).numpy()
            local(Tensor(_data(seed, 4, 16), device="CPU")).numpy()
    assert agt.statistics().graphs == graphs + 4  # two parts of each jit
    inputs = [Tensor(_data(30 + k, 4, 16), device="AG").realize() for k in range(4)]
    Device["AG"].synchronize()
    stats = agt.statistics()
    assert stats.plans == plans + 3  # the local jit's two parts; the remote one's as one
    for k, x in enumerate(inputs):
        batches = _stats(a).batches_sent, _stats(b).batches_sent
        got = remote(x).numpy()
        # One batch to each worker (A's kernels, B's copy from A, its kernels and the read
        # of its result).
        assert (_stats(a).batches_sent, _stats(b).batches_sent) == (batches[0] + 1, batches[1] + 1)
        want = local(Tensor(_data(30 + k, 4, 16), device="CPU")).numpy()
        assert got.tobytes() == want.tobytes(), k
    assert agt.statistics().replays == stats.replays + 4 * len(inputs)  # two parts of each
    assert agt.statistics().plans == stats.plans


def test_a_jit_input_that_two_parts_use_is_one_input_of_their_graph(two_workers: Any) -> None:
    from tinygrad import TinyJit
    from tinygrad.helpers import Context

    def make(device: str) -> Any:
        w = Tensor(_data(24, 16, 16), device=device).realize()

        @TinyJit
        def step(x: Tensor) -> Tensor:
            y = x
            for _ in range(5):  # graphs of 2 and 3 calls, each reading x
                y = (y @ w + x).relu().realize()
            return y

        return step

    remote, local = make("AG:1"), make("CPU")
    with Context(JIT_BATCH_SIZE=2):
        for seed in range(3):
            remote(Tensor(_data(seed, 4, 16), device="AG:1")).numpy()
            local(Tensor(_data(seed, 4, 16), device="CPU")).numpy()
    plans = agt.statistics().plans
    for k in range(4):
        got = remote(Tensor(_data(40 + k, 4, 16), device="AG:1")).numpy()
        assert got.tobytes() == local(Tensor(_data(40 + k, 4, 16), device="CPU")).numpy().tobytes()
    assert agt.statistics().plans == plans


def test_a_jit_over_ag_and_cpu_devices_cut_into_parts_equals_tinygrad_alone(
    two_workers: Any,
) -> None:
    """Parts on a worker, on this host's CPU:1 and over both: those recorded together go
    as one graph, each part that touches this host's memory waited for as it replays."""
    from tinygrad import TinyJit
    from tinygrad.helpers import Context

    def make(first: str) -> Any:
        w = Tensor(_data(25, 16, 16), device=first).realize()
        v = Tensor(_data(26, 16, 16), device="CPU:1").realize()

        @TinyJit
        def step(x: Tensor) -> Tensor:
            for _ in range(3):
                x = (x @ w).relu().realize()
            x = x.to("CPU:1").realize()
            for _ in range(3):
                x = (x @ v - 0.25).relu().realize()
            return x.to(first).realize()

        return step

    remote, local = make("AG"), make("CPU")
    with Context(JIT_BATCH_SIZE=2):
        for seed in range(6):
            got = remote(Tensor(_data(50 + seed, 4, 16), device="AG")).numpy()
            want = local(Tensor(_data(50 + seed, 4, 16), device="CPU")).numpy()
            assert got.tobytes() == want.tobytes(), seed


def test_a_data_parallel_jit_over_cpu_and_ag_devices_is_one_graph(two_workers: Any) -> None:
    from tinygrad import TinyJit

    def make(devices: tuple[str, ...]) -> Any:
        w = Tensor(_data(40, 16, 8)).shard(devices).realize()

        @TinyJit
        def step(x: Tensor) -> Tensor:
            return (x.shard(devices, axis=0) @ w).relu().sum(axis=0).realize()

        return step

    mixed = make(("CPU:1", "AG", "AG:2", "AG:1"))
    local = make(("CPU", "CPU:1", "CPU:2", "CPU:3"))
    graphs = agt.statistics().graphs
    for seed in range(6):
        x = _data(50 + seed, 8, 16)
        assert mixed(Tensor(x)).numpy().tobytes() == local(Tensor(x)).numpy().tobytes()
    # Each jit's step is one graph: the mixed one over this host and both workers.
    assert agt.statistics().graphs == graphs + 2


def test_a_jit_over_cpu_and_ag_devices_returns_once_this_hosts_part_is_done(
    two_workers: Any,
) -> None:
    """A jit that reads or writes this host's memory returns once that part is done (a
    worker's part may still run): its local output is whole the moment it returns, and
    its local input may be written over at once."""
    from tinygrad import TinyJit

    def to_worker(x: Tensor) -> Tensor:
        return (x.to("AG") * 2 + 1).realize()

    def and_back(x: Tensor) -> Tensor:
        return ((x.to("AG:2") * 3).to("CPU:1") + 1).realize()

    for fn, expect in ((to_worker, lambda a: a * 2 + 1), (and_back, lambda a: a * 3 + 1)):
        jit = TinyJit(fn)
        for seed in range(6):
            data = _data(60 + seed, 64, 64)
            x = Tensor(data, device="CPU").realize()
            out = jit(x)
            if out.device == "CPU:1":  # written here: read it at once, with no sync
                got = out.uop.buffer.as_memoryview(force_zero_copy=True)
                assert np.frombuffer(got, np.float32).tobytes() == expect(data).tobytes()
            # Its input, written over as soon as the call returns, was read already.
            x.uop.buffer.as_memoryview(force_zero_copy=True)[:] = bytes(data.nbytes)
            assert out.numpy().tobytes() == expect(data).tobytes()


def test_the_runtimes_thread_never_takes_what_replays_on_other_threads_hold(
    two_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch over this host's memory and workers' is submitted on the runtime's thread,
    # while the caller's thread replays under install()'s lock and wraps host memory with
    # install()'s Wrapper (and may wait there for the runtime's thread): the runtime's
    # thread must neither take that lock nor use that Wrapper.
    from tinygrad import TinyJit

    state = agt._install.current()
    assert state is not None
    on_runtime: list[str] = []

    def watched(name: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if state.runtime.on_runtime_thread():
                on_runtime.append(name)
            return method(*args, **kwargs)

        return call

    for name in ("root", "held", "forget_freed"):
        monkeypatch.setattr(state.wrapper, name, watched(name, getattr(state.wrapper, name)))

    class Lock:
        def __init__(self, lock: Any) -> None:
            self._lock = lock

        def __enter__(self) -> Any:
            if state.runtime.on_runtime_thread():
                on_runtime.append("install()'s lock")
            return self._lock.__enter__()

        def __exit__(self, *exc: Any) -> Any:
            return self._lock.__exit__(*exc)

    monkeypatch.setattr(state, "lock", Lock(state.lock))

    def make(devices: tuple[str, str]) -> Any:
        w = Tensor(_data(80, 16, 8), device=devices[0]).realize()  # held on this host

        @TinyJit
        def step(x: Tensor) -> Tensor:
            h = (x.to(devices[0]) @ w).relu().realize()
            return (h.to(devices[1]) * 2).realize()

        return step

    mixed, local = make(("CPU:1", "AG")), make(("CPU:1", "CPU:2"))
    for seed in range(4):
        x = _data(81 + seed, 4, 16)
        assert mixed(Tensor(x)).numpy().tobytes() == local(Tensor(x)).numpy().tobytes()
    assert agt.statistics().plans >= 1
    assert on_runtime == []


async def test_graph_from_jit_resolves_worker_memory_on_the_runtimes_thread(
    two_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Worker memory is allocated when work first uses it, on the runtime's thread (the
    # recorded work that fills it); a JitGraph that allocated it from its own thread as
    # well could make two allocations of it, and replay on the one never filled.
    from actorgraph.tinygrad._pending import AGMemory

    state = agt._install.current()
    assert state is not None
    elsewhere: list[AGMemory] = []
    resolve = AGMemory.buffer

    def buffer(self: AGMemory, runtime: Any) -> Any:
        if not state.runtime.on_runtime_thread():
            elsewhere.append(self)
        return resolve(self, runtime)

    monkeypatch.setattr(AGMemory, "buffer", buffer)
    remote, local = _two_worker_jit({n: n for n in LOCAL}), _two_worker_jit(LOCAL)
    for seed in range(2):
        remote(Tensor(_data(seed, 4, 16), device="AG")).numpy()
        local(Tensor(_data(seed, 4, 16), device="CPU")).numpy()
    graph = await agt.graph_from_jit(agt.runtime(), remote)
    for seed in range(3):
        x = Tensor(_data(90 + seed, 4, 16), device="AG").realize()  # first used by the replay
        out = await graph(x)
        want = local(Tensor(_data(90 + seed, 4, 16), device="CPU"))
        assert (await _guarded(out.numpy)).tobytes() == want.numpy().tobytes()
    assert elsewhere == []


def _symbolic_jit(device: str, seed: int, body: Any) -> tuple[Any, Tensor, Tensor]:
    """`body` as a TinyJit, and a (3, 12) and a (12, 4) tensor on `device` for it, whose
    shared dimension the tests cut to a bound Variable's value."""
    from tinygrad import TinyJit

    a = Tensor(_data(seed, 3, 12), device=device).realize()
    b = Tensor(_data(seed + 1, 12, 4), device=device).realize()
    return TinyJit(body), a, b


def _relu_sum(x: Tensor, y: Tensor) -> Tensor:
    return ((x @ y).relu().realize() * 2).sum(1).realize()


def _four_kernels(x: Tensor, y: Tensor) -> Tensor:
    h = (x @ y).relu().realize()
    h = (h * 2).realize()
    h = (h + 1).realize()
    return (h * 3).sum(1).realize()


def test_a_symbolic_jit_on_a_worker_plans_once(two_workers: Any) -> None:
    from tinygrad import Variable

    vi = Variable("i", 1, 12)
    remote, ra, rb = _symbolic_jit("AG:1", 60, _relu_sum)
    local, la, lb = _symbolic_jit("CPU", 60, _relu_sum)
    plans = agt.statistics().plans
    a = two_workers[0]
    sent = []
    for k in range(24):
        n = vi.bind(1 + (k * 5) % 12)
        got = remote(ra[:, :n], rb[:n, :]).numpy()
        assert got.tobytes() == local(la[:, :n], lb[:n, :]).numpy().tobytes(), k
        sent.append(_stats(a).programs_sent)
    assert agt.statistics().plans == plans + 2  # one for each jit, over 12 sizes
    # The worker's programs take the var values with each batch: one each, whatever i is
    # (the 12 values come first at calls 0-11; the jit replays from call 2).
    assert sent[2] == sent[-1], sent


def test_a_symbolic_jit_cut_into_parts_on_a_worker_plans_once(two_workers: Any) -> None:
    from tinygrad import Variable
    from tinygrad.helpers import Context

    vi = Variable("i", 1, 12)
    # Four kernels: graphs of 2 and 2 calls.
    remote, ra, rb = _symbolic_jit("AG", 62, _four_kernels)
    local, la, lb = _symbolic_jit("CPU", 62, _four_kernels)
    with Context(JIT_BATCH_SIZE=2):
        for k in range(3):  # capture
            n = vi.bind(1 + k)
            remote(ra[:, :n], rb[:n, :]).numpy()
            local(la[:, :n], lb[:n, :]).numpy()
        plans = agt.statistics().plans
        batches = _stats(two_workers[0]).batches_sent
        for k in range(24):
            n = vi.bind(1 + (k * 5) % 12)
            got = remote(ra[:, :n], rb[:n, :]).numpy()
            assert got.tobytes() == local(la[:, :n], lb[:n, :]).numpy().tobytes(), k
    assert agt.statistics().plans == plans  # the two parts' graph serves all 12 sizes
    assert _stats(two_workers[0]).batches_sent == batches + 24  # each one, the read in it


async def test_graph_from_jit_runs_a_jit_on_workers(two_workers: Any) -> None:
    remote, local = _two_worker_jit({n: n for n in LOCAL}), _two_worker_jit(LOCAL)
    for seed in range(2):
        remote(Tensor(_data(seed, 4, 16), device="AG")).numpy()
        local(Tensor(_data(seed, 4, 16), device="CPU")).numpy()
    with pytest.raises(
        ag.UsageError,
        match=re.escape(
            "jit 'step' runs on AG devices, whose memory lives in the runtime install() "
            "started; pass that runtime: graph_from_jit(agt.runtime(), jit)"
        ),
    ):
        async with ag.open_runtime(["CPU:0"]) as rt:
            await agt.graph_from_jit(rt, remote)
    graph = await agt.graph_from_jit(agt.runtime(), remote)
    for seed in range(3):
        x = Tensor(_data(70 + seed, 4, 16), device="AG").realize()  # recorded, goes first
        out = await graph(x)
        want = local(Tensor(_data(70 + seed, 4, 16), device="CPU"))
        assert (await _guarded(out.numpy)).tobytes() == want.numpy().tobytes()
    assert graph.graphs == 1


def _weighted_on(device: str) -> tuple[Any, Tensor]:
    """A jit of two kernels over a weight it holds on `device`, captured."""
    from tinygrad import TinyJit

    w = Tensor(_data(100, 16, 16), device=device).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return ((x @ w).relu().realize() + 1).realize()

    for seed in range(3):
        step(Tensor(_data(seed, 4, 16), device=device)).numpy()
    return step, w


def test_install_never_runs_a_plan_over_worker_memory_tinygrad_let_go_of(
    two_workers: Any,
) -> None:
    # The weight's buffer deallocated while tinygrad keeps the jit's runner: its memory
    # waits in tinygrad's cache for the next buffer of its size, which the plan must
    # not use as the weight.
    step, w = _weighted_on("AG")
    w.uop.base.buffer.deallocate()
    other = Tensor(_data(101, 16, 16), device="AG").realize()  # may get the weight's memory
    with pytest.raises(
        ag.UsageError,
        match=r"tinygrad freed memory this jit's batch holds \(free_intermediates\(\), or "
        r"a buffer of it deallocated\) while its runner stayed: capture the jit again",
    ):
        step(Tensor(_data(3, 4, 16), device="AG"))
    assert other.numpy().tobytes() == _data(101, 16, 16).tobytes()


async def test_graph_from_jit_reads_a_jit_on_workers_again_once_tinygrad_freed_its_memory(
    two_workers: Any,
) -> None:
    # free_intermediates() deallocates the jit's own memory on the worker (its
    # intermediates, its output): the graph over it never runs again; the next call
    # reads the jit anew, as tinygrad's own next call allocates that memory anew.
    step, _ = _weighted_on("AG:1")
    local, _ = _weighted_on("CPU")
    graph = await agt.graph_from_jit(agt.runtime(), step)
    x = Tensor(_data(110, 4, 16), device="AG:1").realize()
    want = local(Tensor(_data(110, 4, 16))).numpy()
    assert (await _guarded((await graph(x)).numpy)).tobytes() == want.tobytes()
    first = graph.graph
    step.captured.free_intermediates()
    # Tensors of those sizes may get the jit's old memory: the replay must leave them be.
    others = [Tensor(_data(111 + k, 4, 16), device="AG:1").realize() for k in range(4)]
    assert (await _guarded((await graph(x)).numpy)).tobytes() == want.tobytes()
    assert graph.graph is not first
    for k, other in enumerate(others):
        assert other.numpy().tobytes() == _data(111 + k, 4, 16).tobytes()


def _eye_weighted(device: str) -> tuple[Any, Tensor]:
    """A jit of two kernels over a weight it holds on `device` (2 * I), captured. Small
    whole numbers in float32: the expected values are exact."""
    from tinygrad import TinyJit

    w = Tensor((2 * np.eye(4)).astype(np.float32), device=device).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return ((x @ w).realize() + 1).realize()

    for value in range(2):
        step(Tensor(np.full((4, 4), value, np.float32), device=device)).numpy()
    return step, w


def _full_on(device: str, value: float) -> Tensor:
    return Tensor(np.full((4, 4), value, np.float32), device=device).realize()


def test_install_reads_a_jit_on_a_worker_from_its_own_record_when_its_runner_is_rebuilt(
    two_workers: Any,
) -> None:
    # free_intermediates() drops the jit's runners: the next call builds them again from
    # its own arguments, here the jit's weight; later calls with other tensors must still
    # read the weight where the jit uses it.
    step, w = _eye_weighted("AG")
    step.captured.free_intermediates()
    np.testing.assert_array_equal(step(w).numpy(), 4 * np.eye(4) + 1)
    for value in (3, 5):
        np.testing.assert_array_equal(step(_full_on("AG", value)).numpy(), 2 * value + 1)
    np.testing.assert_array_equal(step(w).numpy(), 4 * np.eye(4) + 1)


async def test_graph_from_jit_reads_a_jit_on_a_worker_from_its_own_record(
    two_workers: Any,
) -> None:
    step, w = _eye_weighted("AG:2")
    graph = await agt.graph_from_jit(agt.runtime(), step)

    async def call(x: Tensor) -> Any:
        return await _guarded((await graph(x)).numpy)

    np.testing.assert_array_equal(await call(w), 4 * np.eye(4) + 1)
    for value in (3, 5):
        np.testing.assert_array_equal(await call(_full_on("AG:2", value)), 2 * value + 1)
    np.testing.assert_array_equal(await call(w), 4 * np.eye(4) + 1)


def test_ag_devices_on_workers_that_speak_tls(tmp_path: Path) -> None:
    trustme = pytest.importorskip(
        "trustme", reason="the TLS test makes its certificates with trustme"
    )
    ca = trustme.CA()
    ca_file, cert, key = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    leaf = ca.issue_cert("127.0.0.1")
    leaf.private_key_pem.write_to_path(str(key))
    for pem in leaf.cert_chain_pems:
        pem.write_to_path(str(cert), append=True)
    flags = ["--allow-programs", "--tls-cert", str(cert), "--tls-key", str(key)]
    workers = [start_worker(["CPU:0"], token=TOKEN, extra_args=flags) for _ in range(2)]
    try:
        names = [w.devices[0] for w in workers]
        agt.install(devices=2, remote=names, remote_token=TOKEN, remote_tls_ca=str(ca_file))
        try:
            a = _data(80, 16, 16)
            x = Tensor(a, device="AG")
            got = ((x @ x).to("AG:1").exp()).numpy()  # the copy goes worker to worker, TLS too
            assert all(_connection(name).statistics().tls for name in names)
        finally:
            agt.uninstall()
    finally:
        for worker in workers:
            worker.kill()
    local = Tensor(a, device="CPU")
    assert got.tobytes() == ((local @ local).to("CPU:1").exp()).numpy().tobytes()
