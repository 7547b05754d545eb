"""End-to-end depth pruning: text → calibration windows → Hessian → QUBO → ranked states → validation →
surgery → pruned model, with a report that holds the evidence for the choice.

Example:
    >>> report = prune_depth("smollm2-135m", remove=8, top_k=10, validate=5)   # doctest: +SKIP
    >>> report.print()                                                          # doctest: +SKIP
    >>> report.save_model("pruned/")                                            # doctest: +SKIP
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from cbo.errors import CBOError, InfeasibleError, ModelError
from cbo.qubo import BlockQUBO
from cbo.states import RankedStates

REPORT_FORMAT = "cbo.depthreport"


@dataclass
class ValidatedState:
    """One candidate removal set measured on the validation split."""

    rank: int | None  # energy rank (None for a baseline's selection)
    removed: list[int]
    removed_names: list[str]
    energy: float | None
    kl: float
    ppl: float
    agreement: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "removed": list(self.removed),
            "removed_names": list(self.removed_names),
            "energy": self.energy,
            "kl": _num(self.kl),
            "ppl": _num(self.ppl),
            "agreement": self.agreement,
        }


@dataclass
class DepthReport:
    """Everything ``prune_depth`` did: the QUBO, the ranked states, their validation, the choice and the model.

    Attributes:
        qubo / states: the energy and its ranked low-energy states (None for a baseline method).
        validation: the validated candidates, in energy order.
        chosen_rank: energy rank of the chosen state (None for a baseline).
        chosen_blocks / chosen_names: the removed blocks.
        pruned_model / tokenizer: the pruned model (a new object; the original is untouched) and its tokenizer.
        original_metrics / pruned_metrics: ``cbo.evaluate.evaluate`` on the validation split.
        timings: seconds per step.
    """

    model_name: str
    method: str
    remove: int
    n_blocks: int
    granularity: str
    estimator: str | None
    loss: str | None
    solver: str | None
    qubo: BlockQUBO | None
    states: RankedStates | None
    validation: list[ValidatedState]
    chosen_rank: int | None
    chosen_blocks: list[int]
    chosen_names: list[str]
    pruned_model: Any
    tokenizer: Any
    original_metrics: dict[str, Any]
    pruned_metrics: dict[str, Any]
    timings: dict[str, float]
    data_info: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ views
    @property
    def chosen(self) -> ValidatedState | None:
        for v in self.validation:
            if v.removed == self.chosen_blocks:
                return v
        return None

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable summary (no model weights)."""
        return _jsonable(
            {
                "format": REPORT_FORMAT,
                "model": self.model_name,
                "method": self.method,
                "remove": self.remove,
                "n_blocks": self.n_blocks,
                "granularity": self.granularity,
                "estimator": self.estimator,
                "loss": self.loss,
                "solver": self.solver,
                "chosen": {
                    "rank": self.chosen_rank,
                    "removed": self.chosen_blocks,
                    "removed_names": self.chosen_names,
                },
                "validation": [v.to_json() for v in self.validation],
                "original": self.original_metrics,
                "pruned": self.pruned_metrics,
                "states": self.states.to_json() if self.states is not None else None,
                "qubo": None
                if self.qubo is None
                else {
                    "names": list(self.qubo.names),
                    "kinds": list(self.qubo.kinds),
                    "sizes": [int(s) for s in self.qubo.sizes],
                    "H": self.qubo.H.tolist(),
                    "g": self.qubo.g.tolist(),
                    "metadata": self.qubo.metadata,
                },
                "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
                "data": self.data_info,
                "options": self.options,
            }
        )

    def save(self, path: str | Path) -> Path:
        """Write the JSON report."""
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), indent=1))
        return path

    def save_model(self, directory: str | Path) -> Path:
        """Save the pruned model and tokenizer (``save_pretrained``), ``report.json`` and the QUBO."""
        directory = Path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CBOError(f"cannot create the output folder {str(directory)!r}: {exc}") from exc
        self.pruned_model.save_pretrained(directory)
        if self.tokenizer is not None and hasattr(self.tokenizer, "save_pretrained"):
            self.tokenizer.save_pretrained(directory)
        self.save(directory / "report.json")
        if self.qubo is not None:
            self.qubo.save(directory / "qubo.cboq")
        return directory

    def table(self) -> Any:
        """A rich table: rank, removed blocks, energy, validated KL / PPL / agreement; the choice marked."""
        from rich.table import Table

        validated = {v.rank: v for v in self.validation}
        title = f"{self.model_name}: remove {self.remove} of {self.n_blocks} {self.granularity} blocks — " + (
            f"{self.estimator}/{self.loss} Hessian, solver {self.solver}" if self.method == "cbo" else self.method
        )
        table = Table(title=title)
        for col, just in (
            ("rank", "right"),
            ("removed blocks", "left"),
            ("energy", "right"),
            ("val KL", "right"),
            ("val PPL", "right"),
            ("agree", "right"),
            ("", "left"),
        ):
            table.add_column(col, justify=just)
        if self.states is not None:
            rows = [(s.rank, list(s.removed), s.energy) for s in self.states]
        else:
            rows = [(None, self.chosen_blocks, None)]
        for rank, removed, energy in rows:
            v = validated.get(rank)
            chosen = removed == self.chosen_blocks
            table.add_row(
                "–" if rank is None else str(rank),
                ",".join(map(str, removed)),
                "–" if energy is None else f"{energy:.5g}",
                "–" if v is None else f"{v.kl:.4f}",
                "–" if v is None else f"{v.ppl:.2f}",
                "–" if v is None or v.agreement is None else f"{v.agreement:.3f}",
                "[bold green]◀ chosen[/]" if chosen else "",
                style="bold" if chosen else None,
            )
        o, p = self.original_metrics, self.pruned_metrics
        table.caption = (
            f"validation: original PPL {o.get('ppl', float('nan')):.2f} → pruned PPL {p.get('ppl', float('nan')):.2f}, "
            f"KL {p.get('kl') if p.get('kl') is None else round(p['kl'], 4)}; "
            f"params {o.get('n_params', 0) / 1e6:.1f}M → {p.get('n_params', 0) / 1e6:.1f}M"
        )
        return table

    def print(self, console: Any = None) -> None:
        from rich.console import Console

        (console or Console()).print(self.table())

    def __repr__(self) -> str:
        return (
            f"DepthReport(model={self.model_name!r}, method={self.method!r}, remove={self.remove}/{self.n_blocks}, "
            f"chosen_rank={self.chosen_rank}, chosen={self.chosen_blocks}, "
            f"val_kl={_fmt(self.pruned_metrics.get('kl'))}, val_ppl={_fmt(self.pruned_metrics.get('ppl'))})"
        )


# ---------------------------------------------------------------------------------------------- helpers
def _fmt(v: Any) -> str:
    return "None" if v is None else f"{v:.4g}"


def _num(v: Any) -> Any:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else str(v)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return _num(obj)
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    return repr(obj)


def baseline_methods() -> list[str]:
    """The depth methods ``prune_depth`` accepts: ``cbo`` plus those of ``cbo.baselines`` when installed."""
    methods = ["cbo"]
    if importlib.util.find_spec("cbo.baselines") is not None:
        baselines = importlib.import_module("cbo.baselines")
        listed = getattr(baselines, "METHODS", None)
        if listed is None and callable(getattr(baselines, "methods", None)):
            listed = baselines.methods()
        methods += [m for m in (listed or []) if m != "cbo"]
    return methods


def _select_baseline(method: str, model: Any, splits: Any, remove: int, keep: Sequence[int]) -> list[int]:
    if importlib.util.find_spec("cbo.baselines") is None:
        raise CBOError(f"unknown method {method!r}; valid methods: {baseline_methods()}.")
    baselines = importlib.import_module("cbo.baselines")
    select = getattr(baselines, "select_blocks", None)
    if select is None:
        raise CBOError(f"cbo.baselines has no select_blocks(); valid methods: {baseline_methods()}.")
    kwargs = {}
    if keep and "keep" in inspect.signature(select).parameters:
        kwargs["keep"] = list(keep)
    chosen = select(method, model, splits, remove, **kwargs)
    removed = sorted(int(i) for i in (chosen.removed if hasattr(chosen, "removed") else chosen))
    if keep and set(removed) & set(keep):
        raise CBOError(f"method {method!r} removed kept blocks {sorted(set(removed) & set(keep))}.")
    return removed


def prune_blocks(model: Any, blocks: Sequence[Any], removed: Iterable[int]) -> Any:
    """A pruned copy of ``model`` without the given blocks (layer or sublayer indices into ``blocks``)."""
    from cbo.surgery.depth import remove_blocks, remove_sublayers

    removed = sorted(int(i) for i in removed)
    if all(b.kind == "layer" for b in blocks):
        return remove_blocks(model, [blocks[i].layer for i in removed])
    return remove_sublayers(model, [blocks[i] for i in removed])


def _resolve_keep(keep: Any, blocks: Sequence[Any]) -> list[int]:
    if keep is None:
        return []
    names = [b.name for b in blocks]
    out = []
    for k in [keep] if isinstance(keep, (int, str)) else keep:
        if isinstance(k, str) and not k.lstrip("-").isdigit():
            if k not in names:
                raise InfeasibleError(f"keep names unknown block {k!r}; blocks are {names[0]}..{names[-1]}.")
            out.append(names.index(k))
            continue
        i = int(k)
        if not 0 <= i < len(blocks):
            raise InfeasibleError(f"keep index {i} is out of range; valid: 0..{len(blocks) - 1}.")
        out.append(i)
    return sorted(set(out))


def _check_remove(remove: Any, blocks: Sequence[Any], keep: Sequence[int]) -> int:
    n = len(blocks)
    if isinstance(remove, bool) or not isinstance(remove, (int, np.integer)):
        raise InfeasibleError(f"remove (M) must be an integer, got {remove!r}.")
    remove = int(remove)
    upper = n - len(keep)
    if all(b.kind == "layer" for b in blocks):
        upper = min(upper, n - 1)  # at least one decoder layer must remain
    if not 1 <= remove <= upper:
        why = f" with {len(keep)} kept" if keep else ""
        raise InfeasibleError(f"remove={remove} is out of range: the model has {n} blocks{why}; use 1..{upper}.")
    return remove


def _target_options(estimator: str, options: dict[str, Any] | None, remove: int, keep: list[int]) -> dict[str, Any]:
    """Estimators that refine their QUBO for one M (``fit``, ``trust``) take ``remove`` (and ``keep``) as options."""
    import dataclasses

    from cbo.hessian import get

    options = dict(options or {})
    fields = {f.name for f in dataclasses.fields(get(estimator).Options)}
    if "remove" in fields:
        options.setdefault("remove", remove)
    if "keep" in fields and keep:
        options.setdefault("keep", list(keep))
    return options


def _default_cache_dir() -> Path:
    from cbo.models import cbo_home

    return cbo_home() / "cache" / "hessian"


def _progress(iterable: Any, enabled: bool, **kw: Any) -> Any:
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, leave=False, **kw)


# ---------------------------------------------------------------------------------------------- the pipeline
# the depth estimator used when none is given, chosen from benchmarks/fidelity.py (BENCHMARKS.md): measured
# single-block removal losses, whose validated excited states beat every baseline at M = 8 and 15 of 30 there
DEFAULT_ESTIMATOR = "singles"


def prune_depth(
    model: Any = "smollm2-135m",
    tokenizer: Any = None,
    text: Any = None,
    *,
    remove: int = 8,
    estimator: str = DEFAULT_ESTIMATOR,
    loss: str = "kl",
    solver: str = "auto",
    top_k: int = 10,
    validate: int = 10,
    granularity: str = "layer",
    method: str = "cbo",
    keep: Any = None,
    seed: int = 0,
    cache_dir: str | Path | bool | None = True,
    n_calibration: int = 32,
    n_validation: int = 32,
    seq_len: int = 128,
    batch_size: int = 8,
    splits: Any = None,
    estimator_options: dict[str, Any] | None = None,
    solver_options: dict[str, Any] | None = None,
    dtype: Any = None,
    device: Any = "cpu",
    progress: bool = True,
) -> DepthReport:
    """Remove ``remove`` blocks of a causal LM chosen by constrained binary optimization, validated on held-out text.

    Steps: calibration/validation windows (by document) → Hessian of the gates (once, cached on disk) → the
    ``top_k`` lowest-energy states with exactly ``remove`` blocks removed → the first ``validate`` of them
    measured on the validation split (KL to the original and perplexity) → the best by validation KL is chosen
    (the ground state when ``validate=0``) → a pruned copy of the model.

    Args:
        model: ``"smollm2-135m"``, a local Hugging Face folder or hub id, or a loaded model.
        tokenizer: the model's tokenizer (loaded with the model when ``model`` is a name).
        text: the text source (file, folder, .jsonl, list of strings, datasets object); None = the Austen novels.
        remove: M, the number of blocks to remove.
        estimator, loss: Hessian estimator (``cbo.hessian.names()``; default ``singles``, measured single-block
            removals; ``fisher`` is the cheapest) and loss (``"kl"`` or ``"ce"``).
        solver: a registered solver name (``"auto"`` picks one).
        top_k: how many low-energy states to rank; validate: how many of them to measure.
        granularity: ``"layer"`` or ``"sublayer"`` (attention and MLP halves).
        method: ``"cbo"``, or a baseline of ``cbo.baselines`` (e.g. ``"block_influence"``).
        keep: blocks never removed (indices or names), e.g. ``[0, 29]``.
        seed: seeds data sampling, label sampling and randomized solvers.
        cache_dir: where Hessians are cached; True = ``CBO_HOME/cache/hessian``, None/False = no cache.
        n_calibration, n_validation, seq_len: windows per split and tokens per window.
        splits: precomputed ``TokenSplits`` (then ``text`` and the window counts are not used).
        estimator_options / solver_options: passed to the estimator / solver.
        dtype, device: used when ``model`` is a name.

    Returns:
        A :class:`DepthReport`.

    Example:
        >>> report = prune_depth("smollm2-135m", remove=8, validate=5, keep=[0])   # doctest: +SKIP
        >>> report.pruned_model.config.num_hidden_layers                          # doctest: +SKIP
        22
    """
    from cbo.blocks import find_blocks
    from cbo.data import make_splits
    from cbo.evaluate import evaluate, reference_logits
    from cbo.hessian import estimate_hessian
    from cbo.solvers import names as solver_names
    from cbo.solvers import solve

    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    methods = baseline_methods()
    if method not in methods:
        raise CBOError(f"unknown method {method!r}; valid methods: {methods}.")

    t = time.perf_counter()
    if isinstance(model, (str, Path)):
        from cbo.models import load_model

        model_label = str(model)
        model, loaded_tok = load_model(model, dtype=dtype, device=device)
        tokenizer = tokenizer if tokenizer is not None else loaded_tok
    else:
        if not hasattr(model, "forward"):
            raise ModelError(f"model must be a name, a folder or a loaded causal LM, got {type(model).__name__}.")
        model_label = str(getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)
    timings["load"] = time.perf_counter() - t

    blocks = find_blocks(model, granularity)
    keep_idx = _resolve_keep(keep, blocks)
    remove = _check_remove(remove, blocks, keep_idx)
    for label, v in (("top_k", top_k), ("validate", validate)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < (1 if label == "top_k" else 0):
            raise CBOError(f"{label} must be an integer >= {1 if label == 'top_k' else 0}, got {v!r}.")

    t = time.perf_counter()
    if splits is None:
        if tokenizer is None:
            raise CBOError("a tokenizer is needed to cut the text into windows; pass tokenizer= or splits=.")
        splits = make_splits(
            tokenizer,
            text,
            seq_len=seq_len,
            n_calibration=n_calibration,
            n_validation=n_validation,
            n_test=0,
            seed=seed,
            model=model,
        )
    if splits.validation.shape[0] == 0 and (validate > 0 or method != "cbo"):
        raise CBOError("the validation split is empty; give n_validation >= 1 (or validate=0).")
    timings["data"] = time.perf_counter() - t

    qubo = states = None
    solver_used = None
    if method == "cbo":
        t = time.perf_counter()
        cache = _default_cache_dir() if cache_dir is True else (cache_dir or None)
        estimator_options = _target_options(estimator, estimator_options, remove, keep_idx)
        qubo = estimate_hessian(
            model,
            tokenizer,
            splits.calibration,
            estimator=estimator,
            loss=loss,
            blocks=blocks,
            batch_size=batch_size,
            seed=seed,
            cache_dir=cache,
            progress=progress,
            **(estimator_options or {}),
        )
        timings["hessian"] = time.perf_counter() - t
        if keep_idx:
            qubo = qubo.with_constraints(keep=keep_idx)
        t = time.perf_counter()
        # "auto" is the default; before an automatic selector is registered, the exact enumerator answers
        solver_used = solver if solver != "auto" or "auto" in solver_names() else "enumerate"
        import torch

        threads = torch.get_num_threads()
        try:
            states = solve(qubo, remove, solver_used, k=top_k, seed=seed, progress=progress, **(solver_options or {}))
        finally:
            # numba's OpenMP layer can change the process-wide OpenMP thread count that torch reads
            torch.set_num_threads(threads)
        timings["solve"] = time.perf_counter() - t
        candidates = [(s.rank, list(s.removed), s.energy) for s in states][: max(validate, 1)]
    else:
        t = time.perf_counter()
        removed = _select_baseline(method, model, splits, remove, keep_idx)
        timings["select"] = time.perf_counter() - t
        candidates = [(None, removed, None)]
        validate = max(validate, 1)

    t = time.perf_counter()
    validation: list[ValidatedState] = []
    measured: dict[tuple[int, ...], dict[str, Any]] = {}
    original_metrics: dict[str, Any] = {}
    ref = None
    if splits.validation.shape[0]:
        ref = reference_logits(model, splits.validation, batch_size=batch_size)
        original_metrics = evaluate(model, splits.validation, ref, batch_size=batch_size)
        for rank, removed, energy in _progress(candidates[:validate], progress, desc="validating"):
            pruned = prune_blocks(model, blocks, removed)
            m = evaluate(pruned, splits.validation, ref, batch_size=batch_size)
            del pruned
            measured[tuple(removed)] = m
            names = [blocks[i].name for i in removed]
            validation.append(ValidatedState(rank, removed, names, energy, m["kl"], m["ppl"], m["agreement"]))
    timings["validate"] = time.perf_counter() - t

    if validation:
        best = min(validation, key=lambda v: (v.kl if math.isfinite(v.kl) else math.inf, v.rank or 0))
        chosen_rank, chosen_blocks = best.rank, best.removed
    else:
        chosen_rank, chosen_blocks = candidates[0][0], candidates[0][1]
    t = time.perf_counter()
    pruned_model = prune_blocks(model, blocks, chosen_blocks)
    timings["prune"] = time.perf_counter() - t
    pruned_metrics = measured.get(tuple(chosen_blocks), {})
    if ref is not None and not pruned_metrics:
        t = time.perf_counter()
        pruned_metrics = evaluate(pruned_model, splits.validation, ref, batch_size=batch_size)
        timings["validate"] += time.perf_counter() - t
    del ref
    timings["total"] = time.perf_counter() - t_start

    return DepthReport(
        model_name=model_label,
        method=method,
        remove=remove,
        n_blocks=len(blocks),
        granularity=granularity,
        estimator=estimator if method == "cbo" else None,
        loss=loss if method == "cbo" else None,
        solver=(states.solver if states is not None else None),
        qubo=qubo,
        states=states,
        validation=validation,
        chosen_rank=chosen_rank,
        chosen_blocks=list(chosen_blocks),
        chosen_names=[blocks[i].name for i in chosen_blocks],
        pruned_model=pruned_model,
        tokenizer=tokenizer,
        original_metrics=original_metrics,
        pruned_metrics=pruned_metrics,
        timings=timings,
        data_info=dict(getattr(splits, "info", {}) or {}),
        options={
            "top_k": top_k,
            "validate": validate,
            "keep": keep_idx,
            "seed": seed,
            "batch_size": batch_size,
            "estimator_options": estimator_options or {},
            "solver_options": solver_options or {},
            "requested_solver": solver,
        },
    )


def __getattr__(name: str) -> Any:
    # the width pipeline lives with the width modules; it is part of the end-to-end API here
    if name == "compress":
        from cbo.width.compress import compress

        return compress
    raise AttributeError(f"module 'cbo.pipeline' has no attribute {name!r}")
