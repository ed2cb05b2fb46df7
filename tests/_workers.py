"""Workers for the remote tests: started with the test kernels and a shared token (the
`workers` fixture, in conftest.py, starts two per test module that asks)."""

from __future__ import annotations

from typing import Any

import actorgraph as ag
from actorgraph.testing import Worker, start_worker

GUARD = 30  # seconds: a hang guard only; every test finishes far sooner
TOKEN = b"test-token-0123456789"


def start(devices: str, **options: Any) -> Worker:
    """A worker of the test kernels, with the shared test token."""
    return start_worker(devices.split(","), kernels=["remote_kernels"], token=TOKEN, **options)


def runtime(names: list[str], **options: object) -> object:
    return ag.open_runtime(names, remote_token=TOKEN, **options)
