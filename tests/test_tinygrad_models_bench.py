"""benchmarks/tinygrad_models.py runs in its quick mode (tiny sizes, two rounds), checks
every path bitwise against tinygrad alone on the way, and writes its JSON."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("DEV", "CPU")
pytest.importorskip("tinygrad", reason="tinygrad is not installed (actorgraph[tinygrad])")
if shutil.which(os.environ.get("CC", "clang")) is None:
    pytest.skip(
        "clang is not installed: tinygrad's CPU devices compile with it", allow_module_level=True
    )

from benchmarks import tinygrad_models  # noqa: E402


def test_quick_run_measures_every_model_and_path(tmp_path: Path) -> None:
    out = tmp_path / "tinygrad_models.json"
    assert tinygrad_models.main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["quick"] is True and report["tinygrad"]
    rows = {(row["name"], row["mode"]): row for row in report["rows"]}
    names = {"decoder", "cnn", "mlp", "dp2", "heavy"}
    assert set(rows) == {(name, mode) for name in names for mode in ("pool", "recycled")}
    for row in rows.values():
        for path in ("tinygrad", "install", "trio", "floor"):
            assert row[path] > 0
        assert row["replays"] >= 1  # install() really replayed through actorgraph
    assert set(report["verdicts"]) == {
        *(f"{name} {mode} install" for name, mode in rows),
        *(f"{name} {mode} trio" for name, mode in rows if name != "heavy"),
    }
