"""The estimator interface, the registry, and ``estimate_hessian`` (the driver every estimator shares).

An estimator is a small class with an explicit lifecycle: ``init_state`` (float64 accumulators),
``accumulate`` (one calibration batch, with the gates already attached), ``finalize`` (H, g and
metadata). The driver owns everything else: block discovery, gates (always removed), the progress
bar, the per-batch checkpoint, finiteness checks that name the batch, and the on-disk cache. A new
estimator is one module in ``cbo/hessian/`` that defines a class decorated with :func:`register`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

import numpy as np
import torch

from cbo.errors import CBOError, CorruptFileError, DataError
from cbo.hessian.checkpoint import Checkpoint, ensure_writable_dir
from cbo.hessian.fingerprint import model_fingerprint
from cbo.hessian.gates import Gates, resolve_blocks
from cbo.hessian.losses import LOSSES, check_loss, model_logits
from cbo.qubo import BlockQUBO

_REGISTRY: dict[str, type[Estimator]] = {}


class UnknownEstimatorError(CBOError, KeyError):
    """No estimator is registered under that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass
class Run:
    """What an estimator sees of the run: the model with its gates, the loss, and the batching."""

    model: torch.nn.Module
    blocks: list
    gates: Gates
    loss: str
    seed: int
    seq_len: int
    n_sequences: int
    n_batches: int
    device: torch.device
    passes: dict[str, int] = field(default_factory=lambda: {"forward": 0, "backward": 0})
    # estimators whose batches are long (many passes each) call ``save_partial(state, batch_index)`` inside a
    # batch, with state that records how far the batch got; the driver checkpoints it at most every
    # PARTIAL_SAVE_INTERVAL_S seconds, and a resumed run re-enters that batch with that state
    save_partial: Callable[[dict[str, np.ndarray], int], None] = field(default=lambda state, batch_index: None)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of the gated model (counted as one forward pass)."""
        self.passes["forward"] += 1
        return model_logits(self.model, tokens)

    def count_backward(self, n: int = 1) -> None:
        self.passes["backward"] += n

    def check_finite(self, value: torch.Tensor | float, batch_index: int, what: str = "loss") -> None:
        """Raise DataError naming the batch when ``value`` holds NaN or inf."""
        t = torch.as_tensor(value)
        if not bool(torch.isfinite(t).all()):
            raise DataError(
                f"non-finite {what} in calibration batch {batch_index} (of {self.n_batches}): the model produced "
                "NaN/inf. Check the weights, use float32 or bfloat16 instead of float16, or drop that text."
            )

    def generator(self, *parts: int) -> torch.Generator:
        """A generator on the model's device seeded by the run seed and ``parts`` (batch, draw, ...)."""
        return seeded_generator(self.seed, *parts, device=self.device)


def seeded_generator(seed: int, *parts: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator whose seed is a hash of ``seed`` and ``parts``: independent of the batching history,
    so a resumed run draws the same labels as an uninterrupted one."""
    h = hashlib.sha256(json.dumps([int(seed), *[int(p) for p in parts]]).encode()).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(h[:8], "little") & ((1 << 63) - 1))
    return gen


class Estimator(ABC):
    """Base class of every Hessian estimator; subclasses register with :func:`register`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    cost: ClassVar[str] = ""  # passes per calibration batch, for users choosing an estimator
    losses: ClassVar[tuple[str, ...]] = LOSSES
    needs_grad: ClassVar[bool] = True

    @dataclass
    class Options:
        pass

    def __init__(self, run: Run, options: Any) -> None:
        self.run = run
        self.options = options

    @classmethod
    def make_options(cls, options: dict[str, Any]) -> Any:
        valid = [f.name for f in dataclasses.fields(cls.Options)]
        bad = sorted(set(options) - set(valid))
        if bad:
            raise CBOError(f"estimator {cls.name!r} has no option(s) {bad}; valid options: {valid or 'none'}.")
        opts = cls.Options(**options)
        check = getattr(opts, "validate", None)
        if check is not None:
            check()
        return opts

    def units_per_batch(self) -> int:
        """Progress-bar steps per batch (``accumulate`` calls ``tick`` that many times)."""
        return 1

    @abstractmethod
    def init_state(self) -> dict[str, np.ndarray]:
        """Zeroed float64 accumulators (saved in the checkpoint after each batch)."""

    @abstractmethod
    def accumulate(
        self, state: dict[str, np.ndarray], batch_index: int, tokens: torch.Tensor, tick: Callable[[], None]
    ) -> None:
        """Add one calibration batch to ``state`` in place; call ``tick()`` per progress unit."""

    @abstractmethod
    def finalize(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """(H, g, extra metadata) from the accumulated state."""


def register(cls: type[Estimator]) -> type[Estimator]:
    """Class decorator: add an estimator to the registry."""
    if not cls.name:
        raise CBOError(f"{cls.__name__} has no name.")
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtin() -> None:
    import cbo.hessian  # noqa: F401  (importing the package imports every estimator module)


def names() -> list[str]:
    """Registered estimator names."""
    _load_builtin()
    return sorted(_REGISTRY)


def get(name: str) -> type[Estimator]:
    """The estimator class registered under ``name``."""
    _load_builtin()
    if name not in _REGISTRY:
        raise UnknownEstimatorError(f"unknown estimator {name!r}; registered: {sorted(_REGISTRY)}.")
    return _REGISTRY[name]


def describe() -> dict[str, dict[str, str]]:
    """Every estimator with its description, cost and supported losses."""
    _load_builtin()
    return {
        n: {"description": c.description, "cost": c.cost, "losses": ", ".join(c.losses)}
        for n, c in sorted(_REGISTRY.items())
    }


# --------------------------------------------------------------------------------------- identity
def as_windows(windows: Any, model: torch.nn.Module | None = None) -> torch.Tensor:
    """(B, T) int64 token windows from a tensor, array, nested list or ``TokenSplits`` (its calibration)."""
    from cbo.data import check_windows

    if windows is None:
        raise DataError("no calibration windows given; pass a (B, T) token tensor or cbo.data.make_splits(...).")
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
    from cbo.data import data_hash

    return data_hash(tokens.to(torch.int64))


def model_name(model: torch.nn.Module) -> str:
    cfg = getattr(model, "config", None)
    return str(getattr(cfg, "_name_or_path", "") or getattr(cfg, "model_type", "") or type(model).__name__)


def run_key(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


@contextmanager
def _model_for_gates(model: torch.nn.Module) -> Iterator[None]:
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
        estimator: a registered name (``cbo.hessian.names()``): ``fisher``, ``exact``, ``pairwise``, ...
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
        A BlockQUBO with ``E(x) = ½xᵀHx − g·x`` and metadata (model, data hash, loss, estimator, tokens).

    Example:
        >>> q = estimate_hessian(model, tok, splits, estimator="fisher", loss="kl")  # doctest: +SKIP
        >>> cbo.solve(q, remove=8, k=10)                                              # doctest: +SKIP
    """
    cls = get(estimator)
    check_loss(loss)
    if loss not in cls.losses:
        raise CBOError(f"estimator {estimator!r} supports loss {list(cls.losses)}, not {loss!r}.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise CBOError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
    opts = cls.make_options(options)
    tokens = as_windows(windows, model)
    blocks = resolve_blocks(model, blocks if blocks is not None else granularity)
    granularity = "layer" if all(b.kind == "layer" for b in blocks) else "sublayer"
    # the input device; parameters offloaded by accelerate sit on "meta" and are skipped
    device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    n_seq, seq_len = tokens.shape
    n_batches = (n_seq + batch_size - 1) // batch_size
    options_json = {k: v for k, v in dataclasses.asdict(opts).items()}
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
    key = run_key(identity)
    cache_path = None
    if cache_dir is not None:
        cache_path = ensure_writable_dir(cache_dir, "cache") / f"hessian-{cls.name}-{loss}-{key[:24]}.cboq"
        if cache_path.exists():
            try:
                return BlockQUBO.load(cache_path)
            except CorruptFileError:
                cache_path.unlink()
    ckpt_dir = checkpoint if checkpoint is not None else cache_dir
    ckpt = Checkpoint(ckpt_dir, key) if ckpt_dir is not None else None

    t0 = time.perf_counter()
    with _model_for_gates(model), Gates(model, blocks, requires_grad=cls.needs_grad) as gates:
        run = Run(model, blocks, gates, loss, seed, seq_len, n_seq, n_batches, device)
        est = cls(run, opts)
        state = est.init_state()
        state["_passes"] = np.zeros(2, dtype=np.int64)
        start = 0
        if ckpt is not None:
            loaded = ckpt.load()
            if loaded is not None and set(loaded[0]) == set(state):
                state, start = loaded
        if ckpt is not None:
            run.save_partial = _PartialSaver(ckpt, run, {"estimator": cls.name, "loss": loss, "n_batches": n_batches})
        units = est.units_per_batch()
        bar = _progress(progress, total=n_batches * units, initial=start * units, desc=f"hessian[{cls.name}/{loss}]")
        try:
            for b in range(start, n_batches):
                batch = tokens[b * batch_size : (b + 1) * batch_size].to(device)
                run.passes = {"forward": 0, "backward": 0}
                est.accumulate(state, b, batch, bar.update if bar is not None else _noop)
                for name, arr in state.items():
                    run.check_finite(torch.from_numpy(np.asarray(arr, dtype=np.float64)), b, f"accumulator {name!r}")
                state["_passes"] = state["_passes"] + np.array([run.passes["forward"], run.passes["backward"]])
                if ckpt is not None:
                    ckpt.save(state, b + 1, {"estimator": cls.name, "loss": loss, "n_batches": n_batches})
                if callback is not None:
                    callback(b, state)
        finally:
            if bar is not None:
                bar.close()
        H, g, extra = est.finalize(state)
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
        "forward_passes": int(state["_passes"][0]),
        "backward_passes": int(state["_passes"][1]),
        "wall_time_s": round(wall, 3),
        "resumed_from_batch": start,
        "energy": "E(x) = 0.5 x^T H x - g.x, x_i = 1 removes block i",
        **extra,
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


PARTIAL_SAVE_INTERVAL_S = 30.0


class _PartialSaver:
    """Checkpoints an unfinished batch (its state says how far it got), at most every PARTIAL_SAVE_INTERVAL_S."""

    def __init__(self, ckpt: Checkpoint, run: Run, info: dict[str, Any]) -> None:
        self.ckpt, self.run, self.info = ckpt, run, info
        self.last = time.perf_counter()

    def __call__(self, state: dict[str, np.ndarray], batch_index: int) -> None:
        now = time.perf_counter()
        if now - self.last < PARTIAL_SAVE_INTERVAL_S:
            return
        passes = state["_passes"] + np.array([self.run.passes["forward"], self.run.passes["backward"]])
        self.ckpt.save({**state, "_passes": passes}, batch_index, {**self.info, "partial_batch": batch_index})
        self.last = now


def _noop() -> None:
    return None


def _progress(enabled: bool, **kwargs: Any) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(leave=False, **kwargs)
