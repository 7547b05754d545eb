"""What every pipeline starts from: the model (a name, a folder or a loaded model), its token windows cut by
document, and the cache folders."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cbo.errors import DataError, ModelError


def model_and_tokenizer(
    model: Any, tokenizer: Any = None, *, dtype: Any = None, device: Any = "cpu", quiet: bool = False
) -> tuple:
    """``(model, tokenizer, label)``: a name or folder loaded with :func:`cbo.model.loading.load_model` (its tokenizer
    unless one is given; ``quiet``: without transformers' loading bar), or a loaded model as it is; ``label``
    names the model in reports."""
    if isinstance(model, (str, os.PathLike)):
        from cbo.model.loading import load_model

        label = str(model)
        model, loaded = load_model(model, dtype=dtype, device=device, quiet=quiet)
        return model, tokenizer if tokenizer is not None else loaded, label
    if not hasattr(model, "forward"):
        raise ModelError(f"model must be a name, a folder or a loaded causal LM, got {type(model).__name__}.")
    label = str(getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)
    return model, tokenizer, label


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
