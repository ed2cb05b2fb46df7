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


class ReplayMismatchError(ActorGraphError, RuntimeError):
    """A checked replay (`open_runtime(check_replays=N)`, `install(check_replays=N)`) left
    memory other than the reference run of the same work left it.

    The replay's effects stand and the runtime goes on. Also a RuntimeError.

    Attributes:
        graph: the graph (or tinygrad batch) and the replay, in words.
        item: the number of the first item, in program order, whose output differs (-1:
            memory no item writes).
        label: that item's kernel or copy.
        buffer: the buffer it wrote.
        index: the first element of that buffer that differs (flat, in the buffer's dtype).
        got: the replay's value there.
        expected: the reference run's value there.
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
