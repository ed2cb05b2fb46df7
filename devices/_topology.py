"""Where simulated GPUs sit, and the route a copy between two of them takes.

A cost model may carry a `Topology`: nodes of GPUs. Inside a node every GPU has a port
onto the node's interconnect (NVLink through NVSwitch, or PCIe through its switches), one
link out and one in, each at the cost model's `peer` bandwidth; the interconnect itself
does not block. Between nodes a `Network` (InfiniBand, RoCE): each node has NICs, each GPU
uses one of them (GPU g of a node with k NICs: NIC g * k // gpus_per_node, so with a NIC
per GPU each has its own, as on rail-optimised clusters), each NIC has a link out and one
in at `nic_bandwidth`, and the fabric between the NICs does not block.

A copy's route is the links it crosses: two GPUs of one node, the source's port out and
the destination's port in; two nodes, the source NIC's link out and the destination NIC's
link in (GPUDirect RDMA: the bytes go from GPU memory to the NIC, not through the node's
interconnect). A copy takes the route's latency, then moves its bytes at its share of
every link on the way: copies crossing one link share its bandwidth (devices/_links.py
shares it max-min fairly on trio's clock).

Device names stay `SIM:N`; the topology numbers GPUs node by node, so SIM:N is GPU
N % gpus_per_node of node N // gpus_per_node.
"""

from __future__ import annotations

import math
from typing import Any

import attrs


def _positive_number(instance: Any, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name} must be a finite number > 0, got {value!r}"
        )


def _latency(instance: Any, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name} must be a finite number >= 0, "
            f"got {value!r}"
        )


def _count(instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name} must be an int >= 1, got {value!r}"
        )


@attrs.frozen
class Network:
    """The links between nodes: NICs per node and the fabric's latency.

    GPU g of a node uses NIC `g * nics_per_node // gpus_per_node` (with a NIC per GPU each
    has its own, as on rail-optimised clusters); each NIC is a link out and one in.

    Args:
        name: what descriptions call it ("400 Gb/s InfiniBand NDR").
        latency: seconds from GPU to GPU across the fabric.
        nic_bandwidth: bytes/s of a NIC in each direction.
        nics_per_node: how many NICs a node has.

    Raises:
        ValueError: a latency below 0, a bandwidth that is not above 0, or a count below 1.
    """

    name: str
    latency: float = attrs.field(validator=_latency)
    nic_bandwidth: float = attrs.field(validator=_positive_number)
    nics_per_node: int = attrs.field(validator=_count)


@attrs.frozen
class Topology:
    """A machine of `nodes` nodes of `gpus_per_node` GPUs, its GPUs numbered node by node:
    `SIM:N` is GPU `N % gpus_per_node` of node `N // gpus_per_node`.

    Inside a node every GPU has a port onto the interconnect, one link out and one in at
    the cost model's `peer` bandwidth; between nodes copies go NIC to NIC. Copies that
    cross one link share its bandwidth fairly.

    Args:
        nodes: how many nodes.
        gpus_per_node: how many GPUs each node has.
        interconnect: the name of the links inside a node ("NVLink", "PCIe").
        network: the links between nodes (needed for more than one node).

    Raises:
        ValueError: a count below 1, or several nodes without a network.
    """

    nodes: int = attrs.field(validator=_count)
    gpus_per_node: int = attrs.field(validator=_count)
    interconnect: str = "NVLink"
    network: Network | None = None

    def __attrs_post_init__(self) -> None:
        if self.nodes > 1 and self.network is None:
            raise ValueError(
                f"Topology of {self.nodes} nodes needs network=Network(...): the links "
                f"between its nodes"
            )

    @property
    def gpus(self) -> int:
        """How many GPUs the machine has (nodes x GPUs per node)."""
        return self.nodes * self.gpus_per_node

    def node_of(self, index: int) -> int:
        """The node of GPU `index` (`SIM:index`).

        Args:
            index: the GPU's number.

        Returns:
            index // gpus_per_node.
        """
        return index // self.gpus_per_node

    def nic_of(self, index: int) -> int:
        """The NIC (numbered within its node) that GPU `index` sends and receives through.

        Args:
            index: the GPU's number.

        Returns:
            The NIC's number in its node.
        """
        network = self.network
        nics = 1 if network is None else network.nics_per_node
        return (index % self.gpus_per_node) * nics // self.gpus_per_node

    def describe(self) -> str:
        """One line: the machine's shape and its links.

        Returns:
            The line.
        """
        gpus = f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.gpus_per_node} GPUs"
        out = f"{gpus}, {self.interconnect} in a node"
        if self.network is not None and self.nodes > 1:
            net = self.network
            gbit = net.nic_bandwidth * 8 / 1e9
            out += f", {net.nics_per_node} x {gbit:g} Gb/s {net.name} NICs per node"
        return out


@attrs.frozen
class Link:
    """One direction of a link that copies share: `bandwidth` bytes/s among them."""

    name: str
    bandwidth: float


@attrs.frozen
class Route:
    """What a copy between two devices crosses: its latency, the bandwidth it moves at
    alone (its slowest link's), and the links it shares with other copies."""

    latency: float
    bandwidth: float
    links: tuple[Link, ...] = ()

    def duration(self, nbytes: int) -> float:
        """Seconds a copy of `nbytes` takes with the route to itself."""
        return self.latency + nbytes / self.bandwidth


def gpu_route(
    topology: Topology,
    peer_latency: float,
    peer_bandwidth: float,
    src: int,
    dst: int,
    kind: str = "SIM",
) -> Route:
    """The route of a copy from GPU `src` to GPU `dst` (two different GPUs of `topology`)."""
    src_node, dst_node = topology.node_of(src), topology.node_of(dst)
    if src_node == dst_node:
        port = topology.interconnect
        return Route(
            peer_latency,
            peer_bandwidth,
            (
                Link(f"{kind}:{src} {port} out", peer_bandwidth),
                Link(f"{kind}:{dst} {port} in", peer_bandwidth),
            ),
        )
    network = topology.network
    assert network is not None  # a topology of several nodes has one (checked when made)
    bandwidth = network.nic_bandwidth
    return Route(
        network.latency,
        bandwidth,
        (
            Link(f"node {src_node} NIC {topology.nic_of(src)} out", bandwidth),
            Link(f"node {dst_node} NIC {topology.nic_of(dst)} in", bandwidth),
        ),
    )
