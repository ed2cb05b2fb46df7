"""Errors raised by the planner and the plan verifier."""

from __future__ import annotations


class ActorGraphError(Exception):
    """The base of every error actorgraph raises on purpose (planner, devices, public API)."""


class PlanError(ActorGraphError):
    """A plan could not be built, or a built plan is unsafe (a deadlock or a race)."""


class PlanDeadlockError(PlanError):
    """A plan has waits that no pending work can satisfy (`plan.verify()` found one)."""


class PlanRaceError(PlanError):
    """A plan lets two conflicting accesses to the same bytes run without an order between
    them (`plan.verify()` found one).
    """
