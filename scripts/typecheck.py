"""mypy --strict over actorgraph and its subpackages (devices and scheduler among them).

The folders devices/ and scheduler/ install as subpackages of actorgraph (setuptools
package-dir), which mypy cannot follow. So this lays the installed shape out as links
under build/typecheck/ (actorgraph/'s files, with those two folders inside it),
runs mypy on the package there, and prints paths as they are in the repository.

    python scripts/typecheck.py            # extra arguments go to mypy
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
# Subpackages of the installed package that live at the top of the repository.
MAPPED = {name: ROOT / name for name in ("devices", "scheduler")}


def lay_out() -> Path:
    package = TREE / "actorgraph"
    if package.exists():
        shutil.rmtree(package)  # the links only: mypy's cache beside it stays warm
    package.mkdir(parents=True)
    for entry in (ROOT / "actorgraph").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in MAPPED.items():
        (package / name).symlink_to(folder, target_is_directory=True)
    return package


def main(argv: list[str]) -> int:
    lay_out()
    env = dict(os.environ, MYPYPATH=str(TREE))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "-p",
            "actorgraph",
            *argv,
        ],
        cwd=TREE,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    # Links back to the repository's own paths: build/typecheck/actorgraph/devices/x.py
    # was devices/x.py all along.
    prefixes = [(f"actorgraph/{name}/", f"{name}/") for name in MAPPED]
    for line in (done.stdout + done.stderr).splitlines():
        for linked, real in prefixes:
            if line.startswith(linked):
                line = real + line[len(linked) :]
        print(line)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
