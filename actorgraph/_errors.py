"""The errors users see. Each message names the culprit, states the rule, suggests a fix."""

from __future__ import annotations

from actorgraph.devices import DeviceError as DeviceError
from actorgraph.scheduler import ActorGraphError as ActorGraphError
from actorgraph.scheduler import PlanDeadlockError as PlanDeadlockError
from actorgraph.scheduler import PlanError as PlanError
from actorgraph.scheduler import PlanRaceError as PlanRaceError


class UsageError(ActorGraphError, ValueError):
    """A call got arguments that break a rule of the API (checked before anything runs)."""


class InputError(UsageError):
    """A graph call's inputs do not match what the graph was compiled for."""


class VarError(UsageError):
    """A variable is missing, unknown, or outside its bounds."""


class BufferFreedError(UsageError):
    """A freed buffer was used."""


class GraphvizError(ActorGraphError, RuntimeError):
    """Graphviz's `dot` program is missing or could not draw the plan."""


class ClosedError(ActorGraphError, RuntimeError):
    """A graph used after aclose(), or a runtime used after its `async with` exited."""


class ItemError(ActorGraphError):
    """An item (a kernel or copy) raised while running. The original error is __cause__."""

    def __init__(self, message: str, *, index: int, label: str, device: str) -> None:
        super().__init__(message)
        self.index = index
        self.label = label
        self.device = device


class DeadlockError(ActorGraphError, RuntimeError):
    """Every actor with work waits on a signal that no pending work can set.

    `blocked` lists the waits (actor, signal, value wanted, value now).
    """

    def __init__(self, message: str, *, blocked: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.blocked = blocked


class MissingExtraError(ActorGraphError, ImportError):
    """An optional feature needs a package that is not installed (the message names the extra)."""
