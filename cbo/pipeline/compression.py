"""``compress``: depth and width pruning end to end, with a before/after report.

One-shot (``scheduler="oneshot"``): optionally remove whole layers first, chosen by a depth proposer
(``depth="cbo"``: the ground state of the CBO QUBO; ``depth="antepenultimate"``: layers just before the
last two, as MoP's depth rule; see :mod:`cbo.pipeline.proposers`), taking ``depth_share`` of the parameter
budget in whole layers, then width-prune the rest with a score plugin (Taylor by default), optionally with
KL-based calibration selection. MoP (``scheduler="mop"``): the iterative depth-or-width path of
:mod:`cbo.width.mop`, given the same proposer.

The report gives parameters, held-out perplexity, KL to the original and next-token agreement on the test
split, and measured prefill/decode speed, before and after.

Example:
    >>> report = compress(model, tokenizer, ratio=0.2, width="ntk")             # doctest: +SKIP
    >>> report.print()                                                          # doctest: +SKIP
    >>> report.save_model("out")  # the model (cbo.load_pruned reads it) and report.json   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cbo.checks import check_choice, check_float
from cbo.errors import DataError, InfeasibleError, InvalidOptionError
from cbo.extras import require
from cbo.jsonable import jsonable
from cbo.pipeline.inputs import check_run_options, model_and_tokenizer, token_splits
from cbo.pipeline.options import Data, Estimate, Run, Search, option_groups
from cbo.pipeline.proposers import depth_proposer
from cbo.pipeline.reports import Report
from cbo.width.allocate import check_ratio
from cbo.width.mop import check_mop_options, mixture_of_pruners
from cbo.width.prune import DEFAULT_SCORE, check_width_options, width_prune

torch = require("torch", "compression")

SCHEDULERS = ("oneshot", "mop")
# what ``ratio`` is a fraction of
RATIO_OF = {"blocks": "the decoder layers' parameters", "model": "all the parameters"}
REPORT_FORMAT = "cbo.compressionreport"


@dataclass
class CompressionReport(Report):
    """What :func:`compress` did and measured. ``model`` (also ``pruned_model``) is the compressed model.

    The surface of every pipeline report (:class:`cbo.pipeline.reports.Report`): :meth:`to_json` /
    :meth:`from_json`, :meth:`save` / :meth:`load`, :meth:`table` / :meth:`print` (with the settings line, the
    removed layers and the MoP path), :meth:`summary` (plain text) and :meth:`save_model`.
    """

    format: ClassVar[str] = REPORT_FORMAT

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
    tokenizer: Any = None
    prunable_before: int | None = None

    @property
    def pruned_model(self) -> Any:
        return self.model

    @pruned_model.setter
    def pruned_model(self, value: Any) -> None:
        self.model = value

    @property
    def ratio(self) -> float:
        """Fraction of all the parameters removed (embeddings and head included)."""
        return 1.0 - self.params_after / self.params_before

    @property
    def prunable_ratio(self) -> float | None:
        """Fraction of the prunable parameters (those of the decoder layers) removed; None for old reports."""
        if not self.prunable_before:
            return None
        return (self.params_before - self.params_after) / self.prunable_before

    def removed_line(self) -> str:
        """``"12.3% of all the parameters, 20.0% of the decoder layers'"``: both denominators, always."""
        line = f"{self.ratio:.1%} of all the parameters"
        if self.prunable_ratio is not None:
            line += f", {self.prunable_ratio:.1%} of the decoder layers'"
        return line

    def speedup(self, kind: str = "decode") -> float | None:
        """Tokens per second after over before (``prefill`` or ``decode``); None when speed was not measured."""
        if not self.speed_before or not self.speed_after:
            return None
        key = f"{kind}_tokens_per_s"
        return self.speed_after[key] / self.speed_before[key]

    def path_string(self) -> str:
        """The MoP path, one letter per step (D: a layer, W: heads and neurons); empty for one-shot."""
        return "".join("D" if p["chosen"] == "depth" else "W" for p in self.path)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable summary (no model weights)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("model", "tokenizer")}
        out.update(format=REPORT_FORMAT, ratio=self.ratio, prunable_ratio=self.prunable_ratio)
        out.update(speedup_prefill=self.speedup("prefill"), speedup_decode=self.speedup("decode"))
        return jsonable(out)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompressionReport:
        """The report of a summary written by :meth:`to_json` (``model`` is None)."""
        fields = [f for f in dataclasses.fields(cls) if f.name not in ("model", "tokenizer")]
        names = {f.name for f in fields}
        required = [f.name for f in fields if f.default is f.default_factory is dataclasses.MISSING]
        missing = sorted(n for n in required if n not in data)
        if missing:
            raise KeyError(f"the compression report lacks {missing}")
        return cls(model=None, **{k: v for k, v in data.items() if k in names})

    def table(self) -> Any:
        """A rich table of parameters, perplexity, KL, agreement and speed, before and after (test split)."""
        from rich.table import Table

        table = Table(title="compression report (test split)")
        table.add_column("")
        table.add_column("before", justify="right")
        table.add_column("after", justify="right")
        removed = f"-{self.ratio:.1%}" + (
            f"; -{self.prunable_ratio:.1%} of the layers'" if self.prunable_before else ""
        )
        table.add_row("parameters", f"{self.params_before:,}", f"{self.params_after:,} ({removed})")
        table.add_row("perplexity", f"{self.before['ppl']:.3f}", f"{self.after['ppl']:.3f}")
        table.add_row("KL to original (nats/token)", "0", f"{self.after['kl']:.4f}")
        table.add_row("next-token agreement", "1", f"{self.after['agreement']:.3f}")
        if self.speed_before and self.speed_after:
            for kind in ("prefill", "decode"):
                b = self.speed_before[f"{kind}_tokens_per_s"]
                a = self.speed_after[f"{kind}_tokens_per_s"]
                table.add_row(f"{kind} tokens/s", f"{b:.1f}", f"{a:.1f} (x{a / b:.2f})")
        return table

    def print(self, console: Any = None) -> None:
        """Print the settings line, :meth:`table`, the removed layers and the MoP path."""
        from rich.console import Console

        console = console or Console()
        console.print(self.summary().splitlines()[0])
        console.print(self.table())
        if self.removed_layers:
            console.print(f"removed layers (original indices): {self.removed_layers}")
        if self.path:
            console.print(f"MoP path: {self.path_string()}")

    def summary(self) -> str:
        s = self.settings
        lines = [
            f"compress {s.get('model', '')}: scheduler={s['scheduler']} width={s['width']} depth={s['depth']}"
            + (f" criterion={s['criterion']}" if s["scheduler"] == "mop" else ""),
            f"  parameters: {self.params_before:,} -> {self.params_after:,} (removed {self.removed_line()}; "
            f"target {self.target_params:,}, {s.get('ratio', 0):.1%} of {RATIO_OF.get(s.get('ratio_of', 'model'))})",
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
            lines.append(f"  MoP path: {self.path_string()}")
        return "\n".join(lines)


@dataclass(frozen=True)
class CompressOptions:
    """``compress``'s own options (beside the groups of :mod:`cbo.pipeline.options`).

    Attributes:
        criterion: MoP path criterion (``cosine``, ``kl``, ``ppl``, ``random``).
        gqa / gamma / round_to / allocation / score_options: the width step's units, MLP-vs-attention ratio,
            rounding of kept MLP widths, spreading of the budget over layers (``global`` or ``uniform``; default:
            the score's own, see :func:`cbo.width.allocate.allocate`) and the score's options.
        select_calibration: one-shot: number of candidate calibration batches for KL-based selection (0 or 1 =
            none); candidates are drawn from the calibration split, the control is the validation split.
        recovery / recovery_steps / final_recovery_steps: MoP's recovery fine-tune (see :mod:`cbo.recovery.finetune`).
        measure_speed / speed_options: time prefill and decode before and after (:func:`cbo.evaluate.throughput`).
    """

    criterion: str = "kl"
    gqa: str = "group"
    gamma: float | None = None
    round_to: int = 8
    allocation: str | None = None
    score_options: dict[str, Any] | None = None
    select_calibration: int = 0
    recovery: str = "lora"
    recovery_steps: int = 0
    final_recovery_steps: int = 0
    measure_speed: bool = True
    speed_options: dict[str, Any] | None = None


# the groups' fields compress does not use, and its own defaults of the groups
NOT_USED = (
    "loss", "estimator_options", "solver_options", "top_k", "validate", "refine", "select", "select_options",
    "cache_dir",
)  # fmt: skip
DEFAULTS = {
    "data": Data(n_validation=16, n_test=32),
    "search": Search(refine=None, select=None),  # the depth steps take the ground state; no refinement, no race
    "run": Run(batch_size=4, progress=False),
}


def compress(
    model: Any,
    tokenizer: Any = None,
    text: Any = None,
    *,
    ratio: float = 0.3,
    ratio_of: str = "blocks",
    depth: str = "none",
    width: str | None = None,
    scheduler: str = "oneshot",
    depth_share: float = 0.5,
    out: str | os.PathLike | None = None,
    compression: CompressOptions | None = None,
    data: Data | None = None,
    estimate: Estimate | None = None,
    search: Search | None = None,
    run: Run | None = None,
    **options: Any,
) -> CompressionReport:
    """Compress a causal LM to about ``ratio`` fewer parameters by depth and/or width pruning.

    Args:
        model: a model, or a name/folder for :func:`cbo.model.loading.load_model` (then ``tokenizer`` may be None).
        tokenizer: the model's tokenizer (needed to cut ``text`` into windows unless ``splits`` is given).
        text: calibration/evaluation text (see :func:`cbo.data.windows.load_documents`); None = the default Austen text.
        ratio: fraction of the parameters to remove, in (0, 1), of ``ratio_of``: ``"blocks"`` (default: the
            prunable parameters, those of the decoder layers) or ``"model"`` (all of them, embeddings and head
            included: on a model with a large vocabulary the same ratio removes far more of its layers).
        depth: ``none``, ``cbo`` (QUBO ground state) or ``antepenultimate``; with ``scheduler="mop"`` the rule
            that proposes each step's layer (:func:`cbo.pipeline.proposers.depth_proposer`).
        width: width score (default ``taylor`` one-shot, ``amp`` for MoP: the best of each on the default model
            in BENCHMARKS.md).
        scheduler: ``oneshot`` or ``mop``.
        depth_share: one-shot with depth: share of the budget taken by whole layers (rounded to layers).
        out: folder to save the compressed model (:func:`cbo.surgery.io.save_pruned`) and ``report.json``.
        compression: :class:`CompressOptions` (the MoP criterion, the width step's options, calibration
            selection, recovery, speed measurement).
        data / estimate / search / run: the groups of :mod:`cbo.pipeline.options`; compress uses ``Data``
            (``splits``, ``seq_len``, ``n_calibration``, ``n_validation=16``, ``n_test=32``), the estimator of
            ``Estimate`` and the solver of ``Search`` (of ``depth="cbo"``; MoP uses ``enumerate`` for ``"auto"``),
            and ``Run`` (``seed``, ``batch_size=4``, ``progress=False``, ``device``, ``dtype``).
        **options: the fields of :class:`CompressOptions` and of the groups as flat keywords (``criterion="kl"``,
            ``recovery_steps=2``, ``seed=1``, ``n_test=16``, ``estimator="fisher"``, ...).

    Returns:
        A :class:`CompressionReport` (``report.model`` is the compressed model).

    Example:
        >>> r = compress("smollm2-135m", ratio=0.2, scheduler="mop", criterion="kl", depth="cbo")  # doctest: +SKIP
    """
    from cbo.evaluate import count_parameters, evaluate, reference_logits, throughput
    from cbo.model.blocks import prunable_parameters
    from cbo.model.structures import layer_widths
    from cbo.surgery.depth import REMOVED_KEY, remove_blocks, text_config

    own = {k: options.pop(k) for k in [k for k in options if k in COMPRESS_FIELDS]}
    o = dataclasses.replace(compression or CompressOptions(), **own)
    data, estimate, search, run = option_groups(
        options, who="compress", unused=NOT_USED, defaults=DEFAULTS, data=data, estimate=estimate, search=search,
        run=run,
    )  # fmt: skip
    text = text if text is not None else data.text
    seq_len, n_calibration, n_validation, n_test = data.seq_len, data.n_calibration, data.n_validation, data.n_test
    seed, batch_size, progress = run.seed, run.batch_size, run.progress
    criterion, gqa, gamma, round_to, allocation = o.criterion, o.gqa, o.gamma, o.round_to, o.allocation
    score_options, select_calibration, recovery = o.score_options, o.select_calibration, o.recovery
    recovery_steps, final_recovery_steps = o.recovery_steps, o.final_recovery_steps
    if scheduler not in SCHEDULERS:
        raise InvalidOptionError(f"unknown scheduler {scheduler!r}; use one of {list(SCHEDULERS)}")
    check_ratio(ratio)
    check_choice("ratio_of", ratio_of, RATIO_OF)
    check_float("depth_share", depth_share, 0, 1, error=InfeasibleError)
    dtype, device = check_run_options(
        seq_len=seq_len, n_calibration=n_calibration, n_validation=n_validation, batch_size=batch_size, seed=seed,
        dtype=run.dtype, device=run.device, splits=data.splits,
    )  # fmt: skip
    width = width or ("amp" if scheduler == "mop" else DEFAULT_SCORE)
    check_width_options(width, score_options, gqa, allocation)
    if scheduler == "mop":
        check_mop_options(criterion, recovery)
    proposer = depth_proposer(
        depth,
        estimator=estimate.estimator,
        solver="enumerate" if scheduler == "mop" and search.solver == "auto" else search.solver,
        batch_size=batch_size,
        seed=seed,
        progress=progress and scheduler == "oneshot",
    )
    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    model, tokenizer, name = model_and_tokenizer(model, tokenizer, dtype=dtype, device=device, quiet=not progress)
    splits = token_splits(
        data.splits,
        tokenizer,
        text,
        model=model,
        seq_len=seq_len,
        n_calibration=n_calibration,
        n_validation=n_validation,
        n_test=n_test,
        seed=seed,
        who="compress",
    )
    calib, control, test = splits.calibration, splits.validation, splits.test
    if control is None or control.shape[0] == 0:
        control = calib
    if test is None or test.shape[0] == 0:
        raise DataError("compress needs a non-empty test split to report held-out perplexity and KL")
    model.eval()
    # the options every width step shares (one-shot, calibration selection, each MoP step)
    width_options = dict(gqa=gqa, gamma=gamma, round_to=round_to, allocation=allocation, score_options=score_options)
    settings = dict(model=str(name), ratio=ratio, ratio_of=ratio_of, scheduler=scheduler, width=width, depth=depth)
    settings |= dict(criterion=criterion, depth_share=depth_share, **width_options)
    settings["score_options"] = score_options or {}
    settings |= dict(select_calibration=select_calibration, recovery=recovery, recovery_steps=recovery_steps)
    settings |= dict(final_recovery_steps=final_recovery_steps, seed=seed)

    p0 = count_parameters(model)
    prunable = prunable_parameters(model)
    target = int(round(ratio * (prunable if ratio_of == "blocks" else p0)))
    if target >= prunable:
        raise InfeasibleError(
            f"ratio={ratio} of {RATIO_OF[ratio_of]} is {target:,} parameters, but the decoder layers hold only "
            f"{prunable:,}; give a smaller ratio (or ratio_of='blocks')"
        )

    t0 = time.perf_counter()
    ref = reference_logits(model, test, batch_size=batch_size)
    before = evaluate(model, test, ref, batch_size=batch_size)
    speed_opts = dict(prompt_len=64, new_tokens=16, repeats=3)
    speed_opts.update(o.speed_options or {})
    speed_before = throughput(model, **speed_opts) if o.measure_speed else None
    timings["evaluate_before"] = time.perf_counter() - t0

    path: list[dict[str, Any]] = []
    calib_info = None
    t0 = time.perf_counter()
    if scheduler == "mop":
        result = mixture_of_pruners(
            model,
            calib,
            control,
            ratio=target / p0,
            criterion=criterion,
            depth_proposer=proposer,
            width_score=width,
            recovery_steps=recovery_steps,
            final_recovery_steps=final_recovery_steps,
            recovery=recovery,
            batch_size=batch_size,
            seed=seed,
            progress=progress,
            **width_options,
        )
        pruned = result.model
        path = result.to_dict()["path"]
    else:
        pruned = model
        if proposer is not None and depth_share > 0:
            from cbo.model.blocks import find_blocks

            blocks = find_blocks(model, "layer")
            per_layer = sum(b.n_params for b in blocks) / len(blocks)
            layers = proposer.layers(model, calib, int(round(depth_share * target / per_layer)))
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
                    **width_options,
                )
                windows = choice.windows
                calib_info = {"index": choice.index, "kl": choice.kl, "candidates": select_calibration, "size": size}
            pruned, _ = width_prune(
                pruned,
                windows,
                remove_params=remaining,
                score=width,
                batch_size=batch_size,
                inplace=pruned is not model,
                **width_options,
            )
    timings["prune"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    after = evaluate(pruned, test, ref, batch_size=batch_size)
    speed_after = throughput(pruned, **speed_opts) if o.measure_speed else None
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
        tokenizer=tokenizer,
        prunable_before=prunable,
    )
    if out is not None:
        report.save_model(out, progress=progress)
    return report


COMPRESS_FIELDS = frozenset(f.name for f in dataclasses.fields(CompressOptions))
