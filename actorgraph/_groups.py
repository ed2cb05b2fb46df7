"""One error out of a nursery comes out as itself, not wrapped in an ExceptionGroup.

trio nurseries always wrap what their tasks raise in a group (strict exception groups), so
`except ag.UsageError:` around `async with ag.open_runtime(...)` would catch nothing. The
library's context managers therefore unwrap a group that holds exactly one exception and
raise that exception, with its own traceback, cause and context; a group of several
failures stays a group (nothing is hidden).
"""

from __future__ import annotations


def sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception in `group` (looking through nested groups of one), else None."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup):
        if len(inner.exceptions) != 1:
            return None
        inner = inner.exceptions[0]
    return inner
