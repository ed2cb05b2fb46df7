"""The project's own words checked as text: what they tell a newcomer to run must run."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from _paths import ROOT

# Where the project's texts live: its packages, tests, examples, benchmarks, scripts, CI
# and documents (never a virtual environment or a build).
_TEXT_DIRS = ("actorgraph", "devices", "scheduler", "tests", "examples", "benchmarks", "scripts")
_TEXT_FILES = ("README.md", "pyproject.toml", "_actorgraph_pytest.py", ".ci/run")
_SUFFIXES = {".py", ".md", ".toml", ".ipynb", ".sh", ".txt", ".c"}


def project_texts() -> Iterator[Path]:
    for name in _TEXT_FILES:
        yield ROOT / name
    for folder in (*_TEXT_DIRS, "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if path.suffix in _SUFFIXES and not parts & {"_build", "__pycache__", "results"}:
                yield path


# actorgraph is on no package index: a pip install of it by name (with an extra or not) fails.
_INDEX_INSTALL = re.compile(r"""pip install\s+(?:-U\s+)?["']?actorgraph\b(?![-_.\w])""")


def test_no_text_installs_actorgraph_from_a_package_index() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}: {match.group()}"
        for path in project_texts()
        for text in [path.read_text(errors="replace")]
        for match in _INDEX_INSTALL.finditer(text)
    ]
    assert not found, (
        "these lines install actorgraph from a package index, which has no actorgraph; say "
        'pip install -e ".[EXTRA]" in a checkout (devices.install_hint words it):\n'
        + "\n".join(found)
    )
