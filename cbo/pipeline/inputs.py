"""What every pipeline starts from: the model (a name, a folder or a loaded model), its token windows cut by
document, and the cache folders."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cbo.errors import DataError, ModelError

DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")


def check_run_options(
    *,
    seq_len: Any,
    n_calibration: Any,
    n_validation: Any = 0,
    batch_size: Any,
    seed: Any,
    dtype: Any = None,
    device: Any = "cpu",
    splits: Any = None,
) -> tuple[Any, Any]:
    """The numeric options of a pipeline checked before any loading (InvalidOptionError naming the option and its
    range); returns ``(dtype, device)`` resolved: a torch dtype (or None) and a device that exists here."""
    from cbo.checks import check_int, check_seed

    if splits is None:  # the window options only matter when the text is cut here
        check_int("seq_len (tokens per window, --seq-len)", seq_len, lo=2)
        check_int("n_calibration (calibration windows, --n-calibration)", n_calibration, lo=1)
        check_int("n_validation (validation windows, --n-validation)", n_validation, lo=0)
    check_int("batch_size (--batch-size)", batch_size, lo=1)
    check_seed("seed", seed)
    return resolve_dtype(dtype), check_device(device)


def resolve_dtype(dtype: Any) -> Any:
    """None, a torch dtype, or one of :data:`DTYPE_NAMES` (``"torch.float16"`` too) as a torch dtype."""
    if dtype is None:
        return None
    import torch

    from cbo.checks import check_choice

    if isinstance(dtype, torch.dtype):
        return dtype
    name = dtype.removeprefix("torch.") if isinstance(dtype, str) else dtype
    check_choice("dtype (the weights' type)", name, DTYPE_NAMES)
    return getattr(torch, name)


def check_device(device: Any) -> Any:
    """``device`` when torch can place a model there on this machine, else InvalidOptionError saying what exists."""
    import torch

    from cbo.checks import describe
    from cbo.errors import InvalidOptionError

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise InvalidOptionError(f"device {describe(device)} is not a torch device ('cpu', 'cuda', 'cuda:0').") from exc
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InvalidOptionError(f"device {str(device)!r}: this machine has no CUDA GPU; use device='cpu'.")
        if dev.index is not None and dev.index >= count:
            raise InvalidOptionError(
                f"device {str(device)!r}: this machine has {count} CUDA GPU(s), cuda:0..cuda:{count - 1}."
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise InvalidOptionError(f"device {str(device)!r}: MPS is not available here; use device='cpu'.")
    return device


def model_and_tokenizer(
    model: Any, tokenizer: Any = None, *, dtype: Any = None, device: Any = "cpu", quiet: bool = False
) -> tuple:
    """``(model, tokenizer, label)``: a name or folder loaded with :func:`cbo.model.loading.load_model` (its tokenizer
    unless one is given; ``quiet``: without transformers' loading bar), or a loaded model as it is; ``label``
    names the model in reports."""
    tokenizer = resolve_tokenizer(tokenizer)
    if isinstance(model, (str, os.PathLike)):
        from cbo.model.loading import load_model

        label = str(model)
        model, loaded = load_model(model, dtype=dtype, device=device, quiet=quiet)
        return model, tokenizer if tokenizer is not None else loaded, label
    if not hasattr(model, "forward"):
        raise ModelError(f"model must be a name, a folder or a loaded causal LM, got {type(model).__name__}.")
    label = str(getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)
    return model, tokenizer, label


def resolve_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer given as a model name or folder loaded from there (a loaded tokenizer or None as it is).

    Raises:
        DataError: a string that is no model name or folder (a text passed as the tokenizer, a missing folder),
            or a folder without a tokenizer; the string is shown shortened, never whole.
    """
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    from cbo.data.windows import short_repr
    from cbo.errors import CBOError
    from cbo.extras import require
    from cbo.model.loading import resolve_model

    name = os.fspath(tokenizer)
    usage = "pass a loaded tokenizer, or the name or folder of the model whose tokenizer to load"
    if not name.strip() or len(name) > 1000 or any(c in name for c in "\n\r\t"):
        raise DataError(f"tokenizer={short_repr(name)} is not a model name or folder; {usage}.")
    try:
        source = resolve_model(name)
        transformers = require("transformers", "loading a tokenizer")
        return transformers.AutoTokenizer.from_pretrained(source)
    except (CBOError, OSError, ValueError, KeyError) as exc:
        raise DataError(f"cannot load a tokenizer from tokenizer={short_repr(name)} ({exc}); {usage}.") from exc


def token_splits(
    splits: Any,
    tokenizer: Any,
    text: Any,
    *,
    model: Any,
    seq_len: int,
    n_calibration: int,
    n_validation: int,
    n_test: int,
    seed: int,
    who: str = "pruning",
) -> Any:
    """``splits`` when given, else the text cut into calibration / validation / test windows by document (``who``
    names the caller in the error raised without a tokenizer)."""
    if splits is not None:
        return splits
    if tokenizer is None:
        raise DataError(
            f"{who} needs a tokenizer to cut the text into windows; pass tokenizer= or splits=TokenSplits(...)."
        )
    from cbo.data.windows import make_splits

    return make_splits(
        tokenizer,
        text,
        seq_len=seq_len,
        n_calibration=n_calibration,
        n_validation=n_validation,
        n_test=n_test,
        seed=seed,
        model=model,
    )


def cache_dirs(cache_dir: str | Path | bool | None) -> tuple[Path | None, Path | None]:
    """(Hessian cache, measurement cache): True = ``CBO_HOME/cache/{hessian,measured}``; a folder holds the
    Hessians and a ``measured`` subfolder; None or False: no cache."""
    if cache_dir is True:
        from cbo.model.loading import cbo_home

        root = cbo_home() / "cache"
        return root / "hessian", root / "measured"
    if not cache_dir:
        return None, None
    return Path(cache_dir), Path(cache_dir) / "measured"
