"""The project's own words checked as text: what they tell a newcomer to run must run."""

from __future__ import annotations

import ast
import html
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from _extras import importorskip
from _paths import ROOT, TESTS, child_pythonpath
from test_readme import Block, parse_blocks, run_block

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
for name in ("tinygrad", "ray", "dask"):
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
    files += ["test_peers_bench.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "hide_extras", "-p", "no:cacheprovider", "-q"]
        + ["-rs", "-k", "tinygrad or ray or dask", *(str(TESTS / f) for f in files)]
        + [str(TESTS / "test_docs.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    # The two tinygrad modules, the Ray module, the Ray notebook and script, and the
    # tinygrad and Ray pages' blocks.
    assert sum(int(re.search(r"\[(\d+)\]", line)[1]) for line in skips) >= 7, done.stdout
    for module, extra in (("tinygrad", "tinygrad"), ("ray", "ray"), ("dask", "bench")):
        mine = [line for line in skips if f"{module} is not installed" in line]
        assert mine, (module, skips)
        for line in mine:
            assert f'pip install -e ".[test,{extra}]"' in line, line
    assert not [line for line in skips if "pip install -e" not in line], skips


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


# -- the API reference: every public name, with parameters, returns and raises ---------------

_DIRECTIVE_RST = re.compile(
    r"^\.\. (?P<kind>auto\w+|py:\w+):: (?P<name>\S+)\n(?P<options>(?:   :[\w-]+:.*\n)*)", re.M
)


def api_entries() -> list[tuple[str, str, list[str]]]:
    """(directive, dotted name, members listed) of every entry of the API pages."""
    entries = []
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        for match in _DIRECTIVE_RST.finditer(page.read_text()):
            members = re.search(r":members: (.*)", match.group("options"))
            listed = [m.strip() for m in members.group(1).split(",")] if members else []
            entries.append((match.group("kind"), match.group("name"), listed))
    return entries


def resolve(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_api_reference_has_every_public_name() -> None:
    import actorgraph

    documented = {name for _, name, _ in api_entries()}
    wanted = {f"actorgraph.{n}" for n in actorgraph.__all__}
    if importlib.util.find_spec("tinygrad") is not None:
        import actorgraph.tinygrad

        wanted |= {f"actorgraph.tinygrad.{n}" for n in actorgraph.tinygrad.__all__}
    assert not wanted - documented, f"not in docs/api/*.md: {sorted(wanted - documented)}"


def _params(fn: Any) -> list[str]:
    """The parameters a caller passes, as a docstring names them (`*args`, `**options`)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [
        prefix.get(p.kind, "") + p.name
        for p in signature.parameters.values()
        if p.name not in ("self", "cls")
    ]


def _section(doc: str, title: str) -> str | None:
    """The text of a Google-style section (`Args:`, `Returns:`, ...), or None."""
    match = re.search(rf"^{title}:\n((?:[ \t]+.*\n?|\n)+)", doc, re.M)
    return None if match is None else match.group(1)


def _raises_itself(fn: Any) -> bool:
    """Whether `fn`'s own body (not a function nested in it) has a raise statement."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return False
    tree = ast.parse(source).body[0]
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)

    def walk(node: ast.AST) -> Iterator[ast.AST]:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, nested):
                yield child
                yield from walk(child)

    return any(isinstance(node, ast.Raise) for node in walk(tree))


def callable_faults(where: str, fn: Any) -> list[str]:
    """What a function's or method's docstring lacks: a summary, an `Args:` entry per
    parameter, `Returns:` (or `Yields:`) unless it returns None, `Raises:` where it raises."""
    doc = inspect.getdoc(fn) or ""
    if not doc:
        return [f"{where}: no docstring"]
    faults = []
    params = _params(fn)
    args = _section(doc, "Args") or ""
    for name in params:
        if not re.search(rf"^\s+{re.escape(name)}\b[^\n]*:", args, re.M):
            faults.append(f"{where}: parameter {name!r} is not under Args:")
    returns = inspect.signature(fn).return_annotation
    if returns not in ("None", None, inspect.Signature.empty):
        if _section(doc, "Returns") is None and _section(doc, "Yields") is None:
            faults.append(f"{where}: no Returns: section (it returns {returns})")
    if _raises_itself(fn) and _section(doc, "Raises") is None:
        faults.append(f"{where}: it raises, but has no Raises: section")
    return faults


def _first_line_types_itself(doc: str) -> bool:
    # napoleon reads a property's "text: more" first line as "type: description".
    first = re.sub(r"`[^`]*`|\([^)]*\)", "", doc.splitlines()[0])
    return bool(re.search(r":\s", first))


# Classes whose objects actorgraph makes and hands out (a user never constructs one), so
# their constructors are no part of the API: only what they offer is.
MADE_FOR_YOU = frozenset(
    [
        "Runtime", "Buffer", "Graph", "Replay", "BackgroundRuntime", "BackgroundGraph",
        "Call", "JitFunction", "JitGraph", "ActorGraph", "WorkerCPU",
    ]
)  # fmt: skip


def class_faults(kind: str, where: str, cls: Any, members: list[str]) -> list[str]:
    """What a class's docstring lacks: a summary, an `Args:` or `Attributes:` entry per
    constructor parameter (for classes users make or read fields of), and what
    `callable_faults` asks of each method listed; a property needs a docstring whose
    first line napoleon does not read as a type."""
    doc = inspect.getdoc(cls) or ""
    faults = [] if doc else [f"{where}: no docstring"]
    own_init = "__init__" in vars(cls) or attrs.has(cls)
    made_here = cls.__name__ in MADE_FOR_YOU
    fields = (
        [p for p in _params(cls) if not p.startswith("*")] if own_init and not made_here else []
    )
    if kind == "autoexception":
        fields = [f for f in fields if f != "message"]
    section = (_section(doc, "Args") or "") + (_section(doc, "Attributes") or "")
    for name in fields:
        if not re.search(rf"^\s+{re.escape(name)}\b[^\n]*:", section, re.M):
            faults.append(f"{where}: {name!r} is under neither Args: nor Attributes:")
    for member in members:
        value = inspect.getattr_static(cls, member)
        if not (isinstance(value, property) or inspect.isfunction(value)):
            faults.append(f"{where}.{member}: a field; say it under the class's Attributes:")
        elif isinstance(value, property):
            text = inspect.getdoc(value) or ""
            if not text:
                faults.append(f"{where}.{member}: no docstring")
            elif _first_line_types_itself(text):
                faults.append(f"{where}.{member}: a colon in the first line reads as a type")
        elif inspect.isfunction(value):
            faults += callable_faults(f"{where}.{member}", value)
    return faults


def test_every_documented_name_has_its_parameters_returns_and_raises() -> None:
    faults: list[str] = []
    for kind, name, members in api_entries():
        if name.startswith("actorgraph.tinygrad") and importlib.util.find_spec("tinygrad") is None:
            continue
        if kind in ("autofunction",):
            faults += callable_faults(name, resolve(name))
        elif kind in ("autoclass", "autoexception"):
            faults += class_faults(kind, name, resolve(name), members)
    assert not faults, f"{len(faults)} docstrings to complete:\n" + "\n".join(faults)


# -- every page's code runs, as the README's does ---------------------------------------------

DOCS = ROOT / "docs"


def doc_pages() -> list[Path]:
    """The site's Markdown pages."""
    return [
        page
        for page in sorted(DOCS.rglob("*.md"))
        if not {"_build", "notebooks"} & set(page.relative_to(DOCS).parts)
    ]


PAGE_BLOCKS = [
    (page, block) for page in doc_pages() for block in parse_blocks(page.read_text(), page.name)
]


@pytest.mark.parametrize(
    ("page", "block"),
    PAGE_BLOCKS,
    ids=[f"{p.relative_to(DOCS).with_suffix('')}-{b.name}" for p, b in PAGE_BLOCKS],
)
def test_docs_page_block(
    page: Path, block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run_block(block, page, tmp_path, monkeypatch)


def test_every_page_with_code_is_run() -> None:
    # Counted a second, cruder way, so a parser slip cannot leave a page's code unrun.
    for page in doc_pages():
        fences = re.findall(r"^[ \t]*```(?:python|py)[ \t]*$", page.read_text(), re.M)
        assert len([b for p, b in PAGE_BLOCKS if p == page]) == len(fences), page.name


def _readme_set_up_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    commands = [line for line in lines if line.startswith("python3 -m venv .venv && ")]
    assert len(commands) == 2, commands  # set up and run the demo; set up and run the tests
    return commands


def test_the_docs_give_the_readmes_two_set_up_commands_as_written() -> None:
    # They run the demo and the tests on a fresh machine (CI runs the second as written).
    for page in (DOCS / "index.md", DOCS / "getting-started.md"):
        blocks = "".join(_SHELL_BLOCK.findall(page.read_text()))
        for command in _readme_set_up_commands():
            assert f"{command}\n" in blocks, f"{page.name} lacks {command!r}"


def test_the_docs_build_command_is_the_readmes_everywhere() -> None:
    # CI runs the README's as written; the pages that tell it must say the same.
    lines = (ROOT / "README.md").read_text().splitlines()
    (command,) = [line for line in lines if "python -m sphinx" in line]
    assert command.startswith('pip install -e ".[docs]" && ') and " -W " in command
    blocks = "".join(_SHELL_BLOCK.findall((DOCS / "how-it-is-built.md").read_text()))
    assert f"{command}\n" in blocks, f"how-it-is-built.md lacks {command!r}"


def test_the_pictures_are_drawn_by_the_pages_code(tmp_path: Path) -> None:
    importorskip("matplotlib")
    done = subprocess.run(
        [sys.executable, str(DOCS / "make_pictures.py"), "--out", str(tmp_path)],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=child_pythonpath(), MPLBACKEND="Agg"),
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for picture in ("concepts-timeline.png",):
        drawn = (tmp_path / picture).read_bytes()
        assert drawn.startswith(b"\x89PNG\r\n\x1a\n") and len(drawn) > 10_000
        assert (DOCS / "_static" / picture).read_bytes().startswith(b"\x89PNG")  # committed


# -- the site: built with warnings as errors, then looked at in a browser ----------------------

_DOCS_EXTRA = ("sphinx", "myst_nb", "furo")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built from docs/ with warnings as errors; its html folder."""
    missing = [m for m in _DOCS_EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(
            f'{", ".join(missing)} not installed: pip install -e ".[docs]" in the checkout '
            f"installs what builds the docs"
        )
    out = tmp_path_factory.mktemp("site") / "html"
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
        + [str(DOCS), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GUARD * 2,
    )
    assert done.returncode == 0, f"the docs build failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_the_site_builds_with_warnings_as_errors(site: Path) -> None:
    for page in ("index", "getting-started", "concepts", "howto/tinygrad", "api/runtime"):
        assert (site / f"{page}.html").is_file(), page
    notebooks = sorted(p.stem for p in (ROOT / "examples").glob("*.ipynb"))
    assert sorted(p.stem for p in (site / "notebooks").glob("*.html")) == notebooks
    # A notebook is shown with its committed outputs: its printed lines and its plots.
    for name in notebooks:
        cells = json.loads((ROOT / "examples" / f"{name}.ipynb").read_text())["cells"]
        printed = [
            line.strip()
            for cell in cells
            for output in cell.get("outputs", [])
            if output.get("output_type") == "stream"
            for line in output["text"]
            if len(line.strip()) > 12
        ]
        shown = html.unescape((site / "notebooks" / f"{name}.html").read_text())
        assert printed and printed[0] in shown, (name, printed[:1])
    assert "<img" in (site / "notebooks" / "01_quickstart.html").read_text()


# What a person sees on three pages: the landing page, a how-to, the API reference.
LOOKED_AT = {
    "index": ("actorgraph", 2),
    "howto/tinygrad": ("tinygrad", 5),
    "api/runtime": ("Runtime, buffers and graphs", 0),
}
_LINKS = "Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"
_CODE = "document.querySelectorAll('div.highlight pre').length"
_HEADINGS = "Array.from(document.querySelectorAll('h1, h2, h3')).map(h => h.textContent)"
_API = "document.querySelectorAll('dl.py.function, dl.py.class, dl.py.method').length"


def _ids(page: Path, cache: dict[Path, set[str]]) -> set[str]:
    if page not in cache:
        cache[page] = set(re.findall(r'\bid="([^"]+)"', page.read_text(errors="replace")))
    return cache[page]


def test_the_site_as_a_person_sees_it(site: Path) -> None:
    from _chromium import CHROMIUM, Browser

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    shots = DOCS / "_build" / "screenshots"  # git-ignored, for a person to look at
    shots.mkdir(parents=True, exist_ok=True)
    pages = sorted(site.rglob("*.html"))
    broken: list[str] = []
    ids: dict[Path, set[str]] = {}
    with Browser(guard=GUARD) as browser:
        for page in pages:
            browser.open(page.as_uri())
            name = page.relative_to(site).with_suffix("").as_posix()
            if name in LOOKED_AT:
                title, code_blocks = LOOKED_AT[name]
                headings = browser.evaluate(_HEADINGS)
                assert headings and headings[0].rstrip("¶#") == title, (name, headings)
                assert len(headings) > 1, (name, headings)
                assert browser.evaluate(_CODE) >= code_blocks, name
                shot = browser.screenshot()
                assert shot.startswith(b"\x89PNG") and len(shot) > 20_000, name
                (shots / f"{name.replace('/', '-')}.png").write_bytes(shot)
            if name == "api/runtime":
                assert browser.evaluate(_API) >= 20  # the entries rendered, not raw text
                assert ".. py:" not in browser.evaluate("document.body.innerText")
            for link in browser.evaluate(_LINKS):
                if not link.startswith("file://"):
                    continue  # another site's page
                target, _, anchor = link.removeprefix("file://").partition("#")
                target_path = Path(urllib.parse.unquote(target))
                if target_path.is_dir():
                    target_path = target_path / "index.html"
                if not target_path.is_file():
                    broken.append(f"{name}: {link} (no such page)")
                elif anchor and target_path.suffix == ".html":
                    if urllib.parse.unquote(anchor) not in _ids(target_path, ids):
                        broken.append(f"{name}: {link} (no such anchor)")
    assert len(pages) >= 20
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readmes_links_lead_to_pages() -> None:
    # README.md is the front page: a short one whose links lead to every page it names.
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 15
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, missing
    assert len(text.splitlines()) <= 200
