"""SIM:N devices: simulated GPUs whose data is real and whose time comes from a cost model.

A SIM device has a compute and a copy queue actor, like a GPU with one compute stream
and one DMA engine. A kernel runs its CPU body (so results are exact) and a copy moves
the bytes; the time each takes comes from the runtime's cost model and passes on trio's
clock. Under `trio.testing.MockClock(autojump_threshold=0)` a run costs no wall time and
is deterministic: the same graph gives the same per-item start and end times.

Time is kept lazily. Each queue knows when its simulated hardware is next free
(`_busy_until`); an item starts at max(now, busy_until) and ends `duration` later. The
actor only sleeps on trio's clock before something another task can observe: a signal,
a wait, the end of its job. A run of items with nothing between them costs no checkpoint
per item, and every observable event still happens at its simulated time. A profiled job
(`profile=True`) takes its time item by item, and a SIM actor's profile clock is trio's
clock, so profile spans are the simulated start and end of each item.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import attrs
import numpy as np
import trio
from actorgraph.scheduler import DeviceCaps, QueueKind

from ._actor import QueueActor
from ._costmodel import DEFAULT_PRESET, CostModel, LinkCost, resolve_cost_model
from ._cpu import copy_args, host_launch_call
from ._device import Device, DeviceBuffer, LaunchRequest, MakeSignal, nothing, same_bytes
from ._links import SharedLinks, Transfer
from ._ops import HOST_OPS, KICK, SIM_RUN, Job, Op, SimRun, sim_run
from ._step import run_calls
from ._topology import Route


@attrs.frozen
class SimRecord:
    """One item as a SIM queue ran it, in simulated seconds on trio's clock.

    Attributes:
        queue: the queue actor, "SIM:0/compute".
        submission: which of the runtime's submissions (graph replays, eager items, host
            copies) it belongs to, numbered in the order they were made; `rt.kick.value`
            is the latest.
        item: the item's index in its graph (or in the `rt.run` list), -1 for a host copy.
        start: when it started.
        end: when it ended.
    """

    queue: str
    submission: int
    item: int
    start: float
    end: float


class SimQueueActor(QueueActor):
    """A queue actor that takes simulated time per item and records when each ran."""

    op_codes = HOST_OPS | {SIM_RUN}
    # Profiles and blocked times of a simulated queue are in simulated time.
    clock = staticmethod(trio.current_time)

    def __init__(self, name: str, timeline_start: int = 0) -> None:
        super().__init__(name, timeline_start)
        self._busy_until = -math.inf
        # (submission, item, start, end) per item; a flat list keeps recording cheap.
        self._records: list[tuple[int, int, float, float]] = []

    def sim_records(self) -> tuple[SimRecord, ...]:
        """Every item this queue ran since it started (or since `clear_sim_records`)."""
        name = self.name
        return tuple(SimRecord(name, *rec) for rec in self._records)

    def clear_sim_records(self) -> None:
        self._records.clear()

    async def _run_device_op(self, op: Op, job: Job, next_index: int) -> int:
        if op.code != SIM_RUN:
            return await super()._run_device_op(op, job, next_index)
        # A run of SIM_RUN ops: their bodies as `step` runs a run of calls, their times
        # one after another on the simulated hardware. A profiled job takes them one at a
        # time, so that each span is its item's simulated start and end.
        at = next_index - 1
        if job.observer is None:
            end, calls = job.script.runs[at]
        else:
            end, calls = next_index, ((op.fn, op.args),)
        now = trio.current_time()
        sub = job.submission
        if sub.error is None:
            failed = run_calls(calls, at, None)
            if failed is not None:
                sub.fail(job.item_at(failed[0]), self.name, failed[1])
        busy = self._busy_until
        kick = job.bases[KICK]  # numbers submissions runtime-wide
        # Ops of a run of SIM_RUN ops (Script.runs).
        for run in cast("tuple[SimRun, ...]", job.ops[at:end]):
            start = busy if busy > now else now
            transfer = run.transfer
            # A copy over shared links ends when its share of them has moved its bytes
            # (trio's time is then its end).
            busy = start + run.seconds if transfer is None else await transfer.run(start)
            self._records.append((kick, run.item, start, busy))
        self._busy_until = busy
        # Something observable comes next (a signal, a wait, the job's end): let
        # simulated time catch up first.
        if busy > trio.current_time():
            await trio.sleep_until(busy)
        return end


class SIMDevice(Device):
    """A simulated GPU. Memory is host numpy arrays; the planner sees device memory."""

    kind = "SIM"
    options_taken = frozenset(["sim_preset"])
    host_visible = False

    def __init__(self, name: str, index: int, *, timeline_start: int = 0, **options: Any) -> None:
        super().__init__(name, index, timeline_start=timeline_start, **options)
        self.cost_model: CostModel = resolve_cost_model(options.get("sim_preset", DEFAULT_PRESET))
        self.cost_model.check_index(name, index)
        self.device_cost = self.cost_model.device(self.kind)
        # Every SIM device of one runtime sits in the same simulated machine.
        self.peer_group = f"SIM/{self.cost_model.name}"
        self.node = self.cost_model.node_of(index)
        # The links its copies share; the runtime gives all its SIM devices one (`join`).
        self.links = SharedLinks()
        self._routes: dict[int, Route] = {}
        self._sim_queues = {
            QueueKind.COMPUTE: SimQueueActor(f"{name}/compute", timeline_start),
            QueueKind.COPY: SimQueueActor(f"{name}/copy", timeline_start),
        }

    @property
    def queues(self) -> Mapping[QueueKind, SimQueueActor]:
        return self._sim_queues

    def new_queue(
        self, kind: QueueKind, name: str, make_signal: MakeSignal | None = None
    ) -> QueueActor | None:
        return SimQueueActor(name)

    @property
    def caps(self) -> DeviceCaps:
        return attrs.evolve(super().caps, peer_group=self.peer_group)

    def sim_records(self) -> tuple[SimRecord, ...]:
        """This device's records, compute queue first, each queue in run order."""
        return tuple(rec for actor in self.queues.values() for rec in actor.sim_records())

    def clear_sim_records(self) -> None:
        for actor in self.queues.values():
            actor.clear_sim_records()

    def allocate(self, nelems: int, dtype: np.dtype[Any]) -> Any:
        return np.zeros(nelems, dtype=dtype)

    def join(self, links: SharedLinks) -> None:
        """Share `links` with the other SIM devices of the runtime (before any copy runs)."""
        self.links = links

    # -- costs --

    def link_to(self, other: Device) -> LinkCost:
        """The kind of link a copy between this device and `other` goes over."""
        model = self.cost_model
        if other is self:
            return model.same_device
        if isinstance(other, SIMDevice) and other.peer_group == self.peer_group:
            return model.peer
        return model.host

    def route_to(self, other: Device) -> Route:
        """The route of a copy between this device and `other`, whichever way it goes
        (its links are named for the direction from this device to `other`)."""
        if (
            isinstance(other, SIMDevice)
            and other is not self
            and other.peer_group == self.peer_group
        ):
            route = self._routes.get(other.index)
            if route is None:
                route = self._routes[other.index] = self.cost_model.peer_route(
                    self.index, other.index, self.kind
                )
            return route
        link = self.link_to(other)
        return Route(link.latency, link.bandwidth)

    def launch_duration(
        self, kernel: Any, buffers: Sequence[DeviceBuffer], var_values: Sequence[int]
    ) -> float:
        return self.device_cost.kernel_duration(kernel, [b.nbytes for b in buffers], var_values)

    def copy_route(self, dst: DeviceBuffer, src: DeviceBuffer) -> Route:
        """The route of a copy this device's queue runs, from `src` to `dst`."""
        source, target = src.device_object, dst.device_object
        if isinstance(source, SIMDevice):
            return source.route_to(target)
        return self.route_to(source)  # from the host: the host link, either way

    def copy_duration(self, dst: DeviceBuffer, src: DeviceBuffer) -> float:
        return self.copy_route(dst, src).duration(dst.nbytes)

    def estimate_seconds(self, op: Op) -> float:
        return sim_op_seconds(op)

    # -- lowering --

    def lower_launch(self, launch: LaunchRequest) -> Op:
        fn, args = host_launch_call(self, launch)
        seconds = self.launch_duration(launch.kernel, launch.buffers, launch.var_values)
        return sim_run(fn, args, launch.item, seconds)

    def lower_copy(self, item: int, dst: DeviceBuffer, src: DeviceBuffer, queue: QueueKind) -> Op:
        if same_bytes(dst, src):
            return sim_run(nothing, (), item, 0.0)
        args = copy_args(dst.host_view(), src.host_view())
        route = self.copy_route(dst, src)
        nbytes = dst.nbytes
        transfer = Transfer(self.links, route, nbytes) if route.links else None
        return sim_run(np.copyto, args, item, route.duration(nbytes), transfer)

    def lower_host_write(
        self, buffer: DeviceBuffer, array: np.ndarray[Any, Any], queue: QueueKind
    ) -> Op:
        seconds = self.cost_model.host.duration(buffer.nbytes)
        return sim_run(np.copyto, copy_args(buffer.host_view(), array), -1, seconds)

    def lower_host_read(
        self, buffer: DeviceBuffer, out: np.ndarray[Any, Any], queue: QueueKind
    ) -> Op:
        seconds = self.cost_model.host.duration(buffer.nbytes)
        return sim_run(np.copyto, copy_args(out, buffer.host_view()), -1, seconds)


def sim_op_seconds(op: Op) -> float:
    """Simulated seconds of a lowered op: its duration for SIM ops, 0 for any other."""
    return float(op.seconds) if op.code == SIM_RUN else 0.0


def sim_op_links(op: Op) -> list[tuple[str, float]]:
    """The shared links a lowered op crosses and how long it holds each at full speed
    (a copy between SIM GPUs of a topology); [] for any other op."""
    if op.code != SIM_RUN or op.transfer is None:
        return []
    return op.transfer.link_seconds()


def join_sim_devices(devices: Iterable[Device]) -> SharedLinks | None:
    """Make the SIM devices among `devices` (one runtime's) one simulated machine: their
    copies share one set of links. Returns it (None without SIM devices)."""
    sims = [d for d in devices if isinstance(d, SIMDevice)]
    if not sims:
        return None
    links = SharedLinks()
    for device in sims:
        device.join(links)
    return links
