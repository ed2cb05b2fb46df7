"""A transformer training step on a simulated cluster of 64 GPUs (8 nodes x 8 H100, NVLink in
a node, 8 x 400 Gb/s InfiniBand between nodes): pipeline parallel across the nodes, data
parallel inside them. Prints its makespan against the lower bound, the bound that binds,
where the critical path spends its time, and draws the timeline grouped by node.

    python examples/sim_cluster.py [--micro-batches 8] [--all-reduce ring|tree] [--plot step.png]

Stage s of the model (2 transformer layers) runs on node s; GPU r of every node is data-
parallel replica r, so a micro-batch of replica r goes SIM:r -> SIM:8+r -> ... (its own
InfiniBand rail). Each replica runs its micro-batches forward through the 8 stages, then
backward (GPipe order); then the 8 replicas of each stage add up their weight gradients
with a ring all-reduce over NVLink (`ag.all_reduce`) and take an SGD step. The kernels
compute real (cheap, elementwise) results and declare the FLOPs of the layers they stand
for; activations and gradients are real float32 arrays of the model's sizes, so the
copies move the bytes a real step would. The model is small (hidden 128, 512 tokens per
micro-batch, 16 layers) so that 64 GPUs' worth of arrays fit in about 600 MB of host
memory: at this size launch latency and the InfiniBand hops weigh more than the FLOPs. Time is
simulated on trio's MockClock: the run takes seconds of wall time and prints the same
figures every time. The same ground as 06_sim_cluster.ipynb.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import trio
import trio.testing

import actorgraph as ag

PRESET = "nvlink8x8"
NODES, GPUS_PER_NODE = 8, 8
DTYPE = np.float32


@attrs.frozen
class Model:
    """A decoder-only transformer cut into one pipeline stage per node."""

    hidden: int = 128
    layers_per_stage: int = 2
    tokens: int = 512  # per micro-batch
    micro_batches: int = 8

    @property
    def attention_flops(self) -> float:
        """One layer's attention block, forward: QKV and output projections (8 T h^2),
        scores and their weighted sum (4 T^2 h)."""
        t, h = self.tokens, self.hidden
        return 8 * t * h * h + 4 * t * t * h

    @property
    def mlp_flops(self) -> float:
        """One layer's MLP (h -> 4h -> h), forward."""
        return 16 * self.tokens * self.hidden**2

    @property
    def stage_params(self) -> int:
        return self.layers_per_stage * 12 * self.hidden**2


def _half_plus(out: np.ndarray, x: np.ndarray) -> None:
    np.multiply(x, 0.5, out=out)
    out += 0.25


def _input_grad(dx: np.ndarray, g: np.ndarray) -> None:
    # dx holds the stage's saved input; it becomes the gradient sent back.
    np.multiply(g, 0.5, out=dx)


def _loss_grad(y: np.ndarray) -> None:
    y -= 1.0  # d/dy of 0.5 * (y - 1)^2


def _weight_grad(dw: np.ndarray, g: np.ndarray) -> None:
    dw[: g.size] += g.reshape(-1)[: dw.size]


def _sgd(w: np.ndarray, dw: np.ndarray) -> None:
    w -= dw * 1e-3


def kernels(model: Model) -> dict[str, ag.Kernel]:
    """The step's kernels: cheap bodies, the costs of the layers they stand for."""
    attn, mlp = model.attention_flops, model.mlp_flops
    stage_forward = model.layers_per_stage * (attn + mlp)
    return {
        "attention": ag.Kernel(
            "attention", cpu=_half_plus, outs=(0,), ins=(1,), cost=ag.Work(flops=attn)
        ),
        "mlp": ag.Kernel("mlp", cpu=_half_plus, outs=(0,), ins=(1,), cost=ag.Work(flops=mlp)),
        # Backward: the input gradient costs what the forward did, the weight gradient too.
        "mlp_backward": ag.Kernel(
            "mlp_backward", cpu=_half_plus, outs=(0,), ins=(1,), cost=ag.Work(flops=mlp)
        ),
        "attention_backward": ag.Kernel(
            "attention_backward", cpu=_half_plus, outs=(0,), ins=(1,), cost=ag.Work(flops=attn)
        ),
        # The first layer's attention backward: the gradient the stage sends back.
        "input_grad": ag.Kernel(
            "input_grad", cpu=_input_grad, outs=(0,), ins=(0, 1), cost=ag.Work(flops=attn)
        ),
        "weight_grad": ag.Kernel(
            "weight_grad",
            cpu=_weight_grad,
            outs=(0,),
            ins=(0, 1),
            cost=ag.Work(flops=stage_forward),
        ),
        "loss_grad": ag.Kernel("loss_grad", cpu=_loss_grad, outs=(0,), ins=(0,)),
        "sgd": ag.Kernel("sgd", cpu=_sgd, outs=(0,), ins=(0, 1)),
    }


@attrs.frozen
class Step:
    items: list[ag.Launch | ag.Copy]
    batches: list[list[ag.Buffer]]  # [replica][micro-batch]: the first stage's inputs
    weights: list[list[ag.Buffer]]  # [stage][replica]
    grads: list[list[ag.Buffer]]  # [stage][replica]


def gpu(stage: int, replica: int, gpus_per_node: int = GPUS_PER_NODE) -> str:
    """Stage s runs on node s; replica r on GPU r of it (SIM:N is GPU N % 8 of node N // 8)."""
    return f"SIM:{stage * gpus_per_node + replica}"


def schedule(stages: int, micro_batches: int, order: str = "gpipe") -> list[tuple[str, int, int]]:
    """The order a pipeline framework issues the passes in: ("F" or "B", micro-batch, stage).

    "gpipe": every micro-batch forward through all stages, then every one backward.
    "1f1b": stage s runs min(stages - 1 - s, micro_batches) forwards to fill the pipeline,
    then alternates one forward and one backward, then drains the backwards: the last
    stage starts a micro-batch's backward right after its forward. The passes of all
    stages are interleaved round by round, each stage taking its next pass once what it
    needs came in an earlier round, so each queue's order is close to the time order.
    """
    if order == "gpipe":
        forward = [("F", m, s) for m in range(micro_batches) for s in range(stages)]
        return forward + [
            ("B", m, s) for m in range(micro_batches) for s in reversed(range(stages))
        ]
    if order != "1f1b":
        raise ValueError(f"schedule order is '1f1b' or 'gpipe', got {order!r}")
    plans: list[list[tuple[str, int]]] = []
    for s in range(stages):
        warm = min(stages - 1 - s, micro_batches)
        passes = [("F", m) for m in range(warm)]
        for m in range(micro_batches - warm):
            passes += [("F", warm + m), ("B", m)]
        passes += [("B", m) for m in range(micro_batches - warm, micro_batches)]
        plans.append(passes)
    done: set[tuple[str, int, int]] = set()
    at = [0] * stages
    out: list[tuple[str, int, int]] = []
    while len(out) < 2 * stages * micro_batches:
        this_round = []
        for s in range(stages):
            if at[s] == len(plans[s]):
                continue
            kind, m = plans[s][at[s]]
            needs = ("F", m, s - 1) if kind == "F" else ("B", m, s + 1)
            if (kind == "F" and s == 0) or (kind == "B" and s == stages - 1) or needs in done:
                this_round.append((kind, m, s))
                at[s] += 1
        if not this_round:
            raise RuntimeError("the 1F1B schedule cannot progress")  # never: it is acyclic
        done.update(this_round)
        out += this_round
    return out


def build_training_step(
    rt: Any,
    model: Model,
    *,
    all_reduce: str = "ring",
    order: str = "gpipe",
    nodes: int = NODES,
    gpus_per_node: int = GPUS_PER_NODE,
) -> Step:
    """The items of one training step, in the order the pipeline `order` issues them
    (see `schedule`), then each stage's gradient all-reduce and SGD step: `nodes`
    stages, `gpus_per_node` replicas.

    `rt` is a Runtime or a start_runtime() handle (it allocates the buffers).
    """
    k = kernels(model)
    stages, replicas, micro = nodes, gpus_per_node, model.micro_batches
    shape = (model.tokens, model.hidden)

    def on(s: int, r: int) -> str:
        return gpu(s, r, gpus_per_node)

    def per_gpu(size: Any) -> list[list[ag.Buffer]]:
        return [[rt.alloc(on(s, r), size, DTYPE) for r in range(replicas)] for s in range(stages)]

    # x[s][r][m]: stage s's input of micro-batch m (replica r), later its input gradient;
    # y[s][r][m]: its output, later the output gradient that comes back.
    x = [
        [[rt.alloc(on(s, r), shape, DTYPE) for _ in range(micro)] for r in range(replicas)]
        for s in range(stages)
    ]
    y = [
        [[rt.alloc(on(s, r), shape, DTYPE) for _ in range(micro)] for r in range(replicas)]
        for s in range(stages)
    ]
    weights, grads = per_gpu(model.stage_params), per_gpu(model.stage_params)
    items: list[ag.Launch | ag.Copy] = []
    # A stage receives what it works on as the first step of the pass that needs it, in
    # its own order, as a pipeline runtime posts its receives: the activation coming in
    # before a forward, the gradient coming back before a backward. (A copy runs on the
    # copy queue of the GPU it lands on, so its place there is the receiver's.)
    for kind, m, s in schedule(stages, micro, order):
        for r in range(replicas):  # every replica runs the same schedule on its own GPUs
            if kind == "F":
                came = y[s - 1][r][m] if s > 0 else None  # the previous stage's output
                items += forward_pass(k, model, x[s][r][m], y[s][r][m], came, s + 1 == stages)
            else:  # the gradient of the next stage's input comes back
                came = x[s + 1][r][m] if s + 1 < stages else None
                items += backward_pass(k, model, y[s][r][m], x[s][r][m], grads[s][r], came)
    for s in range(stages):  # data parallel: the replicas of a stage add up their gradients
        items += ag.all_reduce(rt, grads[s], algorithm=all_reduce)
        for r in range(replicas):
            items.append(ag.Launch(k["sgd"], [weights[s][r], grads[s][r]]))
    batches = [[x[0][r][m] for m in range(micro)] for r in range(replicas)]
    return Step(items, batches, weights, grads)


def forward_pass(
    k: dict[str, ag.Kernel],
    model: Model,
    src: ag.Buffer,
    out: ag.Buffer,
    came: ag.Buffer | None,
    last: bool,
) -> list[ag.Launch | ag.Copy]:
    """One stage's forward pass of one micro-batch on one GPU: its input `src` comes in
    from `came` (None on the first stage), its layers write `out`, and the last stage
    starts the backward pass with the loss gradient."""
    items: list[ag.Launch | ag.Copy] = []
    if came is not None:
        items.append(ag.Copy(dst=src, src=came))
    for _ in range(model.layers_per_stage):
        items.append(ag.Launch(k["attention"], [out, src]))
        items.append(ag.Launch(k["mlp"], [out, out]))
        src = out
    if last:
        items.append(ag.Launch(k["loss_grad"], [out]))
    return items


def backward_pass(
    k: dict[str, ag.Kernel],
    model: Model,
    g: ag.Buffer,
    x: ag.Buffer,
    grad: ag.Buffer,
    came: ag.Buffer | None,
) -> list[ag.Launch | ag.Copy]:
    """One stage's backward pass of one micro-batch on one GPU: the output gradient `g`
    comes back from `came` (None on the last stage), its layers' gradients run back,
    the weight gradient adds into `grad` and the input gradient goes into `x`."""
    items: list[ag.Launch | ag.Copy] = []
    if came is not None:
        items.append(ag.Copy(dst=g, src=came))
    for layer in reversed(range(model.layers_per_stage)):
        items.append(ag.Launch(k["mlp_backward"], [g, g]))
        if layer:
            items.append(ag.Launch(k["attention_backward"], [g, g]))
    items.append(ag.Launch(k["weight_grad"], [grad, g]))
    items.append(ag.Launch(k["input_grad"], [x, g]))
    return items


def reference_grads(
    model: Model, batches: Sequence[Sequence[np.ndarray]], nodes: int
) -> list[np.ndarray]:
    """Each stage's summed weight gradient, computed with plain numpy on one device."""
    grads = [np.zeros(model.stage_params, DTYPE) for _ in range(nodes)]
    for replica in batches:
        for batch in replica:
            outs, x = [], batch
            for _ in range(nodes):
                y = x
                for _ in range(model.layers_per_stage):
                    y = (y * DTYPE(0.5) + DTYPE(0.25)).astype(DTYPE)  # attention
                    y = (y * DTYPE(0.5) + DTYPE(0.25)).astype(DTYPE)  # mlp
                outs.append(y)
                x = y
            g = (outs[-1] - DTYPE(1.0)).astype(DTYPE)
            for s in reversed(range(nodes)):
                for _ in range(model.layers_per_stage * 2 - 1):
                    g = (g * DTYPE(0.5) + DTYPE(0.25)).astype(DTYPE)
                grads[s][: g.size] += g.reshape(-1)[: grads[s].size]
                g = (g * DTYPE(0.5)).astype(DTYPE)
    return grads


def critical_path_summary(profile: ag.Profile, nodes: dict[str, int]) -> str:
    """Where the replay's critical path spends its time: kernels, copies inside a node,
    copies between nodes (`nodes`: ag.sim_nodes(rt))."""
    path = profile.critical_path()
    spent: Counter[str] = Counter()
    for event in path:
        if event.kind is ag.EventKind.KERNEL:
            spent["kernels"] += event.duration
        else:  # a copy's label is "copy SRC->DST"
            src, dst = event.label.removeprefix("copy ").split("->")
            inter = nodes[src] != nodes[dst]
            spent["copies between nodes" if inter else "copies in a node"] += event.duration
    total = sum(spent.values()) or 1.0
    parts = ", ".join(
        f"{name} {t * 1e3:.3f} ms ({t / total:.0%})" for name, t in spent.most_common()
    )
    return f"critical path: {len(path)} items; {parts}"


async def main(micro_batches: int, algorithm: str, plot: str | None) -> None:
    model = Model(micro_batches=micro_batches)
    names = [f"SIM:{i}" for i in range(NODES * GPUS_PER_NODE)]
    async with ag.open_runtime(names, sim_preset=PRESET) as rt:
        step = build_training_step(rt, model, all_reduce=algorithm)
        started = time.perf_counter()
        graph = await rt.compile(step.items)
        compile_ms = (time.perf_counter() - started) * 1e3
        print(
            f"{len(step.items)} items on {len(graph.plan.queues)} queues of {len(names)} SIM "
            f"GPUs ({PRESET}); compiled in {compile_ms:.0f} ms of wall time"
        )
        rng = np.random.default_rng(0)
        hosts = [
            [rng.standard_normal((model.tokens, model.hidden)).astype(DTYPE) for _ in replica]
            for replica in step.batches
        ]
        for replica, values in zip(step.batches, hosts):
            for buf, value in zip(replica, values):
                await rt.copyin(buf, value)

        t0 = trio.current_time()
        await graph(profile=True)
        makespan = trio.current_time() - t0
        bounds = ag.sim_bounds(graph)
        print(
            f"makespan {makespan * 1e3:.3f} ms, lower bound {bounds.best * 1e3:.3f} ms "
            f"({bounds.binding}): {makespan / bounds.best:.3f}x the bound"
        )
        print(
            f"  critical path {bounds.critical_path * 1e3:.3f} ms, busiest queue "
            f"{bounds.busiest_queue * 1e3:.3f} ms ({bounds.busiest_queue_name}), busiest link "
            f"{bounds.busiest_link * 1e3:.3f} ms ({bounds.busiest_link_name})"
        )
        profile = graph.last_profile
        assert profile is not None
        print(critical_path_summary(profile, ag.sim_nodes(rt)))

        want = reference_grads(model, hosts, NODES)
        for s in range(NODES):
            got = [await rt.copyout(buf) for buf in step.grads[s]]
            for replica in got[1:]:
                np.testing.assert_array_equal(replica, got[0])  # the all-reduce's result
            np.testing.assert_allclose(got[0], want[s], rtol=2e-2, atol=2e-2)
        print("every stage's replicas hold the same summed gradient, and it matches numpy")
        if plot:
            title = f"training step, {len(names)} SIM GPUs ({PRESET}), rows grouped by node"
            nodes = ag.sim_nodes(rt)
            path = ag.plot_timeline(
                profile, plot, title=title, groups=nodes, fold_idle=True, row_per_device=True
            )
            print("wrote", path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--all-reduce", choices=["ring", "tree"], default="ring")
    parser.add_argument("--plot", metavar="PATH", help="draw the timeline (needs matplotlib)")
    args = parser.parse_args()
    trio.run(
        main,
        args.micro_batches,
        args.all_reduce,
        args.plot,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
    sys.exit(0)
