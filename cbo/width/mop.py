"""MoP (Mixture of Pruners): an iterative path of depth and width steps chosen by a criterion.

Each step builds two candidates from the current model:

* **depth**: remove the one decoder layer a *depth proposer* names: a callable ``(model, calibration) ->
  layer index or None`` (None: no depth candidate). The default, :func:`antepenultimate`, is the paper's
  rule (the layer just before the last two); the pipeline layer adds the CBO proposer (the QUBO's best next
  layer, :mod:`cbo.pipeline.proposers`), so this module never estimates a Hessian or runs a solver itself;
* **width**: remove the same number of parameters as heads and MLP neurons across all layers, scored by a
  width score (AMP by default, as in the paper) and allocated globally (:mod:`cbo.width.allocate`).

Both may get a short recovery fine-tune (:func:`cbo.recovery.finetune.recover`). A path criterion scores each
candidate against the original model on a control split: ``cosine`` (similarity of the final hidden states,
higher is better), ``kl`` (KL to the original's next-token distribution), ``ppl`` (perplexity), or
``random`` (a seeded coin). The better candidate becomes the next base; steps repeat until the target
parameter ratio is reached. When less than half a layer's parameters remain to be removed, one last width
step removes exactly the remainder. The path taken is recorded.

Example:
    >>> result = mixture_of_pruners(model, calib, control, ratio=0.3, criterion="kl")  # doctest: +SKIP
    >>> result.path_string()                                                          # doctest: +SKIP
    'DWWDW'
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from cbo.checks import is_int
from cbo.errors import DataError, InfeasibleError, InvalidOptionError
from cbo.evaluate import count_parameters, kl_to_reference, perplexity, reference_logits
from cbo.extras import require
from cbo.model.blocks import decoder_layers, find_blocks
from cbo.model.forward import input_device, window_batches
from cbo.progress import progress_bar
from cbo.recovery.finetune import RECOVERY, recover
from cbo.surgery.depth import ORIGINAL_KEY, remove_blocks, text_config
from cbo.width.allocate import check_ratio
from cbo.width.prune import check_width_options, width_prune

torch = require("torch", "the MoP scheduler")

CRITERIA = ("cosine", "kl", "ppl", "random")

# the next layer a depth step removes, or None when no layer should go
DepthProposer = Callable[[Any, Any], "int | None"]


def antepenultimate(model: Any, calibration: Any = None) -> int | None:
    """MoP's depth rule (the paper): the layer just before the last two; None below three layers."""
    n = len(decoder_layers(model)[0])
    return n - 3 if n >= 3 else None


def proposer_name(proposer: DepthProposer | None) -> str:
    """How a proposer is recorded: its ``name`` attribute, its function name, or ``"none"``."""
    if proposer is None:
        return "none"
    return str(getattr(proposer, "name", None) or getattr(proposer, "__name__", None) or type(proposer).__name__)


def proposed_layer(proposer: DepthProposer | None, model: Any, calibration: Any) -> int | None:
    """The proposer's layer for ``model``, checked to be a layer of it (None: no depth candidate)."""
    if proposer is None:
        return None
    layer = proposer(model, calibration)
    if layer is None:
        return None
    n = len(decoder_layers(model)[0])
    if not is_int(layer) or not 0 <= int(layer) < n:
        raise InvalidOptionError(
            f"depth proposer {proposer_name(proposer)!r} returned {layer!r}; it must return a layer index in "
            f"0..{n - 1} or None"
        )
    return int(layer)


@dataclass
class MoPStep:
    """One step of the path."""

    step: int
    chosen: str  # "depth" | "width"
    params_before: int
    params_after: int
    depth_layer: int | None  # layer index in the model of this step (None: no depth candidate)
    depth_original_layer: int | None  # index in the original model
    depth_params: int
    width_params: int
    depth_score: float | None
    width_score: float | None
    seconds: float
    final: bool = False  # the last, width-only step that removes the remainder


@dataclass
class MoPResult:
    """The pruned model and the path that produced it."""

    model: Any
    path: list[MoPStep]
    params_before: int
    params_after: int
    target_params: int
    criterion: str
    depth: str  # the depth proposer's name ("none": width only)
    width_score: str
    seed: int
    info: dict[str, Any] = field(default_factory=dict)

    def path_string(self) -> str:
        """One letter per step: D (a layer removed) or W (heads and neurons removed)."""
        return "".join("D" if s.chosen == "depth" else "W" for s in self.path)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "model"}
        out["path_string"] = self.path_string()
        return out


# ------------------------------------------------------------------------------------------ criteria


class PathCriterion:
    """Scores a candidate against the original on the control windows (see :meth:`better`)."""

    def __init__(self, name: str, original: Any, control: Any, batch_size: int, ref_logprobs: Any = None):
        self.name, self.control, self.batch_size = name, control, batch_size
        self.ref = None
        self.hidden = None
        if name == "kl":
            self.ref = ref_logprobs
            if self.ref is None:
                self.ref = reference_logits(original, control, batch_size=batch_size)
        elif name == "cosine":
            self.hidden = self.final_hidden(original)

    @torch.no_grad()
    def final_hidden(self, model: Any) -> Any:
        """The last hidden states of ``model`` on the control windows."""
        out = []
        device = input_device(model)
        for _, batch in window_batches(self.control, self.batch_size):
            batch = batch.to(device)
            out.append(
                model(input_ids=batch, output_hidden_states=True, use_cache=False).hidden_states[-1].float().cpu()
            )
        return torch.cat(out)

    def __call__(self, model: Any) -> float:
        """The criterion value as reported (cosine: similarity; kl, ppl: as measured)."""
        if self.name == "kl":
            return float(kl_to_reference(model, self.control, self.ref, batch_size=self.batch_size))
        if self.name == "ppl":
            return float(perplexity(model, self.control, batch_size=self.batch_size))
        h = self.final_hidden(model)
        return float(torch.nn.functional.cosine_similarity(h, self.hidden, dim=-1).mean())

    def better(self, a: float, b: float) -> bool:
        """True when value ``a`` is strictly better than ``b``."""
        return a > b if self.name == "cosine" else a < b


# ------------------------------------------------------------------------------------------ the scheduler


# the width step's options mixture_of_pruners passes on (cbo.width.prune.width_prune), with their defaults
WIDTH_OPTIONS = {"gqa": "group", "gamma": None, "round_to": 8, "allocation": None, "score_options": None}
MAX_STEPS = 1000  # path steps at most (a guard: each step removes at least a chunk of the budget)


def check_mop_options(criterion: str, recovery: str = "lora") -> None:
    """Raise :class:`InvalidOptionError` for an unknown path criterion or recovery method."""
    if criterion not in CRITERIA:
        raise InvalidOptionError(f"unknown MoP criterion {criterion!r}; use one of {list(CRITERIA)}")
    if recovery not in RECOVERY:
        raise InvalidOptionError(f"unknown recovery method {recovery!r}; use one of {list(RECOVERY)}")


def original_index(model: Any, layer: int) -> int:
    """The index in the original model of ``model``'s layer ``layer`` (after earlier depth steps)."""
    original = getattr(text_config(model), ORIGINAL_KEY, None)
    return int(original[layer]) if original and layer < len(original) else layer


def mixture_of_pruners(
    model: Any,
    calibration: Any,
    control: Any,
    *,
    ratio: float = 0.3,
    criterion: str = "kl",
    depth_proposer: DepthProposer | None = antepenultimate,
    width_score: str = "amp",
    recovery_steps: int = 0,
    final_recovery_steps: int = 0,
    recovery: str = "lora",
    recovery_lr: float = 1e-4,
    batch_size: int = 4,
    seed: int = 0,
    ref_logprobs: Any = None,
    progress: bool = False,
    **width_options: Any,
) -> MoPResult:
    """Prune ``model`` to ``ratio`` of its parameters removed by a path of depth and width steps.

    Args:
        model: the original model (left untouched; the result is a new model).
        calibration: ``(B, T)`` windows for width scores, the depth proposer and recovery.
        control: ``(B, T)`` windows on which the criterion compares candidates with the original.
        ratio: fraction of the original's parameters to remove, in (0, 1).
        criterion: ``cosine``, ``kl``, ``ppl`` or ``random`` (seeded by ``seed``).
        depth_proposer: ``(model, calibration) -> layer or None``, the layer each depth candidate removes:
            :func:`antepenultimate` (the paper, default), the CBO proposer of :mod:`cbo.pipeline.proposers`
            (the QUBO's best next layer), or None (width only).
        width_score: a registered width score (default AMP, as in the paper).
        allocation: how a width step spreads its budget over layers (default: the score's own, see
            :func:`cbo.width.allocate.allocate`).
        recovery_steps / final_recovery_steps: optimizer steps after each candidate / at the end (0 = none).
        recovery: ``lora`` (peft) or ``full``.
        ref_logprobs: the original's log-probs on ``control`` (computed when omitted; used by ``kl``).
        **width_options: the width step's options of :func:`cbo.width.prune.width_prune`: ``gqa="group"``,
            ``gamma``, ``round_to=8``, ``allocation`` and ``score_options``.

    Returns:
        A :class:`MoPResult` with the pruned model and the recorded path.

    Example:
        >>> from cbo.pipeline.proposers import depth_proposer                                # doctest: +SKIP
        >>> r = mixture_of_pruners(model, calib, control, ratio=0.4, criterion="cosine",
        ...                        depth_proposer=depth_proposer("cbo"))                  # doctest: +SKIP
    """
    check_mop_options(criterion, recovery)
    unknown = sorted(set(width_options) - set(WIDTH_OPTIONS))
    if unknown:
        raise InvalidOptionError(f"mixture_of_pruners has no option(s) {unknown}; width options: {list(WIDTH_OPTIONS)}")
    width_options = {**WIDTH_OPTIONS, **width_options}
    check_width_options(width_score, width_options["score_options"], width_options["gqa"], width_options["allocation"])
    if depth_proposer is not None and not callable(depth_proposer):
        raise InvalidOptionError(
            f"depth_proposer must be a callable (model, calibration) -> layer or None, or None; got {depth_proposer!r}"
        )
    check_ratio(ratio)
    for name, w in (("calibration", calibration), ("control", control)):
        if not hasattr(w, "ndim") or w.ndim != 2 or w.shape[0] == 0:
            raise DataError(f"{name} must be (B, T) token windows, got {w!r}")

    p0 = count_parameters(model)
    target = int(round(ratio * p0))
    judge = PathCriterion(criterion, model, control, batch_size, ref_logprobs) if criterion != "random" else None
    rng = np.random.default_rng(seed)
    width_options = dict(score=width_score, batch_size=batch_size, **width_options)

    def width_step(base: Any, budget: int) -> tuple[Any, int]:
        pruned, alloc = width_prune(
            base, calibration, remove_params=budget, total_params=count_parameters(base), **width_options
        )
        return pruned, alloc.removed_params

    def fine_tune(candidate: Any, steps: int, k: int) -> Any:
        return recover(
            candidate, calibration, steps=steps, lr=recovery_lr, method=recovery, batch_size=batch_size, seed=seed + k
        )

    current = model
    path: list[MoPStep] = []
    bar = progress_bar(progress, total=target, desc="MoP", unit="param")
    for step in range(MAX_STEPS):
        t0 = time.perf_counter()
        before = count_parameters(current)
        remaining = target - (p0 - before)
        if remaining <= 0:
            break
        blocks = find_blocks(current, "layer")
        mean_layer = sum(b.n_params for b in blocks) // len(blocks)
        if remaining < mean_layer / 2:  # less than half a layer left: one width step takes exactly the rest
            try:
                width_model, removed = width_step(current, remaining)
            except InfeasibleError:
                break
            if removed == 0:
                break  # the remainder is smaller than any chunk the allocation can take
            width_model = fine_tune(width_model, recovery_steps, 2 * step + 1)
            value = judge(width_model) if judge else None
            seconds = time.perf_counter() - t0
            path.append(
                MoPStep(
                    step, "width", before, before - removed, None, None, 0, removed, None, value, seconds, final=True
                )
            )
            current = width_model
            bar.update(removed)
            break
        layer = proposed_layer(depth_proposer, current, calibration)
        budget = blocks[layer].n_params if layer is not None else mean_layer
        base = current
        if criterion == "random":  # a seeded coin picks the step; only that candidate is built
            wanted = ["width"] if layer is None or rng.random() < 0.5 else ["depth"]
        else:
            wanted = (["depth"] if layer is not None else []) + ["width"]
        built: dict[str, Any] = {}
        width_removed = 0
        if "width" in wanted:
            try:
                built["width"], width_removed = width_step(base, budget)
                if width_removed == 0:
                    del built["width"]
                    raise InfeasibleError("the width step can remove nothing more")
            except InfeasibleError:
                if criterion == "random" and layer is not None:
                    wanted = ["depth"]  # no width left to take: the coin's other side
        if "depth" in wanted:
            built["depth"] = remove_blocks(base, [layer])
        if not built:
            break  # neither a layer nor more width can go
        for kind, k in (("depth", 2 * step), ("width", 2 * step + 1)):
            if kind in built:
                built[kind] = fine_tune(built[kind], recovery_steps, k)
        values = {kind: judge(m) for kind, m in built.items()} if judge else {}
        if len(built) == 1:
            chosen = next(iter(built))
        else:
            chosen = "width" if judge.better(values["width"], values["depth"]) else "depth"
        current = built[chosen]
        after = count_parameters(current)
        orig = original_index(base, layer) if layer is not None else None
        depth_params = budget if layer is not None else 0
        path.append(
            MoPStep(
                step,
                chosen,
                before,
                after,
                depth_layer=layer,
                depth_original_layer=orig,
                depth_params=depth_params,
                width_params=width_removed,
                depth_score=values.get("depth"),
                width_score=values.get("width"),
                seconds=time.perf_counter() - t0,
            )
        )
        bar.update(before - after)
    bar.close()
    if current is model:
        raise InfeasibleError(f"MoP could not remove anything from the model at ratio {ratio}")
    if final_recovery_steps > 0:
        current = fine_tune(current, final_recovery_steps, 10**6)
    info = {"recovery": recovery if recovery_steps or final_recovery_steps else None, "recovery_steps": recovery_steps}
    settings = (criterion, proposer_name(depth_proposer), width_score, seed)
    return MoPResult(current, path, p0, count_parameters(current), target, *settings, info=info)
