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


class ReplayMismatchError(ActorGraphError, RuntimeError):
    """A checked replay (`open_runtime(check_replays=N)`, `install(check_replays=N)`) left
    memory other than the reference run of the same work left it.

    `graph` names the graph (or tinygrad batch) and the replay; `item` is the number of
    the first item, in program order, whose output differs (-1: memory no item writes);
    `label` its kernel or copy; `buffer` the buffer it wrote; `index` the first element
    of that buffer that differs (flat, in the buffer's dtype); `got` the replay's value
    there and `expected` the reference's.
    """

    def __init__(
        self,
        message: str,
        *,
        graph: str,
        item: int,
        label: str,
        buffer: str,
        index: int,
        got: object,
        expected: object,
    ) -> None:
        super().__init__(message)
        self.graph = graph
        self.item = item
        self.label = label
        self.buffer = buffer
        self.index = index
        self.got = got
        self.expected = expected
