"""The R data archive of the Austen novels, read without R: a Debian package (an ``ar`` archive holding a tar)
-> ``Rdata.rdb`` (zlib records) -> R's XDR serialization of one character vector per novel.

Example:
    >>> books = parse_austen_rdb(extract_rdb_from_deb(Path("r-cran-janeaustenr_1.0.0-1_all.deb")))  # doctest: +SKIP
    >>> sorted(books)[:2]                                                                          # doctest: +SKIP
    ['emma', 'mansfield_park']
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from cbo.errors import DataError

RDB_PATH = "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"


class CorruptRdbError(DataError):
    """The R data archive could not be parsed."""


def _r_strings(payload: bytes) -> list[str] | None:
    """Decode an R XDR serialization whose top object is a character vector; None for other objects.

    Format (R ``serialize``, XDR): ``X\\n``, version (int), R version (int), minimal R version (int);
    for version 3 a native-encoding name (int length + bytes); then the object: a flags word whose low
    byte is the type (16 = STRSXP), the element count, and per element a flags word (low byte 9 =
    CHARSXP; bit 2 of the levels = Latin-1), a byte length (-1 = NA) and the bytes.
    """
    if not payload.startswith(b"X\n"):
        raise CorruptRdbError("not an R XDR serialization (no 'X\\n' header)")
    pos = 2

    def read_int() -> int:
        nonlocal pos
        if pos + 4 > len(payload):
            raise CorruptRdbError(f"truncated R serialization at byte {pos}")
        (value,) = struct.unpack_from(">i", payload, pos)
        pos += 4
        return value

    version = read_int()
    read_int()  # R version that wrote it
    read_int()  # minimal R version to read it
    if version == 3:
        n = read_int()
        pos += n
    elif version != 2:
        raise CorruptRdbError(f"unsupported R serialization version {version}")
    flags = read_int()
    if flags & 0xFF != 16:
        return None
    length = read_int()
    if length == -1:  # long vector: two ints
        length = (read_int() << 32) | (read_int() & 0xFFFFFFFF)
    lines: list[str] = []
    for _ in range(length):
        cflags = read_int()
        if cflags & 0xFF != 9:
            raise CorruptRdbError(f"expected a CHARSXP element, found type {cflags & 0xFF}")
        n = read_int()
        if n == -1:
            lines.append("")
            continue
        raw = payload[pos : pos + n]
        if len(raw) != n:
            raise CorruptRdbError("truncated string in R serialization")
        pos += n
        latin1 = (cflags >> 12) & 4
        lines.append(raw.decode("latin-1" if latin1 else "utf-8", errors="replace"))
    return lines


def read_rdb_records(data: bytes) -> Iterator[bytes]:
    """Yield the decompressed records of an R lazy-load database (``.rdb``).

    Each record is a 4-byte big-endian uncompressed length followed by a zlib stream; a decompress object
    finds where each stream ends.
    """
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise CorruptRdbError(f"truncated record header at byte {pos}")
        (expected,) = struct.unpack_from(">I", data, pos)
        decomp = zlib.decompressobj()
        try:
            out = decomp.decompress(data[pos + 4 :])
        except zlib.error as exc:
            raise CorruptRdbError(f"record at byte {pos} is not a zlib stream: {exc}") from exc
        if not decomp.eof:
            raise CorruptRdbError(f"record at byte {pos} ends before its zlib stream does")
        if len(out) != expected:
            raise CorruptRdbError(f"record at byte {pos}: {len(out)} bytes decompressed, header says {expected}")
        yield out
        pos = len(data) - len(decomp.unused_data)


def _slug(title: str) -> str:
    words = "".join(c.lower() if c.isalnum() else " " for c in title).split()
    return "_".join(words)


def parse_austen_rdb(data: bytes) -> dict[str, list[str]]:
    """Novels in a janeaustenr ``Rdata.rdb``: ``{slug of the first line: lines}``, in archive order."""
    books: dict[str, list[str]] = {}
    for record in read_rdb_records(data):
        lines = _r_strings(record)
        if lines is None:
            continue
        title = next((line for line in lines if line.strip()), "")
        slug = _slug(title) or f"record_{len(books)}"
        books[slug] = lines
    if not books:
        raise CorruptRdbError("no character vectors found in the R data archive")
    return books


def _deb_members(deb: bytes) -> dict[str, bytes]:
    """Members of a .deb (an ``ar`` archive)."""
    if not deb.startswith(b"!<arch>\n"):
        raise DataError("the downloaded .deb is not an ar archive")
    pos, members = 8, {}
    while pos + 60 <= len(deb):
        header = deb[pos : pos + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        members[name] = deb[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size % 2)
    return members


def extract_rdb_from_deb(deb_path: Path) -> bytes:
    """The bytes of ``Rdata.rdb`` inside the janeaustenr .deb (pure Python: ar + tar)."""
    found = deb_data_files(deb_path, lambda name: name == RDB_PATH)
    if RDB_PATH not in found:
        raise DataError(f"{deb_path.name} does not contain {RDB_PATH}")
    return found[RDB_PATH]


def deb_data_files(deb_path: Path, wanted: Callable[[str], bool]) -> dict[str, bytes]:
    """``{path: bytes}`` of the files of a .deb's data archive whose path (without a leading ``./``) ``wanted``
    accepts (pure Python for gzip, xz and bzip2; zstd through ``zstandard`` or ``dpkg-deb``)."""
    members = _deb_members(deb_path.read_bytes())
    data_name = next((n for n in members if n.startswith("data.tar")), None)
    if data_name is None:
        raise DataError(f"{deb_path.name} has no data.tar member")
    blob = members[data_name]
    if data_name.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            dpkg = shutil.which("dpkg-deb")
            if dpkg is None:
                raise DataError("the .deb is zstd-compressed: install dpkg-deb or `pip install zstandard`") from None
            with tempfile.TemporaryDirectory() as tmp:
                subprocess.run([dpkg, "-x", str(deb_path), tmp], check=True, capture_output=True)
                root = Path(tmp)
                return {
                    str(p.relative_to(root)): p.read_bytes()
                    for p in sorted(root.rglob("*"))
                    if p.is_file() and wanted(str(p.relative_to(root)))
                }
        blob = zstandard.ZstdDecompressor().decompressobj().decompress(blob)
    out = {}
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix("./")
            if member.isfile() and wanted(name):
                f = tar.extractfile(member)
                if f is not None:
                    out[name] = f.read()
    return out


__all__ = [
    "RDB_PATH",
    "CorruptRdbError",
    "deb_data_files",
    "extract_rdb_from_deb",
    "parse_austen_rdb",
    "read_rdb_records",
]
