"""The actors: one trio task per device queue. Devices run plans; they never make them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ._actor import ActorStatistics as ActorStatistics
from ._actor import QueueActor as QueueActor
from ._costmodel import PRESETS as PRESETS
from ._costmodel import CostModel as CostModel
from ._costmodel import DeviceCost as DeviceCost
from ._costmodel import LinkCost as LinkCost
from ._costmodel import Work as Work
from ._costmodel import check_kernel_cost as check_kernel_cost
from ._cpu import CPUDevice as CPUDevice
from ._device import Device as Device
from ._device import DeviceBuffer as DeviceBuffer
from ._device import DeviceError as DeviceError
from ._device import LaunchRequest as LaunchRequest
from ._extras import install_hint as install_hint
from ._inline import HoldingSignal as HoldingSignal
from ._inline import InlineRun as InlineRun
from ._inline import Resumer as Resumer
from ._inline import run_inline as run_inline
from ._kinds import DEVICE_KINDS as DEVICE_KINDS
from ._linear import NOT_RUN as NOT_RUN
from ._linear import Failure as Failure
from ._linear import LinearRun as LinearRun
from ._linear import NotRun as NotRun
from ._linear import Ran as Ran
from ._linear import Schedule as Schedule
from ._links import LinkStatistics as LinkStatistics
from ._links import SharedLinks as SharedLinks
from ._links import Transfer as Transfer
from ._monitor import find_deadlock as find_deadlock
from ._names import parse_remote_name as parse_remote_name
from ._ops import AWAIT as AWAIT
from ._ops import BATCH as BATCH
from ._ops import EXEC as EXEC
from ._ops import EXEC_THREAD as EXEC_THREAD
from ._ops import FIRST_QUEUE_SLOT as FIRST_QUEUE_SLOT
from ._ops import KICK as KICK
from ._ops import SIGNAL as SIGNAL
from ._ops import WAIT as WAIT
from ._ops import WIRE as WIRE
from ._ops import ActorClosedError as ActorClosedError
from ._ops import Job as Job
from ._ops import JobProfile as JobProfile
from ._ops import Op as Op
from ._ops import OpCodeError as OpCodeError
from ._ops import Quick as Quick
from ._ops import RunOp as RunOp
from ._ops import Script as Script
from ._ops import SignalOp as SignalOp
from ._ops import Submission as Submission
from ._ops import WaitOp as WaitOp
from ._ops import WireOp as WireOp
from ._ops import WorkOp as WorkOp
from ._ops import own_signal as own_signal
from ._ops import run_op as run_op
from ._ops import signal_op as signal_op
from ._ops import wait_op as wait_op
from ._ops import wire_op as wire_op
from ._ops import without_bytes as without_bytes
from ._signal import Doorbell as Doorbell
from ._signal import Signal as Signal
from ._sim import SIMDevice as SIMDevice
from ._sim import SimQueueActor as SimQueueActor
from ._sim import SimRecord as SimRecord
from ._sim import join_sim_devices as join_sim_devices
from ._sim import sim_op_links as sim_op_links
from ._sim import sim_op_seconds as sim_op_seconds
from ._step import run_calls as run_calls
from ._step import step as step
from ._topology import Link as Link
from ._topology import Network as Network
from ._topology import Route as Route
from ._topology import Topology as Topology
from ._walk import OpWalker as OpWalker
from .cuda import CUDADevice as CUDADevice
from .remote import RemoteConnectionError as RemoteConnectionError
from .remote import RemoteDevice as RemoteDevice
from .remote import RemoteError as RemoteError
from .remote import open_remote_devices

# Every option of open_runtime(...) some kind of device reads.
_ALL_KINDS: tuple[type[Device], ...] = (*DEVICE_KINDS.values(), RemoteDevice)
DEVICE_OPTIONS: frozenset[str] = frozenset().union(*(kind.options_taken for kind in _ALL_KINDS))

_NAME = re.compile(r"^([A-Z]+):(\d+)$")


def parse_device_name(name: str) -> tuple[str, int]:
    """'CPU:1' -> ('CPU', 1), with an error that lists the known kinds.

    'KIND:N@HOST:PORT' names device KIND:N of a worker: -> ('REMOTE', N).
    """
    remote = parse_remote_name(name)
    if remote is not None:
        return "REMOTE", remote[1]
    match = _NAME.match(name) if isinstance(name, str) else None
    if match is None or match.group(1) not in DEVICE_KINDS:
        kinds = ", ".join(f"{k}:N" for k in DEVICE_KINDS)
        raise DeviceError(
            f"unknown device name {name!r}: expected one of {kinds} (e.g. 'CPU:0'), or "
            f"KIND:N@HOST:PORT for a device of a worker (e.g. 'CPU:0@127.0.0.1:7000')"
        )
    return match.group(1), int(match.group(2))


def open_device(name: str, *, resumer: Resumer | None = None, **options: Any) -> Device:
    """A device of this process by name (`KIND:N`); `resumer` runs on the jobs held on
    its queues (a runtime gives all its devices its own; None: one of the device's)."""
    kind, index = parse_device_name(name)
    if kind == "REMOTE":
        raise DeviceError(
            f"{name!r} names a device of a worker: open it with devices.open_devices "
            f"(open_runtime does), not with devices.open_device"
        )
    return DEVICE_KINDS[kind](name, index, resumer=resumer, **options)


def open_devices(
    names: Sequence[str], *, resumer: Resumer | None = None, **options: Any
) -> dict[str, Device]:
    """Devices by name: `KIND:N` ones of this process, and `KIND:N@HOST:PORT` ones of
    workers (devices/remote), those of one worker sharing one connection. `resumer`
    runs on the jobs held on any of their queues (None: a new one they all share)."""
    resumer = Resumer() if resumer is None else resumer
    remote = [n for n in names if parse_remote_name(n) is not None]
    opened = (
        open_remote_devices(remote, kinds=DEVICE_KINDS, resumer=resumer, **options)
        if remote
        else {}
    )
    return {
        n: opened[n] if n in opened else open_device(n, resumer=resumer, **options) for n in names
    }
