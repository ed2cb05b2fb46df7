"""The device base: a named set of queue actors plus a device timeline."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

import numpy as np
import trio
from actorgraph.scheduler import ActorGraphError, DeviceCaps, QueueKind

from ._actor import QueueActor
from ._inline import HoldingSignal, Resumer
from ._ops import Op
from ._signal import Signal

# Makes a queue's timeline signal: (name, start value) -> the signal (Device.new_queue).
MakeSignal = Callable[[str, int], Signal]

_VALUE_MAX = (1 << 64) - 1


class DeviceBuffer(Protocol):
    """What a device reads of a buffer (actorgraph's `Buffer` is one).

    A buffer is a typed window on one allocation: `offset` elements into the memory that
    the device's `allocate` returned for it, `shape` of `dtype`.
    """

    @property
    def device(self) -> str: ...  # the device's name

    @property
    def device_object(self) -> Device: ...

    @property
    def memory(self) -> Any: ...  # what `Device.allocate` returned for the allocation

    @property
    def offset(self) -> int: ...  # in elements of `dtype`

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def address(self) -> int: ...  # host address of the first element (host-visible memory)

    def host_view(self) -> np.ndarray[Any, Any]: ...  # host-visible memory only


def same_bytes(dst: DeviceBuffer, src: DeviceBuffer) -> bool:
    """Whether a copy from `src` to `dst` is an exact self-copy (nothing to move)."""
    return (
        dst.memory is src.memory
        and dst.offset * dst.dtype.itemsize == src.offset * src.dtype.itemsize
        and dst.nbytes == src.nbytes
    )


def nothing() -> None:
    """The body of a copy that moves nothing."""


class LaunchRequest(NamedTuple):
    """One kernel launch, resolved for one call: what every device lowers a Launch from.

    `item` numbers it for error reports; buffers are this call's (inputs rebound);
    `var_values` are the kernel's vars in order; dims are padded to 3.
    """

    item: int
    kernel: Any
    buffers: Sequence[DeviceBuffer]
    var_values: Sequence[int]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    queue: QueueKind


class DeviceError(ActorGraphError):
    """A device cannot be opened (an unknown name, no GPU, a worker that refuses), or cannot
    run what it was given.
    """


class Device:
    """A device: its queue actors, its timeline, its memory.

    The timeline orders whole submissions on this device: submission k (a replay, an
    eager item, a host copy) starts on any of the device's queues only when the
    timeline has reached k - 1, and the timeline reaches k when every queue of that
    submission that touches this device is done.
    """

    kind: ClassVar[str] = ""
    host_visible: ClassVar[bool] = True
    host_backed: ClassVar[bool] = True  # its memory is host RAM underneath (see DeviceCaps)
    # A device whose memory the client reaches only through I/O (REMOTE) lowers every
    # copy that touches it, whichever queue the planner puts the copy on.
    lowers_foreign_copies: ClassVar[bool] = False
    host_io: ClassVar[bool] = False  # its memory is reached through I/O (see DeviceCaps)
    # Its kernels read memory in the device's own byte order, whatever a buffer's dtype
    # says (a GPU's): a dtype of the other byte order would mean other numbers there.
    native_byte_order: ClassVar[bool] = False
    # The options of open_runtime(...) this kind of device reads (when it is opened).
    options_taken: ClassVar[frozenset[str]] = frozenset()
    # Its kernels may build slowly on first lowering (compile): see `slow_builds`.
    builds_kernels: ClassVar[bool] = False
    # Its buffers are this process's host memory, which its kernels read in place: memory
    # the host owns can be wrapped as its buffers (`rt.wrap`), and the planner takes it
    # for the host (`DeviceCaps.is_cpu`).
    host_memory: ClassVar[bool] = False
    # Its kernels are calls on this host's CPU that carry their arrays, bound to no
    # thread or stream: machine code compiled for the CPU runs there, any plain queue
    # actor runs its ops (a worker gives each client its own, whose signal tells other
    # workers how far it got), a quick one may run on a worker's event loop, and a
    # replay on such devices alone may run off the runtime's thread.
    runs_host_kernels: ClassVar[bool] = False

    def __init__(
        self,
        name: str,
        index: int,
        *,
        timeline_start: int = 0,
        resumer: Resumer | None = None,
        **options: Any,
    ) -> None:
        self.name = name
        self.index = index
        # What runs on the jobs held on its queues' signals (devices/_inline.py): the
        # runtime's, shared by all its devices, so held jobs never run one inside another.
        self.resumer = Resumer() if resumer is None else resumer
        self.timeline = Signal(f"{name}/timeline", timeline_start)
        self.next_ticket = timeline_start
        self._queues: dict[QueueKind, QueueActor] = {}
        self.options = options

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    @property
    def queues(self) -> Mapping[QueueKind, QueueActor]:
        """The device's queue actors by kind, set when it opens. A kind of device whose
        queues are of a kind of its own narrows this (read-only, so that is sound)."""
        return self._queues

    @property
    def caps(self) -> DeviceCaps:
        return DeviceCaps(
            name=self.name,
            kind=self.kind,
            has_copy_queue=QueueKind.COPY in self.queues,
            host_visible=self.host_visible,
            is_cpu=self.host_memory,
            host_backed=self.host_backed,
            host_io=self.host_io,
        )

    def holding_signal(self, name: str, value: int) -> HoldingSignal:
        """A signal for a queue of this device that jobs may be held on: a job run where
        it was submitted that waits on it stays parked on its actor, and whoever moves it
        runs the job on (`Resumer`), with no task switch."""
        return HoldingSignal(name, value, self.resumer)

    def take_ticket(self) -> int:
        """Give the next submission its place on this device; return the value to wait for."""
        prev = self.next_ticket
        if prev >= _VALUE_MAX:
            raise OverflowError(
                f"{self.name}/timeline would pass 2**64-1; start the runtime with a lower "
                f"timeline_start"
            )
        self.next_ticket = prev + 1
        return prev

    def give_back(self, ticket: int) -> None:
        """Undo the last `take_ticket`, which returned `ticket` (nothing was posted)."""
        self.next_ticket = ticket

    def advance(self) -> None:
        """A submission on this device that took no ticket (a LinearRun: it ran to its
        end where it was submitted, with all earlier work done) is over: it passes its
        turn. The timeline moves before the ticket counter, so an interruption between
        the two leaves the next submission's turn reached, never out of reach."""
        ticket = self.next_ticket + 1
        self.timeline.set(ticket)
        self.next_ticket = ticket

    async def start(self, nursery: trio.Nursery) -> None:
        for actor in self.queues.values():
            await nursery.start(actor.serve)

    def close(self) -> None:
        """Release what the device holds outside trio (threads, driver handles)."""

    def new_queue(
        self, kind: QueueKind, name: str, make_signal: MakeSignal | None = None
    ) -> QueueActor | None:
        """Another actor that runs this device's ops of queue `kind` beside its own (a
        worker gives each client its own, so one client's waits never hold another's
        work), or None where ops are lowered for the device's own queues only.
        `make_signal(name, start)` makes the timeline signal the new actor owns, where
        the kind takes one made by the caller (CPU's does); the others make their own."""
        return None

    def drop_queue(self, actor: QueueActor) -> bool:
        """`actor`, made by `new_queue`, has stopped serving: give back what it holds
        (a stream, ...). Return whether work it started may still be running there (on a
        GPU). Queues of host work hold nothing."""
        return False

    def forget_signals(self, signals: Iterable[Signal], idle: bool) -> None:
        """`signals` (trio-side) will not move again and no new work will wait on them:
        give back what follows them for this device's queues (a GPU's mapped words). With
        `idle` False, work of a dropped queue may still be waiting on them."""

    def lowering_for(self, actor: QueueActor) -> contextlib.AbstractContextManager[None]:
        """While in this context, ops are lowered to run on `actor`, a queue made by
        `new_queue` (where lowering binds a queue's own host work, as CUDA's does)."""
        return contextlib.nullcontext()

    def check_reachable(self) -> None:
        """Raise if the device can take no more work (a remote device whose worker is
        gone raises its connection's error). Local devices always can."""

    def estimate_seconds(self, op: Op) -> float:
        """How long a lowered op of this device is expected to take, for cost-ordered
        plans. Devices without a cost model say 0."""
        return 0.0

    # -- memory --

    def allocate(self, nelems: int, dtype: np.dtype[Any]) -> Any:
        raise NotImplementedError

    def free(self, memory: Any) -> None:
        pass

    # -- lowering: items -> ops the device's actors run --

    def slow_builds(self, kernels: Iterable[Any]) -> list[Any]:
        """The kernels whose first lowering here would build them slowly (compile), so
        the runtime builds them first with `build_kernels` on a worker thread. Only asked
        of a kind of device that says `builds_kernels`."""
        return []

    def build_kernels(self, kernels: Sequence[Any]) -> None:
        """Build `kernels` ahead of lowering. Runs on a worker thread; a kernel that
        fails to build is left for lowering to report."""

    def lower_launch(self, launch: LaunchRequest) -> Op:
        raise NotImplementedError

    def lower_values(self, op: Op, launch: LaunchRequest) -> Op:
        """Lower `launch`, given `op`: what this device lowered a launch to that differed
        from `launch` at most in its var values and dims (the same item on the same
        buffers, bound for other values). Must give what `lower_launch(launch)` gives;
        a kind of device whose ops keep the values apart from what the buffers give
        takes the rest from `op` (the base lowers it anew)."""
        return self.lower_launch(launch)

    def lower_copy(self, item: int, dst: DeviceBuffer, src: DeviceBuffer, queue: QueueKind) -> Op:
        raise NotImplementedError

    def lower_host_write(
        self, buffer: DeviceBuffer, array: np.ndarray[Any, Any], queue: QueueKind
    ) -> Op:
        raise NotImplementedError

    def lower_host_read(
        self, buffer: DeviceBuffer, out: np.ndarray[Any, Any], queue: QueueKind
    ) -> Op:
        raise NotImplementedError
