"""Draw the documentation's pictures with the pages' own code, into docs/_static/.

    python docs/make_pictures.py             # refresh the committed pictures
    python docs/make_pictures.py --out DIR   # draw them into DIR instead

A picture is drawn by the page's python block that writes it (the block names its file),
run as the tests run it, so the picture shown is the one the page's code makes. Needs the
plot extra (matplotlib).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent
# Each picture, by the page whose code draws it.
PICTURES = {"concepts-timeline.png": "concepts.md"}

_PYTHON = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def block_drawing(picture: str) -> str:
    """The source of the python block of its page that writes `picture`."""
    page = DOCS / PICTURES[picture]
    blocks = [b for b in _PYTHON.findall(page.read_text()) if f'"{picture}"' in b]
    if len(blocks) != 1:
        raise SystemExit(f"{page.name} has {len(blocks)} python blocks writing {picture}, not 1")
    return str(blocks[0])


def draw(picture: str, out: Path) -> Path:
    """Run the block that draws `picture` in `out`; return the picture's path."""
    out.mkdir(parents=True, exist_ok=True)
    code = compile(block_drawing(picture), PICTURES[picture], "exec")
    with contextlib.chdir(out):
        exec(code, {"__name__": "__main__"})
    return out / picture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS / "_static")
    out = parser.parse_args().out.resolve()
    os.environ.setdefault("MPLBACKEND", "Agg")
    for picture in PICTURES:
        print(f"drew {draw(picture, out)}")


if __name__ == "__main__":
    main()
