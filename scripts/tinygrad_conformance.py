"""tinygrad's own jit tests, run with actorgraph installed, against the same tests alone.

Takes tinygrad's tests from a checkout of its repository (`git clone
https://github.com/tinygrad/tinygrad`, or a bare copy of it) at the commit matching the
installed release, runs the chosen test files twice in fresh processes on tinygrad's CPU
devices (DEV=CPU): alone, then with `actorgraph.tinygrad.install()` made by a pytest
plugin (scripts/_tinygrad_conformance_plugin.py) before any test runs, and prints passed
/ failed / skipped per file both ways, how many tests really replayed through
actorgraph, and every test that fails only with actorgraph installed. With `--ag`
(tinygrad 0.14) a third run puts them on an `AG` device (DEV=AG): one loopback worker
started here with --allow-programs, installed from the environment (ACTORGRAPH_REMOTE,
ACTORGRAPH_TOKEN_FILE), and names every test that fails there but passes alone. The
tests run against the installed tinygrad (the checkout's own tinygrad/ folder is left
out), and nothing of them is kept in this repository.

    python scripts/tinygrad_conformance.py --repo ~/src/tinygrad [--ag]          # 0.14.0
    python scripts/tinygrad_conformance.py --repo ~/src/tinygrad --ref v0.11.0   # 0.11.0

The test files default to the release's jit tests (see FILES); --out writes the JSON.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FILES = {
    "0.11.0": [
        "test/test_jit.py",
        "test/test_graph.py",
        "test/test_symbolic_jit.py",
        "test/test_multitensor.py",
    ],
    "0.14.0": [
        "test/backend/test_jit.py",
        "test/backend/test_graph.py",
        "test/backend/test_symbolic_jit.py",
        "test/unit/test_jit.py",
        "test/unit/test_jit_cases.py",
        "test/unit/test_jit_footguns.py",
    ],
}
# What the tests import besides tinygrad itself.
FOLDERS = ["test", "extra", "examples"]


def extract(repo: Path, ref: str, into: Path) -> None:
    """tinygrad's tests (and what they import) at `ref`, without its tinygrad/ package."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "--name-only", ref],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    wanted = [p for p in [*FOLDERS, "conftest.py", "pyproject.toml", "setup.py"] if p in listed]
    archive = into / "tests.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(repo), "archive", ref, *wanted], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()


def run(
    tree: Path,
    files: list[str],
    installed: bool,
    timeout: float,
    remote: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One pytest run of `files`: alone, installed on CPU devices, or (`remote`: the
    environment naming a worker device) installed with the tests on that AG device."""
    label = "ag" if remote else "installed" if installed else "alone"
    report = tree / f"report-{label}.json"
    env = dict(os.environ)
    env.update(
        DEV="AG" if remote else "CPU",
        PYTHONPATH=os.pathsep.join([str(tree), str(HERE), str(ROOT)]),
        AG_CONFORMANCE_REPORT=str(report),
        AG_CONFORMANCE_INSTALL="1" if installed or remote else "0",
        **(remote or {}),
    )
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "_tinygrad_conformance_plugin",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        *files,
    ]
    done = subprocess.run(
        command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if not report.exists():
        sys.exit(
            f"pytest wrote no report ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return dict(json.loads(report.read_text()))


def _replayed(report: dict[str, Any], name: str) -> int:
    return sum(1 for node, n in report["replays"].items() if node.split("::")[0] == name and n > 0)


def _worse(alone: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """The tests that fail in `ours` and pass alone."""
    return sorted(
        node
        for node, outcome in ours["outcomes"].items()
        if outcome == "failed" and alone["outcomes"].get(node) == "passed"
    )


def table(
    alone: dict[str, Any],
    ours: dict[str, Any],
    files: list[str],
    on_ag: dict[str, Any] | None = None,
) -> dict[str, Any]:
    rows = {}
    runs = [("alone", alone), ("installed", ours)] + ([("ag", on_ag)] if on_ag else [])
    for name in files:
        counts = {}
        for label, report in runs:
            outcomes = Counter(
                o for node, o in report["outcomes"].items() if node.split("::")[0] == name
            )
            counts[label] = {k: outcomes.get(k, 0) for k in ("passed", "failed", "skipped")}
        rows[name] = {**counts, "replayed": _replayed(ours, name)}
        if on_ag:
            rows[name]["replayed_ag"] = _replayed(on_ag, name)
    both = sorted(
        node
        for node, outcome in ours["outcomes"].items()
        if outcome == "failed" and alone["outcomes"].get(node) == "failed"
    )
    out = {"files": rows, "fail_only_installed": _worse(alone, ours), "fail_both": both}
    if on_ag:
        out["fail_only_on_ag"] = _worse(alone, on_ag)
        # Every failure on AG, with how the test went alone and installed on CPU devices.
        out["fail_on_ag"] = {
            node: {"alone": alone["outcomes"].get(node), "installed": ours["outcomes"].get(node)}
            for node, outcome in sorted(on_ag["outcomes"].items())
            if outcome == "failed"
        }
    return out


class LoopbackWorker:
    """`actorgraph worker --allow-programs` on a free loopback port, serving CPU:0, with
    a token of its own: the AG device of the `--ag` run."""

    def __init__(self, folder: Path) -> None:
        self.token = folder / "worker-token"
        self.token.write_text(os.urandom(16).hex())
        command = [sys.executable, "-m", "actorgraph", "worker", "--port", "0"]
        command += ["--devices", "CPU:0", "--token-file", str(self.token), "--allow-programs"]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        banner = self.process.stdout.readline()
        if "listening on " not in banner:
            self.process.kill()
            sys.exit(f"the worker did not start: {banner!r}")
        self.device = "CPU:0@" + banner.split("listening on ", 1)[1].split()[0]

    def environment(self) -> dict[str, str]:
        return {"ACTORGRAPH_REMOTE": self.device, "ACTORGRAPH_TOKEN_FILE": str(self.token)}

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", required=True, type=Path, help="a git checkout of tinygrad")
    parser.add_argument("--ref", default="HEAD", help="the commit or tag to take tests from")
    parser.add_argument("--files", nargs="*", help="test files (default: the release's jit tests)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per pytest run")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument(
        "--ag", action="store_true", help="also run them on an AG device (a loopback worker)"
    )
    args = parser.parse_args(argv)
    version = importlib.metadata.version("tinygrad")
    files = args.files or FILES.get(version)
    if not files:
        sys.exit(f"no default test files for tinygrad {version}; give --files")
    if args.ag and version == "0.11.0":
        sys.exit("--ag needs tinygrad 0.14.0 (0.11 keeps its own REMOTE device)")
    with tempfile.TemporaryDirectory(prefix="tinygrad-tests-") as folder:
        tree = Path(folder)
        extract(args.repo, args.ref, tree)
        alone = run(tree, files, installed=False, timeout=args.timeout)
        ours = run(tree, files, installed=True, timeout=args.timeout)
        on_ag = None
        if args.ag:
            worker = LoopbackWorker(tree)
            try:
                on_ag = run(tree, files, True, args.timeout, worker.environment())
            finally:
                worker.stop()
    result = table(alone, ours, files, on_ag)
    report(result, version, args.ref)
    if args.out:
        args.out.write_text(json.dumps({"tinygrad": version, "ref": args.ref, **result}, indent=2))
    return 1 if result["fail_only_installed"] or result.get("fail_only_on_ag") else 0


def report(result: dict[str, Any], version: str, ref: str) -> None:
    ag = "fail_only_on_ag" in result
    print(f"tinygrad {version}, tests from {ref}, DEV=CPU" + (" and DEV=AG" if ag else ""))
    head = f"{'file':34} {'alone p/f/s':>14} {'installed p/f/s':>16} {'replayed':>9}"
    print(head + (f" {'on AG p/f/s':>14} {'replayed':>9}" if ag else ""))
    for name, row in result["files"].items():
        a, o = row["alone"], row["installed"]
        line = (
            f"{name:34} {a['passed']:>4}/{a['failed']}/{a['skipped']:<5}    "
            f"{o['passed']:>4}/{o['failed']}/{o['skipped']:<5}   {row['replayed']:>6}"
        )
        if ag:
            g = row["ag"]
            line += f"    {g['passed']:>4}/{g['failed']}/{g['skipped']:<5}  {row['replayed_ag']:>6}"
        print(line)
    print(f"failing only with actorgraph installed: {result['fail_only_installed'] or 'none'}")
    if ag:
        print(f"failing on AG but passing alone: {result['fail_only_on_ag'] or 'none'}")
        for node, how in result["fail_on_ag"].items():
            print(f"  failing on AG: {node} (alone: {how['alone']}, installed: {how['installed']})")
    print(f"failing alone and installed: {result['fail_both'] or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
