"""The records file of a sweep (JSONL, one finished cell per line): reading it, refusing a file that is not one,
and keeping it resumable when a killed write tore its last line.

A record is appended whole (flushed and fsynced); a crash in the middle of a write leaves a torn last line. Before
the next append it is removed (or ended, when the kill cut only its newline), so finished cells stay resumable
however often a sweep is killed; a record that an older CBO appended onto a torn line is recovered.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any


def parse_record_line(line: str) -> tuple[dict[str, Any] | None, bool]:
    """``(record, torn)`` of one line of a sweep file.

    ``torn`` is True for a record cut by a killed write (a line that starts like a record but is not valid JSON);
    an earlier CBO appended the next record onto such a line, and that record is recovered (``record`` not None).
    """
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        if not line.lstrip().startswith("{"):
            return None, False
        start = line.find('{"', 1)
        while start != -1:  # a whole record glued onto the torn one
            try:
                rec = json.loads(line[start:])
            except json.JSONDecodeError:
                start = line.find('{"', start + 1)
                continue
            return (rec if isinstance(rec, dict) and "key" in rec else None), True
        return None, True
    return (rec if isinstance(rec, dict) and "key" in rec else None), False


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a sweep file (a record torn by a crash is skipped with a warning)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        rec, torn = parse_record_line(line)
        if torn:
            warnings.warn(
                f"{path}: line {i + 1} is not valid JSON (an interrupted write?); "
                + ("the record after the torn one is kept." if rec is not None else "it is ignored."),
                stacklevel=2,
            )
        if rec is not None:
            out.append(rec)
    return out


def check_records_file(path: str | os.PathLike) -> None:
    """OutputPathError unless ``path`` is missing, empty, or a sweep file (JSON records, perhaps some torn by a
    crash): records are appended to it, so a user's own file must not be taken for one."""
    from cbo.errors import OutputPathError

    path = Path(path)
    if not path.is_file():
        return
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise OutputPathError(f"cannot read the sweep file {str(path)!r} ({exc}); choose another --out.") from exc
    parsed = [parse_record_line(line) for line in lines]
    bad = [i for i, (rec, torn) in enumerate(parsed) if rec is None and not torn]
    # torn records alone (no whole one) are a sweep file only when there is one, at the end: a killed first write
    torn_only = all(rec is None for rec, _ in parsed) and len(parsed) > 1
    if bad or torn_only:
        line = bad[0] + 1 if bad else 1
        raise OutputPathError(
            f"{str(path)!r} is not a sweep file (line {line} is not a record `cbo sweep` wrote), and a sweep "
            "appends to its --out file; choose another --out (e.g. sweep.jsonl)."
        )


def drop_torn_tail(path: Path) -> None:
    """Make the sweep file ``path`` end with a whole line before records are appended: a last line cut by a killed
    write is removed (with a warning; its cell runs again), or ended when it is a whole record without its newline.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    with path.open("rb+") as fh:
        fh.seek(max(0, size - 1))
        if fh.read(1) == b"\n":
            return
        tail_start = max(0, size - 2**20)
        fh.seek(tail_start)
        tail = fh.read()
        cut = tail.rfind(b"\n")
        last = tail[cut + 1 :]
        try:
            whole = isinstance(json.loads(last.decode("utf-8")), dict)
        except (UnicodeDecodeError, json.JSONDecodeError):
            whole = False
        if whole:
            fh.seek(0, os.SEEK_END)
            fh.write(b"\n")
        else:
            fh.truncate(tail_start + cut + 1 if cut >= 0 else 0)
        fh.flush()
        os.fsync(fh.fileno())
    if not whole:
        warnings.warn(
            f"{path}: removed its torn last line (a write killed mid-record); that cell runs again.", stacklevel=3
        )


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` to the sweep file ``path`` as one line, flushed and fsynced (a finished cell survives a crash)."""
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
