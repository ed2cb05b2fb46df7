"""Benchmark workloads, described once and built for every runner that measures them.

A workload is a jit cache in single-assignment form: every item writes a buffer of its
own, so the same list reads as a DAG of numpy calls (Dask, plain numpy), as tinygrad
tensors realized one kernel at a time, and as actorgraph Launch/Copy items. Buffers are
numbered; each lives on one of the workload's devices, numbered 0..devices-1.

    xor:  out = a ^ b        (a, b and out on the item's device)
    copy: out = src          (out on the item's device, src on another)

`build_actorgraph` turns a workload into actorgraph items on open CPU devices; the
benchmark scripts share it so they measure the same thing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

import actorgraph as ag

TINY_ELEMS = 1024
HEAVY_ELEMS = 4 << 20


@attrs.frozen
class Xor:
    device: int
    out: int
    a: int
    b: int


@attrs.frozen
class Move:
    """A copy from a buffer on another device into `out` on `device`."""

    device: int
    out: int
    src: int


Step = Xor | Move


@attrs.frozen
class Workload:
    """Items over numbered buffers. `inputs` come from the host; `outputs` are the sinks
    (buffers no item reads), whose values a run is checked by."""

    name: str
    devices: int
    elems: int
    buffer_devices: tuple[int, ...]
    inputs: tuple[int, ...]
    steps: tuple[Step, ...]

    @property
    def outputs(self) -> tuple[int, ...]:
        read: set[int] = set()
        for step in self.steps:
            read.update((step.a, step.b) if isinstance(step, Xor) else (step.src,))
        return tuple(step.out for step in self.steps if step.out not in read)

    @property
    def copies(self) -> int:
        return sum(isinstance(step, Move) for step in self.steps)

    def host_inputs(self, seed: int = 0) -> list[np.ndarray[Any, Any]]:
        rng = np.random.default_rng(seed)
        return [rng.integers(0, 1 << 30, self.elems, dtype=np.int32) for _ in self.inputs]


class _Builder:
    """Hands out buffer numbers while a workload's steps are generated."""

    def __init__(self, devices: int) -> None:
        self.devices = devices
        self.buffer_devices: list[int] = []
        self.inputs: list[int] = []
        self.steps: list[Step] = []

    def buffer(self, device: int) -> int:
        self.buffer_devices.append(device)
        return len(self.buffer_devices) - 1

    def input(self, device: int) -> int:
        buf = self.buffer(device)
        self.inputs.append(buf)
        return buf

    def xor(self, device: int, a: int, b: int) -> int:
        out = self.buffer(device)
        self.steps.append(Xor(device, out, a, b))
        return out

    def move(self, device: int, src: int) -> int:
        out = self.buffer(device)
        self.steps.append(Move(device, out, src))
        return out

    def done(self, name: str, elems: int) -> Workload:
        return Workload(
            name,
            self.devices,
            elems,
            tuple(self.buffer_devices),
            tuple(self.inputs),
            tuple(self.steps),
        )


def tiny_chain(items: int = 256, elems: int = TINY_ELEMS) -> Workload:
    """`items` small xor kernels on one device, each reading the previous one's result."""
    build = _Builder(1)
    head, key = build.input(0), build.input(0)
    for _ in range(items):
        head = build.xor(0, head, key)
    return build.done(f"tiny xor x{items}, 1 device", elems)


def two_device_copies(items: int = 1024, copy_every: int = 8, elems: int = TINY_ELEMS) -> Workload:
    """One xor chain per device, items alternating between them; every `copy_every`-th
    item moves one device's latest result to the other (the direction alternates), and
    the next xor there folds it in, so each device in turn waits for the other."""
    build = _Builder(2)
    heads = [build.input(0), build.input(1)]
    keys = [build.input(0), build.input(1)]
    for i in range(items):
        if i % copy_every == copy_every - 1:
            device = (i // copy_every) % 2
            # The moved value becomes this device's key for its next xor.
            keys[device] = build.move(device, heads[1 - device])
        else:
            device = i % 2
            heads[device] = build.xor(device, heads[device], keys[device])
    return build.done(f"{items} items, 2 devices, 1 in {copy_every} a copy", elems)


def heavy(devices: int, kernels: int = 16, elems: int = HEAVY_ELEMS) -> Workload:
    """Two independent xor chains of `kernels // 2` big kernels each; with 2 devices each
    chain has a device of its own, with 1 both share it."""
    build = _Builder(devices)
    chains = [(build.input(c % devices), build.input(c % devices)) for c in range(2)]
    heads = [head for head, _ in chains]
    for i in range(kernels):
        chain = i % 2
        heads[chain] = build.xor(chain % devices, heads[chain], chains[chain][1])
    return build.done(f"heavy xor x{kernels} ({elems} int32), {devices} device(s)", elems)


def random_dag(
    items: int = 1000,
    devices: int = 2,
    copy_every: int = 8,
    window: int = 24,
    elems: int = TINY_ELEMS,
    seed: int = 0,
) -> Workload:
    """A random DAG: each item lands on a random device and xors two distinct recent
    results there, or (1 in `copy_every` on average) moves a recent result of another
    device over. No two items compute the same thing, so no runner can merge them."""
    rng = random.Random(seed)
    build = _Builder(devices)
    recent: list[list[int]] = [[build.input(d), build.input(d)] for d in range(devices)]
    seen: set[tuple[Any, ...]] = set()
    while len(build.steps) < items:
        device = rng.randrange(devices)
        if devices > 1 and rng.randrange(copy_every) == 0:
            other = rng.choice([d for d in range(devices) if d != device])
            src = rng.choice(recent[other][-window:])
            if ("move", src, device) in seen:
                continue
            seen.add(("move", src, device))
            out = build.move(device, src)
        else:
            a, b = rng.sample(recent[device][-window:], 2)
            pair = ("xor", min(a, b), max(a, b))
            if pair in seen:
                continue
            seen.add(pair)
            out = build.xor(device, a, b)
        recent[device].append(out)
    return build.done(f"random DAG of {items} items, {devices} devices", elems)


def reference(workload: Workload, inputs: Sequence[np.ndarray[Any, Any]]) -> dict[int, Any]:
    """Every buffer's value after one run, computed with plain numpy."""
    values: dict[int, Any] = dict(zip(workload.inputs, inputs))
    for step in workload.steps:
        if isinstance(step, Xor):
            values[step.out] = np.bitwise_xor(values[step.a], values[step.b])
        else:
            values[step.out] = values[step.src].copy()
    return values


# -- actorgraph --


# The kernel is numpy's own xor, called as np.bitwise_xor(a, b, out): a plain numpy call
# is then the very kernel, which is what benchmarks/floor.py compares replays against.
XOR = ag.Kernel("xor", cpu=np.bitwise_xor, outs=(2,), ins=(0, 1))


@attrs.frozen
class ActorgraphBuild:
    items: tuple[ag.Launch | ag.Copy, ...]
    inputs: tuple[ag.Buffer, ...]
    buffers: tuple[ag.Buffer, ...]


def cpu_devices(count: int) -> list[str]:
    return [f"CPU:{i}" for i in range(count)]


def build_actorgraph(
    rt: ag.Runtime, workload: Workload, device_names: Sequence[str] | None = None
) -> ActorgraphBuild:
    """Allocate the workload's buffers on `device_names` (default CPU:0..) and list its items."""
    names = list(device_names) if device_names is not None else cpu_devices(workload.devices)
    buffers = tuple(
        rt.alloc(names[device], workload.elems, np.int32) for device in workload.buffer_devices
    )
    items: list[ag.Launch | ag.Copy] = []
    for step in workload.steps:
        if isinstance(step, Xor):
            items.append(ag.Launch(XOR, [buffers[step.a], buffers[step.b], buffers[step.out]]))
        else:
            items.append(ag.Copy(dst=buffers[step.out], src=buffers[step.src]))
    inputs = tuple(buffers[i] for i in workload.inputs)
    return ActorgraphBuild(tuple(items), inputs, buffers)
