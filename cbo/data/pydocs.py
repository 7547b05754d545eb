"""English prose of another kind than Austen's: the Python documentation of the Debian package ``python3.11-doc``.

The package (Python Software Foundation License; the documentation is © the PSF) ships the reStructuredText
sources of the manuals beside their HTML (``usr/share/doc/python3.11/html/_sources/<section>/<page>.rst.txt``).
:func:`read_doc_sources` reads the chosen sections' pages out of the ``.deb`` without installing it (pure Python:
ar + tar, as the Austen text is read from ``r-cran-janeaustenr``); :func:`rst_to_prose` keeps the English prose
of a page (paragraphs, list items, titles, notes) and drops what is not prose: code and literal blocks, doctest
sessions, grammar productions, tables, index entries and markup.

Example:
    >>> pages = read_doc_sources(Path("python3.11-doc_3.11.2-6_all.deb"))    # doctest: +SKIP
    >>> print(rst_to_prose(pages["tutorial/appetite"])[:60])                 # doctest: +SKIP
    Whetting Your Appetite
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from cbo.data.rdata import deb_data_files
from cbo.errors import DataError

DOC_PACKAGE = "python3.11-doc"
SOURCES_DIR = "usr/share/doc/python3.11/html/_sources/"
# the manuals of running prose (the library reference is mostly signatures and tables)
SECTIONS = ("tutorial", "faq", "howto", "reference")
LICENCE = "Python Software Foundation License Version 2 (documentation © Python Software Foundation)"

# directives whose body is prose, kept; every other directive's body (code, grammar, index, toctree...) is dropped
PROSE_DIRECTIVES = {
    "note", "warning", "tip", "important", "caution", "attention", "hint", "seealso", "impl-detail", "topic",
    "sidebar", "versionadded", "versionchanged", "deprecated", "rubric", "admonition",
}  # fmt: skip
_DIRECTIVE = re.compile(r"^\.\.\s+([\w:-]+)::\s*(.*)$")
_UNDERLINE = re.compile(r"^([=\-~^\"'*+#`:.<>_])\1{2,}\s*$")
_TABLE = re.compile(r"^\s*(\+[-=+]+\+|[=\s]{3,}|\|.*\|)\s*$")
_BULLET = re.compile(r"^(\s*)([*+-]|#\.|\d+\.|\(\d+\))\s+")


def read_doc_sources(deb_path: Path, sections: Iterable[str] = SECTIONS) -> dict[str, str]:
    """``{"<section>/<page>": reStructuredText}`` of the chosen sections' pages inside a ``python3.x-doc`` .deb."""
    sections = tuple(sections)

    def wanted(name: str) -> bool:
        rest = name.split(SOURCES_DIR, 1)[-1] if SOURCES_DIR in name else None
        return rest is not None and rest.endswith(".rst.txt") and rest.split("/", 1)[0] in sections

    files = deb_data_files(Path(deb_path), wanted)
    if not files:
        raise DataError(f"{Path(deb_path).name} holds no documentation sources of {list(sections)} under {SOURCES_DIR}")
    pages = {}
    for name, data in sorted(files.items()):
        page = name.split(SOURCES_DIR, 1)[1].removesuffix(".rst.txt")
        pages[page] = data.decode("utf-8", errors="replace")
    return pages


def inline_text(line: str) -> str:
    """A line with reStructuredText's inline markup reduced to its text (roles, links, literals, emphasis)."""
    line = re.sub(r":[\w:+.-]+:`[~!]?([^`<]*?)\s*(<[^>`]*>)?`", lambda m: m[1].strip() or (m[2] or "")[1:-1], line)
    line = re.sub(r"`([^`<]+?)\s*<[^>`]*>`__?", r"\1", line)  # `text <url>`_
    line = re.sub(r"``([^`]+)``", r"\1", line)
    line = re.sub(r"`([^`]+)`_{0,2}", r"\1", line)
    line = re.sub(r"\*\*([^*]+)\*\*", r"\1", line)
    line = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*", r"\1", line)
    line = re.sub(r"\[#\w*\]_|\[\d+\]_", "", line)  # footnote references
    line = re.sub(r"(?<=\w)_(?=[\s.,;:)]|$)", "", line)  # word_ references
    line = line.replace("\\", "")
    return re.sub(r"\s+", " ", line).strip()


def is_prose(paragraph: str, min_words: int = 4) -> bool:
    """A paragraph of running English: enough words, mostly letters, not a code line."""
    words = paragraph.split()
    if len(words) < min_words:
        return False
    letters = sum(c.isalpha() for c in paragraph)
    symbols = sum(c in "{}[]()=<>;$@|\\" for c in paragraph)
    return letters >= 0.6 * len(paragraph.replace(" ", "")) and symbols <= 0.05 * len(paragraph)


def rst_to_prose(text: str) -> str:
    """The English prose of a reStructuredText page: titles and paragraphs, a blank line between them."""
    out: list[str] = []
    paragraph: list[str] = []
    para_indent = 0
    skip_indent: int | None = None  # dropping a block indented deeper than this
    literal_after: int | None = None  # a paragraph at this indent ended with "::": an indented block after it is code
    in_table = False

    def flush() -> None:
        nonlocal literal_after
        if not paragraph:
            return
        joined = " ".join(paragraph)
        paragraph.clear()
        if joined.endswith("::"):
            literal_after = para_indent
            joined = joined[:-2] + ("" if joined[:-2].endswith(" ") or not joined[:-2] else ":")
        joined = inline_text(joined)
        if is_prose(joined):
            out.append(joined)

    for raw in text.expandtabs(8).splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if in_table:
            in_table = bool(stripped)
            continue
        if skip_indent is not None:
            if not stripped or indent > skip_indent:
                continue
            skip_indent = None
        if not stripped:
            flush()
            continue
        if literal_after is not None:
            code = not paragraph and indent > literal_after
            literal_after = None
            if code:
                skip_indent = indent - 1
                continue
        directive = _DIRECTIVE.match(stripped)
        if directive:
            flush()
            name = directive[1].split(":")[-1]
            if name not in PROSE_DIRECTIVES:
                skip_indent = indent
            elif directive[2] and name not in ("versionadded", "versionchanged", "deprecated"):
                paragraph.append(directive[2])
                para_indent = indent
            continue
        if stripped.startswith(".. ") or stripped == "..":  # comments, link targets, substitutions
            flush()
            skip_indent = indent
            continue
        if stripped.startswith(">>>"):  # a doctest session runs to the next blank line
            paragraph.clear()
            in_table = True
            continue
        if _UNDERLINE.match(stripped):  # a section title's under- or overline
            title = inline_text(" ".join(paragraph))
            paragraph.clear()
            if any(c.isalpha() for c in title):
                out.append(title)
            continue
        if _TABLE.match(line):  # a simple or grid table runs to the next blank line
            paragraph.clear()
            in_table = True
            continue
        if re.match(r"^:[\w -]+:(\s|$)", stripped):  # field lists, :tocdepth: (not a line that starts with a role)
            continue
        bullet = _BULLET.match(line)
        if bullet:
            flush()
            stripped = line[bullet.end() :].strip()
        if not paragraph:
            para_indent = indent
        paragraph.append(stripped)
    flush()
    return "\n\n".join(out) + "\n" if out else ""


__all__ = ["DOC_PACKAGE", "LICENCE", "SECTIONS", "inline_text", "is_prose", "read_doc_sources", "rst_to_prose"]
