"""The public names of REMOTE devices (`KIND:N@HOST:PORT`): the device kind lives in
actorgraph.devices.remote, the worker that serves them in actorgraph.worker."""

from actorgraph.devices.remote import MachineCode as MachineCode
from actorgraph.devices.remote import RemoteConnectionError as RemoteConnectionError
from actorgraph.devices.remote import RemoteDevice as RemoteDevice
from actorgraph.devices.remote import RemoteError as RemoteError
from actorgraph.devices.remote import WorkerCPU as WorkerCPU
from actorgraph.devices.remote import open_remote_devices as open_remote_devices

__all__ = [
    "MachineCode",
    "RemoteConnectionError",
    "RemoteDevice",
    "RemoteError",
    "WorkerCPU",
    "open_remote_devices",
]
