"""Schedule quality on simulated GPUs: makespan of one replay / the best lower bound.

One node of 8 SIM devices (`--preset`): a pipeline (8 stages, 32 and 64 micro-batches),
tensor parallelism with a ring all-reduce made of copies and reduction kernels, and a
random DAG of 1k items (target: makespan <= 1.05 x bound). A cluster (`--cluster`,
nvlink8x8: 8 nodes x 8 GPUs, or pcie4x4): a pipeline with one stage per node, data
parallel over every GPU with a ring all-reduce (ag.all_reduce), and a mix of the two,
the transformer training step of examples/sim_cluster.py (pipeline across the nodes,
data parallel inside them; target: makespan <= 1.10 x bound, by default order). For
each graph it prints makespan / max(critical path, busiest queue, queue window, busiest
link, link window), the chain of items that set the makespan, how long the queue it
spends most time on sat idle while a later item of it was ready (head-of-line blocking),
the same items in list-scheduled order (rt.compile(..., order="cost")), where a link
bound binds how that link spent each replay (filling, moving bytes, idle, draining), and
writes everything to benchmarks/results/sim_quality.json.

    python benchmarks/sim_quality.py [--preset nvlink8|pcie8] [--cluster nvlink8x8|pcie4x4]
                                     [--items 1000] [--seed 0] [--quick]

`--quick` runs every graph at a tiny size (a smoke run, written to results/quick/; its ratios mean little).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import random
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import trio
import trio.testing
from actorgraph.scheduler import item_dependencies

import actorgraph as ag

FloatArray = np.ndarray[Any, Any]
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _example(name: str) -> Any:
    """examples/NAME.py as a module, loaded from its file: the examples folder is not put
    on sys.path, where its modules (remote_kernels.py) would stand in for others of the
    same name for the rest of the process and the workers it starts."""
    module = sys.modules.get(f"_example_{name}")
    if module is None:
        spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # attrs and dataclasses look their module up
        spec.loader.exec_module(module)
    return module


def _scale_add(out: FloatArray, x: FloatArray) -> None:
    np.multiply(x, 0.5, out=out)
    out += 1.0


def _mix(out: FloatArray, a: FloatArray, b: FloatArray) -> None:
    np.add(a, b, out=out)
    out *= 0.5


def _accumulate(acc: FloatArray, x: FloatArray) -> None:
    acc += x


def _weighted(out: FloatArray, x: FloatArray, weight: FloatArray) -> None:
    np.multiply(x, weight, out=out)


# -- the three graphs --


def pipeline(
    rt: ag.Runtime,
    devices: Sequence[str],
    micro_batches: int = 32,
    elems: int = 1 << 16,
    stage_seconds: float = 200e-6,
) -> tuple[list[ag.Launch | ag.Copy], list[ag.Buffer], list[ag.Buffer]]:
    """Pipeline parallelism: stage s runs on devices[s]; activations flow to the next stage.

    Returns (items, buffers to fill first, the last stage's outputs).
    """
    stage = ag.Kernel("stage", cpu=_scale_add, outs=(0,), ins=(1,), cost=stage_seconds)
    items: list[ag.Launch | ag.Copy] = []
    firsts = [rt.alloc(devices[0], elems, np.float32) for _ in range(micro_batches)]
    outputs = []
    for m in range(micro_batches):
        x = firsts[m]
        for s, dev in enumerate(devices):
            y = rt.alloc(dev, elems, np.float32)
            items.append(ag.Launch(stage, [y, x]))
            if s + 1 < len(devices):
                x = rt.alloc(devices[s + 1], elems, np.float32)
                items.append(ag.Copy(dst=x, src=y))
        outputs.append(y)
    return items, firsts, outputs


def tensor_parallel(
    rt: ag.Runtime,
    devices: Sequence[str],
    layers: int = 4,
    elems: int = 1 << 20,
    matmul_seconds: float = 300e-6,
) -> tuple[list[ag.Launch | ag.Copy], list[ag.Buffer], list[ag.Buffer]]:
    """Tensor parallelism: per layer each device computes a partial sum, then a ring
    all-reduce (reduce-scatter then all-gather, one chunk per device) adds them up.

    Returns (items, buffers to fill first (activations, then weights), final activations).
    """
    matmul = ag.Kernel("matmul_shard", cpu=_weighted, outs=(0,), ins=(1, 2), cost=matmul_seconds)
    reduce = ag.Kernel("reduce", cpu=_accumulate, outs=(0,), ins=(0, 1))
    ndev = len(devices)
    if elems % ndev:
        raise ValueError(f"elems={elems} must split into {ndev} equal chunks")
    chunk = elems // ndev
    acts = [rt.alloc(d, elems, np.float32) for d in devices]
    weights = [rt.alloc(d, 1, np.float32) for d in devices]
    accs = [rt.alloc(d, elems, np.float32) for d in devices]
    # One receive slot per reduce-scatter step, so a step never waits for the last one's
    # reduction to free its buffer.
    recvs = [rt.alloc(d, chunk * (ndev - 1), np.float32) for d in devices]

    def part(buf: ag.Buffer, index: int) -> ag.Buffer:
        return buf.view(offset=index * chunk, size=chunk)

    items: list[ag.Launch | ag.Copy] = []
    for layer in range(layers):
        src = acts if layer == 0 else accs
        for i in range(ndev):
            # acc_i = act_i * w_i (a matmul shard's partial sum, scaled for checking).
            items.append(ag.Launch(matmul, [accs[i], src[i], weights[i]]))
        for step in range(ndev - 1):
            for i in range(ndev):
                nxt = (i + 1) % ndev
                items.append(
                    ag.Copy(dst=part(recvs[nxt], step), src=part(accs[i], (i - step) % ndev))
                )
            for i in range(ndev):
                nxt = (i + 1) % ndev
                c = (i - step) % ndev
                items.append(ag.Launch(reduce, [part(accs[nxt], c), part(recvs[nxt], step)]))
        for step in range(ndev - 1):
            for i in range(ndev):
                nxt = (i + 1) % ndev
                c = (i + 1 - step) % ndev
                items.append(ag.Copy(dst=part(accs[nxt], c), src=part(accs[i], c)))
    return items, acts + weights, accs


def random_dag(
    rt: ag.Runtime,
    devices: Sequence[str],
    count: int = 1000,
    seed: int = 0,
    elems: int = 1 << 14,
) -> tuple[list[ag.Launch | ag.Copy], list[ag.Buffer], list[ag.Buffer]]:
    """A random DAG: kernels read one or two recent values of their device, copies bring a
    value over from another device. Kernel costs 20-200 us, seeded.

    Returns (items, buffers to fill first, every value produced).
    """
    rng = random.Random(seed)
    values: dict[str, list[ag.Buffer]] = {d: [] for d in devices}
    firsts = []
    for d in devices:
        for _ in range(2):
            buf = rt.alloc(d, elems, np.float32)
            values[d].append(buf)
            firsts.append(buf)
    kernels = [
        ag.Kernel(f"k{i}", cpu=_mix, outs=(0,), ins=(1, 2), cost=rng.uniform(20e-6, 200e-6))
        for i in range(16)
    ]
    items: list[ag.Launch | ag.Copy] = []
    made = []
    for _ in range(count):
        dev = rng.choice(devices)
        out = rt.alloc(dev, elems, np.float32)
        if rng.random() < 0.2:
            other = rng.choice([d for d in devices if d != dev])
            items.append(ag.Copy(dst=out, src=rng.choice(values[other][-8:])))
        else:
            recent = values[dev][-8:]
            a, b = rng.choice(recent), rng.choice(recent)
            items.append(ag.Launch(rng.choice(kernels), [out, a, b]))
        values[dev].append(out)
        made.append(out)
    return items, firsts, made


def data_parallel(
    rt: ag.Runtime,
    devices: Sequence[str],
    elems: int = 1 << 18,
    backward_seconds: float = 500e-6,
) -> tuple[list[ag.Launch | ag.Copy], list[ag.Buffer], list[ag.Buffer]]:
    """Data parallelism: every device computes its gradients (one kernel), then a ring
    all-reduce over all of them (ag.all_reduce, in the devices' order) adds them up.

    Returns (items, buffers to fill first (the activations), the gradients).
    """
    backward = ag.Kernel("backward", cpu=_scale_add, outs=(0,), ins=(1,), cost=backward_seconds)
    acts = [rt.alloc(d, elems, np.float32) for d in devices]
    grads = [rt.alloc(d, elems, np.float32) for d in devices]
    items: list[ag.Launch | ag.Copy] = [ag.Launch(backward, [g, a]) for g, a in zip(grads, acts)]
    items += ag.all_reduce(rt, grads)
    return items, acts, grads


def training_step(
    rt: ag.Runtime, nodes: int, gpus_per_node: int, micro_batches: int = 8
) -> tuple[list[ag.Launch | ag.Copy], list[ag.Buffer], list[ag.Buffer]]:
    """The transformer training step of examples/sim_cluster.py: pipeline parallel with
    a stage per node, data parallel over the GPUs of each node.

    Returns (items, the first stage's inputs, the gradients).
    """
    sim_cluster = _example("sim_cluster")
    step = sim_cluster.build_training_step(
        rt,
        sim_cluster.Model(micro_batches=micro_batches),
        nodes=nodes,
        gpus_per_node=gpus_per_node,
    )
    firsts = [buf for replica in step.batches for buf in replica]
    return step.items, firsts, [g for stage in step.grads for g in stage]


# -- measuring --


def critical_chain(plan: Any, records: Sequence[ag.SimRecord]) -> dict[str, Any]:
    """Walk back from the item that finished last through whichever predecessor made each
    item start when it did: its data (the dependency that ended last) or its queue (the
    item before it on the same in-order queue). The chain covers the whole makespan.

    Returns the chain's length, its data and queue edges, and the time it spends on each
    queue (most first).
    """
    by_item = {r.item: r for r in records}
    deps = item_dependencies(plan.items)
    origin = min(r.start for r in records)
    previous: dict[int, ag.SimRecord] = {}
    lines: dict[str, list[ag.SimRecord]] = {}
    for rec in sorted(records, key=lambda r: (r.start, r.end)):
        line = lines.setdefault(rec.queue, [])
        if line:
            previous[rec.item] = line[-1]
        line.append(rec)
    cur: ag.SimRecord | None = max(records, key=lambda r: (r.end, r.queue))
    data_edges = queue_edges = 0
    per_queue: dict[str, float] = {}
    length = 0
    while cur is not None:
        length += 1
        per_queue[cur.queue] = per_queue.get(cur.queue, 0.0) + (cur.end - cur.start)
        data = max((by_item[d] for d in deps[cur.item]), key=lambda r: r.end, default=None)
        data_ready = data.end if data is not None else origin
        before = previous.get(cur.item)
        if before is not None and before.end >= data_ready and before.end > origin:
            queue_edges += 1
            cur = before
        elif data is not None:
            data_edges += 1
            cur = data
        else:
            cur = None
    on_queues = sorted(per_queue.items(), key=lambda kv: (-kv[1], kv[0]))
    return {
        "items": length,
        "data_edges": data_edges,
        "queue_edges": queue_edges,
        "time_on_queues": [{"queue": q, "s": t} for q, t in on_queues],
    }


def idle_analysis(plan: Any, records: Sequence[ag.SimRecord], queue: str) -> dict[str, Any]:
    """Where `queue` loses time.

    `idle_s`: time the queue sat idle between the replay's start and its last item.
    `fillable_idle_s`: the part of it during which a later item of the same queue already
    had its data ready: an in-order queue stalled on its head item (head-of-line
    blocking) while a reordered queue could have worked.
    """
    by_item = {r.item: r for r in records}
    deps = item_dependencies(plan.items)
    origin = min(r.start for r in records)
    ready = {j: max((by_item[d].end for d in deps[j]), default=origin) for j in by_item}
    mine = sorted((r for r in records if r.queue == queue), key=lambda r: r.start)
    idle = fillable = 0.0
    previous_end = origin
    for k, rec in enumerate(mine):
        gap_start, gap_end = previous_end, rec.start
        if gap_end > gap_start:
            idle += gap_end - gap_start
            # The earliest moment some later item of this queue was ready to run.
            earliest = min((ready[r.item] for r in mine[k + 1 :]), default=gap_end)
            fillable += max(0.0, gap_end - max(gap_start, earliest))
        previous_end = rec.end
    return {"queue": queue, "idle_s": idle, "fillable_idle_s": fillable}


def link_analysis(
    model: ag.CostModel,
    items: Sequence[ag.Launch | ag.Copy],
    records: Sequence[ag.SimRecord],
    link: str,
) -> dict[str, Any]:
    """Where the shared link `link` (a NIC, a GPU's port) lost time in a replay.

    A copy moves its bytes over its route's links after the route's latency, until it
    ends. The makespan is `before_first_s` (from the replay's start to the link's first
    byte: the pipeline filling) + `busy_s` (bytes moving; its `work_s` at the link's full
    bandwidth, more where a copy on it was held back by another link of its route) +
    `idle_inside_s` (idle between its first and last byte, in `gaps` gaps) +
    `after_last_s` (from its last byte to the end: the drain).
    """
    spans: list[tuple[float, float]] = []
    work = 0.0
    for rec in records:
        item = items[rec.item] if rec.item >= 0 else None
        if not isinstance(item, ag.Copy) or item.src.device == item.dst.device:
            continue
        src, dst = (int(b.device.split(":")[1]) for b in (item.src, item.dst))
        route = model.peer_route(src, dst)
        for crossed in route.links:
            if crossed.name == link:
                spans.append((rec.start + route.latency, rec.end))
                work += item.src.nbytes / crossed.bandwidth
    origin = min(r.start for r in records)
    end = max(r.end for r in records)
    if not spans:
        return {"link": link, "work_s": 0.0}
    spans.sort()
    gaps = []
    busy_until = spans[0][1]
    for start, stop in spans[1:]:
        if start > busy_until:
            gaps.append(start - busy_until)
        busy_until = max(busy_until, stop)
    before = spans[0][0] - origin
    return {
        "link": link,
        "work_s": work,
        "busy_s": busy_until - spans[0][0] - sum(gaps),
        "before_first_s": before,
        "idle_inside_s": sum(gaps),
        "gaps": len(gaps),
        "largest_gap_s": max(gaps, default=0.0),
        "after_last_s": end - busy_until,
    }


async def measure(
    rt: ag.Runtime,
    model: ag.CostModel,
    name: str,
    items: Sequence[ag.Launch | ag.Copy],
    firsts: Sequence[ag.Buffer],
    seed_values: Callable[[int], FloatArray],
    target: float = 1.05,
) -> dict[str, Any]:
    """Replay `items` on `rt` (its SIM devices under `model`) in jit and in list-scheduled
    order; their makespans against the bounds, and where the time went."""
    for i, buf in enumerate(firsts):
        await rt.copyin(buf, seed_values(i)[: buf.size].reshape(buf.shape))
    graph = await rt.compile(items, inputs=[], verify=False)
    t0 = trio.current_time()
    await graph()
    makespan = trio.current_time() - t0
    records = ag.sim_timeline(rt, submission=rt.kick.value)
    bounds = ag.sim_bounds(graph)
    best = bounds.best
    chain = critical_chain(graph.plan, records)
    # The same items in list-scheduled order (same results, queues reordered).
    reordered = await rt.compile(items, inputs=[], verify=False, order="cost")
    t0 = trio.current_time()
    await reordered()
    makespan_reordered = trio.current_time() - t0
    records_reordered = ag.sim_timeline(rt, submission=rt.kick.value)
    await reordered.aclose()
    # Where a link bound binds: how that link spent the replay, in both orders.
    link = ""
    if bounds.binding.startswith("link window"):
        link = bounds.link_window_name
    elif bounds.binding.startswith("busiest link"):
        link = bounds.busiest_link_name
    binding_link = {
        order: link_analysis(model, items, recs, link)
        for order, recs in (("jit", records), ("cost", records_reordered))
        if link
    }
    result = {
        "name": name,
        "items": len(items),
        "queues": len(graph.plan.queues),
        "makespan_s": makespan,
        "critical_path_s": bounds.critical_path,
        "busiest_queue_s": bounds.busiest_queue,
        "busiest_queue": bounds.busiest_queue_name,
        "queue_window_s": bounds.queue_window,
        "queue_window_queue": bounds.queue_window_name,
        "busiest_link_s": bounds.busiest_link,
        "busiest_link": bounds.busiest_link_name,
        "link_window_s": bounds.link_window,
        "link_window_link": bounds.link_window_name,
        "binding": bounds.binding,
        "bound_s": best,
        "ratio": makespan / best if best else float("nan"),
        "target": target,
        "target_met": makespan <= target * best,
        "makespan_list_scheduled_s": makespan_reordered,
        "ratio_list_scheduled": makespan_reordered / best if best else float("nan"),
        "critical_chain": chain,
        # The queue the chain spends most time on: did it idle while it had ready work?
        "chain_queue_idle": idle_analysis(graph.plan, records, chain["time_on_queues"][0]["queue"]),
        "binding_link": binding_link,
    }
    await graph.aclose()
    return result


async def run_all(
    preset: str, count: int, seed: int, cluster: str = "nvlink8x8", quick: bool = False
) -> list[dict[str, Any]]:
    devices = [f"SIM:{i}" for i in range(8)]
    rng = np.random.default_rng(seed)

    def values(i: int) -> FloatArray:
        return rng.standard_normal(1 << 20).astype(np.float32)

    # --quick: every graph at a tiny size, for a smoke run.
    small = {"elems": 256} if quick else {}
    micro = (4, 4) if quick else (32, 64)
    results = []
    builders: list[tuple[str, Callable[[ag.Runtime], Any]]] = [
        (f"pipeline 8x{micro[0]}", lambda rt: pipeline(rt, devices, micro[0], **small)),
        (
            f"pipeline 8x{micro[1]}",
            lambda rt: pipeline(rt, devices, micro_batches=micro[1], **small),
        ),
        (
            "tensor-parallel ring all-reduce",
            lambda rt: tensor_parallel(rt, devices, layers=1 if quick else 4, **small),
        ),
        (f"random DAG {count}", lambda rt: random_dag(rt, devices, count, seed, **small)),
    ]
    for name, build in builders:
        async with ag.open_runtime(devices, sim_preset=preset) as rt:
            items, firsts, _ = build(rt)
            results.append(await measure(rt, ag.SIM_PRESETS[preset], name, items, firsts, values))

    topology = ag.SIM_PRESETS[cluster].topology
    assert topology is not None  # the cluster presets have one
    nodes, per_node = topology.nodes, topology.gpus_per_node
    if quick:
        nodes = min(nodes, 2)
    everyone = [f"SIM:{i}" for i in range(nodes * per_node)]
    firsts_of_nodes = [f"SIM:{n * per_node}" for n in range(nodes)]
    stages = micro[0]
    cluster_builders: list[tuple[str, Callable[[ag.Runtime], Any]]] = [
        (
            f"{cluster}: pipeline, a stage per node, {nodes}x{stages}",
            lambda rt: pipeline(rt, firsts_of_nodes, stages, **small),
        ),
        (
            f"{cluster}: data parallel on {len(everyone)} GPUs, ring all-reduce",
            lambda rt: data_parallel(rt, everyone, **({"elems": 1024} if quick else {})),
        ),
        (
            f"{cluster}: training step, pipeline x data parallel",
            lambda rt: training_step(rt, nodes, per_node, micro_batches=2 if quick else 8),
        ),
    ]
    for name, build in cluster_builders:
        async with ag.open_runtime(everyone, sim_preset=cluster) as rt:
            items, firsts, _ = build(rt)
            results.append(
                await measure(rt, ag.SIM_PRESETS[cluster], name, items, firsts, values, target=1.10)
            )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--preset", default="nvlink8", choices=sorted(ag.SIM_PRESETS))
    parser.add_argument("--items", type=int, default=1000, help="random DAG size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cluster",
        default="nvlink8x8",
        choices=sorted(p for p, m in ag.SIM_PRESETS.items() if m.topology and m.topology.nodes > 1),
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--out", default=None, help="the JSON to write (default: results/)")
    args = parser.parse_args(argv)
    count = min(args.items, 100) if args.quick else args.items
    results_dir = pathlib.Path(__file__).parent / "results" / ("quick" if args.quick else "")
    args.out = args.out or str(results_dir / "sim_quality.json")
    results = trio.run(
        run_all,
        args.preset,
        count,
        args.seed,
        args.cluster,
        args.quick,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
    print(
        f"SIM schedule quality, preset {args.preset} and cluster {args.cluster} (target: "
        f"makespan <= 1.05 x bound on one node, 1.10 on the cluster)"
    )
    for r in results:
        chain = r["critical_chain"]
        idle = r["chain_queue_idle"]
        print(
            f"  {r['name']:<34} {r['items']:>5} items  makespan {r['makespan_s'] * 1e3:9.3f} ms  "
            f"bound {r['bound_s'] * 1e3:9.3f} ms  ratio {r['ratio']:.4f}  "
            f"{'ok' if r['target_met'] else 'MISSED'} (target {r['target']:.2f})"
        )
        print(
            f"  {'':<34} binding: {r['binding']}; critical path "
            f"{r['critical_path_s'] * 1e3:.3f} ms, busiest queue "
            f"{r['busiest_queue_s'] * 1e3:.3f} ms ({r['busiest_queue']}), queue window "
            f"{r['queue_window_s'] * 1e3:.3f} ms ({r['queue_window_queue']}), busiest link "
            f"{r['busiest_link_s'] * 1e3:.3f} ms ({r['busiest_link'] or 'none'}); "
            f"makespan chain: {chain['items']} items, {chain['data_edges']} data + "
            f"{chain['queue_edges']} queue edges, longest on {idle['queue']} "
            f"({chain['time_on_queues'][0]['s'] * 1e3:.3f} ms), which idled "
            f"{idle['idle_s'] * 1e3:.3f} ms, {idle['fillable_idle_s'] * 1e3:.3f} ms of it with a "
            f"later item ready (head-of-line blocking)"
        )
        print(
            f"  {'':<34} same items, compile(order='cost'): makespan "
            f"{r['makespan_list_scheduled_s'] * 1e3:.3f} ms, ratio {r['ratio_list_scheduled']:.4f}"
        )
        for order, use in r["binding_link"].items():
            print(
                f"  {'':<34} {use['link']} ({order} order): carries {use['work_s'] * 1e3:.3f} ms "
                f"of bytes, moves them for {use['busy_s'] * 1e3:.3f} ms; first byte at "
                f"{use['before_first_s'] * 1e3:.3f} ms, idle {use['idle_inside_s'] * 1e3:.3f} ms "
                f"in {use['gaps']} gaps (longest {use['largest_gap_s'] * 1e3:.3f} ms), last "
                f"byte {use['after_last_s'] * 1e3:.3f} ms before the end"
            )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "preset": args.preset,
                "cluster": args.cluster,
                "seed": args.seed,
                "quick": args.quick,
                "results": results,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
