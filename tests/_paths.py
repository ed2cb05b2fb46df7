"""Where this checkout is, and the PYTHONPATH a test's child Python process needs."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def child_pythonpath() -> str:
    """This checkout and its tests folder first, then what this process was given (where
    packages carried to a machine may be)."""
    return os.pathsep.join(filter(None, [str(ROOT), str(TESTS), os.environ.get("PYTHONPATH")]))
