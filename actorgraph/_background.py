"""A runtime that lives on its own thread: for notebooks and synchronous code.

`async with open_runtime(...)` keeps the actors alive for one block. A notebook cannot
hold a block open across cells: under IPython's `%autoawait trio` each cell is run by a
fresh `trio.run(...)`, so a nursery opened in one cell is gone when the cell ends; under
Jupyter's default asyncio loop there is no trio run at all. `start_runtime([...])` runs
`trio.run` on a daemon thread that holds the runtime open until `close()`, and returns a
handle whose work methods return `Call` objects: awaitable from an asyncio loop (Jupyter's
default), from any trio run (`%autoawait trio`, a script's `trio.run`), or, with
`.result()`, from plain synchronous code. Nothing runs until a Call is awaited or
`.result()` is asked for. All work, alloc and free included, runs on the runtime's thread,
so device state (driver contexts, trio objects) stays on one thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import sniffio
import trio

from actorgraph.scheduler import Plan

from ._buffer import Buffer
from ._errors import ClosedError, UsageError
from ._graph import Graph
from ._kernel import Item, Kernel
from ._runtime import Runtime, RuntimeStatistics, open_runtime
from ._vars import Var

T = TypeVar("T")


class Call(Generic[T]):
    """One piece of work for a background runtime: `await call` or `call.result()`."""

    def __init__(
        self, owner: BackgroundRuntime, fn: Callable[..., Any], args: Sequence[Any],
        kwargs: Mapping[str, Any], what: str,
    ) -> None:
        self._owner = owner
        self._fn = fn
        self._args = tuple(args)
        self._kwargs = dict(kwargs)
        self._what = what
        self._future: concurrent.futures.Future[T] | None = None

    def __repr__(self) -> str:
        state = "not started" if self._future is None else self._future._state.lower()
        return f"<Call {self._what} {state}>"

    def _submit(self) -> concurrent.futures.Future[T]:
        if self._future is None:
            self._future = self._owner._spawn(self._fn, self._args, self._kwargs, self._what)
        return self._future

    def result(self, timeout: float | None = None) -> T:
        """Run the work (if not started) and block this thread until it is done."""
        if self._owner.on_runtime_thread():
            raise UsageError(
                f"{self._what}.result() on the runtime's own thread would wait for itself; "
                f"use `await` there"
            )
        return self._submit().result(timeout)

    def __await__(self) -> Generator[Any, None, T]:
        if self._owner.on_runtime_thread():
            # Code running on the runtime (a function passed to call()): no hop at all.
            result: T = yield from self._fn(*self._args, **self._kwargs).__await__()
            return result
        try:
            library = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            library = ""
        if library == "asyncio":
            return (yield from asyncio.wrap_future(self._submit()).__await__())
        if library == "trio":
            return (yield from self._wait_trio().__await__())
        raise UsageError(
            f"await {self._what}: awaiting works under asyncio or trio (got "
            f"{library or 'no async library'}); from synchronous code use .result()"
        )

    async def _wait_trio(self) -> T:
        # Another trio run (e.g. one notebook cell under %autoawait trio): park on an event
        # the runtime thread sets through this run's token.
        future = self._submit()
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def wake(_: object) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass  # the waiting run gave up (cancelled) and ended

        future.add_done_callback(wake)
        await done.wait()
        return future.result()


class BackgroundGraph:
    """A Graph owned by a background runtime; calling it returns a Call."""

    def __init__(self, owner: BackgroundRuntime, graph: Graph) -> None:
        self._owner = owner
        self.graph = graph

    def __repr__(self) -> str:
        return repr(self.graph).replace("<Graph", "<BackgroundGraph", 1)

    @property
    def plan(self) -> Plan:
        return self.graph.plan

    def statistics(self) -> Any:
        return self.graph.statistics()

    def __call__(
        self, inputs: Sequence[Buffer] = (), var_vals: Mapping[Var, int] | None = None,
        **options: Any,
    ) -> Call[None]:
        """`await graph(inputs, var_vals=...)`; options pass through to Graph.__call__."""
        kwargs = {"var_vals": var_vals, **options}
        return Call(self._owner, self.graph, (inputs,), kwargs, "graph(...)")

    def __getattr__(self, name: str) -> Any:
        # Read-only facts of the Graph (last_profile, ...) straight from it.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.graph, name)

    def aclose(self) -> Call[None]:
        return Call(self._owner, self.graph.aclose, (), {}, "graph.aclose()")


class BackgroundRuntime:
    """A runtime held open on its own thread until close(). Made by start_runtime()."""

    def __init__(
        self, devices: Sequence[str], options: Mapping[str, Any], clock: trio.abc.Clock | None = None
    ) -> None:
        self._clock = clock
        self._runtime: Runtime | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._crash: BaseException | None = None
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._main, args=(list(devices), dict(options), ready),
            name=f"actorgraph runtime {','.join(map(str, devices))}", daemon=True,
        )
        self._thread.start()
        ready.result()  # raises what opening the runtime raised (bad device names, ...)

    def _main(
        self, devices: list[str], options: dict[str, Any], ready: concurrent.futures.Future[None]
    ) -> None:
        async def serve() -> None:
            async with open_runtime(devices, **options) as runtime:
                async with trio.open_nursery() as nursery:
                    self._runtime = runtime
                    self._nursery = nursery
                    self._token = trio.lowlevel.current_trio_token()
                    self._stop = trio.Event()
                    ready.set_result(None)
                    await self._stop.wait()
                    nursery.cancel_scope.cancel()

        try:
            trio.run(serve, clock=self._clock)
        except BaseException as error:  # noqa: BLE001 - handed to the caller, not swallowed
            if not ready.done():
                ready.set_exception(error)
            else:
                self._crash = error

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running"
        return f"<BackgroundRuntime {list(self.devices)} {state}>"

    # -- state --

    @property
    def runtime(self) -> Runtime:
        """The Runtime itself, for code that runs on the runtime's thread (see call())."""
        assert self._runtime is not None  # set before __init__ returns
        return self._runtime

    @property
    def devices(self) -> tuple[str, ...]:
        return self.runtime.devices

    @property
    def closed(self) -> bool:
        return not self._thread.is_alive()

    def on_runtime_thread(self) -> bool:
        return threading.get_ident() == self._thread.ident

    def _check_running(self, what: str) -> None:
        if self.closed:
            cause = f" (it stopped on {type(self._crash).__name__}: {self._crash})" if self._crash else ""
            raise ClosedError(
                f"{what}: this background runtime is closed{cause}; start a new one with "
                f"ag.start_runtime([...])"
            )

    def _spawn(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], what: str
    ) -> concurrent.futures.Future[Any]:
        self._check_running(what)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        async def runner() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = await fn(*args, **kwargs)
            except trio.Cancelled:
                future.set_exception(ClosedError(f"{what}: the background runtime closed first"))
                raise
            except BaseException as error:
                future.set_exception(error)
                if not isinstance(error, Exception):
                    raise
            else:
                future.set_result(result)

        def start() -> None:
            assert self._nursery is not None
            try:
                self._nursery.start_soon(runner, name=what)
            except RuntimeError:  # the nursery is closing
                future.set_exception(ClosedError(f"{what}: the background runtime is closing"))

        assert self._token is not None
        try:
            self._token.run_sync_soon(start)
        except trio.RunFinishedError:
            raise ClosedError(f"{what}: this background runtime is closed") from None
        return future

    def _sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a quick synchronous call on the runtime's thread and wait for it here.

        Not trio.from_thread.run_sync: that refuses callers inside another trio run (a
        notebook cell under %autoawait trio), and the wait here is short.
        """
        if self.on_runtime_thread():
            return fn(*args, **kwargs)
        what = getattr(fn, "__name__", "call")
        self._check_running(what)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as error:  # noqa: BLE001 - re-raised in the caller
                future.set_exception(error)

        assert self._token is not None
        try:
            self._token.run_sync_soon(run)
        except trio.RunFinishedError:
            raise ClosedError(f"{what}: this background runtime is closed") from None
        return future.result()

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Call[Any]:
        return Call(self, fn, args, kwargs, what)

    # -- the Runtime's surface --

    def alloc(self, device: str, shape: int | tuple[int, ...], dtype: Any = np.float32) -> Buffer:
        return self._sync(self.runtime.alloc, device, shape, dtype)

    def free(self, buffer: Buffer) -> None:
        self._sync(self.runtime.free, buffer)

    def statistics(self) -> RuntimeStatistics:
        return self._sync(self.runtime.statistics)

    def current_time(self) -> float:
        """trio.current_time() of the runtime's run (its clock: see start_runtime(clock=)).

        Under a MockClock with autojump the clock may jump while the runtime idles between
        calls; to time work, read the clock inside a function run by call().
        """
        return self._sync(trio.current_time)

    def copyin(self, buffer: Buffer, array: Any) -> Call[None]:
        return self._call("copyin(...)", self.runtime.copyin, buffer, array)

    def copyout(self, buffer: Buffer) -> Call[np.ndarray[Any, Any]]:
        return self._call("copyout(...)", self.runtime.copyout, buffer)

    def run(self, items: Sequence[Item], var_vals: Mapping[Any, int] | None = None) -> Call[None]:
        return self._call("run(...)", self.runtime.run, items, var_vals)

    def launch(self, kernel: Kernel, bufs: Sequence[Buffer], **options: Any) -> Call[None]:
        return self._call(f"launch({kernel.name})", self.runtime.launch, kernel, bufs, **options)

    def copy(self, dst: Buffer, src: Buffer) -> Call[None]:
        return self._call("copy(...)", self.runtime.copy, dst, src)

    def compile(
        self, items: Sequence[Item], inputs: Sequence[Buffer] = (), **options: Any
    ) -> Call[BackgroundGraph]:
        """`await rt.compile(items, inputs)`; options pass through to Runtime.compile."""

        async def compile_graph() -> BackgroundGraph:
            graph = await self.runtime.compile(items, inputs, **options)
            return BackgroundGraph(self, graph)

        return self._call("compile(...)", compile_graph)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Call[Any]:
        """Run `await fn(*args, **kwargs)` on the runtime's thread (e.g. a jitted function)."""
        if not callable(fn):
            raise UsageError(f"call() takes an async function, got {fn!r}")
        name = getattr(fn, "__name__", "fn")
        return self._call(f"call({name})", fn, *args, **kwargs)

    # -- closing --

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the runtime (work still in flight is cancelled) and join its thread."""
        if self.on_runtime_thread():
            raise UsageError("close() on the runtime's own thread would wait for itself")
        if self._token is not None and self._stop is not None:
            try:
                self._token.run_sync_soon(self._stop.set)
            except trio.RunFinishedError:
                pass
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_runtime(
    devices: Sequence[str], *, clock: trio.abc.Clock | None = None, **options: Any
) -> BackgroundRuntime:
    """Open a runtime on a background thread that lives until `close()`.

    Takes open_runtime's arguments, plus `clock=` for the thread's trio run (e.g.
    `trio.testing.MockClock(autojump_threshold=0)` so SIM devices take no wall time).
    Use it where an `async with` block cannot span the work: notebooks (await its calls
    from any cell), synchronous scripts (`.result()`).
    """
    return BackgroundRuntime(devices, options, clock)


def forward_target(args: Sequence[Any], kwargs: Mapping[str, Any]) -> BackgroundRuntime | None:
    """The background runtime among these arguments, when the caller is not on its thread."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, BackgroundRuntime) and not value.on_runtime_thread():
            return value
    return None
