"""Progress bars for long runs, through tqdm when it is installed, else nothing at all."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(
    iterable: Iterable[T], *, total: int | None = None, desc: str = "", enabled: bool | None = None
) -> Iterator[T]:
    """Iterate `iterable` with a progress bar on stderr.

    `enabled=None` shows the bar only on a terminal; without tqdm (the `progress` extra)
    this is a plain iteration, so callers never need to check.
    """
    if enabled is False:
        yield from iterable
        return
    try:
        from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        yield from iterable
        return
    # tqdm's disable=None means: only when stderr is a terminal.
    yield from tqdm(iterable, total=total, desc=desc, disable=None if enabled is None else False)
