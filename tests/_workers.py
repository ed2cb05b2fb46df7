"""Workers for the remote tests: started with the test kernels and a shared token (the
`workers` fixture, in conftest.py, starts two per test module that asks)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import trio
from actorgraph.devices.remote.wire import NONCE_BYTES, TO_WORKER, as_meta, handshake_mac

import actorgraph as ag
from actorgraph.testing import Worker, start_worker

GUARD = 30  # seconds: a hang guard only; every test finishes far sooner
TOKEN = b"test-token-0123456789"


def start(devices: str, **options: Any) -> Worker:
    """A worker of the test kernels, with the shared test token."""
    return start_worker(devices.split(","), kernels=["remote_kernels"], token=TOKEN, **options)


def runtime(names: list[str], **options: object) -> object:
    return ag.open_runtime(names, remote_token=TOKEN, **options)


def chain(kernel: ag.Kernel, xs: Sequence[Any], steps: int) -> list[Any]:
    """A chain between the two buffers `xs`: `kernel` on one in place, then a copy of it
    to the other, `steps` times (each step on the device the last copy went to)."""
    items: list[Any] = []
    for i in range(steps):
        here, there = xs[i % 2], xs[(i + 1) % 2]
        items += [ag.Launch(kernel, [here, here]), ag.Copy(dst=there, src=here)]
    return items


async def replay_chain_rounds(
    rt: ag.Runtime,
    graph: ag.Graph,
    start: ag.Buffer,
    steps: int,
    rounds: int,
    seed: int,
    before: Callable[[], None],
    after: Callable[[], None],
) -> None:
    """Replay `graph`, a `chain` of `steps` steps of INC from buffer `start`, `rounds`
    times, each from a new random int32 value copied into `start`: `before` is called
    before each replay and `after` after it, then the result (the start plus `steps`) is
    checked against numpy."""
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        start_value = rng.integers(0, 1 << 30, start.size, dtype=np.int32)
        await rt.copyin(start, start_value)
        before()
        await graph()
        after()
        np.testing.assert_array_equal(await rt.copyout(start), start_value + steps)


class Replies:
    """What a session sends its client, kept in a list (an in-process session's outbox)."""

    def __init__(self) -> None:
        self.sent: list[list[Any]] = []
        self.changed = trio.Event()

    def send(self, message: Any, tail: memoryview | None = None) -> trio.Event:
        self.sent.append(as_meta(message))
        self.changed.set()
        self.changed = trio.Event()
        done = trio.Event()
        done.set()
        return done

    def hold(self) -> None:
        pass  # frames are kept as they are sent: nothing to join

    def release(self) -> None:
        pass

    async def wait_for(self, count: int) -> list[list[Any]]:
        while len(self.sent) < count:
            await self.changed.wait()
        return self.sent


async def hello(stream: Any, role: str) -> tuple[bytes, bytes, bool]:
    """The first half of a handshake over the raw protocol, as the connecting side: say
    hello as `role`, read the worker's challenge; (our nonce, its nonce, needs token)."""
    from actorgraph.devices.remote.frames import encode

    nonce = secrets.token_bytes(NONCE_BYTES)
    await stream.send([encode(["hello", role, nonce])])
    meta, _ = await stream.receive()
    assert meta[0] == "challenge", meta
    return nonce, meta[1], meta[2]


async def handshake(
    stream: Any, role: str, devices: Sequence[str] = (), token: bytes = TOKEN
) -> list[Any]:
    """A whole handshake over the raw protocol, as a client ("client") or a linking
    worker ("peer") holding `token`: the worker's answer (a welcome, or an error)."""
    from actorgraph.devices.remote.frames import encode

    ours, theirs, _ = await hello(stream, role)
    mac = handshake_mac(token, role, ours, theirs, TO_WORKER)
    await stream.send([encode(["auth", mac, list(devices)])])
    meta, _ = await stream.receive()
    return meta  # type: ignore[no-any-return]
