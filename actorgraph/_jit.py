"""Capture: `@ag.jit` turns an async function that issues eager work into a replayed Graph.

The function issues work through the runtime's eager calls (`rt.launch`, `rt.copy`,
`rt.run`). Calls go through three stages:

1. The first call runs eagerly and records nothing but the shape of what it issued.
   One-time setup (allocating scratch buffers, loading constants with `rt.copyin`)
   belongs here.
2. The second call *captures*: every item the function issues runs eagerly at once,
   exactly as in stage 1, and is recorded. When the function returns, the recorded items
   are planned into one Graph whose inputs are the Buffers passed as arguments. Running
   eagerly while capturing keeps the capture call's semantics identical to eager code
   (work is visible to any Python the function runs in between); the graph is first
   replayed on the third call.
3. Later calls do not run the function at all: they check the arguments against the
   capture and replay the graph with the new input buffers and var values.

The rule for Python control flow: a captured function must issue the same work for
every call with the same *argument signature*: the arguments' structure, every
non-Buffer argument (compared with `==`, or identity where `==` is not a plain bool),
and each Buffer argument's device, dtype and shape, plus the set of Vars given values.
Those are checked on every call, so control flow that depends on them is safe: a call
that differs raises InputError (or captures again with `jit(recapture=True)`). Control
flow that depends on anything else (buffer contents, var values read some other way,
global state, the call count after the second call) is frozen at the capture: the
replay repeats the capture call's path. Cheap checks catch the common slips: host
transfers (`copyin`/`copyout`) and graph calls inside a capture raise, since a replay
cannot repeat them; a capture call that issues different work than the first call
warns (JitWarning: expected when the first call does setup); and `jit(check_trace=True)`
re-runs the function's Python on every replay, without running its work, and raises
JitTraceError when it issues anything different from the capture.
"""

from __future__ import annotations

import difflib
import enum
import functools
import inspect
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

import attrs

from ._buffer import Allocation, Buffer, dtype_text
from ._call import Call
from ._capture import Mode, Scope, current_scope, entered
from ._errors import ActorGraphError, InputError, UsageError, VarError
from ._kernel import Item, Launch
from ._runtime import Runtime
from ._vars import Var

if TYPE_CHECKING:
    from ._graph import Graph


class JitWarning(UserWarning):
    """A jitted function's capture call (its second) issued different work than its first,
    eager call: the replays repeat the capture call's.
    """


class JitTraceError(ActorGraphError):
    """With `@ag.jit(check_trace=True)`, a replayed call's Python issued different work than
    the capture: its control flow depends on something the jit does not check.
    """


# -- argument signatures --


@attrs.frozen
class _Leaf:
    """One piece of a call's arguments: a Buffer, a container's shape, or a constant."""

    path: str
    kind: str  # "buffer" | "container" | "const"
    value: Any

    def mismatch(self, new: _Leaf, name: str, runtime: Runtime) -> str | None:
        """Why `new`, at this leaf's place in a call of `name`(), cannot stand for it in
        the capture (None: it can)."""
        if self.kind == "container" and self.value != new.value:
            return (
                f"{name}(): argument {self.path} is {new.value} but was {self.value} when captured"
            )
        if self.kind == "const" and not _same_const(self.value, new.value):
            return (
                f"{name}(): argument {self.path} is {_describe(new.value)} but was "
                f"{_describe(self.value)} when captured; non-Buffer arguments are "
                f"constants of the capture"
            )
        if self.kind != "buffer":
            return None
        was, now = self.value, new.value
        for what in ("device", "dtype", "shape"):
            if getattr(was, what) != getattr(now, what):
                return (
                    f"{name}(): argument {self.path} has {what} {_text(now, what)} but "
                    f"the capture used {_text(was, what)}"
                )
        if not runtime.owns(now):
            return (
                f"{name}(): argument {self.path} {now!r} belongs to another runtime "
                f"than the one {name}() was captured on"
            )
        return None


def _flatten(value: Any, path: str, out: list[_Leaf]) -> None:
    if isinstance(value, Buffer):
        out.append(_Leaf(path, "buffer", value))
    elif type(value) in (list, tuple):
        out.append(_Leaf(path, "container", (type(value), len(value))))
        for i, v in enumerate(value):
            _flatten(v, f"{path}[{i}]", out)
    elif type(value) is dict:
        out.append(_Leaf(path, "container", (dict, tuple(value))))
        for k, v in value.items():
            _flatten(v, f"{path}[{k!r}]", out)
    else:
        out.append(_Leaf(path, "const", value))


def _same_const(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        equal = a == b
    except Exception:
        return False
    # `==` that is not a plain truth value (numpy arrays) cannot be trusted: changed.
    return equal is True or (type(equal).__name__ == "bool_" and bool(equal))


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@attrs.frozen
class _Signature:
    leaves: tuple[_Leaf, ...]
    var_keys: frozenset[Var]

    @property
    def buffers(self) -> list[_Leaf]:
        return [leaf for leaf in self.leaves if leaf.kind == "buffer"]

    def mismatch(self, other: _Signature, name: str, runtime: Runtime) -> str | None:
        """Why a call with signature `other` cannot replay this capture (None: it can)."""
        if [(a.path, a.kind) for a in self.leaves] != [(b.path, b.kind) for b in other.leaves]:
            was = ", ".join(f"{a.path}: {a.kind}" for a in self.leaves)
            now = ", ".join(f"{b.path}: {b.kind}" for b in other.leaves)
            return (
                f"{name}() got arguments shaped differently from its capture "
                f"(captured: {was}; now: {now})"
            )
        for old, new in zip(self.leaves, other.leaves):
            why = old.mismatch(new, name, runtime)
            if why is not None:
                return why
        old_alias, new_alias = _aliasing(self.buffers), _aliasing(other.buffers)
        if old_alias != new_alias:
            return (
                f"{name}(): the Buffer arguments repeat differently from the capture "
                f"(the same buffer passed twice must stay the same buffer, and distinct "
                f"ones distinct)"
            )
        if self.var_keys != other.var_keys:
            had = sorted(v.name for v in self.var_keys)
            got = sorted(v.name for v in other.var_keys)
            return f"{name}() was captured with values for Vars {had} but got values for {got}"
        return None


def _text(buf: Buffer, what: str) -> Any:
    """A buffer's device, dtype or shape as a message prints it."""
    return dtype_text(buf.dtype) if what == "dtype" else getattr(buf, what)


def _aliasing(leaves: list[_Leaf]) -> tuple[int, ...]:
    """For each Buffer leaf, the index of the first leaf holding the same Buffer object
    (Buffers compare by identity)."""
    first: dict[Buffer, int] = {}
    return tuple(first.setdefault(leaf.value, i) for i, leaf in enumerate(leaves))


def _unique_buffers(leaves: list[_Leaf]) -> list[Buffer]:
    """The Buffer leaves' Buffers, each once, in order."""
    return list(dict.fromkeys(leaf.value for leaf in leaves))


# -- structural traces: what a call issued, comparable across calls --


def _trace(items: Sequence[Item], inputs: Sequence[Buffer]) -> tuple[Any, ...]:
    """Items with buffers named by role: input i (+offset) or the k-th other allocation
    (the allocation itself, not its address space: wrappers on one device share one)."""
    own: dict[Allocation, int] = {}

    def canon(buf: Buffer) -> tuple[Any, ...]:
        where = (buf.shape, buf.dtype.str, buf.device)
        for i, root in enumerate(inputs):
            if buf.within(root):
                return ("input", i, buf.offset - root.offset, *where)
        return ("own", own.setdefault(buf.allocation, len(own)), buf.offset, *where)

    out: list[tuple[Any, ...]] = []
    for item in items:
        bufs = tuple(canon(b) for b in item.bufs)
        if isinstance(item, Launch):
            out.append(
                (
                    "launch",
                    item.kernel.name,
                    bufs,
                    item.vars,
                    item.fixedvars,
                    item.global_size,
                    item.local_size,
                )
            )
        else:
            out.append(("copy", bufs))
    return tuple(out)


def _first_difference(was: tuple[Any, ...], now: tuple[Any, ...]) -> str:
    for i, (a, b) in enumerate(zip(was, now)):
        if a != b:
            return (
                f"item {i} differs ({a[0]} {a[1] if a[0] == 'launch' else ''} vs {b[0]} "
                f"{b[1] if b[0] == 'launch' else ''})"
            )
    return f"{len(was)} items vs {len(now)}"


# -- results --


@attrs.frozen
class _FromInput:
    """A returned buffer that lies in input `index`: rebased onto each call's input."""

    index: int
    buffer: Buffer


def _result_template(value: Any, inputs: Sequence[Buffer]) -> Any:
    if isinstance(value, Buffer):
        for i, root in enumerate(inputs):
            if value.within(root):
                return _FromInput(i, value)
        return value
    if type(value) in (list, tuple):
        return type(value)(_result_template(v, inputs) for v in value)
    if type(value) is dict:
        return {k: _result_template(v, inputs) for k, v in value.items()}
    return value


def _rebuild(template: Any, old: Sequence[Buffer], new: Sequence[Buffer]) -> Any:
    if isinstance(template, _FromInput):
        return template.buffer.rebased(old[template.index], new[template.index])
    if type(template) in (list, tuple):
        return type(template)(_rebuild(v, old, new) for v in template)
    if type(template) is dict:
        return {k: _rebuild(v, old, new) for k, v in template.items()}
    return template


# -- the decorator --


@attrs.define(eq=False)
class _Capture:
    signature: _Signature
    runtime: Runtime
    graph: Graph
    inputs: tuple[Buffer, ...]
    result: Any
    trace: tuple[Any, ...]


@attrs.define(eq=False)
class _LastCall:
    """The arguments of the latest replay, to skip re-checking identical ones."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    values: dict[Var, int]
    capture: _Capture
    signature: _Signature

    def matches(self, args: tuple[Any, ...], kwargs: dict[str, Any], var_vals: Any) -> bool:
        if len(args) != len(self.args) or len(kwargs) != len(self.kwargs):
            return False
        if any(a is not b for a, b in zip(args, self.args)):
            return False
        if any(kwargs.get(k, _MISSING) is not v for k, v in self.kwargs.items()):
            return False
        if (var_vals or {}) != self.values or self.capture.runtime.closed:
            return False
        # Only top-level identity is known: containers may have been refilled, buffers freed.
        return not any(
            type(a) in (list, tuple, dict) for a in (*args, *kwargs.values())
        ) and not any(leaf.value.freed for leaf in self.signature.buffers)


_MISSING = object()


class State(enum.Enum):
    FRESH = "fresh"  # no call yet: the next call runs eagerly
    WARM = "warm"  # one eager call done: the next call captures
    CAPTURED = "captured"  # calls replay a graph


@attrs.frozen
class JitStatistics:
    state: State
    calls: int
    eager_calls: int
    captures: int
    replays: int
    graphs: int


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class JitFunction:
    """An async function whose calls after the first two replay a captured Graph.

    Made by `@ag.jit`. Call 1 runs the function eagerly, call 2 runs it eagerly and
    records its work, which is planned into a Graph; calls 3 and later check the arguments
    and replay that graph with the call's buffers and Var values, without running the
    function's Python.
    """

    def __init__(
        self,
        fn: Callable[..., Awaitable[Any]],
        *,
        recapture: bool = False,
        max_captures: int = 4,
        check_trace: bool = False,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise UsageError(
                f"@ag.jit decorates async functions (async def ...); {fn!r} is not one"
            )
        if isinstance(max_captures, bool) or not isinstance(max_captures, int) or max_captures < 1:
            raise UsageError(f"jit(max_captures=...) must be an int >= 1, got {max_captures!r}")
        self._fn = fn
        self._signature = inspect.signature(fn)
        self.name = getattr(fn, "__name__", "function")
        self.recapture = bool(recapture)
        self.max_captures = max_captures if recapture else 1
        self.check_trace = bool(check_trace)
        self._captures: list[_Capture] = []  # most recently used last
        self._state = State.FRESH
        self._first_trace: tuple[Any, ...] | None = None
        self._capturing = False
        self._calls = 0
        self._eager_calls = 0
        self._replays = 0
        self._capture_count = 0
        self._last_call: _LastCall | None = None
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<jit {self.name} {self._state.value}, {len(self._captures)} graph(s)>"

    @property
    def graph(self) -> Graph | None:
        """The most recently used captured Graph (`print(f.graph.plan)`), or None."""
        return self._captures[-1].graph if self._captures else None

    def statistics(self) -> JitStatistics:
        """A frozen snapshot of the function's counts.

        Returns:
            Its state (fresh, warm, captured), calls, eager calls, captures, replays and the
            graphs kept.
        """
        return JitStatistics(
            state=self._state,
            calls=self._calls,
            eager_calls=self._eager_calls,
            captures=self._capture_count,
            replays=self._replays,
            graphs=len(self._captures),
        )

    def reset(self) -> None:
        """Forget every capture: the next call runs eagerly again, the one after captures."""
        self._captures.clear()
        self._last_call = None
        self._state = State.FRESH
        self._first_trace = None

    def __call__(self, *args: Any, var_vals: Mapping[Var, int] | None = None, **kwargs: Any) -> Any:
        """`await f(...)`, as the decorated function is called.

        With a background runtime (`ag.start_runtime`) among the arguments, the whole call
        runs on that runtime's thread and this returns a Call: await it from any loop, or
        `.result()` from plain code.

        Args:
            *args: the function's own arguments; Buffers (also inside lists, tuples and dicts)
                are the graph's inputs, anything else a constant of the capture.
            var_vals: the values of the Vars its launches use, `{n: 1000}` (a keyword of
                @ag.jit's own).
            **kwargs: the function's own keyword arguments.

        Returns:
            An awaitable of the function's result (a Call on a background runtime). A returned
            Buffer that lies inside an input is the call's input's; any other is the capture's
            own, which every replay writes again.

        Raises:
            InputError: the arguments differ from the capture's (structure, a Buffer's device,
                dtype or shape, a constant, which Vars have values) and `recapture` is off.
            TypeError: the arguments do not fit the function's signature; the message names the
                nearest keyword.
            JitTraceError: with `check_trace=True`, a replay's Python issued different work.
            VarError: a Var has no value, or one outside its bounds.
        """
        from ._background import forward_target

        handle = forward_target(args, kwargs)
        if handle is not None:
            return Call(handle, self, args, {"var_vals": var_vals, **kwargs}, f"{self.name}(...)")
        coroutine = self._call(args, kwargs, var_vals)
        # "step" in messages about a missing await (a coroutine object has the attribute;
        # the Coroutine type mypy gives an async def's result does not say so).
        coroutine.__qualname__ = self.name  # type: ignore[attr-defined]
        return coroutine

    async def _call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], var_vals: Mapping[Var, int] | None
    ) -> Any:
        outer = current_scope()
        if outer is not None:
            # Called from inside another jitted function: its work becomes part of that one.
            if var_vals:
                raise UsageError(
                    f"{self.name}() is called inside @ag.jit function {outer.name}() with "
                    f"var_vals; give var values to the outermost call, {outer.name}(...)"
                )
            return await self._fn(*args, **kwargs)

        last = self._last_call
        if last is not None and last.matches(args, kwargs, var_vals):
            # The very same argument objects as the last replay: its checks still hold.
            self._calls += 1
            return await self._replay(last.capture, last.signature, last.values, args, kwargs)

        values = self._check_var_vals(var_vals)
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise self._call_error(exc, kwargs) from None
        bound.apply_defaults()
        leaves: list[_Leaf] = []
        for pname, value in bound.arguments.items():
            _flatten(value, pname, leaves)
        signature = _Signature(tuple(leaves), frozenset(values))
        for leaf in signature.buffers:
            leaf.value.check_live(f"{self.name}(): argument {leaf.path} ")
        self._calls += 1
        self._drop_closed_runtimes()

        if self._captures:
            capture, why = self._find(signature)
            if capture is not None:
                self._last_call = _LastCall(args, kwargs, values, capture, signature)
                return await self._replay(capture, signature, values, args, kwargs)
            if not self.recapture:
                raise InputError(
                    f"{why}; pass arguments like the capture's, or decorate with "
                    f"@ag.jit(recapture=True) to capture again for new ones"
                )
            return await self._capture(signature, values, args, kwargs)
        if self._state is State.FRESH or self._capturing:
            return await self._eager(signature, values, args, kwargs)
        return await self._capture(signature, values, args, kwargs)

    def _call_error(self, exc: TypeError, kwargs: Mapping[str, Any]) -> TypeError:
        """Python's word on arguments that do not fit the function, naming the function,
        its parameters and, for a keyword it does not take, the nearest name it (or
        @ag.jit, whose own keyword is var_vals) takes."""
        params = list(self._signature.parameters)
        hint = ""
        for name in kwargs:
            if name not in params:
                close = difflib.get_close_matches(name, [*params, "var_vals"], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                break
        said = str(exc)
        lead = f"{self.name}() " if said.startswith("got ") else f"{self.name}(): "
        return TypeError(
            f"{lead}{said}{hint} ({self.name} takes {', '.join(params)}; var_vals= "
            f"is @ag.jit's own: the calls' Var values)"
        )

    def _check_var_vals(self, var_vals: Mapping[Var, int] | None) -> dict[Var, int]:
        values = dict(var_vals or {})
        for var, value in values.items():
            if not isinstance(var, Var):
                raise VarError(f"{self.name}(): var_vals keys must be ag.Var objects, got {var!r}")
            var.check(value)
        return values

    def _drop_closed_runtimes(self) -> None:
        # A closed runtime can never replay again: start over on whatever runtime is next.
        if self._captures and any(c.runtime.closed for c in self._captures):
            self._captures = [c for c in self._captures if not c.runtime.closed]
            if not self._captures:
                self.reset()

    def _find(self, signature: _Signature) -> tuple[_Capture | None, str]:
        why = ""
        for capture in reversed(self._captures):
            reason = capture.signature.mismatch(signature, self.name, capture.runtime)
            if reason is None:
                self._captures.remove(capture)
                self._captures.append(capture)
                return capture, ""
            why = why or reason
        return None, why

    async def _run(self, scope: Scope, args: Any, kwargs: Any) -> Any:
        with entered(scope):
            return await self._fn(*args, **kwargs)

    async def _eager(
        self, signature: _Signature, values: dict[Var, int], args: Any, kwargs: Any
    ) -> Any:
        # The first call records too, only to compare the capture call against it.
        first = self._state is State.FRESH and not self._capturing
        scope = Scope(self.name, Mode.EAGER, values, record=first)
        result = await self._run(scope, args, kwargs)
        self._eager_calls += 1
        if first:
            self._first_trace = _trace(scope.items, _unique_buffers(signature.buffers))
            self._state = State.WARM
        return result

    async def _capture(
        self, signature: _Signature, values: dict[Var, int], args: Any, kwargs: Any
    ) -> Any:
        inputs = _unique_buffers(signature.buffers)
        for i, a in enumerate(inputs):
            for b in inputs[i + 1 :]:
                if a.overlaps(b):
                    raise InputError(
                        f"{self.name}(): Buffer arguments {a!r} and {b!r} share memory; "
                        f"a captured graph needs distinct input buffers"
                    )
        self._capturing = True
        try:
            scope = Scope(self.name, Mode.CAPTURE, values)
            result = await self._run(scope, args, kwargs)
        finally:
            self._capturing = False
        runtime = scope.runtime
        if not scope.items or not isinstance(runtime, Runtime):
            raise UsageError(
                f"@ag.jit function {self.name}() issued no work through rt.launch / rt.copy "
                f"/ rt.run on its capture call, so there is nothing to replay; call it "
                f"without @ag.jit"
            )
        for leaf in signature.buffers:
            if not runtime.owns(leaf.value):
                raise InputError(
                    f"{self.name}(): argument {leaf.path} {leaf.value!r} belongs to another "
                    f"runtime than the one the function issued its work on"
                )
        try:
            graph = await runtime.compile(scope.items, inputs=inputs)
        except ActorGraphError as error:
            error.add_note(f"(while planning the work captured from {self.name}())")
            raise
        trace = _trace(scope.items, inputs)
        if self._first_trace is not None and trace != self._first_trace:
            warnings.warn(
                JitWarning(
                    f"{self.name}(): the capture call issued different work than the first "
                    f"call ({_first_difference(self._first_trace, trace)}); later calls "
                    f"replay the capture call's work. Expected if the first call does "
                    f"one-time setup; otherwise the function's control flow depends on "
                    f"something the jit does not check (see help(ag.jit))"
                ),
                stacklevel=3,
            )
        self._first_trace = None
        capture = _Capture(
            signature=signature,
            runtime=runtime,
            graph=graph,
            inputs=tuple(inputs),
            result=_result_template(result, inputs),
            trace=trace,
        )
        self._captures.append(capture)
        if len(self._captures) > self.max_captures:
            self._captures.pop(0)
            self._last_call = None
        self._capture_count += 1
        self._state = State.CAPTURED
        return result

    async def _replay(
        self,
        capture: _Capture,
        signature: _Signature,
        values: dict[Var, int],
        args: Any,
        kwargs: Any,
    ) -> Any:
        inputs = _unique_buffers(signature.buffers)
        if self.check_trace:
            scope = Scope(self.name, Mode.TRACE, values)
            await self._run(scope, args, kwargs)
            trace = _trace(scope.items, inputs)
            if trace != capture.trace:
                raise JitTraceError(
                    f"{self.name}() issued different work than its capture "
                    f"({_first_difference(capture.trace, trace)}); its control flow depends "
                    f"on something the jit does not check: make it depend only on the "
                    f"arguments, or call f.reset() to capture again"
                )
        needed = capture.graph.free_vars
        await capture.graph(inputs, var_vals={v: values[v] for v in needed})
        self._replays += 1
        return _rebuild(capture.result, capture.inputs, inputs)


@overload
def jit(fn: F) -> JitFunction: ...


@overload
def jit(
    *, recapture: bool = False, max_captures: int = 4, check_trace: bool = False
) -> Callable[[F], JitFunction]: ...


def jit(
    fn: Any = None,
    *,
    recapture: bool = False,
    max_captures: int = 4,
    check_trace: bool = False,
) -> Any:
    """Capture an async function's eager work once, then replay it as a Graph.

    `@ag.jit`, or `@ag.jit(recapture=True, max_captures=4, check_trace=False)`. Write the
    function with the runtime's eager calls (`rt.launch`, `rt.copy`, `rt.run`). Call 1 runs
    eagerly, call 2 runs eagerly and captures, calls 3 and later replay. Buffer arguments
    are the graph's inputs; other arguments are constants of the capture. Buffers the
    function allocates are allocated once, at capture. The replay repeats the capture
    call's path: branches on buffer contents or globals are frozen at capture.

    Args:
        fn: the async function (when used as `@ag.jit` without parentheses).
        recapture: capture a call whose arguments differ from the captures' instead of
            raising InputError, keeping one graph per signature.
        max_captures: with `recapture`, the most graphs kept (the least recently used is
            dropped).
        check_trace: re-run the function's Python on each replay (without its work) and
            raise JitTraceError on any difference.

    Returns:
        The JitFunction, or (called with options only) a decorator that makes one.

    Raises:
        UsageError: `fn` is not an async function, or `max_captures` is not an int >= 1.
    """

    def wrap(f: Any) -> JitFunction:
        return JitFunction(
            f, recapture=recapture, max_captures=max_captures, check_trace=check_trace
        )

    if fn is None:
        return wrap
    if not callable(fn):
        raise UsageError(f"@ag.jit decorates async functions, got {fn!r}")
    return wrap(fn)
