"""pytest plugin for scripts/tinygrad_conformance.py: with AG_CONFORMANCE_INSTALL=1 it
calls actorgraph.tinygrad.install() before any test runs; either way it records each
test's outcome and how many replays actorgraph made during it, into the JSON file
AG_CONFORMANCE_REPORT names."""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_outcomes: dict[str, str] = {}
_replays: dict[str, int] = {}


def _replays_now() -> int:
    from actorgraph import tinygrad as agt

    return agt.statistics().replays


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("AG_CONFORMANCE_INSTALL") == "1":
        from actorgraph import tinygrad as agt

        agt.install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    installed = os.environ.get("AG_CONFORMANCE_INSTALL") == "1"
    before = _replays_now() if installed else 0
    try:
        return (yield)
    finally:
        _replays[item.nodeid] = (_replays_now() - before) if installed else 0


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _outcomes[report.nodeid] = report.outcome
    elif report.when == "teardown" and report.failed:
        _outcomes[report.nodeid] = "failed"


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("AG_CONFORMANCE_REPORT")
    if path:
        Path(path).write_text(json.dumps({"outcomes": _outcomes, "replays": _replays}))
