"""What the depth benchmarks share beside ``harness``: the model and its splits, estimator specs (``name:key=value``),
cached Hessians and solves, and ``MetricsCache``, the on-disk cache of the test / validation metrics of removal sets
(measured by ``cbo.measure``). Nothing here imports torch at import time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


# ------------------------------------------------------------------------------------------------ model and data
def device_of(args: argparse.Namespace) -> str:
    """``--device``, or cuda when there is one (also for scripts without the option)."""
    import torch

    if getattr(args, "device", None):
        return args.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def hessian_cache(args: argparse.Namespace) -> Path:
    if args.hessian_cache:
        return Path(args.hessian_cache)
    from cbo.model.loading import cbo_home

    return cbo_home() / "cache" / "hessian"


def add_split_args(p: argparse.ArgumentParser, defaults: dict[str, Any]) -> None:
    """``--remove`` and the window counts of the splits in ``defaults`` (``calibration``, ``validation``, ``test``);
    left unset, they take the script's full or ``--quick`` settings (``harness.parse_with_defaults``)."""
    p.add_argument("--remove", help=f"comma-separated M values (default {defaults['remove']})")
    for split in ("calibration", "validation", "test"):
        if split in defaults:
            p.add_argument(f"--{split}", type=int, help=f"{split} windows (default {defaults[split]})")


def load(args: argparse.Namespace, *, n_calibration: int, n_validation: int, n_test: int) -> tuple[Any, Any, Any]:
    """(model, tokenizer, TokenSplits) on the default text (Austen: calibration Emma, validation Mansfield Park,
    test Persuasion)."""
    from cbo.data.windows import make_splits
    from cbo.model.loading import load_model

    model, tok = load_model(args.model, device=device_of(args))
    splits = make_splits(
        tok,
        seq_len=args.seq_len,
        n_calibration=n_calibration,
        n_validation=n_validation,
        n_test=n_test,
        seed=args.seed,
        model=model,
    )
    return model, tok, splits


# ------------------------------------------------------------------------------------------------ specs
def parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


RUN_KEYS = ("windows", "loss", "batch_size", "granularity", "label")


@dataclass
class EstimatorSpec:
    """One estimator configuration: ``name[:key=value[:key=value...]]``.

    Keys ``windows`` (calibration windows used, the first n), ``loss``, ``batch_size``, ``granularity`` and
    ``label`` set the run; every other key is an estimator option (``pairwise:couplings=raw``).
    """

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    windows: int | None = None
    loss: str = "kl"
    batch_size: int | None = None
    granularity: str = "layer"
    label: str | None = None

    @classmethod
    def parse(cls, text: str, *, loss: str = "kl", granularity: str = "layer") -> EstimatorSpec:
        parts = [p for p in text.strip().split(":") if p]
        if not parts:
            raise SystemExit(f"empty estimator spec {text!r}")
        spec = cls(parts[0], loss=loss, granularity=granularity)
        for part in parts[1:]:
            if "=" not in part:
                raise SystemExit(f"estimator spec {text!r}: {part!r} is not key=value")
            key, value = part.split("=", 1)
            if key in RUN_KEYS:
                setattr(spec, key, parse_value(value))
            else:
                spec.options[key] = parse_value(value)
        return spec

    def tag(self, with_loss: bool = True) -> str:
        if self.label:
            return str(self.label)
        bits = [self.name] + [f"{k}={v}" for k, v in sorted(self.options.items())]
        if with_loss and self.loss != "kl":
            bits.append(f"loss={self.loss}")
        if self.windows:
            bits.append(f"w={self.windows}")
        return ":".join(bits)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "options": self.options,
            "windows": self.windows,
            "loss": self.loss,
            "batch_size": self.batch_size,
            "granularity": self.granularity,
            "tag": self.tag(),
        }


def estimate(
    spec: EstimatorSpec, model: Any, tok: Any, calibration: Any, args: argparse.Namespace, progress: bool
) -> tuple[Any, float]:
    """The spec's QUBO (from the Hessian cache when present) and the wall time of this call."""
    from cbo.hessian import estimate_hessian

    windows = calibration if not spec.windows else calibration[: int(spec.windows)]
    t0 = time.perf_counter()
    qubo = estimate_hessian(
        model,
        tok,
        windows,
        estimator=spec.name,
        loss=spec.loss,
        granularity=spec.granularity,
        batch_size=int(spec.batch_size or args.batch_size),
        seed=args.seed,
        cache_dir=hessian_cache(args),
        progress=progress,
        **spec.options,
    )
    return qubo, time.perf_counter() - t0


def cached_solve(qubo: Any, remove: int, solver: str, *, k: int, seed: int, cache_dir: Path) -> Any:
    """``cbo.solve(qubo, remove, solver, k=k, seed=seed)``, from ``cache_dir`` when this exact solve was done before.

    A solve that is not proven exact (``auto`` on a large space under its time budget) depends on how fast the
    machine was, so a rerun of a benchmark would otherwise validate other states; the cache keeps a rerun's
    choices, and its measurements, those of the first run. The key is the QUBO's data and constraints, M, the
    solver, k and the seed.
    """
    import numpy as np

    from cbo.errors import CorruptFileError
    from cbo.qubo.states import RankedStates
    from cbo.solvers import solve

    digest = hashlib.sha256()
    for arr in (qubo.H, qubo.g):
        digest.update(np.ascontiguousarray(arr, dtype=np.float64).tobytes())
    digest.update(json.dumps([qubo.constraints.to_json(), int(remove), solver, int(k), int(seed)]).encode())
    path = Path(cache_dir) / f"states-{digest.hexdigest()[:32]}.json"
    if path.exists():
        try:
            return RankedStates.load(path)
        except (CorruptFileError, KeyError, ValueError):
            pass  # a damaged cache entry: solve again and replace it
    states = solve(qubo, remove, solver, k=k, seed=seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    states.save(path)
    return states


# ------------------------------------------------------------------------------------------------ measuring
class MetricsCache:
    """Test/validation metrics of removal sets, cached on disk so a rerun measures only what is new.

    The cache is keyed by the model's fingerprint, the split's data hash, the granularity and the removed set.
    Sets are measured by ``cbo.measure.measurer.Measurer`` (the original pass of a split's windows once, every set
    from its recorded streams, no model copies); its values equal those of the surgically pruned model.
    """

    def __init__(self, model: Any, splits: Any, cache_file: Path, *, batch_size: int = 8) -> None:
        from cbo.model.fingerprint import model_fingerprint

        self.model = model
        self.splits = splits
        self.batch_size = batch_size
        self.fingerprint = model_fingerprint(model)
        self.cache_file = Path(cache_file)
        self.cache: dict[str, dict] = {}
        if self.cache_file.exists():
            try:
                self.cache = json.loads(self.cache_file.read_text())
            except ValueError:
                self.cache = {}
        self._measurers: dict[tuple[str, str, int | None], Any] = {}
        self._blocks: dict[str, list] = {}
        self.new_measurements = 0
        self.measure_time = 0.0

    def blocks(self, granularity: str) -> list:
        from cbo.model.blocks import find_blocks

        if granularity not in self._blocks:
            self._blocks[granularity] = find_blocks(self.model, granularity)
        return self._blocks[granularity]

    def _data(self, split: str, windows: int | None) -> Any:
        return self.splits[split] if windows is None else self.splits[split][:windows]

    def measurer(self, split: str, granularity: str, windows: int | None = None) -> Any:
        """The ``cbo`` measurer of one split (its first ``windows`` windows) at one granularity."""
        from cbo.measure.measurer import Measurer

        key = (split, granularity, windows)
        if key not in self._measurers:
            data = self._data(split, windows)
            self._measurers[key] = Measurer(self.model, self.blocks(granularity), data, batch_size=self.batch_size)
        return self._measurers[key]

    def _key(self, split: str, granularity: str, removed: Any, windows: int | None) -> str:
        from cbo.data.windows import data_hash

        data = self._data(split, windows)
        text = json.dumps([self.fingerprint, data_hash(data), granularity, sorted(int(i) for i in removed)])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def original(self, split: str, windows: int | None = None) -> dict:
        """Metrics of the unpruned model (KL 0, agreement 1 by definition)."""
        key = self._key(split, "layer", [], windows)
        if key in self.cache:
            return self.cache[key]
        m = self.measurer(split, "layer", windows).losses([()]).base_metrics()
        m["n_params"] = self.measurer(split, "layer", windows).pruned_parameters(())
        self.cache[key] = m
        self.save()
        return m

    def measure(self, split: str, granularity: str, removed: Any, windows: int | None = None) -> dict:
        """``{"ppl", "nll", "kl", "agreement", "n_tokens", "n_params"}`` of the model without ``removed``."""
        key = self._key(split, granularity, removed, windows)
        if key in self.cache:
            return self.cache[key]
        t0 = time.perf_counter()
        measurer = self.measurer(split, granularity, windows)
        m = measurer.losses([removed]).metrics(0)
        m["n_params"] = measurer.pruned_parameters(removed)
        self.measure_time += time.perf_counter() - t0
        self.new_measurements += 1
        self.cache[key] = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in m.items()}
        self.save()
        return self.cache[key]

    def release(self, split: str) -> None:
        """Free the original passes kept for ``split`` (they are run again when needed)."""
        for key in [k for k in self._measurers if k[0] == split]:
            del self._measurers[key]

    def save(self) -> None:
        from cbo.files import atomic_write_text

        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.cache_file, json.dumps(self.cache))
