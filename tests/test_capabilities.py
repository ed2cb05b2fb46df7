"""What a device can do is an attribute of its kind (devices/_device.py: `host_memory`,
`runs_host_kernels`, `host_backed`), never read from its name: a kind of another name
with a capability is treated by it, and one named CPU without it is not."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
import trio
from actorgraph.devices import CPUDevice, CUDADevice, Device, DeviceError, RemoteDevice
from actorgraph.devices.remote import MachineCode, open_remote_devices
from actorgraph.scheduler import QueueKind

import actorgraph as ag
from actorgraph import devices

GUARD = 30


class HostDevice(CPUDevice):
    """A kind of host device under another name: a CPU's capabilities, kind HOST."""

    kind = "HOST"


class SealedCPU(CPUDevice):
    """A kind named CPU whose memory is not host memory others may hand it, and whose
    kernels are not host calls: the capabilities say so, whatever the name."""

    host_memory = False
    runs_host_kernels = False


@pytest.fixture
def kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {**devices.DEVICE_KINDS, "HOST": HostDevice, "SEALED": SealedCPU}
    monkeypatch.setattr(devices, "DEVICE_KINDS", MappingProxyType(table))


def test_every_kind_says_its_capabilities() -> None:
    assert CPUDevice.host_memory and CPUDevice.runs_host_kernels
    for kind in (devices.SIMDevice, CUDADevice, RemoteDevice):
        assert not kind.host_memory and not kind.runs_host_kernels, kind
    assert not CUDADevice.host_backed and CPUDevice.host_backed


@pytest.mark.usefixtures("kinds")
async def test_wrap_takes_host_memory_by_the_capability_not_the_name() -> None:
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["HOST:0", "SEALED:0"]) as rt:
            data = np.arange(4, dtype=np.int32)
            buf = rt.wrap("HOST:0", data, dtype=np.int32)
            np.testing.assert_array_equal(await rt.copyout(buf), data)
            with pytest.raises(ag.UsageError, match=r"wrap: SEALED:0 does not hold host memory"):
                rt.wrap("SEALED:0", data, dtype=np.int32)
            assert rt.caps["HOST:0"].is_cpu and not rt.caps["SEALED:0"].is_cpu


@pytest.mark.usefixtures("kinds")
async def test_a_replay_runs_off_the_runtimes_thread_by_the_capability() -> None:
    kernel = ag.Kernel("inc", lambda x: x.__iadd__(1), outs=[0], ins=[0])
    with trio.fail_after(GUARD):
        async with ag.open_runtime(["HOST:0", "SEALED:0"]) as rt:
            for name, off_thread in (("HOST:0", True), ("SEALED:0", False)):
                x = rt.alloc(name, 4, np.int32)
                graph = await rt.compile([ag.Launch(kernel, [x])])
                assert graph.runs_off_thread is off_thread, name


def _remote(name: str) -> RemoteDevice:
    device = open_remote_devices([name], kinds=devices.DEVICE_KINDS)[name]
    assert isinstance(device, RemoteDevice)
    return device


@pytest.mark.usefixtures("kinds")
def test_a_workers_device_is_treated_by_its_kinds_capabilities() -> None:
    host, sealed = _remote("HOST:0@127.0.0.1:7000"), _remote("SEALED:0@127.0.0.1:7001")
    # A host kind's queue on a worker tells other workers how far it got; a sealed one not.
    assert host.queues[QueueKind.COMPUTE].tells_peers
    assert not sealed.queues[QueueKind.COMPUTE].tells_peers
    code = MachineCode("k", b"\x7fELF" + bytes(60), "x86_64", buffers=1)
    kernel = ag.Kernel("k", code=code, outs=[0])
    launch: Any = (0, kernel, [], [], (1, 1, 1), (1, 1, 1), QueueKind.COMPUTE)
    with pytest.raises(DeviceError, match=r"SEALED:0@127.0.0.1:7001 does not run host kernels"):
        sealed.lower_launch(launch)


def test_a_workers_device_of_a_kind_this_host_lacks_has_no_capabilities() -> None:
    other = open_remote_devices(["XPU:0@127.0.0.1:7000"], kinds=devices.DEVICE_KINDS)
    device = other["XPU:0@127.0.0.1:7000"]
    assert isinstance(device, RemoteDevice) and device.inner_kind is Device
    assert not device.queues[QueueKind.COMPUTE].tells_peers
