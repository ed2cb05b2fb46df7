"""examples/sim_cluster.py: the training step's items, in the order a pipeline runtime
issues them (the replay itself runs in tests/test_notebooks.py)."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from actorgraph.scheduler import QueueId, QueueKind

import actorgraph as ag
from examples import sim_cluster

STAGES, REPLICAS = 4, 4  # pcie4x4: a stage per node, a replica per GPU of it


def _node(buf: ag.Buffer) -> int:
    return int(buf.device.split(":")[1]) // REPLICAS


@pytest.mark.parametrize("order", ["gpipe", "1f1b"])
async def test_each_gpu_receives_in_the_order_its_passes_use_what_comes_in(
    autojump_clock: trio.testing.MockClock, order: str
) -> None:
    # A copy runs on the copy queue of the GPU it lands on, in item order. That queue
    # takes the activations and gradients that come in from the other stages in the
    # order the GPU's compute queue first uses them: under 1F1B a forward's input comes
    # in between two backwards' gradients, so no receive waits behind one needed later.
    model = sim_cluster.Model(micro_batches=5, tokens=16, hidden=8)
    names = [f"SIM:{i}" for i in range(STAGES * REPLICAS)]
    async with ag.open_runtime(names, sim_preset="pcie4x4") as rt:
        step = sim_cluster.build_training_step(
            rt, model, order=order, nodes=STAGES, gpus_per_node=REPLICAS
        )
        graph = await rt.compile(step.items)
        plan = graph.plan
        await graph.aclose()
    items = step.items
    for stage in range(STAGES):
        for replica in range(REPLICAS):
            device = sim_cluster.gpu(stage, replica, REPLICAS)
            copies = plan.queues.index(QueueId(device, QueueKind.COPY))
            compute = plan.queues.index(QueueId(device, QueueKind.COMPUTE))
            runs = [j for j in range(len(items)) if plan.item_queue[j] == compute]
            used_at = []  # for each copy in from another node: where it is first used
            for j, item in enumerate(items):
                if plan.item_queue[j] != copies or not isinstance(item, ag.Copy):
                    continue
                if _node(item.src) == _node(item.dst):
                    continue  # the all-reduce's copies inside the node
                used_at.append(
                    next(
                        place
                        for place, k in enumerate(runs)
                        if k > j and any(buf is item.dst for buf in items[k].bufs)
                    )
                )
            received = 2 * model.micro_batches - (stage in (0, STAGES - 1)) * model.micro_batches
            assert len(used_at) == received, (device, order)
            assert used_at == sorted(used_at), (device, order)
