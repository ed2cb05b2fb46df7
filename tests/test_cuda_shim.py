"""The real CUDA driver path end to end, without a GPU.

tests/cudashim/libcuda.c is a libcuda.so.1 that keeps "device" memory in host memory and
runs each stream on a thread (see its header). Built here with the C compiler against
cuda.h (the test extra installs the header), it stands in for the NVIDIA driver under
cuda-python, so RealDriver, the CUDA device and its queue actors run for real: every
driver call crosses the bindings into C. The CUDA tests (the `gpu`-marked ones, and the
others on real devices instead of the fake driver) run in a fresh process that loads
the library, once per driver configuration a GPU machine may have.

On a machine with a real driver these skip: the `gpu` tests run there against the GPU.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
from _paths import ROOT, child_pythonpath

SOURCE = ROOT / "tests" / "cudashim" / "libcuda.c"
GPU_TESTS = ["tests/test_cuda_driver.py", "tests/test_cuda_fake.py"]


def _cuda_include() -> pathlib.Path | None:
    """A folder with cuda.h: the pip header package, CUDA_HOME, or a CUDA toolkit."""
    places: list[str] = []
    try:
        import nvidia  # type: ignore[import-not-found]

        for root in nvidia.__path__:
            places += sorted(glob.glob(os.path.join(root, "cu*", "include")), reverse=True)
            places.append(os.path.join(root, "cuda_runtime", "include"))
    except ImportError:
        pass
    if os.environ.get("CUDA_HOME"):
        places.append(os.path.join(os.environ["CUDA_HOME"], "include"))
    places += [
        "/usr/local/cuda/include",
        *sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True),
    ]
    for place in places:
        if os.path.exists(os.path.join(place, "cuda.h")):
            return pathlib.Path(place)
    return None


@functools.cache
def _why_not() -> str | None:
    """Why the shim cannot stand in here, or None."""
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError:
        return "cuda-python is not installed"
    try:
        driver.cuInit(0)
        return "a real CUDA driver is present: the gpu tests run against it"
    except Exception:
        pass
    try:
        nvrtc.nvrtcVersion()
    except Exception:
        return "the NVRTC library is not installed (the kernels must compile)"
    if not (shutil.which("cc") or shutil.which("gcc")):
        return "no C compiler to build the test libcuda"
    if _cuda_include() is None:
        return "no cuda.h (pip install nvidia-cuda-runtime)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


@pytest.fixture(scope="session")
def shim(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("cudashim")
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler is not None
    subprocess.run(
        [
            compiler,
            "-std=gnu11",
            "-O1",
            "-Wall",
            "-shared",
            "-fPIC",
            "-pthread",
            f"-I{_cuda_include()}",
            "-o",
            str(folder / "libcuda.so.1"),
            str(SOURCE),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return folder


def _run(shim: pathlib.Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    paths = [str(shim), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
    full_env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(paths), **env}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


# Driver configurations a GPU machine may have. With four GPUs every test of the two
# files runs, the CUDA tests that default to the fake driver included
# (ACTORGRAPH_TEST_CUDA_DRIVER=real); with one, only the `gpu` tests fit.
MODES: dict[str, tuple[dict[str, str], list[str]]] = {
    "four GPUs with peer access": ({"CUDASHIM_DEVICES": "4"}, []),
    "no 64-bit stream memory operations": (
        {"CUDASHIM_DEVICES": "4", "CUDASHIM_NO_MEMOPS": "1"},
        [],
    ),
    "no peer access": ({"CUDASHIM_DEVICES": "4", "CUDASHIM_NO_PEER": "1"}, []),
    # Every stream operation starts after a pause of up to 50 us: other interleavings.
    "four GPUs, streams at uneven speeds": ({"CUDASHIM_DEVICES": "4", "CUDASHIM_JITTER": "7"}, []),
    "one GPU": ({"CUDASHIM_DEVICES": "1"}, ["-m", "gpu"]),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_cuda_tests_pass_on_the_real_driver_over_the_test_libcuda(
    shim: pathlib.Path, mode: str
) -> None:
    env, selection = MODES[mode]
    done = _run(
        shim,
        ["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *selection, *GPU_TESTS],
        ACTORGRAPH_TEST_CUDA_DRIVER="real",
        **env,
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-6000:]
    assert "needs 1 real CUDA GPU" not in report  # the real-driver tests ran, none skipped
    passed = int(report.rsplit(" passed", 1)[0].rsplit(maxsplit=1)[-1])
    assert passed >= (14 if selection else 60), report[-2000:]


def test_the_test_libcuda_catches_a_kernel_reading_another_gpus_memory(shim: pathlib.Path) -> None:
    # Without peer access a kernel on GPU 0 must not touch GPU 1's memory: on a GPU that
    # is a fault, here an abort naming it. This is what lets the runs above fail.
    script = textwrap.dedent("""
        from _cuda_kernels import INC_SRC
        from actorgraph.devices.cuda._real import real_driver
        drv = real_driver()
        ctx0, ctx1 = drv.open_context(0), drv.open_context(1)
        drv.set_context(ctx1)
        theirs = drv.mem_alloc(256)
        drv.set_context(ctx0)
        fn = drv.module_function(drv.module_load(drv.compile(INC_SRC, "inc_k", "sm_90")), "inc_k")
        stream = drv.stream_create()
        drv.launch_kernel(stream, fn, (1, 1, 1), (64, 1, 1), [theirs], [64])
        drv.stream_synchronize(stream)
        print("not caught")
    """)
    done = _run(shim, ["-c", script], CUDASHIM_NO_PEER="1", PYTHONPATH=child_pythonpath())
    assert done.returncode != 0 and "not caught" not in done.stdout
    assert "inc_k: device 0 touched memory of device 1 without peer access" in done.stderr


def test_the_cuda_benchmark_runs_on_the_real_driver_over_the_test_libcuda(
    shim: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    # The benchmark scripts/gpu_check.sh runs on a GPU, small: its raw-CUDA baselines call
    # the driver directly, so this is their only run without a GPU. Its timings here
    # measure threads, not a GPU, and are not looked at.
    out = tmp_path / "cuda.json"
    done = _run(
        shim,
        [
            "benchmarks/cuda_replay.py",
            "--kernels",
            "20",
            "--elems",
            "256",
            "--replays",
            "4",
            "--copy-mb",
            "1",
            "--spin-elems",
            "1024",
            "--json",
            str(out),
        ],
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = json.loads(out.read_text())
    assert result["driver"] == "real" and result["replay"]["result_checked"] is True
    assert result["replay"]["graph_builds"] == 1 and result["overlap"]["queues"] == [
        "CUDA:0/compute",
        "CUDA:0/copy",
    ]


def test_the_cuda_example_runs_on_the_real_driver_over_the_test_libcuda(shim: pathlib.Path) -> None:
    # examples/cuda_pipeline.py (the 03_cuda notebook's twin) picks CUDA when the driver
    # sees GPUs: here it takes the real-driver path a GPU machine would.
    done = _run(shim, ["examples/cuda_pipeline.py"], CUDASHIM_REPORT="1")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "running on CUDA: 2 GPU(s)" in done.stdout
    assert "every micro-batch matches numpy" in done.stdout
    # Closing the runtime gave back every buffer, staging area and signal word.
    assert "cudashim: at exit 0 device and 0 mapped host allocations live" in done.stderr
