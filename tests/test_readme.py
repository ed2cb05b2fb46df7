"""Every Python block of README.md runs here, so the README cannot drift from the code.

Each ```python block is one test, named by its section and line. It runs as a program of
its own: a fresh namespace, `__name__ == "__main__"`, in a fresh temporary folder (files
it writes land there). A block that cannot run fails its test; the only skip is a
block marked `requires` (below) on a machine without what it names, and it says so.
The pages of the documentation site run the same way (tests/test_docs.py), through
`parse_blocks` and `run_block` here.

A block may need something set up that the README shows elsewhere (a worker the user
starts from the shell, the fake CUDA driver). An HTML comment right above the block says
so; GitHub does not show it. The forms:

    <!-- readme-test: notebook -->
        The block is notebook cells: a line whose comment says `# cell N` starts a new
        cell. Each cell runs on its own asyncio loop (`asyncio.run`), sharing the names of
        the cells before it, so nothing lives across cells but what a notebook keeps;
        top-level `await` works as in Jupyter (compiled with PyCF_ALLOW_TOP_LEVEL_AWAIT,
        as IPython does).
    <!-- readme-test: env NAME=VALUE -->
        Run the block with this environment variable set.
    <!-- readme-test: worker DEVICES PORT -->
        Run the README's `actorgraph worker` shell block as written, in the block's
        folder (with the checkout's `examples` folder in it, which the block's kernels
        module comes from), but for its port: the worker takes a free one, and PORT
        where the python block names it becomes that port. The shell block must start a
        worker for DEVICES on PORT.
    <!-- readme-test: requires NAME ... -->
        The block needs these optional modules or programs (tinygrad, clang), a module
        maybe at one release (tinygrad==0.14.0); without one of them the block's test is
        skipped, saying which is missing.
    <!-- readme-test: pytest -->
        The block is a user's test module: it is written to a fresh folder and run with
        pytest in a new process (plugins found as installed), which must pass.
    <!-- readme-test: stdout -->
        What the block prints is the ```text block right after it, exactly: output shown
        in a document is what the code prints.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import inspect
import io
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import _extras
import attrs
import pytest
from _paths import ROOT, child_pythonpath

README = ROOT / "README.md"
# The page that starts a worker from the shell and shows its kernels module.
REMOTE_PAGE = ROOT / "docs" / "howto" / "remote.md"
GUARD = 120  # seconds: a hang guard for a block run in a child process

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^\s`]*)(?:[ \t].*)?$")  # MyST: ```{toctree}
_DIRECTIVE = re.compile(r"^\s*<!--\s*readme-test:\s*(?P<body>.*?)\s*-->\s*$")
_KINDS = {"notebook", "env", "worker", "pytest", "requires", "stdout"}


@attrs.frozen
class Block:
    """One ```python block of README.md and how the tests run it."""

    line: int  # of the opening fence, 1-based
    section: str
    source: str
    directives: tuple[tuple[str, tuple[str, ...]], ...]
    stdout: str | None = None  # what it prints, where a `stdout` directive says so

    @property
    def name(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.section.lower()).strip("-") or "top"
        return f"{slug}-line{self.line}"

    def options(self, kind: str) -> list[tuple[str, ...]]:
        return [args for k, args in self.directives if k == kind]


def parse_blocks(text: str, page: str = "README.md") -> list[Block]:
    """The ```python blocks of a markdown text (`page` names it in errors), with the
    directives above them.

    Raises ValueError on an unclosed fence or a directive that is not understood, so a
    typo cannot make a block run without the set-up it asked for.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    section = ""
    pending: list[tuple[str, tuple[str, ...]]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _DIRECTIVE.match(line)
        fence = _FENCE.match(line)
        if directive:
            words = directive.group("body").split()
            if not words or words[0] not in _KINDS:
                raise ValueError(
                    f"{page} line {i + 1}: unknown readme-test directive {line.strip()!r}; "
                    f"the kinds are {sorted(_KINDS)}"
                )
            pending.append((words[0], tuple(words[1:])))
        elif fence:
            indent, lang = fence.group("indent"), fence.group("lang")
            start = i
            body: list[str] = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"{page} line {start + 1}: the ``` fence is never closed")
            if lang in ("python", "py"):
                source = "\n".join(body) + "\n"
                printed = None
                if any(kind == "stdout" for kind, _ in pending):
                    printed = _shown_output(lines, i + 1, f"{page} line {start + 1}")
                blocks.append(Block(start + 1, section, source, tuple(pending), printed))
            elif pending:
                raise ValueError(
                    f"{page} line {start + 1}: a readme-test directive sits above a "
                    f"{lang or 'plain'} block; only python blocks run"
                )
            pending = []
        elif line.startswith("#"):
            section = line.lstrip("#").strip()
        elif line.strip() and pending:
            raise ValueError(
                f"{page} line {i + 1}: a readme-test directive must sit right above its "
                f"```python block"
            )
        i += 1
    return blocks


def _shown_output(lines: list[str], after: int, where: str) -> str:
    """The ```text block that comes next after line `after` (prose may come between,
    no heading and no other block)."""
    i = after
    while i < len(lines) and not lines[i].lstrip().startswith(("```", "#")):
        i += 1
    if i == len(lines) or lines[i].strip() not in ("```text", "```"):
        raise ValueError(f"{where}: a `stdout` block must be followed by a ```text block")
    end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
    if end is None:
        raise ValueError(f"{where}: the ```text block after it is never closed")
    return "".join(line + "\n" for line in lines[i + 1 : end])


BLOCKS = parse_blocks(README.read_text())


# -- the parser itself --


def test_every_python_block_is_collected() -> None:
    # Counted a second, cruder way, so a parser slip cannot hide a block.
    opening = re.findall(r"^[ \t]*```(?:python|py)[ \t]*$", README.read_text(), re.MULTILINE)
    assert len(BLOCKS) == len(opening) > 0


def test_parser_reads_directives_and_indented_blocks() -> None:
    text = (
        "# Top\n\n<!-- readme-test: env A=1 -->\n<!-- readme-test: notebook -->\n"
        "```python\nx = 1\n```\n\n## Next\n\n- item\n\n  ```python\n  y = 2\n  ```\n"
        "```bash\necho\n```\n```{toctree}\n:hidden:\n\npage\n```\n"
    )
    first, second = parse_blocks(text)
    assert first == Block(5, "Top", "x = 1\n", (("env", ("A=1",)), ("notebook", ())))
    assert second.source == "y = 2\n" and second.section == "Next" and second.line == 13


def test_parser_takes_the_output_a_stdout_block_shows() -> None:
    text = "<!-- readme-test: stdout -->\n```python\nprint(1)\n```\nIt prints:\n```text\n1\n```\n"
    (block,) = parse_blocks(text)
    assert block.stdout == "1\n"


def test_notebook_blocks_split_into_cells_at_cell_comments() -> None:
    code = "import x\na = 1  # cell 1\nb = 2\nc = 3  # cell 2\nd = 4  # cell 3, 4, ..."
    cells = notebook_cells(code)
    # What comes before the first `# cell` line belongs to the first cell.
    assert [cell.strip() for cell in cells] == [
        "import x\na = 1  # cell 1\nb = 2",
        "c = 3  # cell 2",
        "d = 4  # cell 3, 4, ...",
    ]
    assert cells[1] == "\n\n\nc = 3  # cell 2"  # on its own line 4, as in the block


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- readme-test: notbook -->\n```python\n```\n", r"unknown readme-test directive"),
        ("<!-- readme-test: notebook -->\n```bash\n```\n", r"only python blocks run"),
        ("<!-- readme-test: notebook -->\ntext\n```python\n```\n", r"right above"),
        ("```python\nx = 1\n", r"never closed"),
        ("<!-- readme-test: stdout -->\n```python\n```\ntext\n", r"followed by a ```text"),
        ("<!-- readme-test: stdout -->\n```python\n```\n## Next\n```text\n```\n", r"```text"),
    ],
)
def test_parser_refuses_what_it_cannot_honour(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_blocks(text)


def test_the_remote_page_shows_the_example_kernels_module_as_it_is() -> None:
    # The worker's shell block names examples/remote_kernels.py; the page shows it whole.
    text = REMOTE_PAGE.read_text()
    shown = (ROOT / "examples" / "remote_kernels.py").read_text()
    assert any(block.source == shown for block in parse_blocks(text, REMOTE_PAGE.name))
    assert "--kernels remote_kernels" in worker_shell_block(text)[-1]


# -- running the blocks --


def worker_shell_block(text: str) -> list[str]:
    """The lines of a page's ```bash block that starts `actorgraph worker`."""
    found = re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    blocks = [b.splitlines() for b in found if re.search(r"^\S*.*actorgraph worker ", b, re.M)]
    assert len(blocks) == 1, f"expected one shell block starting a worker, found {len(blocks)}"
    return blocks[0]


class _Worker:
    """`actorgraph worker` on loopback, started by the page's own shell block (`text`,
    the remote workers page's by default), as written but for the port (0: a free one)
    and the folder it runs in (`folder`)."""

    def __init__(self, devices: str, port: str, folder: Path, text: str | None = None) -> None:
        lines = worker_shell_block(REMOTE_PAGE.read_text() if text is None else text)
        command = lines[-1]
        assert f" --devices {devices} " in command and f" --port {port} " in command, command
        (folder / "examples").symlink_to(ROOT / "examples")
        script = "\n".join([*lines[:-1], command.replace(f" --port {port} ", " --port 0 ")])
        # `actorgraph` as the user's shell finds it: this interpreter's scripts first.
        bindir = os.path.dirname(sys.executable)
        env = dict(os.environ, PATH=os.pathsep.join([bindir, os.environ.get("PATH", "")]))
        # A session of its own: stop() ends the shell and the worker it started.
        self.proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=folder,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], GUARD)
        line = self.proc.stdout.readline() if ready else ""
        match = re.search(r"listening on \S+:(\d+)", line)
        if match is None:
            self.stop()
            raise RuntimeError(f"the worker did not start: {line!r}")
        self.port = int(match.group(1))

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


_CELL = re.compile(r"#\s*cell\b")


def notebook_cells(code: str) -> list[str]:
    """`code` split where a line's comment says `# cell N`; each cell keeps its lines'
    places (blank lines stand in for the others), so tracebacks name README.md's lines."""
    lines = code.split("\n")
    starts = [i for i, line in enumerate(lines) if _CELL.search(line)]
    bounds = [0, *starts[1:], len(lines)]
    return ["\n" * start + "\n".join(lines[start:end]) for start, end in zip(bounds, bounds[1:])]


def _run_notebook(code: str, namespace: dict[str, object], page: str = "README.md") -> None:
    for cell in notebook_cells(code):
        compiled = compile(cell, page, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)

        async def run_cell(compiled: types.CodeType = compiled) -> None:
            result = eval(compiled, namespace)  # a coroutine where the cell awaits at top level
            if inspect.iscoroutine(result):
                await result

        asyncio.run(run_cell())


def _run_pytest(code: str, folder: Path) -> None:
    (folder / "test_readme_example.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_readme_example.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    assert done.returncode == 0, f"the README's test module failed:\n{done.stdout}\n{done.stderr}"
    tests = len(re.findall(r"^(?:async )?def test_", code, re.MULTILINE))
    assert re.search(rf"\b{tests} passed", done.stdout), done.stdout
    assert not re.search(r"skipped|xfail|deselected", done.stdout), done.stdout


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    yield tmp_path


# Names a `requires` directive may give that are programs (looked for on PATH); any other
# name is a Python module.
PROGRAMS = frozenset(["clang"])


def _installed(name: str) -> bool:
    """Whether what a `requires` directive names is here: a program on PATH, a module
    that imports here (a program of that name elsewhere on PATH, say the `ray` command
    of another venv, is no module), or a module==RELEASE installed at that release."""
    if name in PROGRAMS:
        return shutil.which(name) is not None
    module, _, release = name.partition("==")
    if importlib.util.find_spec(module) is None:
        return False
    return not release or importlib.metadata.version(module) == release


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_readme_block(block: Block, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_block(block, README, in_tmp, monkeypatch)


def run_block(block: Block, page: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run one python block of `page` (README.md, a docs page) in `folder`, the current
    folder, as its directives say."""
    code = block.source
    for names in block.options("requires"):
        missing = [n for n in names if not _installed(n)]
        if missing:
            where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
            pytest.skip(
                f"the block at {where} line {block.line} cannot run here: "
                + "; ".join(
                    f"{n} is not installed: apt-get install {n} installs it"
                    if n in PROGRAMS
                    else _extras.missing(n, "the block")
                    for n in missing
                )
            )
    for (assignment,) in block.options("env"):
        name, _, value = assignment.partition("=")
        monkeypatch.setenv(name, value)
    workers = []
    saved_path = list(sys.path)
    try:
        for devices, port in block.options("worker"):
            worker = _Worker(devices, port, folder, page.read_text())
            workers.append(worker)
            assert (folder / "token").read_text().strip()  # as the shell block wrote it
            code = code.replace(f"127.0.0.1:{port}", f"127.0.0.1:{worker.port}")
        namespace: dict[str, object] = {"__name__": "__main__"}
        padded = "\n" * block.line + code  # tracebacks give the page's own line numbers
        printed = io.StringIO()
        capture = block.stdout is not None
        with contextlib.redirect_stdout(printed) if capture else contextlib.nullcontext():
            if block.options("pytest"):
                _run_pytest(code, folder)
            elif block.options("notebook"):
                _run_notebook(padded, namespace, page.name)
            else:
                exec(compile(padded, page.name, "exec"), namespace)
        if block.stdout is not None:
            assert printed.getvalue() == block.stdout, (
                f"{page.name} line {block.line}: the block printed\n{printed.getvalue()}\n"
                f"where the page shows\n{block.stdout}"
            )
    finally:
        for worker in workers:
            worker.stop()
        _forget_imports(saved_path, folder)


def _forget_imports(saved_path: list[str], folder: Path) -> None:
    """Undo what a block did to this process's imports: its changes to sys.path, and the
    modules it imported from its folder (a kernels module, say), which later tests, and
    the workers they start with this process's path, must not see."""
    sys.path[:] = saved_path
    here = os.path.abspath(folder) + os.sep
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and os.path.abspath(file).startswith(here):
            del sys.modules[name]
