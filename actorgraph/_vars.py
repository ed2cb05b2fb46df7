"""Symbolic integers: Var and the expressions launch dims are written in."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Union

import attrs

from ._errors import VarError

IntLike = Union[int, "Expr"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


_OPS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "//": operator.floordiv,
    "cdiv": _cdiv,
}


class Expr:
    """An integer expression over Vars, evaluated per call.

    Vars combine with ints and with each other by `+`, `-`, `*`, `//` and `cdiv`:
    `ag.cdiv(n, 256)`, `n * 2`. Launch dimensions may be expressions.
    """

    def evaluate(self, values: Mapping[Var, int]) -> int:
        """The expression's value for these Var values.

        Args:
            values: a value for each Var the expression uses.

        Returns:
            The int it evaluates to.

        Raises:
            VarError: a Var of the expression has no value in `values`, or it divides by zero
                for them.
            NotImplementedError: on Expr itself, which only its kinds (a Var, an operation)
                implement.
        """
        raise NotImplementedError

    def variables(self) -> frozenset[Var]:
        """The Vars the expression uses.

        Returns:
            A frozenset of Vars.

        Raises:
            NotImplementedError: on Expr itself, which only its kinds (a Var, an operation)
                implement.
        """
        raise NotImplementedError

    def __add__(self, other: IntLike) -> Expr:
        return BinOp("+", self, _check(other))

    def __radd__(self, other: IntLike) -> Expr:
        return BinOp("+", _check(other), self)

    def __sub__(self, other: IntLike) -> Expr:
        return BinOp("-", self, _check(other))

    def __rsub__(self, other: IntLike) -> Expr:
        return BinOp("-", _check(other), self)

    def __mul__(self, other: IntLike) -> Expr:
        return BinOp("*", self, _check(other))

    def __rmul__(self, other: IntLike) -> Expr:
        return BinOp("*", _check(other), self)

    def __floordiv__(self, other: IntLike) -> Expr:
        return BinOp("//", self, _check(other))

    def __rfloordiv__(self, other: IntLike) -> Expr:
        return BinOp("//", _check(other), self)


def _check(value: object) -> IntLike:
    if isinstance(value, bool) or not isinstance(value, (int, Expr)):
        raise TypeError(
            f"launch-dim expressions combine ints and Vars only; got {value!r} "
            f"({type(value).__name__})"
        )
    return value


# cache_hash: a Var is looked up in the call's values for every var of every item a rebound
# replay lowers (a decode step with a new position each call lowers 16).
@attrs.frozen(eq=True, cache_hash=True)
class Var(Expr):
    """A named symbolic int with inclusive bounds, given a value per call.

    `n = ag.Var("n", 1, 4096)`; a call passes `var_vals={n: 1000}`. The planner plans for
    every value in the bounds.

    Args:
        name: a non-empty name, for messages and `var_vals` errors.
        lo: the smallest value a call may give.
        hi: the largest value a call may give.

    Raises:
        VarError: an empty name, or bounds that are not ints with lo <= hi.
    """

    name: str
    lo: int
    hi: int

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise VarError(f"Var name must be a non-empty string, got {self.name!r}")
        if not (isinstance(self.lo, int) and isinstance(self.hi, int)) or self.lo > self.hi:
            raise VarError(
                f"Var {self.name!r}: bounds must be ints with lo <= hi, got [{self.lo}, {self.hi}]"
            )

    def evaluate(self, values: Mapping[Var, int]) -> int:
        try:
            return values[self]
        except KeyError:
            raise VarError(
                f"no value for Var {self.name!r}; pass var_vals={{{self.name}: ...}}"
            ) from None

    def variables(self) -> frozenset[Var]:
        return frozenset((self,))

    def check(self, value: object) -> int:
        """`value` itself, once it is an int within the bounds.

        Args:
            value: a value for this Var.

        Returns:
            The value.

        Raises:
            VarError: the value is not an int (bools are refused), or lies outside [lo, hi].
        """
        if isinstance(value, bool) or not isinstance(value, int):
            raise VarError(f"Var {self.name!r} needs an int value, got {value!r}")
        if not self.lo <= value <= self.hi:
            raise VarError(
                f"Var {self.name!r} = {value} is outside its bounds [{self.lo}, {self.hi}]; "
                f"pass a value in range or widen the Var's bounds"
            )
        return value

    def __str__(self) -> str:
        return self.name


@attrs.frozen(eq=True)
class BinOp(Expr):
    op: str
    left: IntLike
    right: IntLike

    def evaluate(self, values: Mapping[Var, int]) -> int:
        left = self.left.evaluate(values) if isinstance(self.left, Expr) else self.left
        right = self.right.evaluate(values) if isinstance(self.right, Expr) else self.right
        if self.op in ("//", "cdiv") and right == 0:
            raise VarError(f"launch dim {self} divides by zero for these var values")
        return _OPS[self.op](left, right)

    def variables(self) -> frozenset[Var]:
        out: frozenset[Var] = frozenset()
        for side in (self.left, self.right):
            if isinstance(side, Expr):
                out |= side.variables()
        return out

    def __str__(self) -> str:
        if self.op == "cdiv":
            return f"cdiv({self.left}, {self.right})"
        return f"({self.left} {self.op} {self.right})"


def cdiv(a: IntLike, b: IntLike) -> IntLike:
    """Ceiling division, for ints or expressions: `cdiv(n, 256)` blocks of 256 cover n.

    Args:
        a: the dividend, an int or an expression of Vars.
        b: the divisor, an int or an expression of Vars.

    Returns:
        An int when both are ints, else an expression evaluated per call.

    Raises:
        TypeError: a side is neither an int nor an expression.
    """
    a, b = _check(a), _check(b)
    if isinstance(a, int) and isinstance(b, int):
        return _cdiv(a, b)
    return BinOp("cdiv", a, b)


def evaluate(value: IntLike, values: Mapping[Var, int]) -> int:
    return value.evaluate(values) if isinstance(value, Expr) else value


def variables_of(value: IntLike) -> frozenset[Var]:
    return value.variables() if isinstance(value, Expr) else frozenset()
