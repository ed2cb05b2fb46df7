"""The project's own words checked as text: what they tell a newcomer to run must run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _paths import ROOT, TESTS, child_pythonpath

GUARD = 300  # seconds: a hang guard for a child pytest run

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


# -- skip reasons: a test skipped for want of an extra says the command that runs it --------

_HIDE = """\
import sys

# As if these extras were not installed: importing them raises ImportError.
for name in ("tinygrad", "ray"):
    sys.modules[name] = None
"""


def test_tests_skipped_for_want_of_an_extra_name_the_command_that_runs_them(
    tmp_path: Path,
) -> None:
    # The README's test command installs the test extra only: the tests of the tinygrad
    # and ray extras skip there, and each skip must say how to run them.
    (tmp_path / "hide_extras.py").write_text(_HIDE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), child_pythonpath()]))
    files = ["test_tinygrad.py", "test_tinygrad_private.py", "test_ray.py", "test_notebooks.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "hide_extras", "-p", "no:cacheprovider", "-q"]
        + ["-rs", "-k", "tinygrad or ray", *(str(TESTS / f) for f in files)]
        + [str(TESTS / "test_readme.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    # The two tinygrad modules, the Ray module, the Ray notebook and script, and the
    # README's tinygrad and Ray blocks.
    assert sum(int(re.search(r"\[(\d+)\]", line)[1]) for line in skips) >= 7, done.stdout
    for extra in ("tinygrad", "ray"):
        mine = [line for line in skips if extra in line.lower()]
        assert mine, (extra, skips)
        for line in mine:
            assert f'pip install -e ".[test,{extra}]"' in line, line


# -- what the documented shell steps write stays out of git's way ---------------------------

_SHELL_BLOCK = re.compile(r"^[ \t]*```(?:bash|sh|shell)[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)
# A file a shell line writes: a redirection, or openssl's -out / -keyout.
_WRITES = re.compile(r"(?:(?<![0-9&])>|\s-(?:key)?out)\s*([\w./~-]+)")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def written_by_shell_steps(text: str) -> set[str]:
    """The relative paths the text's shell blocks write (secrets, certificates, ...)."""
    return {
        name
        for block in _SHELL_BLOCK.findall(text)
        for line in block.splitlines()
        if not line.lstrip().startswith("#")
        for name in _WRITES.findall(line.split(" #")[0])
        if not name.startswith(("/", "~", "$", "-"))
    }


def test_the_parser_finds_what_shell_steps_write() -> None:
    text = (
        '```bash\necho "secret" > token\nopenssl req -x509 -keyout worker.key -out worker.pem'
        " -days 1\nls 2>&1 >/dev/null\ncat x > /tmp/y  # outside\n```\n"
    )
    assert written_by_shell_steps(text) == {"token", "worker.key", "worker.pem"}


def test_files_the_documented_shell_steps_write_are_git_ignored() -> None:
    # A newcomer runs the steps in the checkout: the token and certificates they write
    # must not show up as untracked files (nor be committed by accident).
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to ignore files for")
    names = sorted({n for doc in documents() for n in written_by_shell_steps(doc.read_text())})
    assert "token" in names
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", "-v", "-n", *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    unignored = [line.split("\t")[-1] for line in done.stdout.splitlines() if line.startswith("::")]
    assert not unignored, f"add these to .gitignore (the docs' shell steps write them): {unignored}"


# -- plain words: no shorthand a newcomer must decode ----------------------------------------

# A release-keyed aside such as "from call 3 on (0.14: 2)": say what each release does.
_RELEASE_SHORTHAND = re.compile(r"\((?:on\s+|tinygrad\s+)?\d+\.\d+(?:\.\d+)?\s*:\s*[^)]*\)")


def test_no_document_keys_an_aside_by_release_in_shorthand() -> None:
    found = [
        f"{doc.relative_to(ROOT)}: {match.group()}"
        for doc in documents()
        for match in _RELEASE_SHORTHAND.finditer(doc.read_text())
    ]
    assert not found, f"write these out (what each release does, in words): {found}"
