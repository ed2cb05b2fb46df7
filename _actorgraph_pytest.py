"""actorgraph's pytest plugin: fixtures for testing code that runs on actorgraph.

Installing actorgraph registers this module with pytest (the `pytest11` entry point). It
is its own small module, outside the `actorgraph` package, so that pytest runs that use
none of its fixtures never import actorgraph, numpy, trio or pytest-trio for it; the
fixtures import `actorgraph.testing` when a test asks for them.

Runtime fixtures are async: they need pytest-trio, and the test must run under trio
(`trio_mode = true` in the pytest configuration, or `@pytest.mark.trio` on the test):

- `ag_cpu_runtime`: a Runtime on CPU:0, CPU:1.
- `ag_sim_runtime`: a Runtime on SIM:0, SIM:1 on trio's virtual time; the test also takes
  pytest-trio's `autojump_clock`, so simulated seconds cost no wall time and repeat exactly.
- `ag_cuda_runtime`: a Runtime on CUDA:0, CUDA:1 through the fake CUDA driver (host
  memory, kernels run their CPU bodies): every CUDA code path, no GPU.
- `ag_worker` (sync, one per test session): an `actorgraph worker` subprocess on
  loopback, on a free port, with a random token; `ag_worker.devices` are its device
  names, `ag_worker.token` the token. Configured by the ini options
  `actorgraph_worker_devices` and `actorgraph_worker_kernels` (modules of kernels).
- `ag_remote_runtime`: a Runtime on the worker's devices.

`@pytest.mark.actorgraph(devices=N, **options)` sets, per test, how many devices a runtime
fixture opens and other `open_runtime` options (`verify_plans=True`, `sim_preset=...`).
Each runtime lives for its test and closes after it; an actor that fails fails the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

_MARKER = "actorgraph"
_ASYNC_FIXTURES = ("ag_cpu_runtime", "ag_sim_runtime", "ag_cuda_runtime", "ag_remote_runtime")
_NO_TRIO = (
    "{fixture} is an async fixture: it needs pytest-trio (`pip install pytest-trio`, or "
    '`pip install -e ".[test]"` in a checkout of actorgraph) and a test that runs under trio: set '
    "`trio_mode = true` in the pytest configuration or mark the test `@pytest.mark.trio`"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "actorgraph_worker_devices",
        "devices of the ag_worker fixture's worker, comma-separated (default CPU:0,CPU:1)",
        default="CPU:0,CPU:1",
    )
    parser.addini(
        "actorgraph_worker_kernels",
        "modules the ag_worker fixture's worker imports kernels from (--kernels)",
        type="args",
        default=[],
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(devices=2, **options): how many devices the actorgraph runtime fixtures "
        f"open, and other open_runtime options",
    )


@pytest.fixture
def _ag_under_trio(request: pytest.FixtureRequest) -> None:
    """Runs before every async fixture here: a clear word where pytest-trio cannot run it."""
    wanted = [name for name in request.fixturenames if name in _ASYNC_FIXTURES]
    fixture = " and ".join(wanted) or "this actorgraph fixture"
    if not request.config.pluginmanager.hasplugin("trio"):
        pytest.fail(
            _NO_TRIO.format(fixture=fixture) + " (pytest-trio is not active)", pytrace=False
        )
    if request.node.get_closest_marker("trio") is None:
        pytest.fail(
            _NO_TRIO.format(fixture=fixture) + f" ({request.node.name} does not run under trio)",
            pytrace=False,
        )


def _marker_options(request: pytest.FixtureRequest) -> tuple[int, dict[str, Any]]:
    from actorgraph._options import refuse_unknown
    from actorgraph.testing import DEFAULT_COUNT

    options: dict[str, Any] = {}
    # The closest marker wins: a test's own over its class's and module's.
    for marker in reversed(list(request.node.iter_markers(_MARKER))):
        if marker.args:
            raise pytest.UsageError(
                f"@pytest.mark.{_MARKER} takes keywords only (devices=N, open_runtime "
                f"options), got positional {marker.args!r}"
            )
        options.update(marker.kwargs)
    refuse_unknown(options, f"@pytest.mark.{_MARKER}(...)", own=["devices"])
    count = options.pop("devices", DEFAULT_COUNT)
    return count, options


def _runtime(request: pytest.FixtureRequest, kind: str, worker: Any = None) -> Any:
    from actorgraph.testing import open_test_runtime

    count, options = _marker_options(request)
    return open_test_runtime(kind, count, options, worker)


@pytest.fixture
async def ag_cpu_runtime(
    request: pytest.FixtureRequest, _ag_under_trio: None
) -> AsyncIterator[Any]:
    """A Runtime on CPU:0, CPU:1 (`@pytest.mark.actorgraph(devices=N)` for another count)."""
    async with _runtime(request, "CPU") as rt:
        yield rt


@pytest.fixture
async def ag_sim_runtime(
    request: pytest.FixtureRequest, _ag_under_trio: None
) -> AsyncIterator[Any]:
    """A Runtime on SIM:0, SIM:1 on virtual time: the test also takes `autojump_clock`."""
    async with _runtime(request, "SIM") as rt:
        yield rt


@pytest.fixture
async def ag_cuda_runtime(
    request: pytest.FixtureRequest, _ag_under_trio: None
) -> AsyncIterator[Any]:
    """A Runtime on CUDA:0, CUDA:1 through the fake CUDA driver (no GPU needed)."""
    async with _runtime(request, "CUDA") as rt:
        yield rt


@pytest.fixture(scope="session")
def ag_worker(pytestconfig: pytest.Config) -> Iterator[Any]:
    """A loopback `actorgraph worker` subprocess for the session (see the ini options)."""
    from actorgraph.testing import start_worker

    devices = [d.strip() for d in str(pytestconfig.getini("actorgraph_worker_devices")).split(",")]
    kernels = list(pytestconfig.getini("actorgraph_worker_kernels"))
    with start_worker([d for d in devices if d], kernels=kernels) as worker:
        yield worker


@pytest.fixture
async def ag_remote_runtime(
    request: pytest.FixtureRequest, _ag_under_trio: None, ag_worker: Any
) -> AsyncIterator[Any]:
    """A Runtime on the devices of the `ag_worker` worker."""
    async with _runtime(request, "REMOTE", ag_worker) as rt:
        yield rt
