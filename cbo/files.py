"""Files the project writes: atomic writes with unique temporary names, checksummed zip archives, and output
paths checked before the work that fills them.

Two processes that save the same path never share a temporary file (each write gets its own name in the target
folder, then one atomic rename), and a reader sees either the old file or the new one, never half of one.

Outputs: :func:`check_output_file` and :func:`check_output_dir` fail before any long work on a path that cannot
be written (tried with a real temporary file: ``os.access`` says yes to root and on read-only mounts), and refuse a
non-empty folder that is no earlier CBO output unless ``overwrite``; :func:`check_apart` refuses an output that is,
holds or lies inside an input; :func:`output_lock` holds an output for one process; :func:`output_folder` fills a
folder through a staging folder beside it and records the files it wrote (and whether the folder is a command's
output or an installed model) in ``.cbo-written.json``, so a later write replaces and removes only those files.
Every file written gets the mode the umask gives.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
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
OUTPUT_KIND = "output"  # a record's kind: a command's result (written again without overwrite)
MODEL_KIND = "model"  # a record's kind: a model `cbo setup` / `cbo convert` wrote (an input, not an earlier output)
CONVERTED_MANIFEST = "cbo-manifest.json"  # what `cbo convert` writes beside a converted model

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


def file_mode() -> int:
    """The mode ``open`` gives a new file in this process: 0o666 less the umask (0o644 under the usual 022)."""
    try:
        with open("/proc/self/status") as status:  # Linux: read without changing the umask
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a uniquely named temporary file in the same folder and a rename; the
    file gets the mode the umask gives (a temporary file is created 0600)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, file_mode())
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


def try_writing_in(folder: Path, output: Path, what: str) -> None:
    """Create a temporary file in ``folder`` and remove it at once; OutputPathError naming ``output`` when that
    fails. ``os.access`` says yes to root and on read-only mounts (``/sys``, ``/proc``): only a write tells."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".cbo-write-test-")
    except OSError as exc:
        raise OutputPathError(
            f"cannot write the {what} {str(output)!r}: nothing can be written in {str(folder)!r} "
            f"({exc.strerror or exc}); choose a writable place."
        ) from exc
    os.close(fd)
    os.unlink(tmp)


def check_creatable(path: Path, what: str) -> None:
    """OutputPathError unless ``path`` (a file or folder, maybe with missing parents) can be created or written:
    a file is tried in the folder that will hold it (and, for an existing folder, in that folder too)."""
    path = Path(os.path.abspath(path))
    if path.exists():
        if not os.access(path, os.W_OK):
            raise OutputPathError(
                f"cannot write the {what} {str(path)!r}: permission denied on it; choose a writable place."
            )
        if path.is_dir():
            try_writing_in(path, path, what)
        try_writing_in(path.parent, path, what)  # atomic writes, staging folders and locks go beside the output
        return
    base = nearest_existing(path.parent)
    if not base.is_dir():
        raise OutputPathError(f"cannot write the {what} {str(path)!r}: {str(base)!r} is a file, not a folder.")
    if not os.access(base, os.W_OK):
        raise OutputPathError(
            f"cannot write the {what} {str(path)!r}: permission denied on {str(base)!r}; choose a writable place."
        )
    try_writing_in(base, path, what)


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


def check_apart(output: str | os.PathLike, inputs: Sequence[str | os.PathLike], what: str = "output") -> None:
    """OutputPathError when ``output`` is, holds or lies inside one of ``inputs`` (model folders, GGUF or QUBO
    files): writing it would change what the command reads, so it is refused with or without ``overwrite``."""
    out = Path(output).expanduser().resolve()
    for source in inputs:
        src = Path(source).expanduser().resolve()
        if out == src:
            relation = "is"
        elif out in src.parents:
            relation = "holds"
        elif src in out.parents:
            relation = "lies inside"
        else:
            continue
        raise OutputPathError(
            f"the {what} {str(output)!r} {relation} the input {str(source)!r}: CBO never writes over what it reads "
            "(not even with --overwrite); choose an output outside it."
        )


def written_record(folder: Path) -> dict[str, Any] | None:
    """The record ``.cbo-written.json`` of ``folder`` (None when it holds no readable one)."""
    try:
        data = json.loads((folder / WRITTEN_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    files = data.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return data


def written_by_cbo(folder: Path) -> list[str] | None:
    """The files CBO recorded writing into ``folder`` (None when it holds no readable record)."""
    record = written_record(folder)
    return None if record is None else record["files"]


def saved_by_earlier_cbo(folder: Path) -> bool:
    """True for a model folder an earlier CBO saved before it kept a record (its config says it is CBO's)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and PRUNED_FORMAT_KEY in config


def previous_output(folder: Path) -> bool:
    """True when ``folder`` holds a result an earlier CBO command wrote (its record says so, or it is a pruned
    model an earlier version saved without a record): it may be written again without ``overwrite``.

    A model ``cbo setup`` installed or ``cbo convert`` wrote is not one: it is something commands read.
    """
    record = written_record(folder)
    if record is None:
        return saved_by_earlier_cbo(folder)
    kind = record.get("kind")
    if kind is None:  # a record of a version that did not say: a converted model has its manifest
        return not (folder / CONVERTED_MANIFEST).is_file()
    return kind == OUTPUT_KIND


def check_output_dir(path: str | os.PathLike, *, overwrite: bool = False, what: str = "output folder") -> Path:
    """Fail now, not after the work, when the folder ``path`` cannot receive CBO's output.

    A missing or empty folder, or an earlier CBO output (:func:`previous_output`) is fine; a non-empty folder of
    other files (an installed or converted model included) is refused unless ``overwrite`` (even then only files
    of the same names are replaced).

    Raises:
        OutputPathError: ``path`` is a file, cannot be written, or is a non-empty folder that is no CBO output.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"the {what} {str(path)!r} is a file; give a folder (a new or empty one).")
    check_creatable(path, what)
    if path.is_dir() and not overwrite and not previous_output(path):
        entries = sorted(p.name for p in path.iterdir())
        if entries:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            whose = (
                "is a model `cbo setup` or `cbo convert` wrote" if written_record(path) else "was not written by CBO"
            )
            raise OutputPathError(
                f"the {what} {str(path)!r} is not empty ({shown}) and {whose}; choose a new folder, "
                "or pass --overwrite (overwrite=True) to write into it (files of other names are kept)."
            )
    return path


def is_stale_staging(name: str, output: str) -> bool:
    """True for the name of a staging folder of the output ``output`` (``.NAME.xxxxxxxx.staging``, or an earlier
    version's ``.NAME-xxxxxxxx.staging``); the eight random characters never hold a dot or a dash, so the staging
    folder of another output (``NAME.v2``, ``NAME-v2``) never matches."""
    return re.fullmatch(rf"\.{re.escape(output)}[.-][a-z0-9_]{{8}}\.staging", name) is not None


@contextmanager
def output_folder(path: str | os.PathLike, *, kind: str = OUTPUT_KIND) -> Iterator[Path]:
    """A staging folder beside ``path`` to write into; when the block ends, its files move into ``path``.

    Files of the same names are replaced; files an earlier CBO write recorded and this one did not write again
    are removed (e.g. the shards of a larger model, the QUBO of an earlier depth run); every other file in
    ``path`` is kept. Every file written is listed in ``.cbo-written.json`` and gets the mode the umask gives. On
    an error or an interrupt the staging folder is removed and ``path`` is unchanged. ``path`` is held
    (:func:`output_lock`) meanwhile, and staging folders that runs which ended left beside it are removed.

    Args:
        kind: what the record says the folder is: ``"output"`` (a command's result, written again without
            ``overwrite``) or ``"model"`` (a model ``cbo setup`` / ``cbo convert`` wrote: an input of commands).

    Example:
        >>> with output_folder("out/pruned") as tmp:       # doctest: +SKIP
        ...     model.save_pretrained(tmp)
    """
    path = Path(path).expanduser()
    check_creatable(path, "output folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(path, reenter=True):
        for old in path.parent.iterdir():  # no other run writes path now: these are left by runs that ended
            if old.is_dir() and is_stale_staging(old.name, path.name):
                shutil.rmtree(old, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".staging", dir=path.parent))
        try:
            yield staging
            path.mkdir(exist_ok=True)
            previous = written_by_cbo(path) or []
            new = sorted(
                str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file() and p.name != WRITTEN_MARKER
            )
            mode = file_mode()
            for rel in new:
                target = path / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(staging / rel, mode)  # writers that go through a temporary file leave it 0600
                os.replace(staging / rel, target)
            for rel in set(previous) - set(new):
                stale = path / rel
                if stale.is_file() and stale.resolve().is_relative_to(path.resolve()):
                    stale.unlink()
            record = {"files": new, "kind": kind}
            atomic_write_bytes(path / WRITTEN_MARKER, json.dumps(record, indent=1).encode())
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def lock_file(path: Path) -> Path:
    """The lock of the output ``path``: ``.NAME.cbo-lock`` beside it."""
    return path.parent / f".{path.name}.cbo-lock"


@contextmanager
def output_lock(path: str | os.PathLike | None, *, reenter: bool = False) -> Iterator[None]:
    """Hold the output folder or file ``path`` for this process while the block runs (nothing for None): a second
    CBO run writing the same output meanwhile is refused before its work, instead of both reporting success.

    The lock is a file ``.NAME.cbo-lock`` beside ``path`` holding the owner's process id; one whose process has
    ended (a crash, a kill) is taken over.

    Args:
        reenter: a lock this process holds already is fine (the block then neither takes nor releases it): what
            the writer of a folder passes, since the command that calls it holds the folder from its start.

    Raises:
        OutputPathError: another running process holds ``path``, or the lock cannot be written there.
    """
    if path is None:
        yield
        return
    path = Path(os.path.abspath(Path(path).expanduser()))
    lock = lock_file(path)
    if reenter and lock_owner(lock) == os.getpid():
        yield
        return
    created = missing_folders(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        taken = take_lock(lock, path)
    except OSError as exc:
        remove_if_empty(created)
        if isinstance(exc, OutputPathError):
            raise
        raise OutputPathError(
            f"cannot write the output {str(path)!r}: its lock {str(lock)!r} cannot be created "
            f"({exc.strerror or exc}); choose a writable place."
        ) from exc
    if not taken:
        remove_if_empty(created)
        raise OutputPathError(f"cannot lock the output {str(path)!r} ({str(lock)!r} keeps coming back).")
    try:
        yield
    finally:
        if lock_owner(lock) == os.getpid():
            lock.unlink(missing_ok=True)
        remove_if_empty(created)  # a run that wrote nothing leaves no empty folders behind


def missing_folders(folder: Path) -> list[Path]:
    """The folders that creating ``folder`` would create, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def remove_if_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty; stop at the first that is not."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def take_lock(lock: Path, path: Path) -> bool:
    """Create ``lock`` holding this process's id (taking over one whose process ended); False when it keeps
    coming back. OutputPathError when a running process holds it."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            owner = lock_owner(lock)
            if owner is not None and process_alive(owner):
                raise OutputPathError(
                    f"another CBO run (process {owner}) is writing {str(path)!r}; wait for it to finish or choose "
                    f"another output (if no such run exists, delete {str(lock)!r})."
                ) from None
            lock.unlink(missing_ok=True)  # its owner has ended
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def lock_owner(lock: Path) -> int | None:
    """The process id a lock file holds (None when it is missing or unreadable)."""
    try:
        return int(lock.read_text().strip())
    except (OSError, ValueError):
        return None


def process_alive(pid: int) -> bool:
    """True while the process ``pid`` runs (someone else's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
