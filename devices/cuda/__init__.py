"""CUDA:N devices through cuda-python, and a fake driver that runs them without a GPU."""

from ._device import ENV_DRIVER as ENV_DRIVER
from ._device import CUDADevice as CUDADevice
from ._device import CudaMemory as CudaMemory
from ._driver import CopyKind as CopyKind
from ._driver import CudaDriver as CudaDriver
from ._driver import DriverUnavailable as DriverUnavailable
from ._fake import FakeDriver as FakeDriver
from ._queue import CudaQueueActor as CudaQueueActor
from ._queue import MappedSignal as MappedSignal

__all__ = [
    "ENV_DRIVER",
    "CUDADevice",
    "CopyKind",
    "CudaDriver",
    "CudaMemory",
    "CudaQueueActor",
    "DriverUnavailable",
    "FakeDriver",
    "MappedSignal",
]
