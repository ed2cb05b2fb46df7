"""tinygrad on actorgraph workers: a transformer decode step on one worker, and a
data-parallel training step over two, each checked bitwise against tinygrad alone.

    python examples/tinygrad_remote.py [--steps 6]

Starts two workers on loopback (`actorgraph worker --port 0 --devices CPU:0 --token-file
F --allow-programs`: on other hosts, the same with `--host`), runs each model with
tinygrad alone on this host's CPU devices, then installs actorgraph with the workers as
tinygrad's AG and AG:1 (`agt.install(remote=[...])`) and runs the same code there: the
decode step's jit (a KV cache, a new symbolic position every call) on AG, the training
step's jit (the batch sharded over AG and AG:1, the gradients summed between the two
workers, directly) over both. The same ground as 07_tinygrad_remote.ipynb.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

os.environ.setdefault("DEV", "CPU")  # tinygrad's default device: set before importing it

import numpy as np  # noqa: E402
from tinygrad import Context, Tensor, TinyJit, Variable  # noqa: E402
from tinygrad.nn.optim import SGD  # noqa: E402

from actorgraph import tinygrad as agt  # noqa: E402

DIM, HEADS, CTX = 32, 4, 16


class Worker:
    """`actorgraph worker --allow-programs` on a free loopback port, serving CPU:0."""

    def __init__(self, token_file: pathlib.Path) -> None:
        command = [sys.executable, "-m", "actorgraph", "worker", "--port", "0"]
        command += ["--devices", "CPU:0", "--token-file", str(token_file), "--allow-programs"]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.banner = self.process.stdout.readline().strip()
        found = re.search(r"listening on (\S+)", self.banner)
        if found is None:
            self.stop()
            raise RuntimeError(f"the worker did not start (it printed {self.banner!r})")
        self.device = f"CPU:0@{found.group(1)}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def start_workers(count: int) -> tuple[list[Worker], pathlib.Path]:
    """`count` workers sharing a fresh token (in a file only this user can read)."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="ag-tinygrad-"))
    token = folder / "token"
    token.write_text(os.urandom(16).hex())
    token.chmod(0o600)
    return [Worker(token) for _ in range(count)], token


def weights(seed: int, *shape: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * 0.1


class DecoderBlock:
    """Attention over a KV cache filled at a symbolic position, then an MLP."""

    def __init__(self, seed: int, device: str) -> None:
        def w(k: int, *shape: int) -> Tensor:
            return Tensor(weights(seed + k, *shape), device=device).realize()

        self.wq, self.wk, self.wv, self.wo = (w(k, DIM, DIM) for k in range(4))
        self.w1, self.w2 = w(4, DIM, 4 * DIM), w(5, 4 * DIM, DIM)
        self.cache_k = Tensor.zeros(CTX, DIM, device=device).contiguous().realize()
        self.cache_v = Tensor.zeros(CTX, DIM, device=device).contiguous().realize()

    def __call__(self, x: Tensor, pos: Any) -> Tensor:
        q, k, v = x @ self.wq, x @ self.wk, x @ self.wv
        self.cache_k[pos : pos + 1].assign(k).realize()
        self.cache_v[pos : pos + 1].assign(v).realize()
        keys, values = self.cache_k[0 : pos + 1], self.cache_v[0 : pos + 1]
        hd = DIM // HEADS
        qh = q.reshape(HEADS, 1, hd)
        kh = keys.reshape(-1, HEADS, hd).permute(1, 2, 0)
        vh = values.reshape(-1, HEADS, hd).permute(1, 0, 2)
        att = ((qh @ kh) / hd**0.5).softmax(-1) @ vh
        x = x + att.reshape(1, DIM) @ self.wo
        return x + (x @ self.w1).relu() @ self.w2


def decode_steps(device: str, steps: int) -> list[np.ndarray[Any, Any]]:
    """`steps` decode steps of a 2-block decoder on `device`, a new position every call."""
    blocks = [DecoderBlock(10 * i, device) for i in range(2)]
    position = Variable("start_pos", 0, CTX - 1)

    @TinyJit
    def step(x: Tensor, pos: Any) -> Tensor:
        for block in blocks:
            x = block(x, pos)
        return x.realize()

    x = Tensor(weights(99, 1, DIM), device=device).realize()
    outs = []
    for k in range(steps):
        x = step(x, position.bind(k))
        outs.append(x.numpy())
        x = Tensor(outs[-1], device=device).realize()
    return outs


def training_steps(
    devices: tuple[str, ...], steps: int
) -> tuple[list[float], np.ndarray[Any, Any]]:
    """`steps` SGD steps of an MLP, data-parallel over `devices`: its losses and its
    first layer's weights after them."""
    w1 = Tensor(weights(1, 16, 32)).shard(devices).realize()
    w2 = Tensor(weights(2, 32, 4)).shard(devices).realize()
    opt = SGD([w1, w2], lr=0.1)

    @TinyJit
    @Context(TRAINING=1)
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = (((x @ w1).relu() @ w2 - y) ** 2).mean().backward()
        return loss.realize(*opt.schedule_step())

    losses = []
    for k in range(steps):
        x = Tensor(weights(100 + k, 8, 16)).is_param_(False).shard(devices, axis=0)
        y = Tensor(weights(200 + k, 8, 4)).is_param_(False).shard(devices, axis=0)
        losses.append(float(step(x, y).item()))
    return losses, w1.numpy()


def run_both(name: str, alone: Callable[[], Any], on_workers: Callable[[], Any]) -> tuple[Any, Any]:
    """Results of tinygrad alone and on the workers, which must be the same bytes."""
    want, got = alone(), on_workers()
    same = _as_bytes(want) == _as_bytes(got)
    print(f"{name}: {'equal to tinygrad alone, bit for bit' if same else 'DIFFERS'}")
    if not same:
        raise SystemExit(f"{name} on the workers differs from tinygrad alone")
    return want, got


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, tuple):
        return b"".join(_as_bytes(v) for v in value)
    if isinstance(value, list):
        return b"".join(_as_bytes(v) for v in value)
    return np.asarray(value, dtype=np.float64 if isinstance(value, float) else None).tobytes()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="decode and training steps")
    args = parser.parse_args(argv)
    # tinygrad alone, on this host's CPU devices: the reference.
    decoded = decode_steps("CPU", args.steps)
    trained = training_steps(("CPU", "CPU:1"), args.steps)
    workers, token = start_workers(2)
    try:
        for worker in workers:
            print(worker.banner)
        agt.install(remote=[w.device for w in workers], remote_token_file=str(token))
        try:
            run_both("decode step on AG", lambda: decoded, lambda: decode_steps("AG", args.steps))
            losses, _ = run_both(
                "training step over AG and AG:1",
                lambda: trained,
                lambda: training_steps(("AG", "AG:1"), args.steps),
            )[1]
            print(f"losses: {' '.join(f'{loss:.5f}' for loss in losses)}")
            stats = agt.statistics()
            print(f"replays through actorgraph: {stats.replays}, flushes: {stats.flushes}")
        finally:
            agt.uninstall()
    finally:
        for worker in workers:
            worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
