"""Model names and loading: ``"smollm2-135m"`` (the default, installed by ``make setup``), local folders, hub ids.

Example:
    >>> model, tokenizer = load_model("smollm2-135m")   # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from cbo.errors import CBOError, ModelError

DEFAULT_MODEL = "smollm2-135m"
SETUP_HINT = "run `make setup` (or `cbo setup`) to install the default model and text"


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
            "Point CBO_HOME at a writable folder, e.g. `export CBO_HOME=$HOME/.cache/cbo`."
        ) from exc
    return path


def default_model_dir() -> Path:
    """Where the converted default model lives: ``CBO_HOME/models/smollm2-135m``."""
    return cbo_home() / "models" / DEFAULT_MODEL


def is_model_dir(path: Path) -> bool:
    """True when ``path`` is a Hugging Face model folder (has a config.json)."""
    return path.is_dir() and (path / "config.json").is_file()


def resolve_model(name_or_path: str | os.PathLike) -> str:
    """Where to load ``name_or_path`` from.

    ``"smollm2-135m"`` -> the converted local folder; an existing local folder -> itself; anything else that
    looks like a hub id (``org/name``) -> returned unchanged.

    Raises:
        ModelError: the default model is not installed, or a local path does not hold a model.
    """
    name = os.fspath(name_or_path)
    if name == DEFAULT_MODEL:
        folder = default_model_dir()
        if not is_model_dir(folder):
            raise ModelError(f"the default model {DEFAULT_MODEL!r} is not installed in {folder}; {SETUP_HINT}")
        return str(folder)
    path = Path(name).expanduser()
    if path.exists():
        if is_model_dir(path):
            return str(path)
        raise ModelError(f"{name!r} exists but is not a Hugging Face model folder (no config.json)")
    looks_like_path = name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1)
    if looks_like_path or not name:
        raise ModelError(
            f"model folder {name!r} does not exist. Give {DEFAULT_MODEL!r}, a local Hugging Face folder, "
            "or a hub id such as 'HuggingFaceTB/SmolLM2-135M-Instruct'"
        )
    return name


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
    name_or_path: str | os.PathLike = DEFAULT_MODEL, *, dtype: Any = None, device: Any = "cpu"
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer, in eval mode.

    Args:
        name_or_path: ``"smollm2-135m"``, a local Hugging Face folder, or a hub id.
        dtype: torch dtype of the weights (default float32).
        device: where to put the model.

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
        if _records_surgery(source):
            model = _load_pruned(source, dtype)
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, KeyError) as exc:
        where = "local folder" if Path(source).exists() else "hub id (needs internet or a local hub cache)"
        raise ModelError(f"cannot load model {os.fspath(name_or_path)!r} from {source!r} ({where}): {exc}") from exc
    model.to(device)
    model.eval()
    return model, tokenizer
