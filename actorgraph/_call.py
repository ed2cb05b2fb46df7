"""A background runtime's calls: `Call`, the handle of one piece of work made from any
thread (awaitable from asyncio or trio, or `.result()` from plain code), and `Entry`, the
submitted work the runtime's thread runs in order (see _background.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import attrs
import sniffio
import trio

from ._await import GRAPH_NAMES
from ._errors import UsageError

T = TypeVar("T")


class Owner(Protocol):
    """What a Call needs of the background runtime it is made on (a BackgroundRuntime)."""

    def on_runtime_thread(self) -> bool: ...

    def _submit(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        what: str,
        start: Callable[[], Any] | None = None,
    ) -> Entry: ...

    def _observe(self, entry: Entry) -> None: ...


class Call(Generic[T]):
    """One piece of work for a background runtime: `await call`, or `call.result()`.

    A background runtime's methods return one. Made outside the runtime's thread, a Call
    is submitted at once, like a concurrent.futures submission: it runs after every call
    made before it, whether or not anyone waits for it. Made on the runtime's thread
    (inside a function given to `call()`), it is plain async code there and runs when
    awaited. Awaiting works under asyncio (a Jupyter cell) and trio.
    """

    def __init__(
        self,
        owner: Owner,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        what: str,
        start: Callable[[], Any] | None = None,
    ) -> None:
        self._owner = owner
        self._fn = fn
        self._args = tuple(args)
        self._kwargs = dict(kwargs)
        self._what = what
        self._start = start
        self._entry: Entry | None = None
        self._lazy = owner.on_runtime_thread()  # made there: runs when awaited
        self._awaited = False
        if not self._lazy:
            self._entry = owner._submit(fn, self._args, self._kwargs, what, start)

    @classmethod
    def finished(cls, owner: Owner, entry: Entry) -> Call[Any]:
        """A Call for work that already ran where it was made (`entry.future` is done)."""
        call: Call[Any] = cls.__new__(cls)
        call._owner = owner
        call._fn, call._args, call._kwargs = entry.fn, entry.args, entry.kwargs
        call._what, call._start, call._entry = entry.what, None, entry
        call._lazy = call._awaited = False
        return call

    def __repr__(self) -> str:
        state = "not started" if self._entry is None else self._entry.future._state.lower()
        return f"<Call {self._what} {state}>"

    def __del__(self) -> None:
        if self._lazy and self._entry is None and not self._awaited:
            warnings.warn(
                f"{self._what} was made on the runtime's thread and never awaited, so it "
                f"never ran; write `await {self._what}`",
                RuntimeWarning,
                stacklevel=2,
            )

    def _submitted(self) -> Entry:
        if self._entry is None:  # made on the runtime's thread, now waited for elsewhere
            self._awaited = True
            self._entry = self._owner._submit(
                self._fn, self._args, self._kwargs, self._what, self._start
            )
        self._owner._observe(self._entry)
        return self._entry

    def _forgot(self, use: str) -> UsageError:
        return UsageError(
            f"{use} on {self._what} itself, which is a Call, not its result: write "
            f"`x = await {self._what}` in async code or `x = {self._what}.result()` in "
            f"plain code, then use x"
        )

    def __aenter__(self) -> Any:
        raise UsageError(
            f"`async with {self._what}` needs its result, so wait for the call first: write "
            f"`async with await {self._what} as graph:`"
        )

    def __aexit__(self, *exc: object) -> Any:  # pragma: no cover - __aenter__ always raises
        return None

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._forgot("reading it as an array")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._forgot("calling it")

    def __getattr__(self, name: str) -> Any:
        if name in GRAPH_NAMES:
            raise self._forgot(f".{name}")
        raise AttributeError(f"{self!r} has no attribute {name!r}")

    def done(self) -> bool:
        """Whether the work has finished (or failed).

        Returns:
            True once the work's result or error is there.
        """
        return self._entry is not None and self._entry.future.done()

    def result(self, timeout: float | None = None) -> T:
        """Block this thread until the work is done; return its result or raise its error.

        Args:
            timeout: the most seconds to wait (None: as long as it takes).

        Returns:
            The work's result.

        Raises:
            UsageError: called on the runtime's own thread, where it would wait for itself
                (use `await` there).
            TimeoutError: the work was not done within `timeout` seconds.
            Exception: whatever the work raised.
        """
        if self._owner.on_runtime_thread():
            self._awaited = True  # reported here; no second word from __del__
            raise UsageError(
                f"{self._what}.result() on the runtime's own thread would wait for itself; "
                f"use `await` there"
            )
        result: T = self._submitted().future.result(timeout)
        return result

    def __await__(self) -> Generator[Any, None, T]:
        if self._owner.on_runtime_thread():
            if self._entry is None:
                # Code running on the runtime (a function passed to call()): no hop at all.
                self._awaited = True
                result: T = yield from self._fn(*self._args, **self._kwargs).__await__()
                return result
            self._owner._observe(self._entry)
            if not self._entry.future.done():
                raise UsageError(
                    f"await {self._what} on the runtime's thread: it was made outside and "
                    f"runs after the call now running, so this would wait for itself; await "
                    f"it where it was made"
                )
            return self._entry.future.result()  # type: ignore[no-any-return]
        try:
            library = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            library = ""
        if library == "asyncio":
            got: T = yield from asyncio.wrap_future(self._submitted().future).__await__()
            return got
        if library == "trio":
            return (yield from self._wait_trio().__await__())
        raise UsageError(
            f"await {self._what}: awaiting works under asyncio or trio (got "
            f"{library or 'no async library'}); from synchronous code use .result()"
        )

    async def _wait_trio(self) -> T:
        # Another trio run (e.g. one notebook cell under %autoawait trio): park on an event
        # the runtime thread sets through this run's token.
        future = self._submitted().future
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def wake(_: object) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass  # the waiting run gave up (cancelled) and ended

        future.add_done_callback(wake)
        await done.wait()
        result: T = future.result()
        return result


@attrs.define(eq=False)
class Entry:
    """A submitted call: what to run, its future, and whether anyone has asked for it.

    `start`, where given, begins the same work synchronously and returns something with
    `done` and `wait()` (a graph's Replay), or raises trio.WouldBlock when it cannot
    begin without waiting; `finish` then raises the work's failure, if any."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    what: str
    future: concurrent.futures.Future[Any] = attrs.field(factory=concurrent.futures.Future)
    observed: bool = False
    start: Callable[[], Any] | None = None

    def observe(self) -> None:
        """Someone waits for this call (or was told of its failure): its error is theirs."""
        self.observed = True
