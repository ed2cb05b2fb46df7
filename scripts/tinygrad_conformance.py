"""tinygrad's own jit tests, run with actorgraph installed, against the same tests alone.

Takes tinygrad's tests from a checkout of its repository (`git clone
https://github.com/tinygrad/tinygrad`) at the commit matching the installed release, runs
the chosen test files twice in fresh processes on tinygrad's CPU devices (DEV=CPU):
alone, then with `actorgraph.tinygrad.install()` made by a pytest plugin
(scripts/_tinygrad_conformance_plugin.py) before any test runs, and prints passed / failed
/ skipped per file both ways, how many tests really replayed through actorgraph, and
every test that fails only with actorgraph installed. The tests run against the
installed tinygrad (the checkout's own tinygrad/ folder is left out), and nothing of
them is kept in this repository.

    python scripts/tinygrad_conformance.py --repo ~/src/tinygrad                 # 0.14.0
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


def run(tree: Path, files: list[str], installed: bool, timeout: float) -> dict[str, Any]:
    report = tree / f"report-{'installed' if installed else 'alone'}.json"
    env = dict(os.environ)
    env.update(
        DEV="CPU",
        PYTHONPATH=os.pathsep.join([str(tree), str(HERE), str(ROOT)]),
        AG_CONFORMANCE_REPORT=str(report),
        AG_CONFORMANCE_INSTALL="1" if installed else "0",
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


def table(alone: dict[str, Any], ours: dict[str, Any], files: list[str]) -> dict[str, Any]:
    rows = {}
    for name in files:
        counts = {}
        for label, report in (("alone", alone), ("installed", ours)):
            outcomes = Counter(
                o for node, o in report["outcomes"].items() if node.split("::")[0] == name
            )
            counts[label] = {k: outcomes.get(k, 0) for k in ("passed", "failed", "skipped")}
        replayed = sum(
            1 for node, n in ours["replays"].items() if node.split("::")[0] == name and n > 0
        )
        rows[name] = {**counts, "replayed": replayed}
    worse = sorted(
        node
        for node, outcome in ours["outcomes"].items()
        if outcome == "failed" and alone["outcomes"].get(node) == "passed"
    )
    both = sorted(
        node
        for node, outcome in ours["outcomes"].items()
        if outcome == "failed" and alone["outcomes"].get(node) == "failed"
    )
    return {"files": rows, "fail_only_installed": worse, "fail_both": both}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", required=True, type=Path, help="a git checkout of tinygrad")
    parser.add_argument("--ref", default="HEAD", help="the commit or tag to take tests from")
    parser.add_argument("--files", nargs="*", help="test files (default: the release's jit tests)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per pytest run")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    version = importlib.metadata.version("tinygrad")
    files = args.files or FILES.get(version)
    if not files:
        sys.exit(f"no default test files for tinygrad {version}; give --files")
    with tempfile.TemporaryDirectory(prefix="tinygrad-tests-") as folder:
        tree = Path(folder)
        extract(args.repo, args.ref, tree)
        alone = run(tree, files, installed=False, timeout=args.timeout)
        ours = run(tree, files, installed=True, timeout=args.timeout)
    result = table(alone, ours, files)
    print(f"tinygrad {version}, tests from {args.ref}, DEV=CPU")
    print(f"{'file':34} {'alone p/f/s':>14} {'installed p/f/s':>16} {'replayed':>9}")
    for name, row in result["files"].items():
        a, o = row["alone"], row["installed"]
        print(
            f"{name:34} {a['passed']:>4}/{a['failed']}/{a['skipped']:<5}    "
            f"{o['passed']:>4}/{o['failed']}/{o['skipped']:<5}   {row['replayed']:>6}"
        )
    worse = result["fail_only_installed"]
    print(f"failing only with actorgraph installed: {worse or 'none'}")
    print(f"failing alone and installed: {result['fail_both'] or 'none'}")
    if args.out:
        args.out.write_text(json.dumps({"tinygrad": version, "ref": args.ref, **result}, indent=2))
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
