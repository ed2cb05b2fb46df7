"""The kinds of device of this process by the name their devices start with (`CPU`,
`SIM`, `CUDA`). A worker's devices are of these kinds too: a REMOTE device reads what
its worker's device can do from the kind its name gives (devices/remote/_device.py)."""

from __future__ import annotations

from types import MappingProxyType

from ._cpu import CPUDevice
from ._device import Device
from ._sim import SIMDevice
from .cuda import CUDADevice

# Read-only: a runtime opens instances, never edits this.
DEVICE_KINDS: MappingProxyType[str, type[Device]] = MappingProxyType(
    {"CPU": CPUDevice, "SIM": SIMDevice, "CUDA": CUDADevice}
)
