"""actorgraph.ray on a local multi-node Ray cluster (Ray's own cluster utilities).

One cluster serves the whole module: a head node (the client's) and two worker nodes
whose custom resources steer the workers (`node_a`, `node_b`; node B declares two GPUs,
which Ray hands out as it would real ones). Workers listen on loopback. Real sockets and
Ray's own processes cannot run on trio's mock clock: every wait is bounded by a
`trio.fail_after` (or Ray's own timeout), so a hang fails instead of stalling CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from _extras import importorskip
from _paths import child_pythonpath
from remote_kernels import ADD, INC, SLEEPY, XOR

import actorgraph as ag
from actorgraph import remote

ray = importorskip("ray")
cluster_utils = importorskip("ray.cluster_utils")
agray = pytest.importorskip("actorgraph.ray")

GUARD = 30  # seconds: a hang guard only
LOOPBACK = "127.0.0.1"
MB = 1 << 20
NODE = {"object_store_memory": 80 * MB, "num_cpus": 1}  # small: CI has 2 cores, 24 GiB


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    # Worker actors import the tests' kernel module: their processes inherit this.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = child_pythonpath()
    started = None
    try:
        try:
            started = cluster_utils.Cluster(
                initialize_head=True, head_node_args=dict(NODE, include_dashboard=False)
            )
            started.node_a = started.add_node(**NODE, resources={"ag_worker": 1, "node_a": 1})
            started.node_b = started.add_node(
                **NODE, num_gpus=2, resources={"ag_worker": 1, "node_b": 1}
            )
            ray.init(address=started.address, log_to_driver=False)
        except Exception as exc:  # noqa: BLE001 - the reason goes into the skip
            if started is not None:
                started.shutdown()
            pytest.skip(f"Ray cannot start a local cluster here: {type(exc).__name__}: {exc}")
        yield started
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if started is not None:
            started.shutdown()  # every raylet and GCS of the cluster goes with it
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="module")
def workers(cluster: Any) -> Iterator[Any]:
    """One worker on each node with an `ag_worker` resource (A and B), two CPU devices each."""
    started = agray.start_workers(
        ["CPU:0", "CPU:1"],
        resources={"ag_worker": 1},
        num_cpus=0,
        kernels=["remote_kernels"],
        host=LOOPBACK,
        timeout=GUARD,
    )
    yield started
    started.stop()


def on_node(workers: Any, node: Any) -> Any:
    found = [w for w in workers.workers if w.node_id == node.node_id]
    assert len(found) == 1, f"expected one worker on node {node.node_id}: {workers.workers}"
    return found[0]


# -- a graph across the client and two nodes --


async def test_graph_across_client_and_two_nodes_equals_numpy(cluster: Any, workers: Any) -> None:
    a, b = on_node(workers, cluster.node_a), on_node(workers, cluster.node_b)
    a0, a1 = a.devices
    b0 = b.devices[0]
    n = 257
    with trio.fail_after(GUARD):
        async with workers.open_runtime(["CPU:0"]) as rt:
            x, out, final = (rt.alloc("CPU:0", n, np.int32) for _ in range(3))
            xa, ia = rt.alloc(a0, n, np.int32), rt.alloc(a0, n, np.int32)
            ja, ka = rt.alloc(a1, n, np.int32), rt.alloc(a1, n, np.int32)
            xb, yb, zb = (rt.alloc(b0, n, np.int32) for _ in range(3))
            items = [
                ag.Copy(dst=xa, src=x),  # client -> node A
                ag.Launch(INC, [ia, xa]),
                ag.Copy(dst=ja, src=ia),  # between two devices of one worker
                ag.Launch(ADD, [ka, ja, ja]),
                ag.Copy(dst=xb, src=ka),  # node A -> node B, worker to worker
                ag.Copy(dst=yb, src=x),  # client -> node B
                ag.Launch(XOR, [zb, xb, yb]),
                ag.Copy(dst=out, src=zb),  # node B -> client
                ag.Launch(INC, [final, out]),  # and on the client's own CPU
            ]
            graph = await rt.compile(items, inputs=[x])
            rng = np.random.default_rng(17)
            for _ in range(5):
                host = rng.integers(-(1 << 20), 1 << 20, n, dtype=np.int32)
                await rt.copyin(x, host)
                await graph([x])
                expected = (((host + 1) * 2) ^ host) + 1
                np.testing.assert_array_equal(await rt.copyout(final), expected)
            assert rt.device(b0).connection.statistics().batches_sent > 0


# -- placement --


def test_placement_follows_the_resources_asked_for(cluster: Any, workers: Any) -> None:
    # "node": one worker on every node that has `ag_worker`, none on the head.
    assert {w.node_id for w in workers.workers} == {cluster.node_a.node_id, cluster.node_b.node_id}
    assert len({w.port for w in workers.workers}) == 2
    assert all(w.host == LOOPBACK and len(w.devices) == 2 for w in workers.workers)
    assert workers.devices == tuple(d for w in workers.workers for d in w.devices)

    # A count: two workers that each ask for half of node B's `node_b`.
    with agray.start_workers(
        placement=2, resources={"node_b": 0.5}, num_cpus=0, host=LOOPBACK, timeout=GUARD
    ) as pair:
        assert [w.node_id for w in pair.workers] == [cluster.node_b.node_id] * 2
        assert pair.statistics() == agray.RayWorkersStatistics(
            workers=2, alive=2, lost=(), runtimes=0, stopped=False
        )

    # "gpu": one worker per GPU; node B has the only two, each worker gets its own.
    gpus = agray.start_workers(["CPU:0"], placement="gpu", num_cpus=0, host=LOOPBACK, timeout=GUARD)
    try:
        assert [w.node_id for w in gpus.workers] == [cluster.node_b.node_id] * 2
        assert sorted(g for w in gpus.workers for g in w.gpu_ids) == ["0", "1"]
    finally:
        gpus.stop()
    assert gpus.statistics().stopped and pair.statistics().stopped


# -- isolation --


async def test_a_second_runtime_does_not_see_the_first_ones_buffers(workers: Any) -> None:
    name = workers.devices[0]
    with trio.fail_after(GUARD):
        async with workers.open_runtime() as first, workers.open_runtime() as second:
            mine = first.alloc(name, 16, np.int32)
            await first.copyin(mine, np.full(16, 7, np.int32))
            theirs = second.alloc(name, 16, np.int32)
            # The same allocation number, each in its own session on the worker.
            assert theirs.memory.handle == mine.memory.handle
            np.testing.assert_array_equal(await second.copyout(theirs), np.zeros(16))
            await second.copyin(theirs, np.full(16, 9, np.int32))
            np.testing.assert_array_equal(await first.copyout(mine), np.full(16, 7))
            assert workers.statistics().runtimes == 2
    assert workers.statistics().runtimes == 0


async def test_each_set_of_workers_has_its_own_token(workers: Any) -> None:
    async with agray.open_workers(
        placement=1, resources={"node_a": 0.5}, num_cpus=0, host=LOOPBACK, timeout=GUARD
    ) as other:
        with trio.fail_after(GUARD):
            with pytest.raises(remote.RemoteConnectionError, match="authentication failed"):
                async with ag.open_runtime(list(other.devices), **workers.runtime_options()):
                    pass
            async with (
                ag.open_runtime(list(other.devices), **other.runtime_options()) as plain,
                other.open_runtime() as told,
            ):
                x, y = plain.alloc(other.devices[0], 4, np.int32), told.alloc(other.devices[0], 4)
                await plain.copyin(x, np.arange(4, dtype=np.int32))
                np.testing.assert_array_equal(await plain.copyout(x), np.arange(4))
                # Stopping the workers closes their devices in the runtimes still open.
                await trio.to_thread.run_sync(other.stop)
                with pytest.raises(ag.ClosedError, match="did not complete"):
                    await plain.copyout(x)
                with pytest.raises(ag.ClosedError, match="did not complete"):
                    await told.copyout(y)
        assert "token" not in repr(other) and other.statistics().stopped
    # Leaving open_workers stops them again: nothing to do, no error.


async def test_workers_that_speak_tls(cluster: Any, tmp_path: Any) -> None:
    # The handle passes the certificate and key to every worker and the CA to its
    # runtimes: data between the client and the workers, and between the workers (a
    # TLS worker refuses a link that is not), goes over TLS; the token is kept.
    trustme = importorskip("trustme")  # the TLS test makes its certificates with it
    ca = trustme.CA()
    leaf = ca.issue_cert(LOOPBACK)
    cert, key, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    with pytest.raises(ag.UsageError, match=r"both tls_cert= and tls_key="):
        agray.start_workers(tls_cert=cert)
    async with agray.open_workers(
        placement=2,
        resources={"node_a": 0.25},
        num_cpus=0,
        kernels=["remote_kernels"],
        host=LOOPBACK,
        timeout=GUARD,
        tls_cert=cert,
        tls_key=key,
        tls_ca=ca_file,
    ) as tls_workers:
        assert tls_workers.runtime_options()["remote_tls_ca"] == str(ca_file)
        with pytest.raises(ag.UsageError, match=r"remote_tls_ca= is not for a runtime on Ray"):
            tls_workers.open_runtime(remote_tls_ca=ca_file)
        a0, b0 = tls_workers.workers[0].devices[0], tls_workers.workers[1].devices[0]
        with trio.fail_after(GUARD):
            async with tls_workers.open_runtime() as rt:
                assert rt.device(a0).connection.statistics().tls
                x, y = rt.alloc(a0, 64, np.int32), rt.alloc(b0, 64, np.int32)
                await rt.copyin(x, np.arange(64, dtype=np.int32))
                await rt.run([ag.Launch(INC, [x, x]), ag.Copy(dst=y, src=x)])
                np.testing.assert_array_equal(await rt.copyout(y), np.arange(64) + 1)
            # Without the CA, a client is told the workers speak TLS.
            with pytest.raises(remote.RemoteConnectionError, match=r"this worker speaks TLS"):
                token = tls_workers.runtime_options()["remote_token"]
                async with ag.open_runtime([a0], remote_token=token):
                    pass


# -- lifecycle --


async def test_workers_serve_tinygrads_ag_devices(cluster: Any) -> None:
    """Workers started with allow_programs=True are tinygrad's AG devices: a jit's
    data-parallel step over this host and workers on two nodes equals tinygrad's local
    one."""
    pytest.importorskip(
        "tinygrad", reason='needs the tinygrad extra: pip install -e ".[test,tinygrad]"'
    )
    from actorgraph import tinygrad as agt

    if agt.TINYGRAD_VERSION != "0.14.0":
        pytest.skip("AG devices need tinygrad 0.14.0; 0.11 keeps its own REMOTE device")
    from actorgraph.worker._machine_code import loader_problem

    if loader_problem() is not None:
        pytest.skip(f"workers cannot load shipped programs here: {loader_problem()}")
    from tinygrad import Device, Tensor, TinyJit

    started = await trio.to_thread.run_sync(
        lambda: agray.start_workers(
            placement=2,
            strategy="STRICT_SPREAD",
            num_cpus=0.1,
            host=LOOPBACK,
            timeout=GUARD,
            allow_programs=True,
        )
    )
    names = [worker.devices[0] for worker in started.workers]
    agt.install(devices=2, remote=names, **started.runtime_options())
    try:

        def step_on(devices: tuple[str, ...]) -> Any:
            w = Tensor(np.linspace(-1, 1, 16 * 8, dtype=np.float32).reshape(16, 8))
            w = w.shard(devices).realize()

            @TinyJit
            def step(x: Any) -> Any:
                return (x.shard(devices, axis=0) @ w).relu().sum(axis=0).realize()

            return step

        mixed, local = step_on(("CPU", "AG", "AG:1")), step_on(("CPU", "CPU:1", "CPU:2"))
        rng = np.random.default_rng(5)
        for _ in range(4):
            x = rng.standard_normal((6, 16), dtype=np.float32)
            got = mixed(Tensor(x))
            with trio.fail_after(GUARD):  # the wait on the workers, off tinygrad's thread
                await trio.to_thread.run_sync(Device["AG"].synchronize, abandon_on_cancel=True)
            assert got.numpy().tobytes() == local(Tensor(x)).numpy().tobytes()
        assert agt.statistics().replays >= 2
    finally:
        agt.uninstall()
        await trio.to_thread.run_sync(started.stop)


async def test_killing_a_worker_mid_replay(cluster: Any) -> None:
    doomed = await trio.to_thread.run_sync(
        lambda: agray.start_workers(
            placement=1,
            resources={"node_a": 0.5},
            num_cpus=0,
            kernels=["remote_kernels"],
            host=LOOPBACK,
            timeout=GUARD,
        )
    )
    (remote,) = doomed.devices
    # deadlock_check: a long kernel on a worker is not progress the monitor can see yet.
    async with doomed.open_runtime(["CPU:0"], stop_workers=True, deadlock_check=3600) as rt:
        x = rt.alloc(remote, 8, np.int32)
        y, z = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
        graph = await rt.compile([ag.Launch(SLEEPY, [x, x]), ag.Copy(dst=y, src=x)])
        errors: list[BaseException] = []

        async def replay() -> None:
            try:
                await graph()
            except ag.ActorGraphError as exc:
                errors.append(exc)

        with trio.fail_after(10):  # "within seconds": the kernel alone would take 30
            async with trio.open_nursery() as nursery:
                nursery.start_soon(replay)
                await trio.testing.wait_all_tasks_blocked()  # the batch is on the wire
                ray.kill(doomed.actors[0])
        assert len(errors) == 1 and isinstance(errors[0], ag.ClosedError), errors
        assert "did not complete" in str(errors[0])
        with trio.fail_after(GUARD):
            # Local devices go on working; the dead worker's devices stay closed.
            await rt.copyin(z, np.arange(8, dtype=np.int32))
            await rt.run([ag.Launch(INC, [z, z]), ag.Copy(dst=y, src=z)])
            np.testing.assert_array_equal(await rt.copyout(y), np.arange(8) + 1)
            with pytest.raises(ag.ClosedError, match="did not complete"):
                await rt.run([ag.Launch(INC, [x, x])])
            with pytest.raises(ag.ClosedError, match=f"alloc on {remote}"):
                rt.alloc(remote, 8, np.int32)
            lost = await trio.to_thread.run_sync(doomed.wait_lost, GUARD)
        assert lost == ((doomed.workers[0].address, lost[0][1]),)
        assert "ActorDiedError" in lost[0][1]
    assert doomed.statistics().stopped  # stop_workers=True: the runtime owned them
    with pytest.raises(agray.RayWorkerError, match="were stopped"):
        doomed.open_runtime()


async def test_losing_a_node(cluster: Any) -> None:
    # Ray starts and stops nodes from the main thread only (it installs signal handlers).
    node = cluster.add_node(**NODE, resources={"node_c": 1})
    doomed = await trio.to_thread.run_sync(
        lambda: agray.start_workers(
            placement=1, resources={"node_c": 1}, num_cpus=0, host=LOOPBACK, timeout=GUARD
        )
    )
    (remote,) = doomed.devices
    try:
        with trio.fail_after(GUARD):
            async with doomed.open_runtime(["CPU:0"]) as rt:
                x = rt.alloc(remote, 8, np.int32)
                await rt.copyin(x, np.arange(8, dtype=np.int32))
                cluster.remove_node(node)  # its raylet and every process on it are killed
                with pytest.raises(ag.ClosedError, match="did not complete"):
                    with trio.fail_after(10):  # the node's processes are gone: seconds at most
                        await rt.copyout(x)
                local = rt.alloc("CPU:0", 8, np.int32)
                await rt.copyin(local, np.arange(8, dtype=np.int32))
                np.testing.assert_array_equal(await rt.copyout(local), np.arange(8))
    finally:
        await trio.to_thread.run_sync(doomed.stop)


def test_start_runtime_from_synchronous_code(workers: Any) -> None:
    name = workers.devices[-1]
    with workers.start_runtime(["CPU:0"]) as rt:
        assert isinstance(rt, agray.RayBackgroundRuntime) and rt.workers is workers
        x = rt.alloc(name, 32, np.int32)
        y = rt.alloc("CPU:0", 32, np.int32)
        rt.copyin(x, np.arange(32, dtype=np.int32)).result(GUARD)
        rt.run([ag.Launch(INC, [x, x]), ag.Copy(dst=y, src=x)]).result(GUARD)
        np.testing.assert_array_equal(rt.copyout(y).result(GUARD), np.arange(32) + 1)
    assert not workers.statistics().stopped  # not owned: the workers outlive it


# -- bad requests --


def test_bad_requests_are_refused_clearly(
    cluster: Any, workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ag.UsageError, match=r"placement='rack': use 'node'"):
        agray.start_workers(placement="rack")
    with pytest.raises(ag.UsageError, match=r"placement=0"):
        agray.start_workers(placement=0)
    with pytest.raises(ag.UsageError, match=r"devices is a list of names"):
        agray.start_workers("CPU:0")
    with pytest.raises(ag.UsageError, match=r"'CPU:0@h:1' is not a device name"):
        agray.start_workers(["CPU:0@h:1"])
    with pytest.raises(ag.UsageError, match=r"must ask Ray for some resource"):
        agray.start_workers(num_cpus=0)
    with pytest.raises(ag.UsageError, match=r"use num_cpus= / num_gpus= for CPU"):
        agray.start_workers(resources={"CPU": 1})
    with pytest.raises(agray.RayWorkerError, match=r"no node of the Ray cluster can hold"):
        agray.start_workers(resources={"nowhere": 1}, num_cpus=0, host=LOOPBACK)
    with pytest.raises(agray.RayWorkerError, match=r"could not place 3 workers"):
        agray.start_workers(
            placement=3, resources={"node_a": 1}, num_cpus=0, timeout=1, host=LOOPBACK
        )
    with pytest.raises(
        agray.RayWorkerError, match=r"could not start: UsageError: kernel module 'no_such_kernels'"
    ):
        agray.start_workers(
            placement=1,
            resources={"node_a": 0.5},
            num_cpus=0,
            kernels=["no_such_kernels"],
            host=LOOPBACK,
            timeout=GUARD,
        )
    with pytest.raises(ag.UsageError, match=r"remote_token= is not for a runtime on Ray"):
        workers.start_runtime(remote_token=b"x")
    with pytest.raises(ag.UsageError, match=r"names a remote device"):
        workers.start_runtime([workers.devices[0]])
    for call in ("start_runtime", "open_runtime"):
        with pytest.raises(
            ag.UsageError,
            match=rf"workers\.{call}\(\.\.\.\) got an option 'stop_worker' that neither "
            rf"workers\.{call}\(\.\.\.\) nor open_runtime\(\.\.\.\) takes; did you mean "
            r"'stop_workers'\?",
        ):
            getattr(workers, call)(stop_worker=True)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(ag.UsageError, match=r"Ray is not initialised; call ray.init\(\)"):
        agray.start_workers(host=LOOPBACK)
    # With address=, start_workers joins that cluster itself (here: it is already joined).
    joined: list[object] = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: joined.append(kwargs))
    with pytest.raises(agray.RayWorkerError, match=r"no node"):
        agray.start_workers(
            resources={"nowhere": 1}, num_cpus=0, address=cluster.address, host=LOOPBACK
        )
    assert joined == [{"address": cluster.address}]


def test_importing_actorgraph_does_not_import_ray() -> None:
    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    code = "import sys, actorgraph; print('ray' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=GUARD
    )
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.parametrize("page", ["docs/howto/ray.md", "examples/ray_cluster.py"])
def test_the_documented_example_starts_a_ray_of_its_own_beside_a_running_one(
    cluster: Any, page: str, tmp_path: Any
) -> None:
    # A user may have a Ray cluster running (`ray start`, found through RAY_ADDRESS or as
    # the machine's current cluster); the example says it starts a local Ray of its own
    # (ray.init(num_cpus=2, ...)), so it must, and not join that one.
    from _paths import ROOT
    from test_readme import parse_blocks

    if page.endswith(".py"):
        command = [sys.executable, str(ROOT / page), "--replays", "2"]
        where = ROOT / "examples"
    else:
        text = (ROOT / page).read_text()
        (block,) = [b for b in parse_blocks(text, page) if "ray.init(" in b.source]
        command, where = [sys.executable, "-c", block.source], tmp_path
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), RAY_ADDRESS=cluster.address)
    env["MPLBACKEND"] = "Agg"
    done = subprocess.run(
        command, cwd=where, env=env, capture_output=True, text=True, timeout=GUARD * 4
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_workers_beyond_loopback_speak_tls_unless_told_otherwise() -> None:
    # Checked before Ray is asked for anything: the default host is the node's IP.
    for host in (None, "0.0.0.0"):
        where = "the node's IP" if host is None else host
        with pytest.raises(
            ag.UsageError,
            match=rf"start_workers: refusing to serve {where} over plain TCP: .* or pass "
            r"insecure_plaintext=True on a network you trust",
        ):
            agray.start_workers(["CPU:0"], placement=1, host=host)
