"""A host model of jit-cache semantics, and random jit caches for fuzzing.

Shared by every test that compares a runtime with a plain numpy reference. Nothing here
knows a device kind: a fuzzer for another kind (SIM, CUDA, REMOTE) passes its own device
names to `random_programs` and `check_program`.

- `HostArrays`: one numpy array per base allocation; `arrays[buf]` is the numpy view of
  `buf` inside it, so references read like the kernels they check.
- `rebind_buffer` / `rebind_items`: what a graph call does to its items when inputs are
  replaced, done by hand, so eager `rt.run` can run the very same work.
- `KERNELS` (+ `apply_item`): the fuzzer's kernels and an independent numpy model of each.
- `random_programs`: a hypothesis strategy of `ProgramSpec`s (buffers, items, graph split).
- `check_program`: build a spec on a runtime and check every replay against eager and the
  host model.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import trio
from hypothesis import strategies as st

import actorgraph as ag

DTYPE = np.dtype(np.uint32)


# -- host arrays and rebinding --------------------------------------------------------------


class HostArrays:
    """Host copies of whole base allocations, addressed through (possibly rebound) buffers."""

    def __init__(self, mapping: Mapping[ag.Buffer, ag.Buffer] | None = None) -> None:
        self._arrays: dict[int, np.ndarray] = {}
        self._mapping = dict(mapping or {})

    def load(self, base: ag.Buffer, data: np.ndarray) -> None:
        """Set the host copy of a base buffer (the same contents the runtime was given)."""
        if base.is_view:
            raise ValueError(f"load() takes base buffers, got the view {base!r}")
        self._arrays[base.alloc_id] = np.array(data, dtype=base.dtype).reshape(-1)

    def rebound(self, mapping: Mapping[ag.Buffer, ag.Buffer]) -> HostArrays:
        """The same arrays, seen through another input mapping."""
        other = HostArrays(mapping)
        other._arrays = self._arrays
        return other

    def __getitem__(self, buf: ag.Buffer) -> np.ndarray:
        buf = rebind_buffer(buf, self._mapping)
        flat = self._arrays[buf.alloc_id]
        return flat[buf.offset : buf.offset + buf.size].reshape(buf.shape)

    def base_array(self, base: ag.Buffer) -> np.ndarray:
        return self._arrays[base.alloc_id].reshape(base.shape)

    def copy(self) -> HostArrays:
        other = HostArrays(self._mapping)
        other._arrays = {k: v.copy() for k, v in self._arrays.items()}
        return other


def rebind_buffer(buf: ag.Buffer, mapping: Mapping[ag.Buffer, ag.Buffer]) -> ag.Buffer:
    """Where `buf` lives once the graph inputs in `mapping` (old -> new) are replaced.

    An input is replaced itself; a view of a base-buffer input moves onto the new input at
    the same relative offset. Anything else stays.
    """
    if buf in mapping:
        return mapping[buf]
    base = buf.base
    if buf.is_view and base in mapping:
        return mapping[base].view(offset=buf.offset - base.offset, shape=buf.shape)
    return buf


def rebind_items(
    items: Sequence[ag.Launch | ag.Copy], mapping: Mapping[ag.Buffer, ag.Buffer]
) -> list[ag.Launch | ag.Copy]:
    """The items a graph call with these inputs runs, as plain items for eager `rt.run`."""
    out: list[ag.Launch | ag.Copy] = []
    for item in items:
        if isinstance(item, ag.Copy):
            out.append(
                ag.Copy(dst=rebind_buffer(item.dst, mapping), src=rebind_buffer(item.src, mapping))
            )
        else:
            out.append(
                ag.Launch(
                    item.kernel,
                    [rebind_buffer(b, mapping) for b in item.bufs],
                    vars=item.vars,
                    fixedvars=item.fixedvars,
                    global_size=item.global_size,
                    local_size=item.local_size,
                )
            )
    return out


def bases_of(items: Iterable[ag.Launch | ag.Copy]) -> list[ag.Buffer]:
    """The distinct base buffers the items touch, in first-use order."""
    seen: dict[int, ag.Buffer] = {}
    for item in items:
        for buf in item.bufs:
            seen.setdefault(buf.alloc_id, buf.base)
    return list(seen.values())


async def snapshot(rt: ag.Runtime, bases: Iterable[ag.Buffer]) -> dict[int, np.ndarray]:
    return {b.alloc_id: await rt.copyout(b) for b in bases}


def assert_same(what: str, got: Mapping[int, np.ndarray], want: Mapping[int, np.ndarray]) -> None:
    assert got.keys() == want.keys(), what
    for alloc_id, array in want.items():
        np.testing.assert_array_equal(
            got[alloc_id], array, err_msg=f"{what}: allocation #{alloc_id} differs"
        )


# -- the fuzzer's kernels, each with an independent numpy model -----------------------------

SIZE = ag.Var("size", 1, 1 << 20)  # fixed per launch: lets a device kernel bound its threads
SALT = ag.Var("salt", 0, 1000)  # bound per call


def _xor(out: np.ndarray, a: np.ndarray, b: np.ndarray, n: int) -> None:
    np.bitwise_xor(a[:n], b[:n], out=out[:n])


def _add(out: np.ndarray, a: np.ndarray, b: np.ndarray, n: int) -> None:
    np.add(a[:n], b[:n], out=out[:n])


def _move(out: np.ndarray, a: np.ndarray, n: int) -> None:
    np.copyto(out[:n], a[:n])


def _bump(x: np.ndarray, n: int) -> None:
    x[:n] += np.uint32(1)


def _salt(out: np.ndarray, a: np.ndarray, n: int, salt: int) -> None:
    np.add(a[:n], np.uint32(salt), out=out[:n])


_CUDA = """
extern "C" __global__ void {name}({params}, int n{extra}) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {body};
}}
"""


def _cuda(name: str, params: str, body: str, extra: str = "") -> str:
    return _CUDA.format(name=name, params=params, body=body, extra=extra)


_U = "unsigned int*"
KERNELS: dict[str, ag.Kernel] = {
    k.name: k
    for k in (
        ag.Kernel(
            "fz_xor",
            cpu=_xor,
            outs=(0,),
            ins=(1, 2),
            cuda=_cuda("fz_xor", f"{_U} out, const {_U} a, const {_U} b", "out[i] = a[i] ^ b[i]"),
        ),
        ag.Kernel(
            "fz_add",
            cpu=_add,
            outs=(0,),
            ins=(1, 2),
            cuda=_cuda("fz_add", f"{_U} out, const {_U} a, const {_U} b", "out[i] = a[i] + b[i]"),
        ),
        ag.Kernel(
            "fz_move",
            cpu=_move,
            outs=(0,),
            ins=(1,),
            cuda=_cuda("fz_move", f"{_U} out, const {_U} a", "out[i] = a[i]"),
        ),
        ag.Kernel(
            "fz_bump",
            cpu=_bump,
            outs=(0,),
            ins=(0,),
            cuda=_cuda("fz_bump", f"{_U} x", "x[i] += 1u"),
        ),
        ag.Kernel(
            "fz_salt",
            cpu=_salt,
            outs=(0,),
            ins=(1,),
            cuda=_cuda("fz_salt", f"{_U} out, const {_U} a", "out[i] = a[i] + salt", ", int salt"),
        ),
    )
}

# The model: what each kernel means, written again without the kernel bodies.
_MODEL: dict[str, Callable[[list[np.ndarray], dict[str, int]], None]] = {
    "fz_xor": lambda v, _: v[0].__setitem__(slice(None), v[1] ^ v[2]),
    "fz_add": lambda v, _: v[0].__setitem__(slice(None), v[1] + v[2]),
    "fz_move": lambda v, _: v[0].__setitem__(slice(None), v[1]),
    "fz_bump": lambda v, _: v[0].__setitem__(slice(None), v[0] + np.uint32(1)),
    "fz_salt": lambda v, vals: v[0].__setitem__(slice(None), v[1] + np.uint32(vals["salt"])),
}


def apply_item(host: HostArrays, item: ag.Launch | ag.Copy, var_vals: Mapping[ag.Var, int]) -> None:
    """Run one (already rebound) item on the host arrays, from the model's table."""
    if isinstance(item, ag.Copy):
        host[item.dst][...] = host[item.src]
        return
    values = {var.name: value for var, value in var_vals.items()}
    values.update((var.name, value) for var, value in item.fixedvars)
    # Read every input before writing, as the kernels are written against distinct views.
    views = [host[b].copy() for b in item.bufs]
    _MODEL[item.kernel.name](views, values)
    for slot in item.kernel.outs:
        host[item.bufs[slot]][...] = views[slot]


# -- random programs ------------------------------------------------------------------------


@attrs.frozen
class ItemSpec:
    """One random item: a kernel name (or "copy") and (buffer index, offset) per slot."""

    kernel: str
    slots: tuple[tuple[int, int], ...]
    size: int


@attrs.frozen
class ProgramSpec:
    """Buffers (device index each), items, where the item list splits into graphs, which
    base buffers each graph takes as inputs, and how graphs are called."""

    buffer_devices: tuple[int, ...]
    buffer_size: int
    items: tuple[ItemSpec, ...]
    splits: tuple[int, ...]
    graph_inputs: tuple[tuple[int, ...], ...]
    call_orders: tuple[tuple[int, ...], ...]
    seed: int

    def chunks(self) -> list[tuple[int, int]]:
        bounds = [0, *self.splits, len(self.items)]
        return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


def _disjoint(a: tuple[int, int], b: tuple[int, int], size: int) -> bool:
    return a[0] != b[0] or a[1] + size <= b[1] or b[1] + size <= a[1]


@st.composite
def _item(draw: Any, buffer_devices: tuple[int, ...], buffer_size: int) -> ItemSpec:
    size = draw(st.sampled_from((1, 4, 8, 16)))
    nbufs = len(buffer_devices)

    def view(choices: Sequence[int]) -> tuple[int, int]:
        return draw(st.sampled_from(choices)), draw(st.integers(0, buffer_size - size))

    kernel = draw(
        st.sampled_from(("copy", "copy", "fz_xor", "fz_add", "fz_move", "fz_bump", "fz_salt"))
    )
    if kernel == "copy":
        # Copies may overlap their source (memmove), or be exact self-copies.
        return ItemSpec(kernel, (view(range(nbufs)), view(range(nbufs))), size)
    device = draw(st.sampled_from(sorted(set(buffer_devices))))
    local = [i for i, d in enumerate(buffer_devices) if d == device]
    nins = len(KERNELS[kernel].ins) if kernel != "fz_bump" else 0
    out = view(local)
    ins = [view(local) for _ in range(nins)]
    # A kernel's output is either disjoint from its inputs or the same view: partial
    # overlap inside one kernel has no portable meaning on a parallel device.
    ins = [v if _disjoint(out, v, size) or v == out else out for v in ins]
    return ItemSpec(kernel, (out, *ins), size)


@st.composite
def random_programs(
    draw: Any, max_devices: int = 6, max_items: int = 24, max_graphs: int = 4
) -> ProgramSpec:
    """Random jit caches over `max_devices` devices, split into up to `max_graphs` graphs."""
    ndevices = draw(st.integers(1, max_devices))
    buffer_devices = tuple(d for d in range(ndevices) for _ in range(draw(st.integers(1, 3))))
    buffer_size = 32
    items = tuple(
        draw(st.lists(_item(buffer_devices, buffer_size), min_size=1, max_size=max_items))
    )
    cuts = st.lists(st.integers(1, len(items) - 1), max_size=max_graphs - 1)
    splits = tuple(sorted(set(draw(cuts)))) if len(items) > 1 else ()
    bounds = [0, *splits, len(items)]
    graph_inputs = []
    for lo, hi in itertools.pairwise(bounds):
        used = sorted({b for item in items[lo:hi] for b, _ in item.slots})
        graph_inputs.append(tuple(b for b in used if draw(st.booleans())))
    ngraphs = len(graph_inputs)
    call_orders = tuple(
        tuple(draw(st.permutations(range(ngraphs)))) for _ in range(draw(st.integers(1, 3)))
    )
    return ProgramSpec(
        buffer_devices,
        buffer_size,
        items,
        splits,
        tuple(graph_inputs),
        call_orders,
        draw(st.integers(0, 2**32 - 1)),
    )


def build_items(spec: ProgramSpec, buffers: Sequence[ag.Buffer]) -> list[ag.Launch | ag.Copy]:
    items: list[ag.Launch | ag.Copy] = []
    for item in spec.items:
        views = [buffers[b].view(offset=off, size=item.size) for b, off in item.slots]
        if item.kernel == "copy":
            items.append(ag.Copy(dst=views[0], src=views[1]))
            continue
        kernel = KERNELS[item.kernel]
        extra = (SALT,) if item.kernel == "fz_salt" else ()
        items.append(
            ag.Launch(
                kernel,
                views,
                vars=(SIZE, *extra),
                fixedvars={SIZE: item.size},
                global_size=ag.cdiv(SIZE, 32),
                local_size=32,
            )
        )
    return items


# -- running a program three ways -----------------------------------------------------------


def random_contents(rng: np.random.Generator, buf: ag.Buffer) -> np.ndarray:
    """Random values over the dtype's whole range (integer dtypes)."""
    info = np.iinfo(buf.dtype)
    return rng.integers(info.min, info.max, size=buf.shape, dtype=buf.dtype, endpoint=True)


async def random_fill(
    rt: ag.Runtime, host: HostArrays, bases: Iterable[ag.Buffer], rng: np.random.Generator
) -> None:
    """Give each base buffer fresh random contents, on the runtime and in the host model."""
    for base in bases:
        data = random_contents(rng, base)
        await rt.copyin(base, data)
        host.load(base, data)


async def _call(
    graph: ag.Graph,
    inputs: list[ag.Buffer],
    var_vals: dict[ag.Var, int] | None,
    submitted: list[int],
    index: int,
) -> None:
    submitted.append(index)  # a call submits synchronously, before its first checkpoint
    await graph(inputs, var_vals=var_vals)


async def check_program(
    rt: ag.Runtime, device_names: Sequence[str], spec: ProgramSpec, *, replays: int | None = None
) -> None:
    """Build `spec` on `rt`, compile its graphs, verify every plan, and check every round
    of graph calls (fresh inputs, fresh contents, calls issued concurrently) against eager
    `rt.run` of the same work from the same state and against the host model."""
    rng = np.random.default_rng(spec.seed)
    buffers = [rt.alloc(device_names[d], spec.buffer_size, DTYPE) for d in spec.buffer_devices]
    items = build_items(spec, buffers)
    graphs = []
    chunks = spec.chunks()
    for (lo, hi), input_ids in zip(chunks, spec.graph_inputs):
        inputs = [buffers[b] for b in input_ids]
        graph = await rt.compile(items[lo:hi], inputs=inputs)
        graph.plan.verify()
        graphs.append((graph, items[lo:hi], inputs))

    host = HostArrays()
    await random_fill(rt, host, buffers, rng)
    orders = spec.call_orders if replays is None else spec.call_orders[:replays]
    for round_index, order in enumerate(orders):
        salt = int(rng.integers(0, 1001))
        # Fresh input buffers with fresh contents for every graph call.
        calls = []
        for gi in order:
            graph, chunk, inputs = graphs[gi]
            fresh = [rt.alloc(b.device, b.shape, b.dtype) for b in inputs]
            await random_fill(rt, host, fresh, rng)
            uses_salt = any(SALT in item.free_vars() for item in chunk)
            calls.append((gi, fresh, {SALT: salt} if uses_salt else None))
        tracked = list(buffers) + [b for _, fresh, _ in calls for b in fresh]
        before = host.copy()

        # Issue every call at once from its own task; record the order they submit in.
        submitted: list[int] = []
        async with trio.open_nursery() as nursery:
            for index, (gi, fresh, var_vals) in enumerate(calls):
                nursery.start_soon(_call, graphs[gi][0], fresh, var_vals, submitted, index)
        got = await snapshot(rt, tracked)

        # The host model and eager, in the order the calls were submitted.
        eager_items: list[tuple[list[ag.Launch | ag.Copy], dict[ag.Var, int] | None]] = []
        for index in submitted:
            gi, fresh, var_vals = calls[index]
            _, chunk, inputs = graphs[gi]
            bound = rebind_items(chunk, dict(zip(inputs, fresh)))
            for item in bound:
                apply_item(host, item, var_vals or {})
            eager_items.append((bound, var_vals))
        want = {b.alloc_id: host.base_array(b) for b in tracked}
        assert_same(f"round {round_index}: graphs vs host model", got, want)

        for base in tracked:
            await rt.copyin(base, before.base_array(base))
        for bound, var_vals in eager_items:
            await rt.run(bound, var_vals=var_vals)
        eager = await snapshot(rt, tracked)
        assert_same(f"round {round_index}: eager vs host model", eager, want)
