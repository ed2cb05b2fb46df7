"""Cost models for simulated devices: how long a launch or a copy takes, as plain data.

A cost model is a table, not code paths: per device kind a launch latency, a compute
throughput and a memory bandwidth; per link (same device, peer link, host link) a
latency and a bandwidth. A kernel may declare its own cost (`Kernel(..., cost=...)`):

    cost=None            memory-bound estimate: bytes the launch touches / memory bandwidth
    cost=2e-5            the kernel runs 20 us
    cost=Work(flops=..)  roofline: max(flops / throughput, bytes / memory bandwidth)
    cost=fn              fn(buffer_nbytes, var_values) -> seconds or a Work, per launch

The device's launch latency is added to every kernel; a copy takes the link's latency
plus bytes / bandwidth.

Presets (figures per direction; vendor datasheets named per figure):

- ``nvlink8``: an 8-GPU HGX H100 SXM5 node (the H200 SXM board has the same compute and
  NVLink figures and more memory bandwidth).
  compute 989 TFLOP/s (dense BF16 tensor core, NVIDIA H100 Tensor Core GPU datasheet,
  SXM5 column); memory 3.35 TB/s (HBM3, same datasheet); peer link 450 GB/s (NVLink 4:
  900 GB/s total bidirectional per GPU through NVSwitch, same datasheet; NVIDIA HGX H100
  platform brief); host link 64 GB/s (PCIe Gen5 x16: 128 GB/s bidirectional, same
  datasheet).
- ``pcie8``: 8 H100 PCIe cards without NVLink bridges, peers talk through PCIe switches.
  compute 756 TFLOP/s (dense BF16, H100 datasheet, PCIe column); memory 2.0 TB/s (HBM2e,
  same column); peer and host links 64 GB/s (PCIe Gen5 x16, 128 GB/s bidirectional).

Latencies are not datasheet figures: they are round values of the order that CUDA
micro-benchmarks report (a kernel launch inside a graph ~2 us, a peer copy ~3 us, a
host copy ~10 us). A same-device copy reads and writes device memory, so it moves at
half the memory bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

from ._device import DeviceError


def _non_negative(instance: Any, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name} must be a number >= 0, got {value!r}"
        )
    if math.isinf(value):
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name} must be finite, got {value!r}"
        )


def _positive(instance: Any, attribute: attrs.Attribute[float], value: float) -> None:
    _non_negative(instance, attribute, value)
    if value == 0:
        raise ValueError(f"{type(instance).__name__}.{attribute.name} must be > 0, got {value!r}")


@attrs.frozen
class Work:
    """What a kernel launch does, for the roofline estimate.

    `nbytes=None` means the bytes of the buffers the launch touches.
    """

    flops: float = attrs.field(default=0.0, validator=_non_negative)
    nbytes: float | None = None

    def __attrs_post_init__(self) -> None:
        nbytes = self.nbytes
        if nbytes is not None and (
            isinstance(nbytes, bool)
            or not isinstance(nbytes, (int, float))
            or not 0 <= nbytes < math.inf
        ):
            raise ValueError(f"Work.nbytes must be None or a number >= 0, got {nbytes!r}")


@attrs.frozen
class DeviceCost:
    """Per device kind: seconds per launch, FLOP/s, bytes/s of device memory."""

    launch_latency: float = attrs.field(validator=_non_negative)
    compute_throughput: float = attrs.field(validator=_positive)
    memory_bandwidth: float = attrs.field(validator=_positive)


@attrs.frozen
class LinkCost:
    """One kind of link: seconds per transfer, bytes/s."""

    latency: float = attrs.field(validator=_non_negative)
    bandwidth: float = attrs.field(validator=_positive)

    def duration(self, nbytes: int) -> float:
        return self.latency + nbytes / self.bandwidth


def _device_table(value: Mapping[str, DeviceCost]) -> Mapping[str, DeviceCost]:
    table = dict(value)
    for kind, cost in table.items():
        if not isinstance(cost, DeviceCost):
            raise ValueError(f"CostModel.devices[{kind!r}] must be a DeviceCost, got {cost!r}")
    return MappingProxyType(table)


@attrs.frozen
class CostModel:
    """A simulated node: device costs per device kind, and its three kinds of link."""

    name: str
    devices: Mapping[str, DeviceCost] = attrs.field(converter=_device_table)
    same_device: LinkCost
    peer: LinkCost
    host: LinkCost

    def device(self, kind: str) -> DeviceCost:
        try:
            return self.devices[kind]
        except KeyError:
            raise DeviceError(
                f"cost model {self.name!r} has no figures for {kind} devices; "
                f"add devices={{{kind!r}: DeviceCost(...)}}"
            ) from None

    def kernel_duration(
        self, kind: str, kernel: Any, buffer_nbytes: Sequence[int], var_values: Sequence[int]
    ) -> float:
        """Seconds one launch of `kernel` takes on a `kind` device (launch latency included)."""
        dev = self.device(kind)
        cost = kernel.cost
        if cost is None:  # the common case first: bytes the launch touches, at memory speed
            return dev.launch_latency + sum(buffer_nbytes) / dev.memory_bandwidth
        if callable(cost) and not isinstance(cost, Work):
            cost = cost(tuple(buffer_nbytes), tuple(var_values))
        if cost is None:
            cost = Work()
        if isinstance(cost, Work):
            nbytes = sum(buffer_nbytes) if cost.nbytes is None else cost.nbytes
            body = max(cost.flops / dev.compute_throughput, nbytes / dev.memory_bandwidth)
        elif isinstance(cost, (int, float)) and not isinstance(cost, bool) and 0 <= cost < math.inf:
            body = float(cost)
        else:
            raise DeviceError(
                f"kernel {kernel.name!r}: cost must give seconds >= 0 or a Work, got {cost!r}"
            )
        return dev.launch_latency + body


def check_kernel_cost(name: str, cost: Any) -> None:
    """Reject a cost that is not None, seconds >= 0, a Work, or a callable."""
    if cost is None or isinstance(cost, Work) or callable(cost):
        return
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and 0 <= cost < math.inf:
        return
    raise ValueError(
        f"Kernel {name!r}: cost= must be seconds >= 0, a Work(flops=..., nbytes=...), or "
        f"fn(buffer_nbytes, var_values) -> seconds; got {cost!r}"
    )


_H100_SXM = DeviceCost(launch_latency=2e-6, compute_throughput=989e12, memory_bandwidth=3.35e12)
_H100_PCIE = DeviceCost(launch_latency=2e-6, compute_throughput=756e12, memory_bandwidth=2.0e12)
_PCIE5 = LinkCost(latency=10e-6, bandwidth=64e9)

PRESETS: Mapping[str, CostModel] = MappingProxyType(
    {
        "nvlink8": CostModel(
            name="nvlink8",
            devices={"SIM": _H100_SXM},
            same_device=LinkCost(latency=2e-6, bandwidth=3.35e12 / 2),
            peer=LinkCost(latency=3e-6, bandwidth=450e9),
            host=_PCIE5,
        ),
        "pcie8": CostModel(
            name="pcie8",
            devices={"SIM": _H100_PCIE},
            same_device=LinkCost(latency=2e-6, bandwidth=2.0e12 / 2),
            peer=LinkCost(latency=10e-6, bandwidth=64e9),
            host=_PCIE5,
        ),
    }
)

DEFAULT_PRESET = "nvlink8"


def resolve_cost_model(preset: Any) -> CostModel:
    """`sim_preset=` as given to open_runtime: a preset name or a CostModel."""
    if isinstance(preset, CostModel):
        return preset
    if isinstance(preset, str) and preset in PRESETS:
        return PRESETS[preset]
    raise DeviceError(
        f"unknown sim_preset {preset!r}: use one of {sorted(PRESETS)} or a CostModel(...)"
    )
