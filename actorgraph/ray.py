"""Workers on a Ray cluster: placed, supervised and found by Ray (the `actorgraph[ray]` extra).

    import ray
    from actorgraph import ray as agray

    ray.init(address="auto")                       # or ray.init() for a local one
    workers = agray.start_workers(devices=["CPU:0"], kernels=["mypkg.kernels"])
    async with workers.open_runtime(["CPU:0"]) as rt:
        ...                                        # workers.devices are remote devices

Ray is the control plane only: it places one actor per worker (by resources and a
placement group: one per node, one per GPU, or a count), keeps it alive, tells us when it
dies and hands the client the workers' addresses and a token made for this set of
workers. The data plane is actorgraph's own wire protocol: each actor runs the worker
server (`actorgraph worker`) on a thread of its own, with its own `trio.run`, listening
on its node's address; the client reaches it as remote devices `KIND:N@HOST:PORT`, one
round trip per replay, copies between workers go worker to worker.

Death is noticed twice: the worker's sockets close with its process (the client's
connection fails every job in flight at once), and a watcher thread holds one pending
call per actor (`watch`), which Ray fails when the actor or its node is lost, even when
no socket says so (a node cut off from the network). Either way the runtimes opened
through the handle close their connection to that worker, so calls on its devices raise
`ag.ClosedError`; local devices and the other workers keep working.

Nothing restarts by itself: a worker actor runs with `max_restarts=0`, because a new
process would have a new port (so new device names) and none of the old buffers; a
runtime keeps the dead worker's devices closed. To go on, stop the handle and start new
workers (a new token comes with them), then open a new runtime.

Nothing of Ray is imported unless this module is.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NamedTuple

import attrs
import trio

from actorgraph.devices import install_hint

from ._background import BackgroundRuntime
from ._errors import ActorGraphError, MissingExtraError, UsageError
from ._options import refuse_unknown
from ._runtime import Runtime, open_runtime
from .devices.remote.tls import TLSSetupError, client_context
from .worker import plaintext_problem

try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as _missing:  # pragma: no cover - depends on what is installed
    raise MissingExtraError(
        f"actorgraph.ray needs Ray ({_missing}); install the ray extra: {install_hint('ray')}"
    ) from None

__all__ = [
    "RayBackgroundRuntime",
    "RayWorker",
    "RayWorkerError",
    "RayWorkers",
    "RayWorkersStatistics",
    "open_workers",
    "start_workers",
]

_LOCAL_NAME = re.compile(r"^[A-Z]+:\d+$")
_PLACEMENTS = ("node", "gpu")


class RayWorkerError(ActorGraphError, RuntimeError):
    """Ray could not place or start a worker, or a started worker was lost."""


@attrs.frozen
class RayWorker:
    """One worker actor: where it runs and the remote device names it serves."""

    node_id: str
    host: str
    port: int
    devices: tuple[str, ...]  # KIND:N@HOST:PORT, as the client names them
    pid: int
    gpu_ids: tuple[str, ...]  # the GPUs Ray gave the actor (CUDA:0 is the first one)

    @property
    def address(self) -> str:
        return f"{_host_part(self.host)}:{self.port}"


@attrs.frozen
class RayWorkersStatistics:
    workers: int
    alive: int
    lost: tuple[tuple[str, str], ...]  # (worker address, why Ray says it went)
    runtimes: int  # runtimes opened through the handle and still open
    stopped: bool


def _host_part(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# -- the actor --


@attrs.frozen
class WorkerTLSFiles:
    """Where each worker finds its certificate, key and (for its links) CA: paths on
    the worker's own node."""

    cert: str
    key: str
    ca: str | None


class WorkerServer:
    """The body of a worker actor: `actorgraph worker` on a thread with its own trio run.

    A thread rather than a child process: the server lives and dies with the actor's
    process, so Ray's view of the actor is the truth about the server (no orphan keeps a
    port open after Ray killed the actor). Ray runs the methods on a small thread pool
    (`max_concurrency`), so `watch` can wait while `stop` is called.
    """

    def __init__(self) -> None:
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self._thread: threading.Thread | None = None
        self._ended = threading.Event()
        self._why = "stopped"

    def start(
        self,
        devices: Sequence[str],
        host: str | None,
        token: bytes,
        kernels: Sequence[str],
        limits: Any,
        tls: WorkerTLSFiles | None = None,
        allow_programs: bool = False,
        insecure_plaintext: bool = False,
    ) -> dict[str, Any] | str:
        """Serve `devices`; the worker's place and address, or why it could not start."""
        bind = host or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        ready: concurrent.futures.Future[tuple[str, int]] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._main,
            args=(list(devices), bind, token, list(kernels), limits, tls, allow_programs),
            kwargs={"insecure_plaintext": insecure_plaintext, "ready": ready},
            name="actorgraph worker",
            daemon=True,
        )
        self._thread.start()
        try:
            bound_host, port = ready.result()
        except Exception as exc:  # noqa: BLE001 - handed to the client as text
            error: BaseException = exc
            while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
                error = error.exceptions[0]  # the one error of the server's nurseries
            return f"{type(error).__name__}: {error}"
        if bound_host in ("0.0.0.0", "::"):
            # The wildcard is no address to connect to: the node's IP is.
            bound_host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": bound_host,
            "port": port,
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        }

    def _main(
        self,
        devices: list[str],
        host: str,
        token: bytes,
        kernels: list[str],
        limits: Any,
        tls: WorkerTLSFiles | None,
        allow_programs: bool,
        *,
        insecure_plaintext: bool,
        ready: concurrent.futures.Future[tuple[str, int]],
    ) -> None:
        from actorgraph.worker import run_worker

        async def serve() -> None:
            self._trio_token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                bound = await nursery.start(
                    lambda task_status: run_worker(
                        devices,
                        host,
                        0,
                        token=token,
                        kernel_modules=kernels,
                        limits=limits,
                        tls_cert=None if tls is None else tls.cert,
                        tls_key=None if tls is None else tls.key,
                        tls_ca=None if tls is None else tls.ca,
                        allow_programs=allow_programs,
                        insecure_plaintext=insecure_plaintext,
                        task_status=task_status,
                    )
                )
                ready.set_result(bound)

        try:
            trio.run(serve)
        except BaseException as exc:  # noqa: BLE001 - reported, never swallowed silently
            if not ready.done():
                ready.set_exception(exc)
            self._why = f"the worker server stopped on {type(exc).__name__}: {exc}"
        finally:
            self._ended.set()

    def watch(self) -> str:
        """Returns when the server has ended (and why); Ray fails it if the actor dies."""
        self._ended.wait()
        return self._why

    def stop(self) -> None:
        token, cancel = self._trio_token, self._cancel
        if token is not None and cancel is not None:
            try:
                token.run_sync_soon(cancel.cancel)
            except trio.RunFinishedError:
                pass
        if self._thread is not None:
            self._thread.join(30)


_WorkerActor = ray.remote(WorkerServer)


# -- the handle --


class RayWorkers:
    """Worker actors started by `start_workers` (or `open_workers`): their device names,
    their token (in memory only), the runtimes opened on them, and a watcher thread."""

    def __init__(
        self,
        workers: Sequence[RayWorker],
        actors: Sequence[Any],
        group: Any,
        token: bytes,
        tls_ca: str | None = None,
    ) -> None:
        self.workers = tuple(workers)
        self._actors = list(actors)
        self._group = group
        self._token = token
        # The client's CA for the workers' certificates: their connections speak TLS.
        self._tls_ca = tls_ca
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._lost: dict[int, str] = {}
        self._hooks: list[Callable[[RayWorker, str], None]] = []
        self._stopping = threading.Event()
        self._stopped = False
        self._watch_refs = {actor.watch.remote(): i for i, actor in enumerate(self._actors)}
        self._watcher = threading.Thread(
            target=self._watch, name="actorgraph ray watcher", daemon=True
        )
        self._watcher.start()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else f"{len(self.workers) - len(self._lost)} alive"
        return f"<RayWorkers {len(self.workers)} workers, {state}: {list(self.devices)}>"

    @property
    def devices(self) -> tuple[str, ...]:
        """Every remote device name of every worker, worker by worker."""
        return tuple(name for worker in self.workers for name in worker.devices)

    @property
    def actors(self) -> tuple[Any, ...]:
        """The Ray actor handles, in the order of `workers` (for Ray's own tools)."""
        return tuple(self._actors)

    def runtime_options(self) -> dict[str, Any]:
        """The options `ag.open_runtime` needs to reach these workers (their token, and
        the CA their certificates are checked against when they speak TLS).

        A runtime opened this way is not told by Ray that a worker died (it still sees the
        connection break); `open_runtime` and `start_runtime` of this handle are.
        """
        self._check_running("runtime_options()")
        return self._options()

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"remote_token": self._token}
        if self._tls_ca is not None:
            options["remote_tls_ca"] = self._tls_ca
        return options

    def statistics(self) -> RayWorkersStatistics:
        with self._lock:
            lost = tuple((self.workers[i].address, why) for i, why in sorted(self._lost.items()))
            return RayWorkersStatistics(
                workers=len(self.workers),
                alive=0 if self._stopped else len(self.workers) - len(lost),
                lost=lost,
                runtimes=len(self._hooks),
                stopped=self._stopped,
            )

    def wait_lost(self, timeout: float | None = None) -> tuple[tuple[str, str], ...]:
        """Block until Ray reports a worker lost (or `timeout` seconds pass); returns
        (address, why) of every lost worker so far."""
        with self._changed:
            self._changed.wait_for(lambda: bool(self._lost) or self._stopped, timeout)
        return self.statistics().lost

    # -- runtimes on these workers --

    def open_runtime(
        self, local: Sequence[str] = (), *, stop_workers: bool = False, **options: Any
    ) -> AbstractAsyncContextManager[Runtime]:
        """`ag.open_runtime(local + workers.devices, ...)` with the workers' token, whose
        connections close as soon as Ray reports a worker lost. With `stop_workers=True`
        leaving the block also stops the workers."""
        self._check_running("open_runtime()")
        refuse_unknown(options, "workers.open_runtime(...)", own=["stop_workers"])
        return self._runtime_block(self._names(local, options), stop_workers, options)

    @asynccontextmanager
    async def _runtime_block(
        self, names: list[str], stop_workers: bool, options: Mapping[str, Any]
    ) -> AsyncIterator[Runtime]:
        try:
            async with open_runtime(names, **self._options(), **options) as runtime:
                hook = _closer(runtime, trio.lowlevel.current_trio_token())
                self._add_hook(hook)
                try:
                    yield runtime
                finally:
                    self._remove_hook(hook)
        finally:
            if stop_workers:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self.stop)

    def start_runtime(
        self, local: Sequence[str] = (), *, stop_workers: bool = False, **options: Any
    ) -> BackgroundRuntime:
        """`ag.start_runtime(local + workers.devices, ...)` (notebooks, synchronous code),
        told by Ray when a worker is lost. With `stop_workers=True`, its `close()` also
        stops the workers."""
        self._check_running("start_runtime()")
        refuse_unknown(options, "workers.start_runtime(...)", own=["stop_workers"])
        names = self._names(local, options)
        return RayBackgroundRuntime(self, names, dict(options, **self._options()), stop_workers)

    def _names(self, local: Sequence[str], options: Mapping[str, Any]) -> list[str]:
        if isinstance(local, str):
            raise UsageError(f"local devices are a list of names, e.g. [{local!r}]; got a string")
        for key in ("remote_token", "remote_token_file", "remote_tls_ca"):
            if key in options:
                raise UsageError(
                    f"{key}= is not for a runtime on Ray workers: their token (and their TLS "
                    f"CA) comes from the handle; leave it out"
                )
        names = [*local, *self.devices]
        for name in local:
            if "@" in str(name):
                raise UsageError(
                    f"local device {name!r} names a remote device; the workers' devices are "
                    f"added for you (workers.devices), pass only this machine's devices"
                )
        return names

    def _add_hook(self, hook: Callable[[RayWorker, str], None]) -> None:
        with self._lock:
            self._hooks.append(hook)
            lost = [(self.workers[i], why) for i, why in self._lost.items()]
        for worker, why in lost:  # lost before this runtime opened: close those at once
            hook(worker, why)

    def _remove_hook(self, hook: Callable[[RayWorker, str], None]) -> None:
        with self._lock:
            if hook in self._hooks:
                self._hooks.remove(hook)

    # -- supervision --

    def _watch(self) -> None:
        pending = dict(self._watch_refs)
        while pending and not self._stopping.is_set():
            try:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            except Exception:  # noqa: BLE001 - Ray itself went away (ray.shutdown())
                return
            for ref in ready:
                index = pending.pop(ref)
                try:
                    why = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    why = _first_line(exc)
                if self._stopping.is_set():
                    return
                self._lose(index, why)

    def _lose(self, index: int, why: str) -> None:
        worker = self.workers[index]
        with self._changed:
            self._lost[index] = why
            hooks = list(self._hooks)
            self._changed.notify_all()
        for hook in hooks:
            hook(worker, why)

    def _check_running(self, what: str) -> None:
        if self._stopped:
            raise RayWorkerError(
                f"{what}: these Ray workers were stopped; start new ones with "
                f"actorgraph.ray.start_workers(...)"
            )

    # -- stopping --

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every worker actor and give back their placement group. Runtimes still
        open on them see their devices closed (`ag.ClosedError`). Idempotent."""
        with self._changed:
            if self._stopped:
                return
            self._stopped = True
            hooks = list(self._hooks)
            self._changed.notify_all()
        self._stopping.set()
        for worker in self.workers:
            for hook in hooks:
                hook(worker, "the Ray workers were stopped (RayWorkers.stop())")
        if not ray.is_initialized():
            # ray.shutdown() came first: this driver's actors and groups ended with it.
            self._watcher.join(timeout)
            return
        refs = [actor.stop.remote() for actor in self._actors]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=timeout)
        finally:
            for actor in self._actors:
                ray.kill(actor, no_restart=True)
            remove_placement_group(self._group)
            self._watcher.join(timeout)

    def __enter__(self) -> RayWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _closer(runtime: Runtime, token: trio.lowlevel.TrioToken) -> Callable[[RayWorker, str], None]:
    """A hook that closes, on the runtime's own thread, its connection to a lost worker."""

    def close_on_runtime_thread(worker: RayWorker, why: str) -> None:
        from actorgraph.devices import RemoteConnectionError

        names = [name for name in worker.devices if name in runtime.devices]
        if not names:
            return
        connection = getattr(runtime.device(names[0]), "connection", None)
        if connection is None or connection.error is not None:
            return  # already lost (its socket said so first), or not a remote device
        error = RemoteConnectionError(
            f"the Ray worker at {worker.address} on node {worker.node_id[:12]} is gone ({why}); "
            f"work on {', '.join(names)} did not complete. Nothing restarts it: start new "
            f"workers and open a new runtime"
        )
        connection.close(error)  # its reader fails every job in flight with that error

    def hook(worker: RayWorker, why: str) -> None:
        try:
            token.run_sync_soon(close_on_runtime_thread, worker, why)
        except trio.RunFinishedError:
            pass  # that runtime is gone already

    return hook


class RayBackgroundRuntime(BackgroundRuntime):
    """A background runtime (`start_runtime`) on Ray workers: told by Ray when a worker is
    lost, and, when it owns them, stopping them on `close()`."""

    def __init__(
        self,
        workers: RayWorkers,
        devices: Sequence[str],
        options: Mapping[str, Any],
        stop_workers: bool,
    ) -> None:
        super().__init__(devices, options)
        self.workers = workers
        self._stop_workers = stop_workers

        async def trio_token() -> trio.lowlevel.TrioToken:
            return trio.lowlevel.current_trio_token()

        self._hook = _closer(self.runtime, self.call(trio_token).result())
        workers._add_hook(self._hook)

    def close(self, timeout: float | None = 10.0) -> None:
        try:
            super().close(timeout)
        finally:
            self.workers._remove_hook(self._hook)
            if self._stop_workers:
                self.workers.stop()


# -- starting workers --


def _bundle(
    placement: str | int,
    num_cpus: float | None,
    num_gpus: float | None,
    resources: Mapping[str, float] | None,
) -> dict[str, float]:
    if placement == "gpu":
        if num_gpus not in (None, 1):
            raise UsageError(
                f"placement='gpu' starts one worker per GPU (num_gpus=1 each); got "
                f"num_gpus={num_gpus}; use a count placement for other shares"
            )
        num_gpus = 1
    bundle: dict[str, float] = {
        "CPU": 1.0 if num_cpus is None else float(num_cpus),
        "GPU": float(num_gpus or 0),
    }
    for key, value in (resources or {}).items():
        if key in ("CPU", "GPU"):
            raise UsageError(f"resources={{{key!r}: ...}}: use num_cpus= / num_gpus= for {key}")
        if not isinstance(value, (int, float)) or value < 0:
            raise UsageError(f"resources[{key!r}] must be a number >= 0, got {value!r}")
        bundle[key] = float(value)
    if any(v < 0 for v in bundle.values()):
        raise UsageError(f"num_cpus and num_gpus must be >= 0, got {bundle}")
    bundle = {k: v for k, v in bundle.items() if v > 0}
    if not bundle:
        raise UsageError(
            "each worker must ask Ray for some resource (num_cpus, num_gpus or resources), "
            "or Ray cannot place it; e.g. num_cpus=1"
        )
    return bundle


def _fits(node: Mapping[str, Any], bundle: Mapping[str, float]) -> int:
    """How many bundles fit in a node's total resources."""
    have = node.get("Resources", {})
    return int(min(have.get(k, 0.0) // v for k, v in bundle.items()))


def _count(placement: str | int, bundle: Mapping[str, float]) -> tuple[int, str]:
    """How many workers, and the placement group strategy that spreads them."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    if placement == "node":
        count = sum(1 for n in nodes if _fits(n, bundle) >= 1)
        what = "node"
        strategy = "STRICT_SPREAD"
    elif placement == "gpu":
        count = sum(_fits(n, bundle) for n in nodes)
        what = "GPU"
        strategy = "SPREAD"
    else:
        return int(placement), "SPREAD"
    if count == 0:
        raise RayWorkerError(
            f"placement={placement!r}: no {what} of the Ray cluster can hold a worker asking "
            f"for {dict(bundle)} (nodes have {[n.get('Resources') for n in nodes]}); ask for "
            f"less, or add nodes that have it"
        )
    return count, strategy


def start_workers(
    devices: Sequence[str] | None = None,
    *,
    placement: str | int = "node",
    kernels: Sequence[str] = (),
    resources: Mapping[str, float] | None = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    host: str | None = None,
    strategy: str | None = None,
    runtime_env: Mapping[str, Any] | None = None,
    limits: Any = None,
    address: str | None = None,
    timeout: float = 120.0,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    allow_programs: bool = False,
    insecure_plaintext: bool = False,
) -> RayWorkers:
    """Start worker actors on the Ray cluster this process is connected to; returns once
    every worker listens.

    devices: what each worker serves (default ["CPU:0"], or ["CUDA:0"] with
    placement="gpu": Ray makes the actor's GPU its CUDA:0).
    placement: "node" (one worker on every node that has the resources asked for),
    "gpu" (one per GPU, each with num_gpus=1), or a count (that many workers).
    kernels: modules whose KERNELS the workers may launch by name; importable on every
    node (installed, or shipped with runtime_env={"py_modules": [...]}).
    resources / num_cpus / num_gpus: what each worker asks Ray for (num_cpus default 1);
    custom resources steer workers to chosen nodes.
    host: the address each worker listens on (default: its node's IP); token-protected.
    strategy: the placement group strategy (default STRICT_SPREAD for "node", else SPREAD).
    address: a cluster to connect to when Ray is not initialised yet (ray.init(address)).
    timeout: seconds to wait for Ray to place and start the workers.
    tls_cert / tls_key: the workers speak TLS (`actorgraph worker --tls-cert --tls-key`),
    with the certificate and key at these paths on each worker's node (each naming its
    node's address); tls_ca: the CA that signed them, at this path here (the runtimes'
    remote_tls_ca) and on every node (the workers' links to each other); by default
    tls_cert itself (workers that share one certificate). The token is kept as well.
    allow_programs: the workers run the compiled CPU programs clients ship (`actorgraph
    worker --allow-programs`: tinygrad's AG devices, `agt.install(remote=workers.devices,
    **workers.runtime_options())`); needs the tinygrad extra on every node, and trusts
    every holder of the token with the workers' processes.
    insecure_plaintext: workers listening beyond loopback without TLS (else refused with
    UsageError: the token does not protect what crosses the network after the
    handshake); only for a cluster network you trust.
    """
    devices = _check_request(devices, placement, kernels)
    tls = _tls_files(tls_cert, tls_key, tls_ca)
    bundle = _bundle(placement, num_cpus, num_gpus, resources)
    problem = plaintext_problem(
        host or "the node's IP", tls is not None, insecure_plaintext, "insecure_plaintext=True"
    )
    if problem is not None:
        raise UsageError(f"start_workers: {problem}")
    if not ray.is_initialized():
        if address is None:
            raise UsageError(
                "start_workers: Ray is not initialised; call ray.init() (a local cluster) or "
                "ray.init(address=...) first, or pass address="
            )
        ray.init(address=address)
    count, default_strategy = _count(placement, bundle)
    strategy = strategy or default_strategy
    group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    actors: list[Any] = []
    try:
        try:
            ray.get(group.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise RayWorkerError(
                f"Ray could not place {count} workers of {dict(bundle)} "
                f"({strategy}) within {timeout:g} s; free resources: "
                f"{ray.available_resources()}"  # type: ignore[no-untyped-call]
            ) from None
        token = secrets.token_hex(32).encode()
        actors.extend(_worker_actors(group, count, bundle, runtime_env))
        started = _Start(
            devices, host, token, list(kernels), limits, tls, allow_programs, insecure_plaintext
        )
        workers = _started(actors, started, timeout)
    except BaseException:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(group)
        raise
    return RayWorkers(workers, actors, group, token, None if tls is None else tls.ca or tls.cert)


def _tls_files(cert: Any, key: Any, ca: Any) -> WorkerTLSFiles | None:
    """The workers' TLS files, checked here before anything starts: both of a
    certificate and its key, and a CA this process can load."""
    if cert is None and key is None:
        if ca is not None:
            raise UsageError("tls_ca= is for workers that speak TLS: add tls_cert= and tls_key=")
        return None
    if cert is None or key is None:
        raise UsageError(
            "workers speak TLS with both tls_cert= and tls_key= (a certificate and its "
            "private key, paths on each worker's node); give both"
        )
    files = WorkerTLSFiles(os.fspath(cert), os.fspath(key), None if ca is None else os.fspath(ca))
    try:
        client_context(files.ca or files.cert, "tls_ca")
    except TLSSetupError as exc:
        raise UsageError(f"start_workers: {exc}") from None
    return files


def _check_request(
    devices: Sequence[str] | None, placement: str | int, kernels: Sequence[str]
) -> list[str]:
    """The devices each worker serves, checked with the placement and kernels asked for."""
    if isinstance(placement, bool) or not (
        placement in _PLACEMENTS or (isinstance(placement, int) and placement >= 1)
    ):
        raise UsageError(
            f"placement={placement!r}: use 'node' (one per node), 'gpu' (one per GPU) or a "
            f"worker count >= 1"
        )
    if devices is None:
        devices = ["CUDA:0"] if placement == "gpu" else ["CPU:0"]
    if isinstance(devices, str):
        raise UsageError(f"devices is a list of names, e.g. [{devices!r}]; got a string")
    devices = list(devices)
    for name in devices:
        if not isinstance(name, str) or not _LOCAL_NAME.match(name):
            raise UsageError(
                f"worker device {name!r} is not a device name like 'CPU:0' or 'CUDA:0' (a "
                f"worker serves devices of its own node)"
            )
    if not devices or len(set(devices)) != len(devices):
        raise UsageError(f"devices={devices}: give each device once, at least one")
    if isinstance(kernels, str):
        raise UsageError(f"kernels is a list of module names, e.g. [{kernels!r}]; got a string")
    return devices


def _worker_actors(
    group: Any, count: int, bundle: Mapping[str, float], runtime_env: Mapping[str, Any] | None
) -> list[Any]:
    """One worker actor per bundle of the placement group."""
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    return [
        _WorkerActor.options(
            num_cpus=bundle.get("CPU", 0),
            num_gpus=bundle.get("GPU", 0),
            resources=custom,
            max_concurrency=4,
            max_restarts=0,
            max_task_retries=0,
            runtime_env=dict(runtime_env) if runtime_env else None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=index
            ),
        ).remote()
        for index in range(count)
    ]


class _Start(NamedTuple):
    """What each worker actor is started with (`_WorkerActor.start`'s arguments)."""

    devices: list[str]
    host: str | None
    token: bytes
    kernels: list[str]
    limits: Any
    tls: WorkerTLSFiles | None
    allow_programs: bool
    insecure_plaintext: bool


def _started(actors: list[Any], start: _Start, timeout: float) -> list[RayWorker]:
    """Start every worker; what each listens on, once all do."""
    devices = start.devices
    try:
        started = ray.get([a.start.remote(*start) for a in actors], timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise RayWorkerError(f"the Ray workers did not start within {timeout:g} s") from None
    except ray.exceptions.RayError as exc:
        raise RayWorkerError(f"a Ray worker actor failed to start: {_first_line(exc)}") from None
    workers = []
    for info in started:
        if isinstance(info, str):
            raise RayWorkerError(f"a worker could not start: {info}")
        prefix = f"@{_host_part(info['host'])}:{info['port']}"
        workers.append(
            RayWorker(
                node_id=info["node_id"],
                host=info["host"],
                port=info["port"],
                devices=tuple(f"{name}{prefix}" for name in devices),
                pid=info["pid"],
                gpu_ids=tuple(info["gpu_ids"]),
            )
        )
    return workers


@asynccontextmanager
async def open_workers(
    devices: Sequence[str] | None = None, **options: Any
) -> AsyncIterator[RayWorkers]:
    """`start_workers(...)` for a trio program: the workers live for the block."""
    workers = await trio.to_thread.run_sync(lambda: start_workers(devices, **options))
    try:
        yield workers
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(workers.stop)
