import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _workers import start
from hypothesis import HealthCheck, settings

from actorgraph.testing import Worker

# A fixed profile for CI so runs are stable; `dev` explores more locally.
settings.register_profile(
    "ci",
    max_examples=40,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[Worker, Worker]]:
    """Two workers for a test module: A with CPU:0 and CPU:1, B with CPU:0."""
    a = start("CPU:0,CPU:1")
    b = start("CPU:0")
    yield a, b
    a.kill()
    b.kill()


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The gate file of the test kernel GATED (remote_kernels.py), not there yet: a
    GATED kernel runs until the test creates it (`gate.touch()`)."""
    path = tmp_path / "gate"
    monkeypatch.setenv("ACTORGRAPH_TEST_GATE", str(path))
    return path


@pytest.fixture(autouse=True)
def _no_token_file_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime would read the workers' token from ACTORGRAPH_TOKEN_FILE when a test gives
    none: tests set it themselves where they mean to."""
    monkeypatch.delenv("ACTORGRAPH_TOKEN_FILE", raising=False)
