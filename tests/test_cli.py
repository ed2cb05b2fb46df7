"""The `actorgraph` command: every subcommand runs, has --help, and rejects bad flags clearly."""

from __future__ import annotations

import json
import os
import pathlib
import re
import select
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import trio
from _extras import importorskip
from _paths import child_pythonpath
from actorgraph.devices import install_hint

import actorgraph as ag
from actorgraph import _bench
from actorgraph import testing as ag_testing
from actorgraph._cli import build_parser, main
from actorgraph._inventory import GPUInfo, Inventory, probe_cuda, render


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit:
        code = int(exit.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["demo", "bench", "worker", "devices"])
def test_every_command_has_help(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, _ = run_cli(capsys, command, "--help")
    assert code == 0 and out.startswith(f"usage: actorgraph {command}")
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and command in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), r"the following arguments are required: COMMAND"),
        (("bogus",), r"argument COMMAND: invalid choice: 'bogus'"),
        (("devices", "--bogus"), r"actorgraph devices: error: unrecognized arguments: --bogus"),
        (("worker", "--bogus"), r"actorgraph worker: error: unrecognized arguments: --bogus"),
        (
            ("worker", "--port", "x"),
            r"actorgraph worker: error: argument --port: invalid int value: 'x'",
        ),
        (
            ("bench", "--items", "x"),
            r"actorgraph bench: error: argument --items: invalid int value: 'x'",
        ),
        (("bench", "--items", "0"), r"actorgraph bench: --items must be >= 1, got 0"),
        (("bench", "--replays", "-3"), r"actorgraph bench: --replays must be >= 1, got -3"),
        (
            ("bench", "--items", "5"),
            r"--items, --replays, --device, --token-file and --tls-ca apply to the built-in "
            r"benchmark; add --builtin",
        ),
        (("demo", "--replays", "0"), r"actorgraph demo: --replays must be >= 1"),
        (
            ("worker", "--max-handshakes", "0"),
            r"actorgraph worker: --max-handshakes must be >= 1 \(connections not yet "
            r"authenticated held at once\), got 0",
        ),
        (
            ("worker", "--max-handshakes-per-address", "-3"),
            r"actorgraph worker: --max-handshakes-per-address must be >= 1 \(connections not "
            r"yet authenticated held at once from one address\), got -3",
        ),
        (("demo", "--devices", ","), r"give at least one device, e.g. CPU:0,CPU:1"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert re.search(message, err), err


def test_devices_lists_cpu_and_never_needs_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "devices")
    assert code == 0
    assert "CPU:N" in out and "CUDA" in out
    assert (
        "remote   KIND:N@HOST:PORT: device KIND:N of an `actorgraph worker` listening on "
        "HOST:PORT, e.g. CPU:0@127.0.0.1:7000 (IPv6: CPU:0@[::1]:7000)"
    ) in out
    code, out, _ = run_cli(capsys, "devices", "--json")
    data = json.loads(out)
    assert data["remote_names"] == "KIND:N@HOST:PORT"
    assert code == 0 and "CPU" in data["kinds"] and data["cpu_cores"] >= 1
    gpus, note = probe_cuda()  # whatever this machine has, it answers without raising
    assert isinstance(note, str) and len(gpus) == len(data["cuda_gpus"])
    assert re.fullmatch(r"\d+\.\d+, builds sm_\d+ to sm_\d+|not installed: .*", data["nvrtc_note"])


def test_devices_lists_cuda_among_the_kinds_it_can_open_only_with_a_gpu(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from actorgraph import _inventory

    no_driver = "no NVIDIA driver on this machine (libcuda not found)"
    monkeypatch.setattr(_inventory, "probe_cuda", lambda: ((), no_driver))
    code, out, _ = run_cli(capsys, "devices")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "device kinds this machine can open: CPU, SIM"
    assert lines[1] == (
        "         (CUDA only through the fake driver, which runs without a GPU: "
        'open_runtime(..., cuda_driver="fake") or ACTORGRAPH_CUDA_DRIVER=fake)'
    )
    assert f"CUDA     none: {no_driver}" in out
    code, out, _ = run_cli(capsys, "devices", "--json")
    data = json.loads(out)
    assert (data["kinds"], data["fake_driver_only"]) == (["CPU", "SIM"], ["CUDA"])
    gpu = GPUInfo(0, "NVIDIA H200", 141 << 30, (9, 0))
    monkeypatch.setattr(_inventory, "probe_cuda", lambda: ((gpu,), "driver 13.0"))
    code, out, _ = run_cli(capsys, "devices", "--json")
    data = json.loads(out)
    assert (data["kinds"], data["fake_driver_only"]) == (["CPU", "SIM", "CUDA"], [])


def test_devices_text_names_gpus_and_sim_presets() -> None:
    inv = Inventory(
        kinds=("CPU", "SIM", "CUDA"),
        cpu_cores=16,
        gpus=(GPUInfo(0, "NVIDIA H200", 141 << 30, (9, 0)),),
        gpu_note="driver 13.0",
        sim_presets=("a100x8", "nvlink8"),
        sim_default="nvlink8",
        nvrtc_note="13.0, builds sm_75 to sm_121",
        sim_machines=(("a100x8", "8 A100"), ("nvlink8", "8 H100")),
    )
    text = render(inv)
    assert "CUDA:0   NVIDIA H200, 141 GiB, compute capability 9.0" in text
    assert "NVRTC    13.0, builds sm_75 to sm_121" in text
    assert "cost-model presets (sim_preset=...): a100x8, nvlink8 (default)" in text
    assert "           a100x8   8 A100\n           nvlink8  8 H100" in text
    assert json.loads(json.dumps(inv.as_json()))["cuda_gpus"][0]["name"] == "CUDA:0"


def test_builtin_bench_prints_and_writes_json(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    out_file = tmp_path / "bench.json"
    code, out, _ = run_cli(
        capsys, "bench", "--builtin", "--items", "8", "--replays", "3", "--out", str(out_file)
    )
    assert code == 0 and "graph replay:" in out and "@ag.jit call:" in out
    assert f"figures written as JSON to {out_file}" in out
    data = json.loads(out_file.read_text())
    assert data["items"] == 8 and data["graph_us_per_item"] > 0


def test_builtin_bench_without_out_says_nothing_is_written(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(capsys, "bench", "--builtin", "--items", "4", "--replays", "2")
    assert code == 0
    assert "figures not written to a file: add --out PATH to write them as JSON" in out
    assert list(tmp_path.iterdir()) == []
    code, out, _ = run_cli(capsys, "bench", "--help")
    assert "the built-in benchmark writes a file only with --out" in " ".join(out.split())


def test_bench_runs_the_checkouts_core_benchmarks_when_present(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "core.py"
    fake.write_text("def main(argv):\n    print('core ran with', argv)\n    return 0\n")
    monkeypatch.setattr(_bench, "core_script", lambda: fake)
    code, out, _ = run_cli(capsys, "bench", "--out", "x.json")
    assert code == 0 and "core ran with ['--out', 'x.json']" in out


def test_parser_keeps_one_subparser_per_command() -> None:
    # Each command is one subparser of this parser; new ones slot in the same way.
    parser = build_parser()
    choices = next(a for a in parser._actions if a.dest == "command").choices
    assert {"demo", "bench", "worker", "devices"} <= set(choices)


def test_demo_with_an_unknown_device_is_a_clear_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from actorgraph._cli import main

    assert main(["demo", "--devices", "GPU:0"]) == 2
    err = capsys.readouterr().err
    assert "actorgraph demo: unknown device name 'GPU:0': expected one of CPU:N" in err
    assert "Traceback" not in err


# -- the demo on every device kind ------------------------------------------------------------


@pytest.mark.parametrize(
    "devices",
    ["CPU:0,CPU:1", "SIM:0,SIM:1", "CUDA:0,CUDA:1", "CPU:0,CUDA:0", "CUDA:0,CPU:0,SIM:0"],
)
def test_demo_runs_on_every_local_device_kind(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, devices: str
) -> None:
    monkeypatch.setenv("ACTORGRAPH_CUDA_DRIVER", "fake")  # CUDA without a GPU
    code, out, err = run_cli(capsys, "demo", "--devices", devices, "--replays", "2")
    assert (code, err) == (0, "")
    assert f"on {devices.replace(',', ', ')}:" in out
    assert "2 replays checked against eager: OK" in out


class Worker:
    """`actorgraph worker` in a subprocess on loopback, started in `folder`."""

    def __init__(self, folder: pathlib.Path, *args: str) -> None:
        env = dict(os.environ, PYTHONPATH=child_pythonpath())
        # -P: no folder of its own on sys.path, as the `actorgraph` console script runs.
        cmd = [sys.executable, "-P", "-m", "actorgraph", "worker", "--port", "0", *args]
        self.proc = subprocess.Popen(
            cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def address(self) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        match = re.search(r"listening on (\S+):(\d+)", line)
        assert match is not None, (line, self.stop())
        return f"{match.group(1)}:{match.group(2)}"

    def stop(self) -> str:
        self.proc.kill()
        _, err = self.proc.communicate(timeout=30)
        return err


def test_demo_runs_on_remote_devices_of_any_worker(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    worker = Worker(tmp_path, "--devices", "CPU:0,CPU:1")  # no --kernels: it knows the demo's
    try:
        where = worker.address()
        devices = f"CPU:0,CPU:0@{where},CPU:1@{where}"
        code, out, err = run_cli(capsys, "demo", "--devices", devices, "--replays", "2")
        assert (code, err) == (0, "")
        assert "2 replays checked against eager: OK" in out
    finally:
        worker.stop()


# -- workers with a token --------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_worker() -> Iterator[ag_testing.Worker]:
    """A worker on loopback that requires its token (in `token_worker.token_file`)."""
    with ag_testing.start_worker(["CPU:0", "CPU:1"]) as worker:
        yield worker


def test_demo_reaches_a_worker_with_a_token(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    token_worker: ag_testing.Worker,
) -> None:
    monkeypatch.delenv("ACTORGRAPH_TOKEN_FILE", raising=False)
    devices = ",".join(["CPU:0", *token_worker.devices])
    demo = ("demo", "--devices", devices, "--replays", "2")
    # Without the token, the refusal says how to give one from the command line.
    code, _, err = run_cli(capsys, *demo)
    assert code == 2
    assert (
        "requires a token; pass open_runtime(..., remote_token_file=PATH) naming its "
        "--token-file, or set ACTORGRAPH_TOKEN_FILE=PATH (the actorgraph command: "
        "--token-file PATH)"
    ) in err
    code, out, err = run_cli(capsys, *demo, "--token-file", str(token_worker.token_file))
    assert (code, err) == (0, "") and "2 replays checked against eager: OK" in out
    # From the environment, as for any program that opens a runtime.
    monkeypatch.setenv("ACTORGRAPH_TOKEN_FILE", str(token_worker.token_file))
    code, out, err = run_cli(capsys, *demo)
    assert (code, err) == (0, "") and "2 replays checked against eager: OK" in out


def test_builtin_bench_reaches_a_worker_with_a_token(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    token_worker: ag_testing.Worker,
) -> None:
    monkeypatch.delenv("ACTORGRAPH_TOKEN_FILE", raising=False)
    device = token_worker.devices[0]
    bench = ("bench", "--builtin", "--device", device, "--items", "4", "--replays", "2")
    code, out, err = run_cli(capsys, *bench, "--token-file", str(token_worker.token_file))
    assert (code, err) == (0, "")
    assert f"built-in replay benchmark: 4 tiny xor kernels on {device}" in out
    monkeypatch.setenv("ACTORGRAPH_TOKEN_FILE", str(token_worker.token_file))
    code, out, err = run_cli(capsys, *bench)
    assert (code, err) == (0, "") and "graph replay:" in out
    # The core benchmarks run on this machine only: the options say where they apply.
    monkeypatch.setattr(_bench, "core_script", lambda: pathlib.Path("core.py"))
    code, _, err = run_cli(capsys, "bench", "--token-file", "t")
    assert code == 2
    assert "--items, --replays, --device, --token-file and --tls-ca apply to the built-in" in err


async def test_open_runtime_takes_the_token_file_the_environment_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, token_worker: ag_testing.Worker
) -> None:
    names = list(token_worker.devices)
    monkeypatch.setenv("ACTORGRAPH_TOKEN_FILE", str(token_worker.token_file))
    with trio.fail_after(30):
        async with ag.open_runtime(names) as rt:
            buf = rt.alloc(names[0], 4, np.int32)
            await rt.copyin(buf, np.arange(4, dtype=np.int32))
            assert (await rt.copyout(buf)).tolist() == [0, 1, 2, 3]
        # A token option of the program's own comes first.
        wrong = tmp_path / "wrong"
        wrong.write_text("not the token")
        with pytest.raises(ag.DeviceError, match="refused this client's token"):
            async with ag.open_runtime(names, remote_token_file=str(wrong)):
                pass  # pragma: no cover
        # A file that is not there is named, with the variable that named it.
        missing = tmp_path / "missing"
        monkeypatch.setenv("ACTORGRAPH_TOKEN_FILE", str(missing))
        with pytest.raises(
            ag.UsageError,
            match=re.escape(
                f"ACTORGRAPH_TOKEN_FILE={str(missing)!r} is not a file; name the file holding "
                f"the token the workers were started with (their --token-file)"
            ),
        ):
            async with ag.open_runtime(names):
                pass  # pragma: no cover
        async with ag.open_runtime(["CPU:0"]):  # a local runtime never reads it
            pass


def test_the_demos_profile_shows_the_work_on_a_worker(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    worker = Worker(tmp_path, "--devices", "CPU:0,CPU:1")
    try:
        where = worker.address()
        devices = f"CPU:0,CPU:0@{where},CPU:1@{where}"
        trace, plot = tmp_path / "trace.json", tmp_path / "timeline.png"
        code, out, err = run_cli(
            capsys,
            "demo",
            "--devices",
            devices,
            "--replays",
            "3",
            "--trace",
            str(trace),
            "--plot",
            str(plot),
        )
        assert (code, err) == (0, "")
    finally:
        worker.stop()
    summary = out[out.index("3 replays, ") :].splitlines()
    rows = {line.split()[0]: line.split() for line in summary[1:] if "items" in line}
    for device in (f"CPU:0@{where}", f"CPU:1@{where}"):
        row = rows[f"{device}/compute"]
        assert int(row[1]) > 0 and int(row[1]) % 3 == 0, row  # its kernels, in 3 replays
        assert "clock" in row and row[row.index("clock") + 1].startswith("+-"), row
    assert "'clock +-' is how far off they can be" in out
    slices = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert any("@" in e["name"] or "clock_error_us" in e["args"] for e in slices)
    assert plot.stat().st_size > 0


def test_the_demos_picture_labels_each_of_its_replays(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    importorskip("matplotlib")
    from matplotlib.figure import Figure

    saved: list[Figure] = []
    real_savefig = Figure.savefig

    def keep(self: Figure, *args: object, **kwargs: object) -> None:
        saved.append(self)
        real_savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    plot = tmp_path / "timeline.png"
    code, out, _ = run_cli(capsys, "demo", "--replays", "2", "--plot", str(plot))
    assert code == 0
    (ax,) = saved[0].axes
    labels = [t.get_text() for t in ax.texts if t.get_text().startswith("replay ")]
    # The picture's two replays, submitted back to back after the two checked ones.
    assert labels == ["replay 3", "replay 4"]
    assert "timeline of replays 3 and 4 written to" in out


# -- the worker's kernel modules --------------------------------------------------------------


def test_worker_imports_kernel_modules_from_its_folder(tmp_path: pathlib.Path) -> None:
    (tmp_path / "mykernels.py").write_text(
        "import numpy as np\nimport actorgraph as ag\n"
        "KERNELS = [ag.Kernel('mine', cpu=lambda o, a: np.copyto(o, a), outs=(0,), ins=(1,))]\n"
    )
    worker = Worker(tmp_path, "--kernels", "mykernels")
    try:
        assert re.fullmatch(r"127\.0\.0\.1:\d+", worker.address())
    finally:
        worker.stop()


def test_worker_help_says_where_kernel_modules_are_found(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run_cli(capsys, "worker", "--help")
    assert "found on the Python path or in the current folder" in " ".join(out.split())


@pytest.mark.parametrize(
    ("source", "module", "message"),
    [
        (
            None,
            "nosuch",
            "actorgraph worker: kernel module 'nosuch' not found: no nosuch.py (or package nosuch) in the current folder ({folder}) or on the Python path; start the worker in the module's folder, or install it",
        ),
        (
            "x = 1 / 0\n",
            "broken",
            "actorgraph worker: kernel module 'broken' failed to import: ZeroDivisionError: division by zero ({folder}/broken.py:1)",
        ),
        (
            "import nosuchdependency\n",
            "needy",
            "actorgraph worker: kernel module 'needy' failed to import: ModuleNotFoundError: No module named 'nosuchdependency' ({folder}/needy.py:1)",
        ),
        (
            "def f(:\n",
            "typo",
            "actorgraph worker: kernel module 'typo' failed to import: SyntaxError: invalid syntax ({folder}/typo.py:1)",
        ),
        (
            "X = 1\n",
            "bare",
            "actorgraph worker: kernel module 'bare' has no KERNELS; define KERNELS = [ag.Kernel(...), ...]",
        ),
    ],
)
def test_a_kernel_module_that_cannot_load_is_one_clear_line(
    tmp_path: pathlib.Path, source: str | None, module: str, message: str
) -> None:
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    worker = Worker(tmp_path, "--kernels", module)
    _, err = worker.proc.communicate(timeout=60)
    assert worker.proc.returncode == 2
    assert err.strip() == message.format(folder=tmp_path)  # one line, no traceback


def test_a_worker_that_cannot_load_programs_will_not_start_with_allow_programs(
    tmp_path: pathlib.Path,
) -> None:
    # A tinygrad that cannot be imported, ahead of the installed one (if any).
    (tmp_path / "shadow" / "tinygrad").mkdir(parents=True)
    (tmp_path / "shadow" / "tinygrad" / "__init__.py").write_text(
        "raise ImportError('no tinygrad here')\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'shadow'}{os.pathsep}{child_pythonpath()}")
    cmd = [sys.executable, "-P", "-m", "actorgraph", "worker", "--port", "0", "--allow-programs"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    if not sys.platform.startswith("linux"):
        assert "runs shipped CPU programs on Linux workers only" in done.stderr
        return
    assert done.stderr.strip() == (
        "actorgraph worker: --allow-programs loads shipped CPU programs with tinygrad 0.14's "
        "ELF loader, which this worker's Python cannot import (no tinygrad here); on the "
        f"worker, install the tinygrad extra: {install_hint('tinygrad')}"
    )


def test_a_worker_says_when_it_runs_shipped_programs(tmp_path: pathlib.Path) -> None:
    from actorgraph.worker._machine_code import loader_problem

    if loader_problem() is not None:
        pytest.skip(f'{loader_problem()} (pip install -e ".[test,tinygrad]")')
    for flags, says in (("--allow-programs", True), ("--max-programs", False)):
        worker = Worker(tmp_path, *flags.split(), *(["3"] if not says else []))
        try:
            assert worker.proc.stdout is not None
            line = worker.proc.stdout.readline()
        finally:
            worker.stop()
        assert "listening on 127.0.0.1:" in line, line
        assert ("runs shipped programs" in line) == says, line
