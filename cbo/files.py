"""Files the project writes: atomic writes with unique temporary names, checksummed zip archives, and output
paths checked before the work that fills them.

Two processes that save the same path never share a temporary file (each write gets its own name in the target
folder, then one atomic rename), and a reader sees either the old file or the new one, never half of one.

Output folders: :func:`check_output_file` and :func:`check_output_dir` fail before any long work on a path that
cannot be written, and refuse a non-empty folder that CBO did not write unless ``overwrite``;
:func:`output_folder` fills a folder through a staging folder beside it and records the files it wrote in
``.cbo-written.json``, so a later write replaces and removes only those files, never anything else.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from cbo.errors import CorruptFileError, OutputPathError

WRITTEN_MARKER = ".cbo-written.json"  # the files CBO wrote into an output folder (the only ones it may replace)
PRUNED_FORMAT_KEY = "cbo_pruned_format"  # the config.json entry of every model folder cbo.save_pruned writes

# what a damaged zip member or .npy header can raise while being read (every reader of a CBO archive catches these)
READ_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    NotImplementedError,  # a damaged header names an unknown compression method
    KeyError,
    ValueError,  # JSON, UTF-8 and .npy header errors
    TypeError,
    OSError,
    EOFError,
    RuntimeError,
    OverflowError,
    MemoryError,  # a damaged .npy header can claim an absurd shape
)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a uniquely named temporary file in the same folder and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"))


class CheckpointFile:
    """The one writer of resumable state (Hessian estimates, heals, searches): one file, replaced atomically after
    each finished step, so an interrupt leaves the previous step's state whole; deleted when the work is done.

    Subclasses encode their state to bytes and decode it back; a file that cannot be decoded or belongs to another
    run is reported with :meth:`starting_over` (a warning naming the file), or refused where resuming matters.

    Example:
        >>> ck = CheckpointFile(tmp / "run.ckpt")          # doctest: +SKIP
        >>> ck.write(b"state"); ck.read()                  # doctest: +SKIP
        b'state'
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def exists(self) -> bool:
        return self.path.is_file()

    def write(self, data: bytes) -> None:
        """Replace the file with ``data`` (its folder is created when missing)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, data)

    def read(self) -> bytes | None:
        """The file's bytes, or None when there is none."""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)

    def starting_over(self, reason: str, detail: Any = None, stacklevel: int = 4) -> None:
        """Warn that this checkpoint is not used (``reason``: ``"unreadable"``, ``"another run's"``) and that the
        work starts over."""
        import warnings

        more = f" ({detail})" if detail is not None else ""
        warnings.warn(f"ignoring {reason} checkpoint {str(self.path)!r}{more}; starting over.", stacklevel=stacklevel)


def archive_checksum(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> str:
    """SHA-256 over the arrays (dtype, shape, bytes) and the metadata without its ``sha256`` entry."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(key.encode())
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    h.update(json.dumps({k: v for k, v in meta.items() if k != "sha256"}, sort_keys=True).encode())
    return h.hexdigest()


def write_archive(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Path:
    """One zip file: ``meta.json`` (with the checksum) and one ``.npy`` member per array, written atomically."""
    meta = {**meta, "sha256": archive_checksum(arrays, meta)}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("meta.json", json.dumps(meta, indent=1, sort_keys=True))
        for key, arr in arrays.items():
            b = io.BytesIO()
            np.save(b, arr, allow_pickle=False)
            zf.writestr(f"{key}.npy", b.getvalue())
    return atomic_write_bytes(path, buf.getvalue())


def read_archive(path: Path, keys: Sequence[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The metadata and arrays of an archive written by :func:`write_archive`; any damage raises CorruptFileError.

    The checksum is not verified here: the caller checks the format first, to give the clearer message.
    """
    label = repr(str(path))
    try:
        with zipfile.ZipFile(path) as zf:
            meta = json.loads(zf.read("meta.json").decode("utf-8"))
            arrays = {k: np.load(io.BytesIO(zf.read(f"{k}.npy")), allow_pickle=False) for k in keys}
    except READ_ERRORS as exc:
        raise CorruptFileError(
            f"{label} is not a readable CBO file (truncated, damaged or not written by CBO): {exc}"
        ) from exc
    if not isinstance(meta, dict):
        raise CorruptFileError(f"{label} has metadata of type {type(meta).__name__}; expected a JSON object.")
    return meta, arrays


# --------------------------------------------------------------------------------------- output paths
def nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (the folder a new path would be created in)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_creatable(path: Path, what: str) -> None:
    """OutputPathError unless ``path`` (a file or folder, maybe with missing parents) can be created or written."""
    path = Path(os.path.abspath(path))
    if path.exists():
        if not os.access(path, os.W_OK):
            raise OutputPathError(
                f"cannot write the {what} {str(path)!r}: permission denied on it; choose a writable place."
            )
        return
    base = nearest_existing(path.parent)
    if not base.is_dir():
        raise OutputPathError(f"cannot write the {what} {str(path)!r}: {str(base)!r} is a file, not a folder.")
    if not os.access(base, os.W_OK):
        raise OutputPathError(
            f"cannot write the {what} {str(path)!r}: permission denied on {str(base)!r}; choose a writable place."
        )


def check_output_file(path: str | os.PathLike, what: str = "output file", *, make_parents: bool = False) -> Path:
    """Fail now, not after the work, when the file ``path`` cannot be written.

    Args:
        make_parents: the writer creates missing folders (then only their nearest existing folder must be
            writable).

    Raises:
        OutputPathError: ``path`` is a folder, its folder does not exist (unless ``make_parents``) or lies under a
            file, or it cannot be written.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise OutputPathError(f"the {what} {str(path)!r} is a folder; give a file name, e.g. {str(path / 'out')!r}.")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(f"cannot write the {what} {str(path)!r}: the file is read-only.")
    check_creatable(path, what)
    folder = path.parent
    if not make_parents and not folder.is_dir():
        raise OutputPathError(
            f"cannot write the {what} {str(path)!r}: the folder {str(folder)!r} does not exist; create it first."
        )
    return path


def written_by_cbo(folder: Path) -> list[str] | None:
    """The files CBO recorded writing into ``folder`` (None when it holds no readable record)."""
    try:
        data = json.loads((folder / WRITTEN_MARKER).read_text())
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return files


def saved_by_earlier_cbo(folder: Path) -> bool:
    """True for a model folder an earlier CBO saved before it kept a record (its config says it is CBO's)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and PRUNED_FORMAT_KEY in config


def check_output_dir(path: str | os.PathLike, *, overwrite: bool = False, what: str = "output folder") -> Path:
    """Fail now, not after the work, when the folder ``path`` cannot receive CBO's output.

    A missing or empty folder, or one CBO wrote before (it holds ``.cbo-written.json``, or it is a pruned model
    folder an earlier version saved), is fine; a non-empty
    folder of other files is refused unless ``overwrite`` (even then only files of the same names are replaced).

    Raises:
        OutputPathError: ``path`` is a file, cannot be written, or is a non-empty folder CBO did not write.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"the {what} {str(path)!r} is a file; give a folder (a new or empty one).")
    check_creatable(path, what)
    if path.is_dir() and not overwrite and written_by_cbo(path) is None and not saved_by_earlier_cbo(path):
        entries = sorted(p.name for p in path.iterdir())
        if entries:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise OutputPathError(
                f"the {what} {str(path)!r} is not empty ({shown}) and was not written by CBO; choose a new folder, "
                "or pass --overwrite (overwrite=True) to write into it (files of other names are kept)."
            )
    return path


@contextmanager
def output_folder(path: str | os.PathLike) -> Iterator[Path]:
    """A staging folder beside ``path`` to write into; when the block ends, its files move into ``path``.

    Files of the same names are replaced; files an earlier CBO write recorded and this one did not write again
    are removed (e.g. the shards of a larger model); every other file in ``path`` is kept. On an error or an
    interrupt the staging folder is removed and ``path`` is unchanged.

    Example:
        >>> with output_folder("out/pruned") as tmp:       # doctest: +SKIP
        ...     model.save_pretrained(tmp)
    """
    path = Path(path).expanduser()
    check_creatable(path, "output folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", suffix=".staging", dir=path.parent))
    try:
        yield staging
        path.mkdir(exist_ok=True)
        previous = written_by_cbo(path) or []
        new = sorted(
            str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file() and p.name != WRITTEN_MARKER
        )
        for rel in new:
            target = path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / rel, target)
        for rel in set(previous) - set(new):
            stale = path / rel
            if stale.is_file() and stale.resolve().is_relative_to(path.resolve()):
                stale.unlink()
        atomic_write_bytes(path / WRITTEN_MARKER, json.dumps({"files": new}, indent=1).encode())
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def record_written(folder: str | os.PathLike, paths: Sequence[str | os.PathLike]) -> None:
    """Add files CBO wrote straight into ``folder`` (plots, a report) to its record of the files it wrote, so that
    a later command may write there again without ``overwrite``."""
    folder = Path(folder)
    names = {os.path.relpath(p, folder) for p in paths}
    files = sorted(set(written_by_cbo(folder) or []) | names)
    atomic_write_bytes(folder / WRITTEN_MARKER, json.dumps({"files": files}, indent=1).encode())


@contextmanager
def output_lock(path: str | os.PathLike | None) -> Iterator[None]:
    """Hold the output folder or file ``path`` for this process while the block runs (nothing for None): a second
    CBO run writing the same output meanwhile is refused before its work, instead of both reporting success.

    The lock is a file ``.NAME.cbo-lock`` beside ``path`` holding the owner's process id; one whose process has
    ended (a crash, a kill) is taken over.

    Raises:
        OutputPathError: another running process holds ``path``.
    """
    if path is None:
        yield
        return
    path = Path(os.path.abspath(Path(path).expanduser()))
    lock = path.parent / f".{path.name}.cbo-lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = _lock_owner(lock)
            if owner is not None and _alive(owner):
                raise OutputPathError(
                    f"another CBO run (process {owner}) is writing {str(path)!r}; wait for it to finish or choose "
                    f"another output (if no such run exists, delete {str(lock)!r})."
                ) from None
            lock.unlink(missing_ok=True)  # its owner has ended
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        break
    else:
        raise OutputPathError(f"cannot lock the output {str(path)!r} ({str(lock)!r} keeps coming back).")
    try:
        yield
    finally:
        if _lock_owner(lock) == os.getpid():
            lock.unlink(missing_ok=True)


def _lock_owner(lock: Path) -> int | None:
    try:
        return int(lock.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
