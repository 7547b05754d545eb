"""``estimate_hessian``: the driver every estimator shares (gates, batches, checkpoints, cache, work accounting)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from cbo.checks import check_int
from cbo.errors import CorruptFileError, DataError, InvalidOptionError
from cbo.hessian.base import ESTIMATORS, Run
from cbo.hessian.checkpoint import Checkpoint, ensure_writable_dir
from cbo.measure.losses import check_loss
from cbo.model.fingerprint import cache_mismatch, model_fingerprint
from cbo.model.forward import input_device
from cbo.model.gates import Gates, resolve_blocks
from cbo.progress import progress_bar
from cbo.qubo.block_qubo import BlockQUBO

PARTIAL_SAVE_INTERVAL_S = 30.0


# --------------------------------------------------------------------------------------- identity
def as_windows(windows: Any, model: torch.nn.Module | None = None) -> torch.Tensor:
    """(B, T) int64 token windows from a tensor, array, nested list or ``TokenSplits`` (its calibration)."""
    from cbo.data.windows import check_windows

    if windows is None:
        raise DataError(
            "no calibration windows given; pass a (B, T) token tensor or cbo.data.windows.make_splits(...)."
        )
    if hasattr(windows, "calibration") and not isinstance(windows, torch.Tensor):
        windows = windows.calibration
    if not isinstance(windows, torch.Tensor):
        try:
            windows = torch.as_tensor(np.asarray(windows))
        except (TypeError, ValueError) as exc:
            raise DataError(f"calibration windows must be a (B, T) array of token ids: {exc}") from exc
    return check_windows(windows, model).cpu()


def tokens_hash(tokens: torch.Tensor) -> str:
    """The data hash of token windows (the one ``TokenSplits.info`` records)."""
    from cbo.data.windows import data_hash

    return data_hash(tokens.to(torch.int64))


def model_name(model: torch.nn.Module) -> str:
    cfg = getattr(model, "config", None)
    return str(getattr(cfg, "_name_or_path", "") or getattr(cfg, "model_type", "") or type(model).__name__)


def run_key(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


@contextmanager
def frozen_for_gates(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode and frozen weights for the run (gradients flow to the gates only); restored after."""
    was_training = model.training
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)
        model.train(was_training)


# --------------------------------------------------------------------------------------- driver
def estimate_hessian(
    model: torch.nn.Module,
    tokenizer: Any = None,
    windows: Any = None,
    *,
    estimator: str = "fisher",
    loss: str = "kl",
    granularity: str = "layer",
    blocks: Any = None,
    batch_size: int = 8,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    checkpoint: str | Path | None = None,
    progress: bool = True,
    callback: Callable[[int, dict[str, np.ndarray]], None] | None = None,
    **options: Any,
) -> BlockQUBO:
    """Estimate the block-removal QUBO (H, g) of a model on calibration text.

    Args:
        model: a Hugging Face causal LM (any dtype/device; accumulation is float32/float64).
        tokenizer: optional, recorded in the metadata.
        windows: (B, T) token windows or a ``TokenSplits`` (its calibration split is used).
        estimator: a registered name (``cbo.hessian.names()``): ``fisher``, ``singles``, ``pairwise``, ...
        loss: ``"kl"`` (KL to the original) or ``"ce"`` (next-token cross-entropy).
        granularity: ``"layer"`` (decoder layers) or ``"sublayer"`` (attention/MLP halves).
        blocks: an explicit block list (overrides ``granularity``).
        batch_size: sequences per forward pass.
        seed: seeds label sampling (the result is reproducible).
        cache_dir: folder for finished QUBOs keyed by model, data, estimator, loss and options.
        checkpoint: folder for the per-batch checkpoint (defaults to ``cache_dir``).
        progress: show a progress bar.
        callback: called as ``callback(batch_index, state)`` after each batch's checkpoint.
        **options: estimator options (see each estimator's ``Options``).

    Returns:
        A BlockQUBO with ``E(x) = ½xᵀHx − g·x`` and metadata (model, data hash, loss, estimator, tokens, and the
        work: ``forward_passes``, ``backward_passes``, ``fpe`` (forward-pass equivalents) relative to one full forward
        over the calibration windows).

    Example:
        >>> q = estimate_hessian(model, tok, splits, estimator="fisher", loss="kl")  # doctest: +SKIP
        >>> cbo.solve(q, remove=8, k=10)                                              # doctest: +SKIP
    """
    cls = ESTIMATORS.get(estimator)
    check_loss(loss)
    if loss not in cls.losses:
        raise InvalidOptionError(f"estimator {cls.name!r} supports loss {list(cls.losses)}, not {loss!r}.")
    check_int("batch_size", batch_size, 1)
    opts = ESTIMATORS.make_options(cls, options)
    tokens = as_windows(windows, model)
    blocks = resolve_blocks(model, blocks if blocks is not None else granularity)
    granularity = "layer" if all(b.part == "layer" for b in blocks) else "sublayer"
    device = input_device(model)
    n_seq, seq_len = tokens.shape
    n_batches = (n_seq + batch_size - 1) // batch_size
    options_json = dataclasses.asdict(opts)
    identity = {
        "model": model_fingerprint(model),
        "data": tokens_hash(tokens),
        "estimator": cls.name,
        "loss": loss,
        "blocks": [b.name for b in blocks],
        "options": options_json,
        "batch_size": batch_size,
        "seed": seed,
    }
    if cls.measures:
        from cbo.measure.replay import VERSION

        identity["measurer"] = VERSION
    key = run_key(identity)
    cache_path = None
    if cache_dir is not None:
        cache_path = ensure_writable_dir(cache_dir, "cache") / f"hessian-{cls.name}-{loss}-{key[:24]}.cboq"
        check_cache_file(cache_path)
        cached = cached_qubo(cache_path, identity, key)
        if cached is not None:
            return cached
    ckpt_dir = checkpoint if checkpoint is not None else cache_dir
    ckpt = Checkpoint(ckpt_dir, key) if ckpt_dir is not None else None
    info = {"estimator": cls.name, "loss": loss, "n_batches": n_batches}

    t0 = time.perf_counter()
    with frozen_for_gates(model), Gates(model, blocks, requires_grad=cls.needs_grad) as gates:
        run = Run(model, blocks, gates, loss, seed, seq_len, n_seq, n_batches, device, batch_size)
        est = cls(run, opts)
        state = est.init_state()
        # work so far: forward passes, backward passes, forward-pass equivalents (FPE)
        state["_work"] = np.zeros(3)
        start = 0
        if ckpt is not None:
            loaded = ckpt.load()
            if loaded is not None and same_layout(loaded[0], state, ckpt.path):
                state, start = loaded
            run.save_partial = PartialSaver(ckpt, run, info)
        units = est.units_per_batch()
        bar = progress_bar(progress, total=n_batches * units, initial=start * units, desc=f"hessian[{cls.name}/{loss}]")
        try:
            for b in range(start, n_batches):
                batch = tokens[b * batch_size : (b + 1) * batch_size].to(device)
                run.passes, run.fpe = {"forward": 0, "backward": 0}, 0.0
                est.accumulate(state, b, batch, bar.update if bar is not None else _noop)
                for name, arr in state.items():
                    run.check_finite(torch.from_numpy(np.asarray(arr, dtype=np.float64)), b, f"accumulator {name!r}")
                state["_work"] = state["_work"] + batch_work(run)
                if ckpt is not None:
                    ckpt.save(state, b + 1, info)
                if callback is not None:
                    callback(b, state)
        finally:
            if bar is not None:
                bar.close()
        # estimators that measure more removal sets once every batch is in (``fit``, ``trust``) do it here
        run.passes, run.fpe = {"forward": 0, "backward": 0}, 0.0
        H, g, extra = est.finalize(state)
        work = state["_work"] + batch_work(run)
    wall = time.perf_counter() - t0

    metadata = {
        "model": model_name(model),
        "model_fingerprint": identity["model"],
        "model_class": type(model).__name__,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "tokenizer": str(getattr(tokenizer, "name_or_path", "")) if tokenizer is not None else None,
        "data_hash": identity["data"],
        "n_sequences": int(n_seq),
        "seq_len": int(seq_len),
        "n_tokens": int(n_seq * seq_len),
        "loss": loss,
        "estimator": cls.name,
        "granularity": granularity,
        "options": options_json,
        "batch_size": batch_size,
        "seed": seed,
        "cache_key": key,
        "wall_time_s": round(wall, 3),
        "resumed_from_batch": start,
        "energy": "E(x) = 0.5 x^T H x - g.x, x_i = 1 removes block i",
        **extra,
        "forward_passes": int(work[0]),
        "backward_passes": int(work[1]),
        "fpe": round(float(work[2]), 2),
    }
    qubo = BlockQUBO(
        H,
        g,
        names=[b.name for b in blocks],
        kinds=[b.kind for b in blocks],
        sizes=[int(b.n_params) for b in blocks],
        metadata=metadata,
        symmetrize=True,
    )
    if cache_path is not None:
        qubo.save(cache_path)
    if ckpt is not None:
        ckpt.delete()
    return qubo


def check_cache_file(path: Path) -> None:
    """CacheDirError before any work when something other than a file (a folder) sits at a cache file's path: the
    finished result could not be saved there."""
    from cbo.model.loading import CacheDirError

    if path.exists() and not path.is_file():
        raise CacheDirError(
            f"{str(path)!r} is a folder (or another non-file), so the Hessian computed for this run could not be "
            "cached there. Move or delete it, or run without the cache (--no-cache; cache_dir=None in Python)."
        )


def cached_qubo(path: Path, identity: dict[str, Any], key: str) -> BlockQUBO | None:
    """The QUBO cached at ``path`` for this run, or None (no file; or a damaged file, or one whose record says it
    is another run's, each with a warning naming the file: it is recomputed and replaced, never used)."""
    if not path.exists():
        return None
    try:
        qubo = BlockQUBO.load(path)
    except CorruptFileError as exc:
        warnings.warn(f"ignoring the damaged cached Hessian {str(path)!r} ({exc}); recomputing it.", stacklevel=3)
        return None
    why = cache_mismatch(qubo.metadata, qubo.names, identity, key)
    if why is not None:
        warnings.warn(
            f"ignoring the cached Hessian {str(path)!r}: it is not this run's result ({why}); recomputing it.",
            stacklevel=3,
        )
        return None
    if "forward_equivalents" in qubo.metadata:  # cached before the cost unit had one name (FPE)
        qubo.metadata.setdefault("fpe", qubo.metadata.pop("forward_equivalents"))
    return qubo


def same_layout(loaded: dict[str, np.ndarray], state: dict[str, np.ndarray], path: Path) -> bool:
    """True when a checkpoint's accumulators have the names and shapes of this run's (else a warning)."""
    same = set(loaded) == set(state) and all(np.shape(loaded[k]) == np.shape(state[k]) for k in state)
    if not same:
        warnings.warn(f"checkpoint {str(path)!r} does not fit this run's accumulators; starting over.", stacklevel=3)
    return same


def batch_work(run: Run) -> np.ndarray:
    """The run's counters of the current batch as ``[forward passes, backward passes, FPE]``."""
    return np.array([run.passes["forward"], run.passes["backward"], run.fpe], dtype=np.float64)


class PartialSaver:
    """Checkpoints an unfinished batch (its state says how far it got), at most every PARTIAL_SAVE_INTERVAL_S."""

    def __init__(self, ckpt: Checkpoint, run: Run, info: dict[str, Any]) -> None:
        self.ckpt, self.run, self.info = ckpt, run, info
        self.last = time.perf_counter()

    def __call__(self, state: dict[str, np.ndarray], batch_index: int) -> None:
        now = time.perf_counter()
        if now - self.last < PARTIAL_SAVE_INTERVAL_S:
            return
        work = state["_work"] + batch_work(self.run)
        self.ckpt.save({**state, "_work": work}, batch_index, {**self.info, "partial_batch": batch_index})
        self.last = now


def _noop() -> None:
    return None
