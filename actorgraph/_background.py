"""A runtime that lives on its own thread: for notebooks and synchronous code.

`async with open_runtime(...)` keeps the actors alive for one block. A notebook cannot
hold a block open across cells: under IPython's `%autoawait trio` each cell is run by a
fresh `trio.run(...)`, so a nursery opened in one cell is gone when the cell ends; under
Jupyter's default asyncio loop there is no trio run at all. `start_runtime([...])` runs
`trio.run` on a daemon thread that holds the runtime open until `close()`, and returns a
handle whose work methods return `Call` objects: awaitable from an asyncio loop (Jupyter's
default), from any trio run (`%autoawait trio`, a script's `trio.run`), or, with
`.result()`, from plain synchronous code. Like a concurrent.futures submission, a call
runs whether or not anyone waits for it, and calls run one after another in the order
they were made (a free too, so work made before it still sees its buffer). A call that
fails while nobody waits for it is logged, and its error is raised by the next call made
on the runtime or by close(): it never vanishes. All work, alloc and free included, runs
on the runtime's thread, so device state (driver contexts, trio objects) stays on one
thread; the one exception is a graph call that runs as one loop of numpy-level calls on
idle CPU queues, which the calling thread runs itself while the runtime's loop is stopped
(`BackgroundRuntime._replay_here`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import trio

from actorgraph.scheduler import DeviceCaps, Plan

from ._await import described
from ._buffer import Buffer
from ._call import Call, Entry
from ._errors import ClosedError, UsageError
from ._graph import Graph
from ._kernel import Item, Kernel
from ._log import logger as _log
from ._options import refuse_unknown
from ._profile import Profile
from ._runtime import Runtime, RuntimeStatistics, open_runtime
from ._vars import Var
from ._window import StallReport

T = TypeVar("T")


class _LoopLock(trio.abc.Instrument):
    """Held by the runtime's thread whenever its trio run runs anything of ours.

    The run lets go of `lock` only while it blocks waiting for I/O (trio's
    before_io_wait .. after_io_wait hooks, around its epoll wait): every task step,
    deadline, cancellation and run_sync_soon callback runs with the lock held.
    Invariant: a thread that holds `lock` sees the run stopped between two task steps,
    with every task parked or waiting to run; it may then read and change what a task
    step of the run could, like one more task step, except trio's own run state (it
    wakes no task: reschedule() works only on the run's thread). `wanted` is set while
    the run waits for the lock, so callers stand back and the run gets it next.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wanted = False
        self._due: list[Callable[[], None]] = []

    def as_it_waits(self, fn: Callable[[], None]) -> None:
        """Call `fn` (on the run's thread) once the run next stops to wait for I/O, just
        before it lets go of `lock`: a result handed to another thread then wakes it as
        this one goes to sleep, not while this one still has steps to run (it would
        take the GIL from them at their next system call)."""
        self._due.append(fn)

    def run_due(self) -> None:
        due, self._due = self._due, []
        for fn in due:
            try:
                fn()
            except Exception:  # (a failing instrument is dropped by trio: never raise)
                _log.exception("handing a result to its caller failed")

    def before_io_wait(self, timeout: float) -> None:
        if self._due:
            self.run_due()
        self.lock.release()

    def after_io_wait(self, timeout: float) -> None:
        if not self.lock.acquire(blocking=False):
            self.wanted = True
            self.lock.acquire()
            self.wanted = False


class BackgroundGraph:
    """A Graph compiled on a background runtime; calling it returns a Call.

    Made by `bg.compile(...)`. The Graph's facts (`last_profile`, `replays`, ...) read
    straight through; `graph.graph` is the Graph itself.
    """

    def __init__(self, owner: BackgroundRuntime, graph: Graph) -> None:
        self._owner = owner
        self.graph = graph

    def __repr__(self) -> str:
        return repr(self.graph).replace("<Graph", "<BackgroundGraph", 1)

    @property
    def plan(self) -> Plan:
        """The Graph's plan (see Graph.plan)."""
        return self.graph.plan

    def statistics(self) -> Any:
        """The Graph's statistics (see Graph.statistics).

        Returns:
            A frozen snapshot of the graph's counts.
        """
        return self.graph.statistics()

    def __call__(
        self,
        inputs: Sequence[Buffer] = (),
        var_vals: Mapping[Var, int] | None = None,
        **options: Any,
    ) -> Call[None]:
        """Replay the graph: `await graph(inputs)` from any loop, or `graph(inputs).result()`.

        A call from plain code with no options, that would run at once as one loop on idle
        CPU queues with no earlier call still queued, runs on the calling thread itself;
        every other call runs on the runtime's thread, in the order calls were made.

        Args:
            inputs: as for Graph.__call__.
            var_vals: as for Graph.__call__.
            **options: Graph.__call__'s keyword options (`profile=`, `after=`, `then=`).

        Returns:
            The Call of the replay; it runs whether or not anyone waits for it.
        """
        graph = self.graph
        if not options:
            done = self._owner._replay_here(graph, inputs, var_vals)
            if done is not None:
                return done
        kwargs = {"var_vals": var_vals, **options}

        def start() -> Any:
            return graph.submit_nowait(inputs, **kwargs)

        return Call(self._owner, graph, (inputs,), kwargs, "graph(...)", start)

    def call_here(
        self, inputs: Sequence[Buffer] = (), var_vals: Mapping[Var, int] | None = None
    ) -> bool:
        """Replay on the calling thread, now, for a caller that waits for its replay anyway.

        It runs where calling the graph would run it here (no call made before it still
        queued, its items inline on idle CPU queues), with no Call made.

        Args:
            inputs: as for Graph.__call__.
            var_vals: as for Graph.__call__.

        Returns:
            True once the replay ran (raising its failure, an ItemError naming the item);
            False, having done nothing, when it must go to the runtime's thread: call the
            graph then.
        """
        return self._owner._call_here(self.graph, inputs, var_vals)

    def __getattr__(self, name: str) -> Any:
        # Read-only facts of the Graph (last_profile, ...) straight from it.
        if name.startswith("_"):
            raise AttributeError(name)
        if name in ("submit", "submit_nowait"):
            # They start a replay in the calling task, which is the runtime's thread's to do.
            raise UsageError(
                f"graph.{name}(...) on a background runtime's graph: calling the graph is "
                f"the submission here, it returns at once and runs in order: write "
                f"`call = graph(inputs)`, then `await call` or `call.result()` when needed"
            )
        return getattr(self.graph, name)

    def aclose(self) -> Call[None]:
        """Close the graph once the replays already submitted are done.

        Returns:
            The Call of the close.
        """
        return Call(self._owner, self.graph.aclose, (), {}, "graph.aclose()")

    async def __aenter__(self) -> BackgroundGraph:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class BackgroundRuntime:
    """A runtime held open on its own thread until `close()`, made by `start_runtime()`.

    Its methods mirror Runtime's and return Calls, awaitable from an asyncio loop (a
    Jupyter cell), from any trio run, or waited for with `.result()` from synchronous
    code. A call runs whether or not anyone waits for it, and calls run one after another
    in the order they were made. `alloc`, `wrap` and `free` return at once. A call that
    fails while nobody waits for it is logged, and its error is raised by the next call
    made on the runtime (which then does not run) or by `close()`. `with
    ag.start_runtime(...) as rt:` closes it at the end of the block.
    """

    def __init__(
        self,
        devices: Sequence[str],
        options: Mapping[str, Any],
        clock: trio.abc.Clock | None = None,
    ) -> None:
        self._clock = clock
        self._runtime: Runtime | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self._crash: BaseException | None = None
        # Invariants (under _lock): _queue holds the submitted calls not yet started, in the
        # order they were made; once _finished is set nothing is queued any more.
        self._lock = threading.Lock()
        self._queue: collections.deque[Entry] = collections.deque()
        # The dispatcher's bell: a byte written to `_bell` wakes the dispatcher where it
        # waits for calls (`_idle`, under _lock: it waits), straight from the run's
        # I/O wait: no run_sync_soon callback, no task woken in between.
        self._bell, self._bell_reader = socket.socketpair()
        self._bell.setblocking(False)
        self._bell_reader.setblocking(False)
        self._idle = False
        # Set while the dispatcher runs a call (on the runtime's thread only): no call
        # may start beside it.
        self._busy = False
        self._closing = False
        self._finished = False
        self._unobserved: list[Entry] = []  # failed while nobody waited for them
        self._loop = _LoopLock()
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._main,
            args=(list(devices), dict(options), ready),
            name=f"actorgraph runtime {','.join(map(str, devices))}",
            daemon=True,
        )
        self._thread.start()
        ready.result()  # raises what opening the runtime raised (bad device names, ...)

    def _main(
        self, devices: list[str], options: dict[str, Any], ready: concurrent.futures.Future[None]
    ) -> None:
        async def serve() -> None:
            async with open_runtime(devices, **options) as runtime:
                with trio.CancelScope() as cancel:
                    self._runtime = runtime
                    self._cancel = cancel
                    self._token = trio.lowlevel.current_trio_token()
                    # From here to the end of the run this thread holds the loop lock
                    # whenever it runs anything (see _LoopLock).
                    self._loop.lock.acquire()
                    trio.lowlevel.add_instrument(self._loop)
                    ready.set_result(None)
                    await self._dispatch()

        try:
            trio.run(serve, clock=self._clock)
        except BaseException as error:  # noqa: BLE001 - handed to the caller, not swallowed
            if not ready.done():
                ready.set_exception(error)
            else:
                self._crash = error
        finally:
            self._loop.run_due()  # (the run may end without waiting for I/O again)
            with self._lock:
                self._finished = True
                left = list(self._queue)
                self._queue.clear()
            for entry in left:
                closed = ClosedError(f"{entry.what}: the background runtime closed before it ran")
                self._fail(entry, closed, report=False)
            self._bell.close()
            self._bell_reader.close()

    async def _dispatch(self) -> None:
        """Run the submitted calls one after another, in the order they were made."""
        while True:
            with self._lock:
                entry = self._queue.popleft() if self._queue else None
                closing = self._closing
                self._idle = entry is None and not closing
            if entry is None:
                if closing:
                    return
                try:
                    await trio.lowlevel.wait_readable(self._bell_reader)
                finally:
                    with self._lock:
                        self._idle = False
                self._drain_bell()
                continue
            if not entry.future.set_running_or_notify_cancel():
                continue
            self._busy = True
            try:
                result = await entry.fn(*entry.args, **entry.kwargs)
            except trio.Cancelled:
                error = ClosedError(
                    f"{entry.what}: the background runtime closed before it finished"
                )
                self._fail(entry, error, report=False)  # close() did it: nothing to report
                raise
            except BaseException as error:
                self._fail(entry, error)
                if not isinstance(error, Exception):
                    raise
            else:
                self._loop.as_it_waits(functools.partial(entry.future.set_result, result))
            finally:
                self._busy = False

    def _start_calls(self) -> None:
        """On the runtime's thread, once per call made: start the calls at the head of
        the queue that can start synchronously (a graph replay), in order, while the
        dispatcher is idle. One that completes at once (a replay on idle queues) is
        answered here, with no task woken; one still running is left at the head for the
        dispatcher to wait for, so calls still run one after another. The dispatcher is
        woken only when a call is left for it."""
        while not self._busy:
            with self._lock:
                entry = self._queue[0] if self._queue else None
            if entry is None or entry.start is None:
                break
            try:
                started = entry.start()
            except trio.WouldBlock:
                break  # it has to wait (a full window, a timeline): the dispatcher's job
            except Exception as error:
                self._take(entry)
                if entry.future.set_running_or_notify_cancel():
                    self._fail(entry, error)
                continue
            self._take(entry)
            if not started.done:
                # The dispatcher waits for it before the next call starts.
                entry.fn, entry.args, entry.kwargs, entry.start = started.wait, (), {}, None
                with self._lock:
                    self._queue.appendleft(entry)
                break
            if not entry.future.set_running_or_notify_cancel():
                continue
            try:
                started.finish()
            except Exception as error:
                self._fail(entry, error)
            else:
                entry.future.set_result(None)
        with self._lock:
            waiting = bool(self._queue) or self._closing
        if waiting:
            self._wake_dispatcher()

    def _take(self, entry: Entry) -> None:
        with self._lock:
            if self._queue and self._queue[0] is entry:
                self._queue.popleft()

    def _fail(self, entry: Entry, error: BaseException, report: bool = True) -> None:
        with self._lock:
            report = report and not entry.observed
            if report:
                self._unobserved.append(entry)
        if report:
            self._warn_unobserved(entry, error)
        if not entry.future.done():
            if entry.future.running() or entry.future.set_running_or_notify_cancel():
                entry.future.set_exception(error)

    @staticmethod
    def _warn_unobserved(entry: Entry, error: BaseException) -> None:
        _log.warning(
            "%s failed while nobody waited for it (%s: %s); the next call on the runtime "
            "or close() raises it",
            entry.what,
            type(error).__name__,
            error,
        )

    def _observe(self, entry: Entry) -> None:
        """Someone waits for this call: its error is theirs, not the next call's."""
        with self._lock:
            entry.observe()
            if entry in self._unobserved:
                self._unobserved.remove(entry)

    def _raise_unobserved(self, what: str) -> None:
        """Raise the error of a call that failed while nobody waited for it (once)."""
        with self._lock:
            failed, self._unobserved = self._unobserved, []
        if not failed:
            return
        for entry in failed:
            entry.observe()
        first = failed[0]
        error = first.future.exception()
        assert error is not None
        more = f" (and {len(failed) - 1} more, logged)" if len(failed) > 1 else ""
        error.add_note(
            f"raised by {what}: {first.what} failed earlier while nobody waited for it{more}; "
            f"the call that raised this did not run"
        )
        raise error

    def _submit(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        what: str,
        start: Callable[[], Any] | None = None,
    ) -> Entry:
        self._check_running(what)
        self._raise_unobserved(what)
        entry = Entry(fn, tuple(args), dict(kwargs), what, start=start)
        with self._lock:
            if self._finished or self._closing:
                raise ClosedError(
                    f"{what}: this background runtime is closing; start a new one with "
                    f"ag.start_runtime([...])"
                )
            self._queue.append(entry)
            ring = start is None and self._idle
        if start is None:
            if ring:  # (a busy dispatcher takes it next without one)
                self._wake_dispatcher()
            return entry
        assert self._token is not None
        try:
            self._token.run_sync_soon(self._start_calls)
        except trio.RunFinishedError:
            pass  # _main's exit fails what is still queued
        return entry

    def _replay_here(
        self, graph: Graph, inputs: Sequence[Buffer], var_vals: Mapping[Var, int] | None
    ) -> Call[None] | None:
        """A graph call from outside the runtime's thread, run right here, in the
        caller's thread, when that is the same as running it on the runtime's thread
        now; None (having done nothing) when it is not: the call then goes there.

        It is the same when, with the loop lock held (the run stopped between task
        steps, see _LoopLock): no call made before it is queued or running (so calls
        still run in the order they were made), and the replay runs as one loop on
        idle CPU queues (`_submitted.run_here`) moving no signal that a task waits on (so it
        wakes no task, which only the runtime's thread may do). Such a replay calls
        only numpy-level kernel bodies and changes plain Python state; the runtime's
        thread, when it next runs, finds it done as if a task step of its own had
        done it. Binding new inputs (lowering CPU items) is plain Python too. The
        caller is never blocked: if the run holds the lock or wants it, the call goes
        to the runtime's thread as usual."""
        if not self._stop_for(graph):
            return None
        try:
            if self._unobserved:
                return None  # the call goes on, so that _submit raises their error
            entry = Entry(graph, (inputs,), {"var_vals": var_vals}, "graph(...)")
            try:
                if not graph.replay_off_thread(inputs, var_vals):
                    return None
            except Exception as error:
                # As a call that fails on the runtime's thread: nobody waits for it
                # yet, so it is the next call's error unless someone asks for it.
                failed: BaseException | None = error
                entry.future.set_running_or_notify_cancel()
                entry.future.set_exception(error)
                self._unobserved.append(entry)
            else:
                failed = None
                entry.future.set_running_or_notify_cancel()
                entry.future.set_result(None)
        finally:
            self._resume()
        if failed is not None:
            self._warn_unobserved(entry, failed)
        return Call.finished(self, entry)

    def _call_here(
        self, graph: Graph, inputs: Sequence[Buffer], var_vals: Mapping[Var, int] | None
    ) -> bool:
        """`_replay_here` for a caller that waits for the replay where it calls: no Call
        is made; True once the replay ran, raising what binding or the replay raised
        (an ItemError for an item's failure), or False having done nothing."""
        if not self._stop_for(graph):
            return False
        try:
            if self._unobserved:
                return False  # the call goes on, so that _submit raises their error
            return graph.replay_off_thread(inputs, var_vals)
        finally:
            self._resume()

    def _stop_for(self, graph: Graph) -> bool:
        """Take the loop lock and this runtime's lock, when a call of `graph` may run on
        the calling thread now: the run not waiting for the loop lock, the graph able
        to run off the runtime's thread, no call queued or running, the runtime open.
        False, holding neither, when it may not; else `_resume()` releases both."""
        loop = self._loop
        if not loop.lock.acquire(blocking=False):
            return False
        if loop.wanted or not graph.runs_off_thread:  # (a graph on other devices than CPU ones)
            loop.lock.release()
            return False
        self._lock.acquire()
        if self._queue or self._busy or self._closing or self._finished:
            self._lock.release()
            loop.lock.release()
            return False
        return True

    def _resume(self) -> None:
        self._lock.release()
        self._loop.lock.release()

    def _wake_dispatcher(self) -> None:
        """Ring the dispatcher's bell (from any thread): it looks at the queue again."""
        try:
            self._bell.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a bell full of rings wakes it all the same; a closed one, nobody

    def _drain_bell(self) -> None:
        try:
            while self._bell_reader.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running"
        return f"<BackgroundRuntime {list(self.devices)} {state}>"

    # -- state --

    @property
    def runtime(self) -> Runtime:
        """The Runtime itself, for code that runs on the runtime's thread (see `call`)."""
        assert self._runtime is not None  # set before __init__ returns
        return self._runtime

    @property
    def devices(self) -> tuple[str, ...]:
        """The names of the devices the runtime opened."""
        return self.runtime.devices

    @property
    def closed(self) -> bool:
        """Whether the runtime's thread has stopped (after `close()`, or a crash)."""
        return not self._thread.is_alive()

    def on_runtime_thread(self) -> bool:
        return threading.get_ident() == self._thread.ident

    def _check_running(self, what: str) -> None:
        if self.closed:
            cause = (
                f" (it stopped on {type(self._crash).__name__}: {self._crash})"
                if self._crash
                else ""
            )
            raise ClosedError(
                f"{what}: this background runtime is closed{cause}; start a new one with "
                f"ag.start_runtime([...])"
            )

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
        """A new zero-filled buffer, at once (Runtime.alloc).

        Args:
            device: the name of an open device.
            shape: how many elements (an int or a tuple), never bytes.
            dtype: the numpy dtype of the elements.

        Returns:
            The Buffer.
        """
        if not self.on_runtime_thread():
            self._raise_unobserved("alloc(...)")
        return self._sync(self.runtime.alloc, device, shape, dtype)

    def wrap(
        self,
        device: str,
        source: Any,
        *,
        nbytes: int | None = None,
        dtype: Any = np.uint8,
        shape: int | tuple[int, ...] | None = None,
    ) -> Buffer:
        """A Buffer over host memory actorgraph did not allocate, at once (Runtime.wrap).

        Args:
            device: the CPU device whose work the memory joins.
            source: an address (with `nbytes=`), or an object exporting host memory.
            nbytes: the size in bytes of the memory at an address.
            dtype: the numpy dtype of the elements.
            shape: the Buffer's shape in elements.

        Returns:
            The Buffer.
        """
        if not self.on_runtime_thread():
            self._raise_unobserved("wrap(...)")
        return self._sync(
            self.runtime.wrap, device, source, nbytes=nbytes, dtype=dtype, shape=shape
        )

    def free(self, buffer: Buffer) -> None:
        """Free `buffer` after the calls made before this one; returns at once.

        Args:
            buffer: a base Buffer of this runtime.

        Raises:
            UsageError: `buffer` is no Buffer, is a view, or belongs to another runtime.
            BufferFreedError: it was freed already.
        """
        if self.on_runtime_thread():
            self.runtime.free(buffer)
            return
        # The cheap checks here, so a plain mistake raises at once; the free itself waits
        # its turn behind the calls made before it, which may still use the buffer.
        if not isinstance(buffer, Buffer):
            raise UsageError(f"free() takes a Buffer, got {described(buffer)}")
        if buffer.is_view:
            raise UsageError(f"free() takes a base buffer; {buffer!r} is a view")
        self.runtime.check_own(buffer, "free: ")
        buffer.check_live("free: ")

        async def free() -> None:
            self.runtime.free(buffer)

        self._submit(free, (), {}, f"free({buffer!r})")

    def free_now(self, buffer: Buffer) -> None:
        """Free `buffer` at once, on the runtime's thread, and return when it is freed:
        for a caller whose calls that use the buffer are all done (its later wraps of
        that memory, on another device say, must see it freed). Raises what
        Runtime.free raises."""
        self._sync(self.runtime.free, buffer)

    def statistics(self) -> RuntimeStatistics:
        """The runtime's statistics (Runtime.statistics), read at once, also after `close()`.

        Returns:
            A frozen snapshot of the runtime's counts.
        """
        return self._read(self.runtime.statistics)

    # Facts of the runtime, read at once (not in call order): on its thread while it
    # runs, directly once it has closed. See Runtime for what each means.

    def _read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if not self.closed:
            try:
                return self._sync(fn, *args, **kwargs)
            except ClosedError:
                self._thread.join()  # it closed meanwhile: its state stays as it was left
        return fn(*args, **kwargs)

    def profile(self, *, clear: bool = False) -> Profile:
        """Every profiled replay so far (Runtime.profile), read at once.

        Args:
            clear: forget the records after reading them.

        Returns:
            The Profile.
        """
        return self._read(self.runtime.profile, clear=clear)

    def actor_names(self) -> tuple[str, ...]:
        return self.runtime.actor_names()

    def owns(self, buffer: Buffer) -> bool:
        """Whether this runtime made `buffer` (Runtime.owns)."""
        return self.runtime.owns(buffer)

    @property
    def in_flight(self) -> int:
        return self._read(lambda: self.runtime.in_flight)

    @property
    def frees_pending(self) -> int:
        return self._read(lambda: self.runtime.frees_pending)

    @property
    def submissions(self) -> int:
        return self._read(lambda: self.runtime.submissions)

    @property
    def replays(self) -> int:
        return self._read(lambda: self.runtime.replays)

    @property
    def replays_done(self) -> int:
        return self._read(lambda: self.runtime.replays_done)

    @property
    def frees(self) -> int:
        return self._read(lambda: self.runtime.frees)

    @property
    def graphs_compiled(self) -> int:
        return self._read(lambda: self.runtime.graphs_compiled)

    @property
    def stalls(self) -> list[StallReport]:
        """A copy of the watchdog's reports so far."""
        return self._read(lambda: list(self.runtime.stalls))

    # Options fixed when the runtime opened, and what it opened.

    @property
    def number(self) -> int:
        return self.runtime.number

    @property
    def caps(self) -> dict[str, DeviceCaps]:
        return dict(self.runtime.caps)

    @property
    def verify_plans(self) -> bool:
        return self.runtime.verify_plans

    @property
    def profiling(self) -> bool:
        return self.runtime.profiling

    @property
    def max_in_flight(self) -> int:
        return self.runtime.max_in_flight

    @property
    def deadlock_check(self) -> float:
        return self.runtime.deadlock_check

    @property
    def watchdog(self) -> float | None:
        return self.runtime.watchdog

    @property
    def check_replays(self) -> int:
        return self.runtime.check_replays

    def current_time(self) -> float:
        """`trio.current_time()` of the runtime's run (its clock: see `start_runtime(clock=)`).

        Under a MockClock with autojump the clock may jump while the runtime idles between
        calls; to time work, read the clock inside a function run by `call()`.

        Returns:
            The runtime's clock, in seconds.
        """
        return self._sync(trio.current_time)

    def copyin(self, buffer: Buffer, array: Any) -> Call[None]:
        """Copy a host array into `buffer`, in order with the calls made before (Runtime.copyin).

        Args:
            buffer: the Buffer to write.
            array: host data of its size.

        Returns:
            The Call; it runs whether or not anyone waits for it.
        """
        return self._call("copyin(...)", self.runtime.copyin, buffer, array)

    def copyout(
        self, buffer: Buffer, out: np.ndarray[Any, Any] | None = None
    ) -> Call[np.ndarray[Any, Any]]:
        """A host copy of `buffer`, in order with the calls made before (Runtime.copyout).

        Args:
            buffer: the Buffer to read.
            out: a numpy array to copy into (as Runtime.copyout takes it).

        Returns:
            The Call, whose result is the numpy array.
        """
        return self._call("copyout(...)", self.runtime.copyout, buffer, out)

    def run(self, items: Sequence[Item], var_vals: Mapping[Any, int] | None = None) -> Call[None]:
        """Run items eagerly, in order with the calls made before (Runtime.run).

        Args:
            items: a list of Launch and Copy items.
            var_vals: the values of the Vars the items read.

        Returns:
            The Call.
        """
        return self._call("run(...)", self.runtime.run, items, var_vals)

    def launch(self, kernel: Kernel, bufs: Sequence[Buffer], **options: Any) -> Call[None]:
        """Launch one kernel, in order with the calls made before (Runtime.launch).

        Args:
            kernel: the Kernel.
            bufs: its buffers, in slot order.
            **options: Runtime.launch's keywords (`vars=`, `fixedvars=`, `global_size=`,
                `local_size=`, `var_vals=`).

        Returns:
            The Call.
        """
        return self._call(f"launch({kernel.name})", self.runtime.launch, kernel, bufs, **options)

    def copy(self, dst: Buffer, src: Buffer) -> Call[None]:
        """Copy `src` into `dst`, in order with the calls made before (Runtime.copy).

        Args:
            dst: the Buffer written.
            src: the Buffer read.

        Returns:
            The Call.
        """
        return self._call("copy(...)", self.runtime.copy, dst, src)

    def compile(
        self, items: Sequence[Item], inputs: Sequence[Buffer] = (), **options: Any
    ) -> Call[BackgroundGraph]:
        """Plan `items` once (Runtime.compile): `graph = await rt.compile(items, inputs)`.

        Args:
            items: a list of Launch and Copy items.
            inputs: the buffers a call may replace.
            **options: Runtime.compile's keywords (`verify=`, `aliasing=`, `order=`,
                `var_vals=`, `max_sizes=`).

        Returns:
            The Call, whose result is a BackgroundGraph.
        """

        async def compile_graph() -> BackgroundGraph:
            graph = await self.runtime.compile(items, inputs, **options)
            return BackgroundGraph(self, graph)

        return self._call("compile(...)", compile_graph)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Call[Any]:
        """Run `await fn(*args, **kwargs)` on the runtime's thread, in order with the other calls.

        For code that needs the Runtime itself (`rt.runtime`), or to time work on the
        runtime's clock.

        Args:
            fn: an async function.
            *args: its positional arguments.
            **kwargs: its keyword arguments.

        Returns:
            The Call, whose result is what `fn` returns.

        Raises:
            UsageError: `fn` is not callable.
        """
        if not callable(fn):
            raise UsageError(f"call() takes an async function, got {fn!r}")
        name = getattr(fn, "__name__", "fn")
        return self._call(f"call({name})", fn, *args, **kwargs)

    # -- closing --

    def close(self, timeout: float | None = 10.0) -> None:
        """Finish the calls already made, then stop the runtime and join its thread.

        Args:
            timeout: seconds to let unfinished calls run before they are cancelled (they
                raise ClosedError then); None waits for them.

        Raises:
            UsageError: called on the runtime's own thread (it would wait for itself).
            Exception: the error of a call that failed while nobody waited for it.
        """
        if self.on_runtime_thread():
            raise UsageError("close() on the runtime's own thread would wait for itself")
        with self._lock:
            self._closing = True
        if self._token is not None:
            self._wake_dispatcher()
            try:
                self._thread.join(timeout)
                if self._thread.is_alive():
                    _log.warning("close(): calls still running after %ss are cancelled", timeout)
                    self._token.run_sync_soon(self._cancel_all)
            except trio.RunFinishedError:
                pass
        self._thread.join()
        self._raise_unobserved("close()")

    def _cancel_all(self) -> None:
        if self._cancel is not None:
            self._cancel.cancel()

    def __enter__(self) -> BackgroundRuntime:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the block's own error goes on; this one is logged
            _log.warning("close() after an error in the with block also failed", exc_info=True)


def start_runtime(
    devices: Sequence[str], *, clock: trio.abc.Clock | None = None, **options: Any
) -> BackgroundRuntime:
    """Open a runtime on a background thread that lives until `close()`.

    Use it where an `async with` block cannot span the work: notebooks (await its calls
    from any cell) and synchronous scripts (`.result()`).

    Args:
        devices: device names, as for open_runtime.
        clock: the clock of the thread's trio run (say
            `trio.testing.MockClock(autojump_threshold=0)`, so SIM devices take no wall
            time).
        **options: open_runtime's options.

    Returns:
        The BackgroundRuntime, open.

    Raises:
        UsageError: an option that neither start_runtime nor open_runtime takes (the
            message names the closest one), or what open_runtime refuses.
        DeviceError: a device that cannot open.
    """
    refuse_unknown(options, "start_runtime(...)", own=["clock"])
    return BackgroundRuntime(devices, options, clock)


def forward_target(args: Sequence[Any], kwargs: Mapping[str, Any]) -> BackgroundRuntime | None:
    """The background runtime among these arguments, when the caller is not on its thread."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, BackgroundRuntime) and not value.on_runtime_thread():
            return value
    return None
