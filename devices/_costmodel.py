"""Cost models for simulated devices: how long a launch or a copy takes, as plain data.

A cost model is a table, not code paths: per device kind a launch latency, a compute
throughput and a memory bandwidth; per link (same device, peer link, host link) a
latency and a bandwidth; and the machine's shape, a `Topology` of nodes of GPUs and the
network between them (devices/_topology.py). A kernel may declare its own cost
(`Kernel(..., cost=...)`):

    cost=None            memory-bound estimate: bytes the launch touches / memory bandwidth
    cost=2e-5            the kernel runs 20 us
    cost=Work(flops=..)  roofline: max(flops / throughput, bytes / memory bandwidth)
    cost=fn              fn(buffer_nbytes, var_values) -> seconds or a Work, per launch

The device's launch latency is added to every kernel. A copy between two GPUs takes its
route's latency plus bytes / bandwidth, where copies that cross one link at the same
time share its bandwidth; a copy within a GPU or to and from the host takes that link's
latency plus bytes / bandwidth. A cost model without a topology is one node of any
number of GPUs whose copies never share a link.

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
- ``nvlink8x8``: 8 of the ``nvlink8`` nodes (64 GPUs, a DGX H100 SuperPOD scalable unit's
  shape) on an InfiniBand NDR fabric: 8 NICs per node, one per GPU, 400 Gb/s = 50 GB/s
  each way (NVIDIA DGX H100 datasheet: 8 single-port ConnectX-7, up to 400 Gb/s
  InfiniBand; NVIDIA ConnectX-7 datasheet).
- ``pcie4x4``: 4 nodes of 4 H100 PCIe cards (the ``pcie8`` figures) on 100 Gb/s Ethernet
  with RoCE: one NIC per node, 100 Gb/s = 12.5 GB/s each way, shared by its 4 GPUs
  (NVIDIA ConnectX-6 Dx datasheet, 100 GbE port).

Latencies are not datasheet figures: they are round values of the order that CUDA
and NCCL micro-benchmarks report (a kernel launch inside a graph ~2 us, a peer copy
~3 us over NVLink and ~10 us over PCIe, a host copy ~10 us, GPU to GPU across InfiniBand
~5 us and across RoCE ~10 us). A same-device copy reads and writes device memory, so it
moves at half the memory bandwidth. Link bandwidths are line rates: no protocol overhead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

from ._device import DeviceError
from ._topology import Network, Route, Topology, gpu_route


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
    """What a kernel launch does, for the roofline estimate of a SIM device: the launch takes
    the slower of `flops` / compute throughput and `nbytes` / memory bandwidth.

    Args:
        flops: the floating-point operations of one launch.
        nbytes: the bytes it moves through device memory (None: the bytes of the buffers
            the launch touches).

    Raises:
        ValueError: a figure that is not a number >= 0.
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
    """The figures of one device kind.

    Args:
        launch_latency: seconds every launch takes before its work.
        compute_throughput: FLOP/s.
        memory_bandwidth: bytes/s of device memory.

    Raises:
        ValueError: a latency below 0, or a throughput or bandwidth that is not above 0.
    """

    launch_latency: float = attrs.field(validator=_non_negative)
    compute_throughput: float = attrs.field(validator=_positive)
    memory_bandwidth: float = attrs.field(validator=_positive)

    def kernel_duration(
        self, kernel: Any, buffer_nbytes: Sequence[int], var_values: Sequence[int]
    ) -> float:
        """Seconds one launch of `kernel` takes on such a device, launch latency included.

        Args:
            kernel: the Kernel, whose `cost` says what a launch does.
            buffer_nbytes: the bytes of each of the launch's buffers.
            var_values: the launch's Var values (for a cost function).

        Returns:
            The seconds.

        Raises:
            DeviceError: the kernel's cost function gave neither seconds >= 0 nor a Work.
        """
        cost = kernel.cost
        if cost is None:  # the common case first: bytes the launch touches, at memory speed
            return self.launch_latency + sum(buffer_nbytes) / self.memory_bandwidth
        if callable(cost) and not isinstance(cost, Work):
            cost = cost(tuple(buffer_nbytes), tuple(var_values))
        if cost is None:
            cost = Work()
        if isinstance(cost, Work):
            nbytes = sum(buffer_nbytes) if cost.nbytes is None else cost.nbytes
            body = max(cost.flops / self.compute_throughput, nbytes / self.memory_bandwidth)
        elif isinstance(cost, (int, float)) and not isinstance(cost, bool) and 0 <= cost < math.inf:
            body = float(cost)
        else:
            raise DeviceError(
                f"kernel {kernel.name!r}: cost must give seconds >= 0 or a Work, got {cost!r}"
            )
        return self.launch_latency + body


@attrs.frozen
class LinkCost:
    """One kind of link: a copy over it takes `latency` plus its bytes over `bandwidth`.

    Args:
        latency: seconds per transfer.
        bandwidth: bytes/s.

    Raises:
        ValueError: a latency below 0, or a bandwidth that is not above 0.
    """

    latency: float = attrs.field(validator=_non_negative)
    bandwidth: float = attrs.field(validator=_positive)

    def duration(self, nbytes: int) -> float:
        """Seconds a copy of `nbytes` takes over such a link alone.

        Args:
            nbytes: the bytes copied.

        Returns:
            latency + nbytes / bandwidth.
        """
        return self.latency + nbytes / self.bandwidth


def _device_table(value: Mapping[str, DeviceCost]) -> Mapping[str, DeviceCost]:
    table = dict(value)
    for kind, cost in table.items():
        if not isinstance(cost, DeviceCost):
            raise ValueError(f"CostModel.devices[{kind!r}] must be a DeviceCost, got {cost!r}")
    return MappingProxyType(table)


def _topology(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, Topology):
        raise ValueError(f"CostModel.topology must be a Topology or None, got {value!r}")


@attrs.frozen
class CostModel:
    """A simulated machine, plain data: what its devices and links cost, and its shape.

    Give one to `open_runtime(..., sim_preset=...)`, or use a preset by name
    (`ag.SIM_PRESETS`).

    Args:
        name: what messages call it.
        devices: a DeviceCost per device kind ("SIM").
        same_device: the link of a copy within one GPU.
        peer: the link between two GPUs of a node (NVLink or PCIe).
        host: the link between a GPU and host memory.
        topology: the machine's shape (nodes of GPUs and the network between them); None
            is one node of any number of GPUs whose copies never share a link.

    Raises:
        ValueError: a device cost that is no DeviceCost, or a topology that is no Topology.
    """

    name: str
    devices: Mapping[str, DeviceCost] = attrs.field(converter=_device_table)
    same_device: LinkCost
    peer: LinkCost
    host: LinkCost
    topology: Topology | None = attrs.field(default=None, validator=_topology)

    def check_index(self, name: str, index: int) -> None:
        """Refuse a device `name` (number `index`) that the topology has no GPU for."""
        topology = self.topology
        if topology is not None and index >= topology.gpus:
            bigger = sorted(
                f"{preset!r} ({model.topology.gpus} GPUs)"
                for preset, model in PRESETS.items()
                if model.topology is not None and model.topology.gpus > index
            )
            hint = f", or a preset with more GPUs: {', '.join(bigger)}" if bigger else ""
            raise DeviceError(
                f"{name} is past the {topology.gpus} GPUs of sim_preset {self.name!r} "
                f"({topology.describe()}): use SIM:0 to SIM:{topology.gpus - 1}{hint}"
            )

    def describe(self) -> str:
        """The machine in one line: its shape, its links, its device names.

        Returns:
            The line, as `actorgraph devices` prints it.
        """
        topology = self.topology
        if topology is None:
            return "one node of any number of GPUs (SIM:N), copies never share a link"
        names = f"SIM:0 to SIM:{topology.gpus - 1}"
        if topology.nodes > 1:
            names += f", SIM:N in node N // {topology.gpus_per_node}"
        return f"{topology.describe()}: {names}"

    def node_of(self, index: int) -> int:
        """The node GPU `index` (`SIM:index`) sits in.

        Args:
            index: the GPU's number, N of SIM:N.

        Returns:
            Its node's number; 0 without a topology.
        """
        return 0 if self.topology is None else self.topology.node_of(index)

    def peer_route(self, src: int, dst: int, kind: str = "SIM") -> Route:
        """The route of a copy between two different GPUs: its latency, its bandwidth alone, and
        the links it shares with other copies.

        Args:
            src: the source GPU's number.
            dst: the destination GPU's number.
            kind: the device kind whose names the route's links use.

        Returns:
            The Route.
        """
        peer = self.peer
        if self.topology is None:
            return Route(peer.latency, peer.bandwidth)
        return gpu_route(self.topology, peer.latency, peer.bandwidth, src, dst, kind)

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
        """Seconds one launch of `kernel` takes on a `kind` device, launch latency included.

        Args:
            kind: the device kind ("SIM").
            kernel: the Kernel.
            buffer_nbytes: the bytes of each of the launch's buffers.
            var_values: the launch's Var values.

        Returns:
            The seconds.
        """
        return self.device(kind).kernel_duration(kernel, buffer_nbytes, var_values)


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

_NVLINK4 = LinkCost(latency=3e-6, bandwidth=450e9)
_PCIE5_PEER = LinkCost(latency=10e-6, bandwidth=64e9)
_SXM_COPY = LinkCost(latency=2e-6, bandwidth=3.35e12 / 2)
_PCIE_CARD_COPY = LinkCost(latency=2e-6, bandwidth=2.0e12 / 2)
_NDR = Network("InfiniBand NDR", latency=5e-6, nic_bandwidth=50e9, nics_per_node=8)
_ROCE_100G = Network("RoCE Ethernet", latency=10e-6, nic_bandwidth=12.5e9, nics_per_node=1)

_NVLINK8 = CostModel(
    name="nvlink8",
    devices={"SIM": _H100_SXM},
    same_device=_SXM_COPY,
    peer=_NVLINK4,
    host=_PCIE5,
    topology=Topology(1, 8, "NVLink"),
)
_PCIE8 = CostModel(
    name="pcie8",
    devices={"SIM": _H100_PCIE},
    same_device=_PCIE_CARD_COPY,
    peer=_PCIE5_PEER,
    host=_PCIE5,
    topology=Topology(1, 8, "PCIe"),
)

PRESETS: Mapping[str, CostModel] = MappingProxyType(
    {
        "nvlink8": _NVLINK8,
        "pcie8": _PCIE8,
        # Clusters of those nodes: the same GPUs and links in a node, a network between.
        "nvlink8x8": attrs.evolve(
            _NVLINK8, name="nvlink8x8", topology=Topology(8, 8, "NVLink", _NDR)
        ),
        "pcie4x4": attrs.evolve(
            _PCIE8, name="pcie4x4", topology=Topology(4, 4, "PCIe", _ROCE_100G)
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
