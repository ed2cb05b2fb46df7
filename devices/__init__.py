"""The actors: one trio task per device queue. Devices run plans; they never make them."""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any

from ._actor import EXEC as EXEC
from ._actor import EXEC_THREAD as EXEC_THREAD
from ._actor import FIRST_DEVICE_OP as FIRST_DEVICE_OP
from ._actor import SIGNAL as SIGNAL
from ._actor import WAIT as WAIT
from ._actor import ActorClosedError as ActorClosedError
from ._actor import ActorStatistics as ActorStatistics
from ._actor import Job as Job
from ._actor import QueueActor as QueueActor
from ._actor import Submission as Submission
from ._costmodel import PRESETS as PRESETS
from ._costmodel import CostModel as CostModel
from ._costmodel import DeviceCost as DeviceCost
from ._costmodel import LinkCost as LinkCost
from ._costmodel import Work as Work
from ._cpu import CPUDevice as CPUDevice
from ._device import Device as Device
from ._device import DeviceError as DeviceError
from ._signal import Signal as Signal
from ._sim import SIMDevice as SIMDevice
from ._sim import SimQueueActor as SimQueueActor
from ._sim import SimRecord as SimRecord

# Device kinds by name prefix. Read-only: a runtime opens instances, never edits this.
DEVICE_KINDS: MappingProxyType[str, type[Device]] = MappingProxyType(
    {"CPU": CPUDevice, "SIM": SIMDevice}
)

_NAME = re.compile(r"^([A-Z]+):(\d+)$")


def parse_device_name(name: str) -> tuple[str, int]:
    """'CPU:1' -> ('CPU', 1), with an error that lists the known kinds."""
    match = _NAME.match(name) if isinstance(name, str) else None
    if match is None or match.group(1) not in DEVICE_KINDS:
        kinds = ", ".join(f"{k}:N" for k in DEVICE_KINDS)
        raise DeviceError(f"unknown device name {name!r}: expected one of {kinds} (e.g. 'CPU:0')")
    return match.group(1), int(match.group(2))


def open_device(name: str, **options: Any) -> Device:
    kind, index = parse_device_name(name)
    return DEVICE_KINDS[kind](name, index, **options)
