"""Errors raised by the planner and the plan verifier."""

from __future__ import annotations


class ActorGraphError(Exception):
    """Base of every error the project raises on purpose (planner, devices, public API)."""


class PlanError(ActorGraphError):
    """A plan could not be built, or a built plan is unsafe (deadlock or race)."""


class PlanDeadlockError(PlanError):
    """A plan has waits that no pending work can satisfy."""


class PlanRaceError(PlanError):
    """A plan lets two conflicting accesses run without a happens-before order."""
