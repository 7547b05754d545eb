"""``compress``: depth and width pruning end to end, with a before/after report.

One-shot (``scheduler="oneshot"``): optionally remove whole layers first (``depth="cbo"``: the ground state
of the CBO QUBO; ``depth="antepenultimate"``: layers just before the last two, as MoP's depth rule), taking
``depth_share`` of the parameter budget in whole layers, then width-prune the rest with a score plugin
(NIRVANA's NTK by default), optionally with KL-based calibration selection. MoP
(``scheduler="mop"``): the iterative depth-or-width path of :mod:`cbo.width.mop`.

The report gives parameters, held-out perplexity, KL to the original and next-token agreement on the test
split, and measured prefill/decode speed, before and after.

Example:
    >>> report = compress(model, tokenizer, ratio=0.2, width="ntk")             # doctest: +SKIP
    >>> print(report.summary())                                                 # doctest: +SKIP
    >>> report.model.save_pretrained("out")  # or cbo.surgery.io.save_pruned    # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbo.errors import CBOError, DataError, InfeasibleError
from cbo.extras import require

torch = require("torch", "compression")

# the one-shot width score used when none is given: the best measured on the default model (BENCHMARKS.md)
DEFAULT_ONESHOT_SCORE = "taylor"
SCHEDULERS = ("oneshot", "mop")
DEPTH_METHODS = ("none", "cbo", "antepenultimate")


def width_prune(
    model: Any,
    windows: Any = None,
    *,
    ratio: float | None = None,
    remove_params: int | None = None,
    score: str = DEFAULT_ONESHOT_SCORE,
    gqa: str = "group",
    gamma: float | None = None,
    round_to: int = 8,
    min_heads: int = 1,
    min_neurons: int | None = None,
    allocation: str | None = None,
    batch_size: int = 4,
    total_params: int | None = None,
    inplace: bool = False,
    score_options: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """One-shot width pruning: score, allocate globally, slice. Returns ``(pruned_model, Allocation)``.

    Example:
        >>> small, alloc = width_prune(model, splits.calibration, ratio=0.2, score="afr")  # doctest: +SKIP
    """
    from cbo.surgery.width import prune_width
    from cbo.width.allocate import allocate
    from cbo.width.scores import score_units

    scores = score_units(model, windows, score, gqa=gqa, batch_size=batch_size, **(score_options or {}))
    alloc = allocate(
        scores,
        ratio=ratio,
        remove_params=remove_params,
        gamma=gamma,
        round_to=round_to,
        min_heads=min_heads,
        min_neurons=min_neurons,
        total_params=total_params,
        allocation=allocation,
    )
    return prune_width(model, alloc.plan, inplace=inplace), alloc


def depth_layers(
    model: Any,
    n: int,
    method: str,
    calibration: Any = None,
    *,
    estimator: str = "fisher",
    solver: str = "auto",
    batch_size: int = 4,
    seed: int = 0,
    progress: bool = False,
) -> list[int]:
    """The ``n`` layers a one-shot depth step removes (``cbo``: QUBO ground state with first/last kept)."""
    from cbo.blocks import decoder_layers

    layers = len(decoder_layers(model)[0])
    if n <= 0:
        return []
    if n > layers - 3:
        raise InfeasibleError(f"cannot remove {n} of {layers} layers by depth (the first and last two stay)")
    if method == "antepenultimate":
        return list(range(layers - 2 - n, layers - 2))
    if method != "cbo":
        raise CBOError(f"unknown depth method {method!r}; use one of {DEPTH_METHODS}")
    from cbo.hessian import estimate_hessian
    from cbo.solvers.base import names as solver_names
    from cbo.solvers.base import solve

    qubo = estimate_hessian(
        model,
        None,
        calibration,
        estimator=estimator,
        loss="kl",
        granularity="layer",
        batch_size=batch_size,
        seed=seed,
        progress=progress,
    )
    if solver == "auto" and "auto" not in solver_names():
        solver = "enumerate"
    states = solve(qubo, remove=n, solver=solver, k=1, keep=[0, layers - 1], seed=seed)
    return sorted(int(i) for i in states.removed(0))


@dataclass
class CompressionReport:
    """What :func:`compress` did and measured. ``model`` is the compressed model."""

    model: Any
    settings: dict[str, Any]
    params_before: int
    params_after: int
    target_params: int
    before: dict[str, Any]
    after: dict[str, Any]
    speed_before: dict[str, Any] | None
    speed_after: dict[str, Any] | None
    removed_layers: list[int]
    widths: list[dict[str, int]]
    path: list[dict[str, Any]] = field(default_factory=list)
    calibration: dict[str, Any] | None = None
    data: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Fraction of parameters removed."""
        return 1.0 - self.params_after / self.params_before

    def speedup(self, kind: str = "decode") -> float | None:
        if not self.speed_before or not self.speed_after:
            return None
        key = f"{kind}_tokens_per_s"
        return self.speed_after[key] / self.speed_before[key]

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "model"}
        out["ratio"] = self.ratio
        out["speedup_prefill"] = self.speedup("prefill")
        out["speedup_decode"] = self.speedup("decode")
        return out

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n")
        return path

    def summary(self) -> str:
        s = self.settings
        lines = [
            f"compress {s.get('model', '')}: scheduler={s['scheduler']} width={s['width']} depth={s['depth']}"
            + (f" criterion={s['criterion']}" if s["scheduler"] == "mop" else ""),
            f"  parameters: {self.params_before:,} -> {self.params_after:,} ({self.ratio:.1%} removed; "
            f"target {self.target_params / self.params_before:.1%})",
            f"  held-out ppl: {self.before['ppl']:.3f} -> {self.after['ppl']:.3f}   "
            f"KL to original: {self.after['kl']:.4f} nats/token   next-token agreement: {self.after['agreement']:.3f}",
        ]
        if self.speed_before and self.speed_after:
            lines.append(
                f"  prefill tokens/s: {self.speed_before['prefill_tokens_per_s']:.1f} -> "
                f"{self.speed_after['prefill_tokens_per_s']:.1f} (x{self.speedup('prefill'):.2f})   decode tokens/s: "
                f"{self.speed_before['decode_tokens_per_s']:.1f} -> {self.speed_after['decode_tokens_per_s']:.1f} "
                f"(x{self.speedup('decode'):.2f})"
            )
        if self.removed_layers:
            lines.append(f"  removed layers (original indices): {self.removed_layers}")
        if self.path:
            lines.append("  MoP path: " + "".join("D" if p["chosen"] == "depth" else "W" for p in self.path))
        return "\n".join(lines)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def compress(
    model: Any,
    tokenizer: Any = None,
    text: Any = None,
    *,
    ratio: float = 0.3,
    depth: str = "none",
    width: str | None = None,
    scheduler: str = "oneshot",
    criterion: str = "kl",
    depth_share: float = 0.5,
    gqa: str = "group",
    gamma: float | None = None,
    round_to: int = 8,
    allocation: str | None = None,
    score_options: dict[str, Any] | None = None,
    select_calibration: int = 0,
    recovery_steps: int = 0,
    final_recovery_steps: int = 0,
    recovery: str = "lora",
    splits: Any = None,
    seq_len: int = 128,
    n_calibration: int = 32,
    n_validation: int = 16,
    n_test: int = 32,
    batch_size: int = 4,
    measure_speed: bool = True,
    speed_options: dict[str, Any] | None = None,
    estimator: str = "fisher",
    solver: str = "auto",
    out: str | os.PathLike | None = None,
    seed: int = 0,
    progress: bool = False,
) -> CompressionReport:
    """Compress a causal LM to about ``ratio`` fewer parameters by depth and/or width pruning.

    Args:
        model: a model, or a name/folder for :func:`cbo.models.load_model` (then ``tokenizer`` may be None).
        tokenizer: the model's tokenizer (needed to cut ``text`` into windows unless ``splits`` is given).
        text: calibration/evaluation text (see :func:`cbo.data.load_documents`); None = the default Austen text.
        ratio: fraction of the model's parameters to remove, in (0, 1).
        depth: ``none``, ``cbo`` (QUBO ground state) or ``antepenultimate``; with ``scheduler="mop"`` the rule
            that proposes each step's layer.
        width: width score (default ``taylor`` one-shot, ``amp`` for MoP: the best of each on the default model
            in BENCHMARKS.md).
        scheduler: ``oneshot`` or ``mop``.
        criterion: MoP path criterion (``cosine``, ``kl``, ``ppl``, ``random``).
        depth_share: one-shot with depth: share of the budget taken by whole layers (rounded to layers).
        allocation: ``global`` or ``uniform`` spreading of the width budget over layers (default: the
            score's own; see :func:`cbo.width.allocate.allocate`).
        select_calibration: one-shot: number of candidate calibration batches for KL-based selection
            (0 or 1 = none); candidates are drawn from the calibration split, the control is the validation split.
        recovery_steps / final_recovery_steps / recovery: MoP recovery fine-tune (see :mod:`cbo.width.mop`).
        splits: a :class:`cbo.data.TokenSplits` to use instead of cutting ``text``.
        measure_speed: time prefill and decode before and after (:func:`cbo.evaluate.throughput`).
        out: folder to save the compressed model (:func:`cbo.surgery.io.save_pruned`) and ``report.json``.

    Returns:
        A :class:`CompressionReport` (``report.model`` is the compressed model).

    Example:
        >>> r = compress("smollm2-135m", ratio=0.2, scheduler="mop", criterion="kl", depth="cbo")  # doctest: +SKIP
    """
    from cbo.evaluate import count_parameters, evaluate, reference_logits, throughput
    from cbo.structures import layer_widths
    from cbo.surgery.depth import REMOVED_KEY, remove_blocks, text_config

    if scheduler not in SCHEDULERS:
        raise CBOError(f"unknown scheduler {scheduler!r}; use one of {SCHEDULERS}")
    if depth not in DEPTH_METHODS:
        raise CBOError(f"unknown depth method {depth!r}; use one of {DEPTH_METHODS}")
    if not (isinstance(ratio, (int, float)) and 0.0 < float(ratio) < 1.0):
        raise InfeasibleError(f"ratio must be in (0, 1) (fraction of parameters to remove), got {ratio!r}")
    if not 0.0 <= depth_share <= 1.0:
        raise InfeasibleError(f"depth_share must be in [0, 1], got {depth_share}")
    width = width or ("amp" if scheduler == "mop" else DEFAULT_ONESHOT_SCORE)
    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    name = (
        model if isinstance(model, (str, os.PathLike)) else getattr(getattr(model, "config", None), "_name_or_path", "")
    )
    if isinstance(model, (str, os.PathLike)):
        from cbo.models import load_model

        model, loaded_tok = load_model(str(model))
        tokenizer = tokenizer or loaded_tok
    if splits is None:
        if tokenizer is None:
            raise DataError("compress needs a tokenizer to cut text into windows, or splits=TokenSplits(...)")
        from cbo.data import make_splits

        splits = make_splits(
            tokenizer,
            text,
            seq_len=seq_len,
            n_calibration=n_calibration,
            n_validation=n_validation,
            n_test=n_test,
            seed=seed,
            model=model,
        )
    calib, control, test = splits.calibration, splits.validation, splits.test
    if control is None or control.shape[0] == 0:
        control = calib
    if test is None or test.shape[0] == 0:
        raise DataError("compress needs a non-empty test split to report held-out perplexity and KL")
    model.eval()
    settings = dict(
        model=str(name),
        ratio=ratio,
        scheduler=scheduler,
        width=width,
        depth=depth,
        criterion=criterion,
        depth_share=depth_share,
        gqa=gqa,
        gamma=gamma,
        round_to=round_to,
        allocation=allocation,
        score_options=score_options or {},
        select_calibration=select_calibration,
        recovery_steps=recovery_steps,
        final_recovery_steps=final_recovery_steps,
        recovery=recovery,
        seed=seed,
    )

    t0 = time.perf_counter()
    ref = reference_logits(model, test, batch_size=batch_size)
    before = evaluate(model, test, ref, batch_size=batch_size)
    speed_opts = dict(prompt_len=64, new_tokens=16, repeats=3)
    speed_opts.update(speed_options or {})
    speed_before = throughput(model, **speed_opts) if measure_speed else None
    timings["evaluate_before"] = time.perf_counter() - t0

    p0 = count_parameters(model)
    target = int(round(ratio * p0))
    path: list[dict[str, Any]] = []
    calib_info = None
    t0 = time.perf_counter()
    if scheduler == "mop":
        from cbo.width.mop import mixture_of_pruners

        result = mixture_of_pruners(
            model,
            calib,
            control,
            ratio=ratio,
            criterion=criterion,
            depth=depth,
            width_score=width,
            gqa=gqa,
            gamma=gamma,
            round_to=round_to,
            allocation=allocation,
            score_options=score_options,
            recovery_steps=recovery_steps,
            final_recovery_steps=final_recovery_steps,
            recovery=recovery,
            estimator=estimator,
            solver="enumerate" if solver == "auto" else solver,
            batch_size=batch_size,
            seed=seed,
            progress=progress,
        )
        pruned = result.model
        path = result.to_dict()["path"]
    else:
        from cbo.blocks import find_blocks

        pruned = model
        if depth != "none" and depth_share > 0:
            blocks = find_blocks(model, "layer")
            per_layer = sum(b.n_params for b in blocks) / len(blocks)
            n_layers = int(round(depth_share * target / per_layer))
            layers = depth_layers(
                model,
                n_layers,
                depth,
                calib,
                estimator=estimator,
                solver=solver,
                batch_size=batch_size,
                seed=seed,
                progress=progress,
            )
            if layers:
                pruned = remove_blocks(model, layers)
        remaining = target - (p0 - count_parameters(pruned))
        if remaining > 0:
            windows = calib
            if select_calibration and select_calibration > 1:
                from cbo.width.calibration import candidate_batches
                from cbo.width.calibration import select_calibration as choose

                size = max(1, calib.shape[0] // select_calibration)
                candidates = candidate_batches(calib, select_calibration, size, seed=seed)
                choice = choose(
                    pruned,
                    candidates,
                    control,
                    remove_params=remaining,
                    score=width,
                    batch_size=batch_size,
                    gqa=gqa,
                    gamma=gamma,
                    round_to=round_to,
                    score_options=score_options,
                    allocation=allocation,
                )
                windows = choice.windows
                calib_info = {"index": choice.index, "kl": choice.kl, "candidates": select_calibration, "size": size}
            pruned, _ = width_prune(
                pruned,
                windows,
                remove_params=remaining,
                score=width,
                gqa=gqa,
                gamma=gamma,
                round_to=round_to,
                allocation=allocation,
                batch_size=batch_size,
                inplace=pruned is not model,
                score_options=score_options,
            )
    timings["prune"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    after = evaluate(pruned, test, ref, batch_size=batch_size)
    speed_after = throughput(pruned, **speed_opts) if measure_speed else None
    timings["evaluate_after"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    before.update(kl=0.0, agreement=1.0)
    report = CompressionReport(
        model=pruned,
        settings=settings,
        params_before=p0,
        params_after=count_parameters(pruned),
        target_params=target,
        before=before,
        after=after,
        speed_before=speed_before,
        speed_after=speed_after,
        removed_layers=list(getattr(text_config(pruned), REMOVED_KEY, None) or []),
        widths=layer_widths(pruned),
        path=path,
        calibration=calib_info,
        data=dict(splits.info) if getattr(splits, "info", None) else {},
        seconds=timings,
    )
    if out is not None:
        from cbo.surgery.io import save_pruned

        folder = save_pruned(pruned, out, tokenizer)
        report.save(folder / "report.json")
    return report
