"""The capture scope: what eager calls and graph calls consult while an `@ag.jit`
function runs (actorgraph/_jit.py captures; this module is all the runtime needs of it).

A jitted function's call lives in a contextvar for that call: the runtime's eager calls
record their items into it (`issue`), and host transfers and graph calls inside a
capture are refused, since a replay cannot repeat them.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from ._errors import UsageError, VarError
from ._kernel import Item
from ._vars import Var


class Mode(enum.Enum):
    EAGER = "eager"  # first call (or a call while another task captures): run, don't record
    CAPTURE = "capture"  # run and record
    TRACE = "trace"  # record only (check_trace): the graph runs the work


_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
    "actorgraph_jit_scope", default=None
)


def current_scope() -> Scope | None:
    """The capture scope of the calling task, if it is inside an @ag.jit function."""
    return _SCOPE.get()


def check_host_transfer(what: str) -> None:
    scope = _SCOPE.get()
    if scope is not None and scope.mode is not Mode.EAGER:
        raise UsageError(
            f"rt.{what}() inside @ag.jit function {scope.name}() while it is being "
            f"captured: a graph replay cannot repeat host transfers; move the {what} "
            f"outside the function (or do it only on the first call, which runs eagerly)"
        )


@contextlib.contextmanager
def entered(scope: Scope) -> Iterator[None]:
    """The calling task inside `scope` until the block ends: one call of a jitted
    function (actorgraph/_jit.py)."""
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)


# current_scope() without the Python call around it, for the hot path of graph calls.
scope_get = _SCOPE.get


def capturing() -> bool:
    """Whether the calling task is inside an @ag.jit function (cheap: one lookup)."""
    return _SCOPE.get() is not None


def check_graph_call() -> None:
    scope = _SCOPE.get()
    if scope is not None and scope.mode is not Mode.EAGER:
        raise UsageError(
            f"await graph(...) inside @ag.jit function {scope.name}() while it is being "
            f"captured: a captured function issues work with rt.launch / rt.copy / rt.run; "
            f"call the graph outside the function"
        )


@attrs.define(eq=False)
class Scope:
    """What one call of a jitted function issued. Lives in a contextvar for that call."""

    name: str
    mode: Mode
    var_vals: dict[Var, int]
    record: bool = True
    items: list[Item] = attrs.field(factory=list)
    runtime: object = None  # the runtime it issued work on (None: none yet)

    def issue(self, runtime: object, items: Sequence[Item], var_vals: Any) -> bool:
        """Record `items`; return whether the runtime should also run them now."""
        if var_vals:
            raise UsageError(
                f"rt.launch / rt.run inside @ag.jit function {self.name}() got var_vals: "
                f"inside a jitted function var values come from the call; pass "
                f"var_vals={{...}} to {self.name}(...), or fix a constant with "
                f"Launch(..., fixedvars={{var: value}})"
            )
        if self.runtime is None:
            self.runtime = runtime
        elif runtime is not self.runtime:
            raise UsageError(
                f"@ag.jit function {self.name}() issued work on two runtimes; a captured "
                f"graph runs on one runtime: use one runtime per jitted function"
            )
        for item in items:
            missing = sorted(v.name for v in item.free_vars() if v not in self.var_vals)
            if missing:
                raise VarError(
                    f"{self.name}() issued {item.label}, which uses Vars {missing}, but the "
                    f"call gave no values for them; call {self.name}(..., "
                    f"var_vals={{{missing[0]}: ...}})"
                )
        if self.record:
            self.items.extend(items)
        return self.mode is not Mode.TRACE

    def values_for(self, items: Sequence[Item]) -> dict[Var, int]:
        """The call's values for the Vars these items use (and only those)."""
        needed: frozenset[Var] = frozenset().union(*(item.free_vars() for item in items))
        return {var: self.var_vals[var] for var in needed}
