"""The pytest plugin (`_actorgraph_pytest`) and `actorgraph.testing`, run as a user runs
them: each case writes a test module and runs pytest on it with pytester, plugins found
through their entry points."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trio

import actorgraph as ag
from actorgraph.testing import start_worker

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
GUARD = 30  # seconds: a hang guard only

HEADER = """
import numpy as np, pytest, trio
import actorgraph as ag

XOR = ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,), ins=(1, 2))
"""


def run_module(pytester: pytest.Pytester, body: str, ini: str = "") -> pytest.RunResult:
    pytester.makeini("[pytest]\ntrio_mode = true\n" + ini)
    pytester.makepyfile(HEADER + body)
    return pytester.runpytest("-p", "no:cacheprovider")


def test_cpu_runtime_runs_work_and_closes(pytester: pytest.Pytester) -> None:
    result = run_module(
        pytester,
        """
seen = []

async def test_cpu(ag_cpu_runtime):
    rt = ag_cpu_runtime
    assert list(rt.devices) == ["CPU:0", "CPU:1"]
    a, b, c = (rt.alloc("CPU:0", 8, np.int32) for _ in range(3))
    d = rt.alloc("CPU:1", 8, np.int32)
    await rt.copyin(a, np.arange(8, dtype=np.int32))
    await rt.run([ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c)])
    assert (await rt.copyout(d) == np.arange(8)).all()
    seen.append(rt)

def test_the_runtime_closed_after_its_test():
    with pytest.raises(ag.ClosedError, match="has exited"):
        seen[0].alloc("CPU:0", 8, np.int32)

@pytest.mark.actorgraph(devices=3, verify_plans=True)
async def test_marker_sets_count_and_options(ag_cpu_runtime):
    assert list(ag_cpu_runtime.devices) == ["CPU:0", "CPU:1", "CPU:2"]
    assert ag_cpu_runtime.statistics() is not None
""",
    )
    result.assert_outcomes(passed=3)


def test_sim_runtime_runs_on_virtual_time(pytester: pytest.Pytester) -> None:
    result = run_module(
        pytester,
        """
import time

SLOW = ag.Kernel("slow", cpu=lambda out, x: np.copyto(out, x), outs=(0,), ins=(1,), cost=3600.0)

async def test_an_hour_of_simulated_work(ag_sim_runtime, autojump_clock):
    rt = ag_sim_runtime
    assert list(rt.devices) == ["SIM:0", "SIM:1"]
    x, y = rt.alloc("SIM:0", 8, np.int32), rt.alloc("SIM:0", 8, np.int32)
    await rt.copyin(x, np.arange(8, dtype=np.int32))
    wall, start = time.monotonic(), trio.current_time()
    await rt.run([ag.Launch(SLOW, [y, x])])
    assert trio.current_time() - start >= 3600.0
    assert time.monotonic() - wall < 60
    assert (await rt.copyout(y) == np.arange(8)).all()

async def test_without_the_clock(ag_sim_runtime):
    pass
""",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*take pytest-trio's `autojump_clock` fixture*"])


def test_cuda_runtime_runs_on_the_fake_driver(pytester: pytest.Pytester) -> None:
    result = run_module(
        pytester,
        """
SRC = r'''extern "C" __global__ void inc_k(int *buf, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) buf[i] += 1;
}'''
INC = ag.Kernel("inc_k", cuda=SRC, cpu=lambda buf: np.add(buf, 1, out=buf), outs=(0,), ins=(0,))

async def test_cuda(ag_cuda_runtime):
    rt = ag_cuda_runtime
    assert list(rt.devices) == ["CUDA:0", "CUDA:1"]
    a, b = rt.alloc("CUDA:0", 8, np.int32), rt.alloc("CUDA:1", 8, np.int32)
    await rt.copyin(a, np.arange(8, dtype=np.int32))
    await rt.run([ag.Launch(INC, [a], fixedvars={}, global_size=1, local_size=8), ag.Copy(dst=b, src=a)])
    assert (await rt.copyout(b) == np.arange(8) + 1).all()
""",
    )
    result.assert_outcomes(passed=1)


def test_a_failing_actor_fails_the_test(pytester: pytest.Pytester) -> None:
    result = run_module(
        pytester,
        """
from actorgraph.devices._actor import QueueActor

async def test_actor_breaks(ag_cpu_runtime, monkeypatch):
    async def broken(self, job):
        raise RuntimeError("the actor broke")

    monkeypatch.setattr(QueueActor, "_run_job", broken)
    monkeypatch.setattr(QueueActor, "runs_inline", False)  # every job goes to its actor
    a = ag_cpu_runtime.alloc("CPU:0", 8, np.int32)
    with trio.fail_after(30):
        await ag_cpu_runtime.run([ag.Launch(XOR, [a, a, a])])
""",
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) + outcomes.get("errors", 0) >= 1
    assert "passed" not in outcomes
    result.stdout.fnmatch_lines(["*RuntimeError: the actor broke*"])


def test_async_fixtures_say_they_need_trio(pytester: pytest.Pytester) -> None:
    body = """
def test_sync(ag_cpu_runtime):
    pass
"""
    pytester.makepyfile(body)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ag_cpu_runtime is an async fixture: it needs pytest-trio*test_sync does not run under trio*"
        ]
    )
    # Without pytest-trio at all.
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:trio")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*ag_cpu_runtime is an async fixture*pytest-trio is not active*"])


def test_worker_fixture_serves_a_remote_runtime_and_stops(pytester: pytest.Pytester) -> None:
    (pytester.path / "mykernels.py").write_text(
        "import numpy as np\nimport actorgraph as ag\n"
        "KERNELS = [ag.Kernel('twice', cpu=lambda out, x: np.multiply(x, 2, out=out), outs=(0,), ins=(1,))]\n"
    )
    pidfile = pytester.path / "pid"
    result = run_module(
        pytester,
        f"""
from mykernels import KERNELS

def test_worker(ag_worker):
    assert len(ag_worker.devices) == 3 and ag_worker.devices[0].startswith("CPU:0@127.0.0.1:")
    open({str(pidfile)!r}, "w").write(str(ag_worker.process.pid))

@pytest.mark.actorgraph(devices=2)
async def test_remote(ag_remote_runtime, ag_worker):
    rt = ag_remote_runtime
    assert list(rt.devices) == ag_worker.devices[:2]
    x, y = rt.alloc(rt.devices[0], 8, np.int32), rt.alloc(rt.devices[1], 8, np.int32)
    await rt.copyin(x, np.arange(8, dtype=np.int32))
    with trio.fail_after(30):
        await rt.run([ag.Launch(KERNELS[0], [x, x]), ag.Copy(dst=y, src=x)])
        assert (await rt.copyout(y) == np.arange(8) * 2).all()
""",
        ini="actorgraph_worker_devices = CPU:0,CPU:1,CPU:2\nactorgraph_worker_kernels = mykernels\n",
    )
    result.assert_outcomes(passed=2)
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the worker is gone with its session


def test_importing_the_plugin_imports_nothing_heavy() -> None:
    code = (
        "import sys, _actorgraph_pytest\n"
        "heavy = [m for m in ('actorgraph', 'numpy', 'trio', 'pytest_trio') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=GUARD)


# -- start_worker outside pytest's fixtures --


def test_start_worker_refuses_a_device_string() -> None:
    with pytest.raises(
        ag.UsageError, match=r"devices must be a non-empty list.*\['CPU:0', 'CPU:1'\]"
    ):
        start_worker("CPU:0,CPU:1")  # type: ignore[arg-type]


def test_start_worker_reports_a_worker_that_cannot_start() -> None:
    with pytest.raises(
        ag.UsageError, match=r"exited with code \d+ before listening(.|\n)*no_such_kernels"
    ):
        start_worker(["CPU:0"], kernels=["no_such_kernels"])


async def test_start_worker_gives_names_and_token() -> None:
    with start_worker(["CPU:0"], kernels=["remote_kernels"]) as worker:
        assert worker.devices == [worker.name("CPU:0")] == [f"CPU:0@127.0.0.1:{worker.port}"]
        with trio.fail_after(GUARD):
            async with ag.open_runtime(worker.devices, remote_token=worker.token) as rt:
                x = rt.alloc(worker.devices[0], 4, np.int32)
                await rt.copyin(x, np.arange(4, dtype=np.int32))
                assert list(await rt.copyout(x)) == [0, 1, 2, 3]
    assert worker.process.poll() is not None
    assert not worker.token_file.exists()


def test_bad_markers_are_clear_errors(pytester: pytest.Pytester) -> None:
    result = run_module(
        pytester,
        """
@pytest.mark.actorgraph(devices=0)
async def test_no_devices(ag_cpu_runtime):
    pass

@pytest.mark.actorgraph(3)
async def test_positional(ag_cpu_runtime):
    pass

@pytest.mark.actorgraph(devices=5)
async def test_more_than_the_worker_has(ag_remote_runtime):
    pass
""",
    )
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines_random(
        [
            "*devices=...) must be an int >= 1, got 0*",
            "*takes keywords only (devices=N, open_runtime options), got positional (3,)*",
            "*devices=5) asks for more devices than the worker serves*actorgraph_worker_devices*",
        ]
    )


def test_a_marker_keyword_typo_names_the_near_one(pytester: pytest.Pytester) -> None:
    result = run_module(
        pytester,
        """
@pytest.mark.actorgraph(device=3)
async def test_typo(ag_cpu_runtime):
    pass
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.actorgraph(...) got an option 'device' that neither "
            "@pytest.mark.actorgraph(...) nor open_runtime(...) takes; did you mean 'devices'?*"
        ]
    )
