"""Schedule quality on SIM devices: per-item simulated durations, lower bounds, timelines.

The durations are read from the ops a replay would run, so the bounds use exactly the
figures the simulated queues take; items on non-SIM devices count as 0 s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from actorgraph.devices import SIMDevice, SimRecord, sim_op_links, sim_op_seconds
from actorgraph.scheduler import Bounds, list_schedule_order, lower_bounds

from ._buffer import Buffer
from ._errors import UsageError
from ._graph import Graph, check_graph
from ._kernel import Item

if TYPE_CHECKING:
    from ._program import Program
    from ._runtime import Runtime


def _costs(
    graph: Graph, inputs: Sequence[Buffer] | None, var_vals: Mapping[Any, int] | None, what: str
) -> tuple[Program, list[float], list[list[tuple[str, float]]]]:
    """Each item's simulated seconds alone, and the shared links it holds for how long."""
    check_graph(graph, what)
    bound = graph.bind(graph.inputs if inputs is None else inputs, var_vals)
    program, ops = bound.program, bound.ops
    durations = []
    links: list[list[tuple[str, float]]] = []
    for j in range(len(program.items)):
        qi, pos = program.where[j]
        op = ops[qi][pos]
        durations.append(sim_op_seconds(op))
        links.append(sim_op_links(op))
    return program, durations, links


def _durations(
    graph: Graph, inputs: Sequence[Buffer] | None, var_vals: Mapping[Any, int] | None, what: str
) -> tuple[Program, list[float]]:
    program, durations, _ = _costs(graph, inputs, var_vals, what)
    return program, durations


def sim_durations(
    graph: Graph, inputs: Sequence[Buffer] | None = None, var_vals: Mapping[Any, int] | None = None
) -> list[float]:
    """The simulated seconds of each item of `graph`, each alone on its route, for a call with
    these inputs and Var values.

    Args:
        graph: a Graph with items on SIM devices (items on other devices count as 0 s).
        inputs: the input buffers of the call to estimate (None: those the graph was
            compiled with).
        var_vals: the call's Var values.

    Returns:
        One duration per item, in the order of the graph's items.

    Raises:
        UsageError: `graph` is no Graph.
        InputError: the inputs do not fit the graph.
    """
    return _durations(graph, inputs, var_vals, "sim_durations()")[1]


def sim_bounds(
    graph: Graph, inputs: Sequence[Buffer] | None = None, var_vals: Mapping[Any, int] | None = None
) -> Bounds:
    """Lower bounds on one replay's makespan under the SIM costs.

    The critical path; the busiest queue's work; the queue window (each queue as one
    machine whose items are released by the chains before them and followed by the
    chains after them: it sees a pipeline's fill and drain); and the same two for every
    shared link (a GPU's port, a node's NIC). The bounds hold for every order of the
    items; makespan / `bounds.best` says how far a replay is from them.

    Args:
        graph: a Graph with items on SIM devices (items on other devices count as 0 s).
        inputs: the input buffers of the call to estimate (None: those the graph was
            compiled with).
        var_vals: the call's Var values.

    Returns:
        The Bounds: each bound in seconds, `best` (the largest) and `binding` (which one).

    Raises:
        UsageError: `graph` is no Graph.
        InputError: the inputs do not fit the graph.
    """
    program, durations, links = _costs(graph, inputs, var_vals, "sim_bounds()")
    return lower_bounds(program.plan, durations, links)


def sim_reorder(
    graph: Graph, inputs: Sequence[Buffer] | None = None, var_vals: Mapping[Any, int] | None = None
) -> list[Item]:
    """The graph's items in the order a list scheduler starts them under the SIM costs.

    Compile the returned list instead of the original (or compile with
    `order="cost"`): results are the same (every pair of items that touch the same bytes
    keeps its order), but no queue waits behind an item whose data comes late while a
    later item of it could run.

    Args:
        graph: a Graph with items on SIM devices (items on other devices count as 0 s).
        inputs: the input buffers of the call to estimate (None: those the graph was
            compiled with).
        var_vals: the call's Var values.

    Returns:
        The items, reordered.

    Raises:
        UsageError: `graph` is no Graph.
        InputError: the inputs do not fit the graph.
    """
    program, durations = _durations(graph, inputs, var_vals, "sim_reorder()")
    order = list_schedule_order(program.plan, durations)
    return [program.items[j] for j in order]


def sim_nodes(runtime: Runtime) -> dict[str, int]:
    """The node each SIM device of `runtime` sits in, by name.

    `SIM:N` is in node `N // gpus_per_node` of its cost model's topology (0 without one).
    `ag.plot_timeline(..., groups=ag.sim_nodes(rt))` draws a timeline grouped by node.

    Args:
        runtime: an open Runtime.

    Returns:
        A dict from each SIM device's name to its node.
    """
    nodes: dict[str, int] = {}
    for name in runtime.devices:
        device = runtime.device(name)
        if isinstance(device, SIMDevice):
            nodes[name] = device.node
    return nodes


def sim_timeline(runtime: Runtime, submission: int | None = None) -> tuple[SimRecord, ...]:
    """What every SIM queue of `runtime` ran, sorted by start time (then queue name).

    Args:
        runtime: an open Runtime.
        submission: keep only this submission's records (see SimRecord.submission).

    Returns:
        The SimRecords.
    """
    records: list[SimRecord] = []
    for name in runtime.devices:
        device = runtime.device(name)
        if isinstance(device, SIMDevice):
            records.extend(device.sim_records())
    if submission is not None:
        records = [r for r in records if r.submission == submission]
    records.sort(key=lambda r: (r.start, r.queue, r.end))
    return tuple(records)


def clear_sim_timeline(runtime: Runtime) -> None:
    """Forget the SIM queues' records (a long-running simulation keeps them otherwise).

    Args:
        runtime: an open Runtime.
    """
    for name in runtime.devices:
        device = runtime.device(name)
        if isinstance(device, SIMDevice):
            device.clear_sim_records()


def last_submission(runtime: Runtime) -> int:
    """The number of the runtime's latest submission, for sim_timeline(rt, submission=...)."""
    value = runtime.kick.value
    if value == 0:
        raise UsageError("this runtime has not submitted any work yet")
    return value
