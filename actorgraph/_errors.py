"""The errors users see. Each message names the culprit, states the rule, suggests a fix."""

from __future__ import annotations

from actorgraph.devices import DeviceError as DeviceError
from actorgraph.scheduler import ActorGraphError as ActorGraphError
from actorgraph.scheduler import PlanDeadlockError as PlanDeadlockError
from actorgraph.scheduler import PlanError as PlanError
from actorgraph.scheduler import PlanRaceError as PlanRaceError


class UsageError(ActorGraphError, ValueError):
    """A call got arguments that break a rule of the API, checked before anything runs.

    Also a ValueError. The message names the argument, the rule and the fix.
    """


class InputError(UsageError):
    """A graph call's inputs do not match what the graph was compiled for (count, device,
    dtype, shape), share memory, or an @ag.jit call's arguments differ from its capture's.
    """


class VarError(UsageError):
    """A Var has no value, an unknown one, or a value outside its bounds."""


class BufferFreedError(UsageError):
    """A buffer was used after `rt.free` released it."""


class GraphvizError(ActorGraphError, RuntimeError):
    """Graphviz's `dot` program is missing or could not draw the plan (`graph.to_svg`)."""


class ClosedError(ActorGraphError, RuntimeError):
    """Work on something that has closed: a graph after `aclose()`, a runtime after its
    `async with` block, or a device whose worker was lost. Also a RuntimeError.
    """


class ItemError(ActorGraphError):
    """An item (a kernel or a copy) raised while it ran; the original error is `__cause__`.

    The rest of that replay skips its kernels but still signals, so nothing hangs, and the
    runtime stays usable.

    Attributes:
        index: the item's index in the list the graph was compiled from (or given to
            `rt.run`).
        label: the kernel's name, or the copy's label.
        device: the device whose queue ran it.
    """

    def __init__(self, message: str, *, index: int, label: str, device: str) -> None:
        super().__init__(message)
        self.index = index
        self.label = label
        self.device = device


class DeadlockError(ActorGraphError, RuntimeError):
    """Every actor with work waits on a signal that no pending work can set.

    The runtime refuses further work after it (a sticky fault). Also a RuntimeError.

    Attributes:
        blocked: the waits that can never be met, each with its actor, the signal it waits
            on, the value it wants and the value the signal holds.
    """

    def __init__(self, message: str, *, blocked: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.blocked = blocked


class MissingExtraError(ActorGraphError, ImportError):
    """An optional feature needs a package that is not installed; the message names the
    extra and how to install it. Also an ImportError.
    """
