"""Forgotten `await`s, said plainly.

An async method called without `await` gives back a coroutine, and Python's own messages
about it ("'coroutine' object has no attribute 'plan'", "does not support the asynchronous
context manager protocol") do not say what to do. `Pending` is the awaitable our async
calls that return something (a Graph) give back instead: awaiting it runs the call, and
every other use of it raises a UsageError that names the call to await. `described()`
words an awaitable (or a `Hinted` object: a Graph) that reached a place expecting a Buffer;
`listed()` takes what a call takes as a list, and says so when one object came instead.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

import numpy as np

from ._buffer import Buffer
from ._errors import UsageError

T = TypeVar("T")

# What a Graph offers: asking a Pending compile for one of these is a forgotten await.
GRAPH_NAMES = frozenset(
    {"plan", "submit", "submit_nowait", "statistics", "aclose", "replays", "last_profile", "inputs"}
)


class Pending(Generic[T]):
    """`await` it for the result (`graph = await rt.compile(...)`); nothing runs until then."""

    __slots__ = ("_fn", "_args", "_kwargs", "_what", "_name", "_awaited", "_said")

    def __init__(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        what: str,
        name: str,
    ) -> None:
        self._fn = fn
        self._args = args
        self._kwargs = kwargs
        self._what = what  # the call as the user wrote it: "rt.compile(...)"
        self._name = name  # what its result is usually called: "graph"
        self._awaited = False
        self._said = False  # a forgotten await was already reported: no word from __del__

    def __repr__(self) -> str:
        return f"<awaitable {self._what}: await it for its {self._name}>"

    def __await__(self) -> Generator[Any, None, T]:
        if self._awaited:
            raise UsageError(
                f"{self._what} was awaited twice; call it again for another {self._name}"
            )
        self._awaited = True
        return (yield from self._fn(*self._args, **self._kwargs).__await__())

    def _forgot(self, use: str) -> UsageError:
        self._said = True
        return UsageError(
            f"{use} on {self._what} itself, which is not awaited yet: write "
            f"`{self._name} = await {self._what}`, then use {self._name}"
        )

    def __aenter__(self) -> Any:
        self._said = True
        raise UsageError(
            f"`async with {self._what}` needs the {self._name}, so await the call first: "
            f"write `async with await {self._what} as {self._name}:`"
        )

    def __aexit__(self, *exc: object) -> Any:  # pragma: no cover - __aenter__ always raises
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._forgot(f"calling {self._name}(...)")

    def __getattr__(self, name: str) -> Any:
        if name in GRAPH_NAMES:
            raise self._forgot(f".{name}")
        raise AttributeError(f"{self!r} has no attribute {name!r}")

    def __del__(self) -> None:
        if not self._awaited and not self._said:
            warnings.warn(
                f"{self._what} was never awaited, so it never ran; write "
                f"`{self._name} = await {self._what}`",
                RuntimeWarning,
                stacklevel=2,
            )


class Hinted:
    """Something users pass by mistake where a Buffer belongs (a Graph): it says what to
    pass instead, so `described` words it without knowing its class."""

    def argument_hint(self) -> str:
        return repr(self)


def described(value: object) -> str:
    """`value` for an error message about an argument that should have been a Buffer."""
    if isinstance(value, Hinted):
        return value.argument_hint()
    if inspect.iscoroutine(value):
        return (
            f"{value!r}, a coroutine: the async call {value.__qualname__}(...) that made it "
            f"was not awaited; write `await` before it"
        )
    if inspect.isawaitable(value):
        return (
            f"{value!r}, an awaitable: await it for its result (on a background runtime, "
            f"`.result()` from plain code)"
        )
    array = _host_array(value)
    return repr(value) if array is None else array


def listed(
    value: object, takes: str, write: str, error: type[UsageError] = UsageError
) -> tuple[Any, ...]:
    """`value`, which a call takes as a list, as a tuple. A single object (say, one Buffer
    where a list of them belongs, or a host array, whose elements are no Buffers) or
    anything else that is no sequence raises `error` saying what the call takes (`takes`)
    and how to write it (`write`)."""
    kind = type(value)
    if kind is list or kind is tuple:  # what calls are given: no more to check, per replay
        return tuple(value)  # type: ignore[arg-type]
    if (
        isinstance(value, (str, bytes))
        or not hasattr(value, "__iter__")
        or _host_array(value) is not None
    ):
        raise error(f"{takes}, got {described(value)}; write {write}")
    return tuple(value)


_ARRAY_WAYS = (
    "`buf = rt.alloc(device, arr.shape, arr.dtype)` and `await rt.copyin(buf, arr)`, or use "
    'its memory in place with `buf = rt.wrap("CPU:0", {name})`'
)


def _host_array(value: object) -> str | None:
    """How to make a Buffer of `value` where it is host data (a numpy array, or anything
    numpy reads: a memoryview, an object with `__array__` or `__dlpack__`), else None."""
    if isinstance(value, np.ndarray):
        return (
            f"a numpy array (shape {value.shape}, dtype {value.dtype}): actorgraph's calls "
            f"take Buffers; make one from it with {_ARRAY_WAYS.format(name='arr')}"
        )
    if isinstance(value, (memoryview, bytearray)) or (
        not isinstance(value, Buffer)
        and not inspect.isawaitable(value)
        and any(hasattr(value, name) for name in ("__array__", "__array_interface__", "__dlpack__"))
    ):
        return (
            f"a {type(value).__name__}, an array of host data: actorgraph's calls take "
            f"Buffers; make one from it with `arr = np.asarray(x)`, "
            f"{_ARRAY_WAYS.format(name='x')}"
        )
    return None
