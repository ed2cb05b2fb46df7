"""Test helpers for code that runs on actorgraph, and what its pytest fixtures run.

The fixtures themselves (`ag_cpu_runtime`, `ag_sim_runtime`, `ag_cuda_runtime`,
`ag_worker`, `ag_remote_runtime`) are declared by the pytest plugin `_actorgraph_pytest`,
which installing actorgraph registers with pytest; it stays light and imports this module
only when a test uses one of them. This module is plain Python: `start_worker` also serves
code outside pytest (a script, a notebook) that wants a loopback worker.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio
import trio.testing

from ._errors import UsageError
from ._runtime import Runtime, open_runtime

__all__ = ["Worker", "open_test_runtime", "start_worker"]

DEFAULT_COUNT = 2  # devices per runtime fixture: two, so cross-device copies are exercised
START_TIMEOUT = 30.0  # seconds for a worker to say it is listening
STOP_TIMEOUT = 10.0  # seconds for a worker to exit when asked, before it is killed


class Worker:
    """An `actorgraph worker` subprocess on loopback, started by `start_worker`.

    `devices` are the names a client opens (`CPU:0@127.0.0.1:PORT`, ...), `token` the
    shared secret (pass `remote_token=worker.token` to `open_runtime`). Use it as a context
    manager, or call `stop()`; `kill()` ends it abruptly (to test a worker that dies).
    """

    def __init__(
        self,
        devices: Sequence[str],
        *,
        kernels: Sequence[str] = (),
        token: bytes | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        extra_args: Sequence[str] = (),
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        if isinstance(devices, str) or not devices:
            raise UsageError(
                f"start_worker: devices must be a non-empty list of local names such as "
                f"['CPU:0', 'CPU:1'], got {devices!r}"
            )
        self.host = host
        self.token = token if token is not None else secrets.token_hex(16).encode()
        self._folder = Path(tempfile.mkdtemp(prefix="actorgraph-worker-"))
        self.token_file = self._folder / "token"
        self.token_file.write_bytes(self.token + b"\n")
        cmd = [sys.executable, "-m", "actorgraph", "worker", "--host", host, "--port", str(port)]
        cmd += ["--devices", ",".join(devices), "--token-file", str(self.token_file)]
        for module in kernels:
            cmd += ["--kernels", module]
        cmd += list(extra_args)
        # The worker imports the kernel modules: let it import what this process can.
        entries = [os.getcwd() if entry == "" else entry for entry in sys.path]
        inherited = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [*entries, inherited])))
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
        )
        self._output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        # A thread drains the worker's output, so it never blocks on a full pipe and its
        # words are at hand when it fails.
        self._reader = threading.Thread(
            target=self._read, name="actorgraph worker output", daemon=True
        )
        self._reader.start()
        self.port = self._wait_listening(start_timeout)
        self.devices = [f"{name}@{self._address()}" for name in devices]

    def __repr__(self) -> str:
        return f"<Worker {self._address()} pid {self.process.pid} devices {self.devices}>"

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def output(self) -> str:
        """What the worker printed so far (stdout and stderr)."""
        return "".join(self._output)

    def name(self, device: str) -> str:
        """The client-side name of the worker's `device`: `CPU:0` -> `CPU:0@HOST:PORT`."""
        return f"{device}@{self._address()}"

    def stop(self) -> None:
        """Ask the worker to exit, kill it if it does not, and remove its token file."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._cleanup()

    def kill(self) -> None:
        """End the worker at once, as a crash would."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._cleanup()

    def _address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def _cleanup(self) -> None:
        self._reader.join(STOP_TIMEOUT)
        if self.process.stdout is not None:
            self.process.stdout.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._output.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def _wait_listening(self, timeout: float) -> int:
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise UsageError(
                    f"the actorgraph worker did not start listening within {timeout:g} s; "
                    f"its output:\n{self.output}"
                ) from None
            if line is None:
                code = self.process.wait()
                self._cleanup()
                raise UsageError(
                    f"the actorgraph worker exited with code {code} before listening; "
                    f"its output:\n{self.output}"
                )
            if "listening on " in line:
                return int(line.split("listening on ", 1)[1].split()[0].rsplit(":", 1)[1])


def start_worker(
    devices: Sequence[str] = ("CPU:0", "CPU:1"),
    *,
    kernels: Sequence[str] = (),
    token: bytes | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    extra_args: Sequence[str] = (),
) -> Worker:
    """Start `actorgraph worker` for `devices` on loopback and wait until it listens.

    The port is 0 by default: the system picks a free one (`worker.port`), so parallel
    test runs never collide. `kernels` are module names it imports (`--kernels`); it can
    import what this process can. A random token is made unless one is given.
    """
    return Worker(
        devices, kernels=kernels, token=token, host=host, port=port, extra_args=extra_args
    )


def _check_autojump_clock() -> None:
    clock = trio.lowlevel.current_clock()
    if not (isinstance(clock, trio.testing.MockClock) and clock.autojump_threshold == 0):
        raise UsageError(
            f"SIM devices in a test run on trio's virtual time, but this run's clock is "
            f"{clock!r}; take pytest-trio's `autojump_clock` fixture in the test's own "
            f"arguments (pytest-trio hands trio.run only the test's clock): "
            f"`async def test_x(ag_sim_runtime, autojump_clock): ...`"
        )


@contextlib.asynccontextmanager
async def open_test_runtime(
    kind: str,
    count: int = DEFAULT_COUNT,
    options: Mapping[str, Any] | None = None,
    worker: Worker | None = None,
) -> AsyncIterator[Runtime]:
    """The runtime a fixture gives a test: `count` devices of `kind` (CPU, SIM, CUDA on the
    fake driver, or REMOTE: the first `count` devices of `worker`), with `options` for
    `open_runtime`. SIM needs trio's autojump clock."""
    opts = dict(options or {})
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UsageError(f"@pytest.mark.actorgraph(devices=...) must be an int >= 1, got {count!r}")
    if kind == "REMOTE":
        if worker is None:
            raise UsageError("a REMOTE test runtime needs a worker (the ag_worker fixture)")
        if count > len(worker.devices):
            raise UsageError(
                f"@pytest.mark.actorgraph(devices={count}) asks for more devices than the "
                f"worker serves ({', '.join(worker.devices)}); raise actorgraph_worker_devices "
                f"in the pytest configuration"
            )
        names = worker.devices[:count]
        opts.setdefault("remote_token", worker.token)
    else:
        names = [f"{kind}:{i}" for i in range(count)]
        if kind == "SIM":
            _check_autojump_clock()
        elif kind == "CUDA":
            opts.setdefault("cuda_driver", "fake")
    async with open_runtime(names, **opts) as rt:
        yield rt
