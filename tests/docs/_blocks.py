"""The code blocks of the documentation (docs/**/*.md and README.md), with their test markers.

A marker is an HTML comment on the line(s) before a fenced block (the page does not
show it):

- ``<!-- test: skip <why> -->``: not run; the reason is required (see MARKERS).
- ``<!-- test: real-broker -->``: run on the test kit's real RabbitMQ, not in memory.
- ``<!-- test: spark -->``: needs a local Spark: not run here (tests/spark runs it).
- ``<!-- test-setup: ... -->``: hidden Python run before the next block, for the names a
  fragment takes from its context (``class Order``), so the page can stay short.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

MARKERS = ("skip", "real-broker", "spark")

_FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*test:\s*([\w-]+)\s*(.*?)\s*-->", re.S)
_SETUP = re.compile(r"<!--\s*test-setup:\s*\n(.*?)-->", re.S)


@dataclass
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None = None  # one of MARKERS
    reason: str = ""
    setup: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    page = str(path.relative_to(ROOT))
    out: list[Block] = []
    pos = 0
    for m in _FENCE.finditer(text):
        between = text[pos : m.start()]
        pos = m.end()
        line = text.count("\n", 0, m.start()) + 1
        code = textwrap.dedent(m.group(3)) if m.group(1) else m.group(3)
        b = Block(page, line, m.group(2), code)
        # markers apply only when they are the last thing before the fence
        tail = between.rstrip()
        setups = []
        while True:
            mk = _MARK.search(tail)
            st = _SETUP.search(tail)
            last = max(
                (x for x in (mk, st) if x is not None and x.end() == len(tail)),
                key=lambda x: x.end(),
                default=None,
            )
            if last is None:
                break
            if last is st:
                setups.insert(0, st.group(1))
            else:
                if mk.group(1) not in MARKERS:
                    raise ValueError(f"{page}:{line}: unknown test marker {mk.group(1)!r}")
                b.marker, b.reason = mk.group(1), mk.group(2)
            tail = tail[: last.start()].rstrip()
        b.setup = setups
        out.append(b)
    return out
