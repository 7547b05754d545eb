"""The code blocks of the manual (docs/**/*.md) and the README, and the markers that say who runs them.

Every ```python, ```bash, ```sh or ```console block of the manual is one of:

* ``<!-- example: NAME (who runs it) -->`` on the line before it: a test runs it, finding it by
  ``example("NAME")`` (tests/test_docs.py checks that such a call exists for every name);
* ``<!-- not-run: REASON -->`` on the line before it: it cannot run in the suite (a GPU, a cluster, a big model, a
  full benchmark run), and the reason says so;
* a shell block of ``cbo ...`` lines only (comments and continuation lines aside): every line is parsed against the
  typer app (tests/test_docs.py), as the README's are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CHECKED = ("python", "bash", "sh", "console")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*(example|not-run):\s*(.*?)\s*-->\s*$", re.S)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    code: str
    marker: str | None  # "example" or "not-run"
    detail: str  # the example's name (first word) and note, or the reason

    @property
    def name(self) -> str:
        return self.detail.split()[0] if self.marker == "example" and self.detail else ""

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        found.append(
            Block(
                path=path,
                line=text.count("\n", 0, m.start()) + 1,
                language=m.group(1),
                code=m.group(2),
                marker=marker.group(1) if marker else None,
                detail=marker.group(2) if marker else "",
            )
        )
    return found


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)]


def example(name: str) -> str:
    """The code of the docs blocks marked ``<!-- example: NAME ... -->`` (one example; a page may repeat it
    word for word, as the front page and getting started do the README's quick start)."""
    codes = {b.code for b in all_blocks() if b.marker == "example" and b.name == name}
    assert len(codes) == 1, f"{len(codes)} different docs blocks are marked `example: {name}`"
    return codes.pop()


def shell_lines(code: str) -> list[str]:
    """The commands of a shell block: comments dropped, continuation lines joined."""
    lines, current = [], ""
    for raw in code.splitlines():
        line = raw.split("  #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip() and not current:
            continue
        current += " " + line.strip() if current else line.strip()
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        if current:
            lines.append(current)
        current = ""
    return lines


def cbo_lines() -> list[tuple[str, str]]:
    """Every ``cbo ...`` line of the manual's shell blocks, with where it is."""
    return [
        (b.where(), line)
        for b in all_blocks()
        if b.language in ("bash", "sh", "console") and b.marker is None
        for line in shell_lines(b.code)
        if line.startswith("cbo ")
    ]
