"""How to install one of actorgraph's extras, worded once for every message that asks for one.

actorgraph is on no package index, so `pip install` by name finds nothing: an extra comes
from the checkout the package was installed from (editable), or with a wheel built there.
"""

from __future__ import annotations

import importlib.metadata


def install_hint(extra: str) -> str:
    """The pip command that installs actorgraph's extra `extra`, from a checkout or a wheel.

    Args:
        extra: the name of the extra, as pyproject.toml lists it (say "tinygrad").

    Returns:
        The commands, as a message puts them after "install the ... extra: ".
    """
    try:
        version = importlib.metadata.version("actorgraph")
    except importlib.metadata.PackageNotFoundError:
        version = "VERSION"
    return (
        f'pip install -e ".[{extra}]" in a checkout of actorgraph (or, with a wheel built '
        f'there, pip install "actorgraph-{version}-py3-none-any.whl[{extra}]")'
    )
