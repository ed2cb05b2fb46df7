"""Which tinygrad actorgraph.tinygrad accepts: the supported releases, and a clear
ImportError for any other (checked against a real import, in a process of its own)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from _paths import child_pythonpath

import actorgraph as ag


def _version_module() -> ModuleType:
    """actorgraph.tinygrad._version, read from its file: importing it through its package
    runs actorgraph.tinygrad, which raises where no supported tinygrad is installed (what
    these tests check), and they run without the tinygrad extra too."""
    path = Path(ag.__file__).parent / "tinygrad" / "_version.py"
    spec = importlib.util.spec_from_file_location("actorgraph.tinygrad._version", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_version = _version_module()
NEWEST, SUPPORTED = _version.NEWEST, _version.SUPPORTED
TinygradVersionError, adapter_for = _version.TinygradVersionError, _version.adapter_for


def test_each_supported_release_has_its_adapter() -> None:
    assert list(SUPPORTED) == ["0.11.0", "0.14.0"] and NEWEST == "0.14.0"
    assert adapter_for("0.11.0") == "_v011" and adapter_for("0.14.0") == "_v014"


def test_another_release_is_refused_naming_it_and_the_fix() -> None:
    with pytest.raises(TinygradVersionError) as raised:
        adapter_for("0.13.0")
    message = str(raised.value)
    assert "tinygrad 0.13.0 is installed" in message
    assert "supports tinygrad 0.11.0, 0.14.0" in message
    assert 'install a supported release: pip install -e ".[tinygrad]" in a checkout' in message
    assert isinstance(raised.value, ImportError) and isinstance(raised.value, ag.MissingExtraError)


def test_no_tinygrad_says_how_to_install_it() -> None:
    with pytest.raises(
        ag.MissingExtraError, match=r'not installed: pip install -e "\.\[tinygrad\]" in a checkout'
    ):
        adapter_for(None)


def test_importing_with_an_unsupported_tinygrad_raises_its_import_error(tmp_path: Path) -> None:
    # A tinygrad 0.12.0 distribution found first on the path: what pip would leave after
    # `pip install tinygrad==0.12.0`, as far as importlib.metadata can tell.
    dist = tmp_path / "tinygrad-0.12.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tinygrad\nVersion: 0.12.0\n")
    program = (
        "import sys\n"
        "try:\n"
        "    import actorgraph.tinygrad\n"
        "except ImportError as error:\n"
        "    print(type(error).__name__, error)\n"
        "    sys.exit(0)\n"
        "sys.exit('imported with tinygrad 0.12.0')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        env={"PYTHONPATH": f"{tmp_path}:{child_pythonpath()}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(
        "TinygradVersionError actorgraph.tinygrad supports tinygrad 0.11.0, 0.14.0"
    )
    assert "tinygrad 0.12.0 is installed" in done.stdout
