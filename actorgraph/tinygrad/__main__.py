"""`python -m actorgraph.tinygrad SCRIPT [ARGS ...]`: run a tinygrad script, unmodified,
with actorgraph installed: actorgraph replays its jits, and the worker devices that
`ACTORGRAPH_REMOTE` names (with the token `ACTORGRAPH_TOKEN_FILE` names) are its AG
devices, so `DEV=AG python -m actorgraph.tinygrad model.py` runs it on the first one."""

from __future__ import annotations

import runpy
import sys

USAGE = "usage: python -m actorgraph.tinygrad SCRIPT [ARGS ...]"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{__doc__}", file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    from actorgraph import tinygrad as agt

    agt.install()
    sys.argv = list(args)
    try:
        runpy.run_path(args[0], run_name="__main__")
    finally:
        agt.uninstall()
    return 0


if __name__ == "__main__":
    sys.exit(main())
