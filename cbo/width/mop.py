"""MoP (Mixture of Pruners): an iterative path of depth and width steps chosen by a criterion.

Each step builds two candidates from the current model:

* **depth**: remove one decoder layer, chosen by the CBO QUBO of the current model (``depth="cbo"``:
  :func:`cbo.hessian.estimate_hessian` + :func:`cbo.solve` with ``M = 1``, first and last layer kept) or by
  the paper's rule, the antepenultimate layer (``depth="antepenultimate"``, keeping the last two);
* **width**: remove the same number of parameters as heads and MLP neurons across all layers, scored by a
  width score (AMP by default, as in the paper) and allocated globally (:mod:`cbo.width.allocate`).

Both may get a short recovery fine-tune (a few optimizer steps on the calibration windows; LoRA through
``peft`` when installed, merged back afterwards). A path criterion scores each candidate against the
original model on a control split: ``cosine`` (similarity of the final hidden states, higher is better),
``kl`` (KL to the original's next-token distribution), ``ppl`` (perplexity), or ``random`` (a seeded coin).
The better candidate becomes the next base; steps repeat until the target parameter ratio is reached.
When less than half a layer's parameters remain to be removed, one last width step removes exactly the
remainder. The path taken is recorded.

Example:
    >>> result = mixture_of_pruners(model, calib, control, ratio=0.3, criterion="kl")  # doctest: +SKIP
    >>> result.path_string()                                                          # doctest: +SKIP
    'DWWDW'
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from cbo.errors import CBOError, DataError, InfeasibleError
from cbo.extras import has_module, require

torch = require("torch", "the MoP scheduler")

CRITERIA = ("cosine", "kl", "ppl", "random")
DEPTH_RULES = ("cbo", "antepenultimate", "none")
RECOVERY = ("lora", "full")


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
    depth: str
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


# ------------------------------------------------------------------------------------------ recovery


def _lm_loss(model: Any, batch: Any) -> Any:
    logits = model(input_ids=batch).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1)
    )


@torch.no_grad()
def lm_loss_of(model: Any, windows: Any, batch_size: int = 4) -> float:
    """Mean next-token loss of ``model`` on ``windows`` (eval mode)."""
    device = next(model.parameters()).device
    losses = [
        float(_lm_loss(model, windows[i : i + batch_size].to(device))) for i in range(0, windows.shape[0], batch_size)
    ]
    return sum(losses) / len(losses)


def _lora_targets(model: Any) -> list[str]:
    from cbo.structures import model_structures

    names = set()
    for s in model_structures(model).all():
        for slot in s.slots:
            for name, module in model.named_modules():
                if module is slot.module:
                    names.add(name.rsplit(".", 1)[-1])
                    break
    return sorted(names)


def recover(
    model: Any,
    windows: Any,
    *,
    steps: int = 10,
    lr: float = 1e-4,
    method: str = "lora",
    batch_size: int = 4,
    seed: int = 0,
    lora_rank: int = 8,
) -> Any:
    """A short recovery fine-tune on ``windows`` (next-token loss); returns the model (same shapes, eval mode).

    ``method="lora"`` trains LoRA adapters on the attention and MLP projections and merges them back (needs
    ``peft``; falls back to ``"full"`` with a note in ``model.config.cbo_recovery`` when it is missing);
    ``"full"`` updates every weight with AdamW.
    """
    if method not in RECOVERY:
        raise CBOError(f"unknown recovery method {method!r}; use one of {RECOVERY}")
    if steps <= 0:
        return model
    torch.manual_seed(seed)
    used = method if (method != "lora" or has_module("peft")) else "full"
    target = model
    if used == "lora":
        peft = require("peft", "LoRA recovery")
        config = peft.LoraConfig(
            r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0, target_modules=_lora_targets(model)
        )
        target = peft.get_peft_model(model, config)
    params = [p for p in target.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    target.train()
    n = windows.shape[0]
    device = next(model.parameters()).device
    try:
        for i in range(steps):
            start = (i * batch_size) % n
            batch = windows[start : start + batch_size].to(device)
            loss = _lm_loss(target, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    finally:
        target.eval()
    if used == "lora":
        model = target.merge_and_unload()
    model.eval()
    model.config.cbo_recovery = {"method": used, "steps": steps, "lr": lr}
    return model


# ------------------------------------------------------------------------------------------ criteria


class _Criterion:
    """Scores a candidate against the original on the control windows (lower is better)."""

    def __init__(self, name: str, original: Any, control: Any, batch_size: int, ref_logprobs: Any = None):
        from cbo.evaluate import reference_logits

        self.name, self.control, self.batch_size = name, control, batch_size
        self.ref = None
        self.hidden = None
        if name == "kl":
            self.ref = (
                ref_logprobs if ref_logprobs is not None else reference_logits(original, control, batch_size=batch_size)
            )
        elif name == "cosine":
            self.hidden = self._final_hidden(original)

    @torch.no_grad()
    def _final_hidden(self, model: Any) -> Any:
        out = []
        device = next(model.parameters()).device
        for i in range(0, self.control.shape[0], self.batch_size):
            batch = self.control[i : i + self.batch_size].to(device)
            out.append(
                model(input_ids=batch, output_hidden_states=True, use_cache=False).hidden_states[-1].float().cpu()
            )
        return torch.cat(out)

    def __call__(self, model: Any) -> float:
        """The criterion value as reported (cosine: similarity; kl, ppl: as measured)."""
        from cbo.evaluate import kl_to_reference, perplexity

        if self.name == "kl":
            return float(kl_to_reference(model, self.control, self.ref, batch_size=self.batch_size))
        if self.name == "ppl":
            return float(perplexity(model, self.control, batch_size=self.batch_size))
        h = self._final_hidden(model)
        return float(torch.nn.functional.cosine_similarity(h, self.hidden, dim=-1).mean())

    def better(self, a: float, b: float) -> bool:
        """True when value ``a`` is strictly better than ``b``."""
        return a > b if self.name == "cosine" else a < b


# ------------------------------------------------------------------------------------------ candidates


def _original_index(model: Any, layer: int) -> int:
    from cbo.surgery.depth import ORIGINAL_KEY, text_config

    original = getattr(text_config(model), ORIGINAL_KEY, None)
    return int(original[layer]) if original and layer < len(original) else layer


def choose_depth_layer(
    model: Any,
    rule: str,
    calibration: Any,
    *,
    estimator: str = "fisher",
    solver: str = "enumerate",
    batch_size: int = 4,
    seed: int = 0,
) -> int | None:
    """The layer a depth step removes (None when the model is too shallow: fewer than 3 layers)."""
    from cbo.blocks import decoder_layers

    n = len(decoder_layers(model)[0])
    if rule == "none" or n < 3:
        return None
    if rule == "antepenultimate":
        return n - 3
    if rule != "cbo":
        raise CBOError(f"unknown depth rule {rule!r}; use one of {DEPTH_RULES}")
    from cbo.hessian import estimate_hessian
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
        progress=False,
    )
    states = solve(qubo, remove=1, solver=solver, k=1, keep=[0, n - 1], seed=seed)
    return int(states.removed(0)[0])


def _width_candidate(model: Any, calibration: Any, budget: int, score: str, batch_size: int, **alloc: Any):
    from cbo.evaluate import count_parameters
    from cbo.surgery.width import prune_width
    from cbo.width.allocate import allocate
    from cbo.width.scores import score_units

    opts = dict(alloc)
    score_options = opts.pop("score_options", None) or {}
    gqa = opts.pop("gqa", "group")
    scores = score_units(model, calibration, score, gqa=gqa, batch_size=batch_size, **score_options)
    allocation = allocate(scores, remove_params=budget, total_params=count_parameters(model), **opts)
    return prune_width(model, allocation.plan), allocation.removed_params


def mixture_of_pruners(
    model: Any,
    calibration: Any,
    control: Any,
    *,
    ratio: float = 0.3,
    criterion: str = "kl",
    depth: str = "antepenultimate",
    width_score: str = "amp",
    gqa: str = "group",
    gamma: float | None = None,
    round_to: int = 8,
    allocation: str | None = None,
    score_options: dict[str, Any] | None = None,
    recovery_steps: int = 0,
    final_recovery_steps: int = 0,
    recovery: str = "lora",
    recovery_lr: float = 1e-4,
    estimator: str = "fisher",
    solver: str = "enumerate",
    batch_size: int = 4,
    seed: int = 0,
    ref_logprobs: Any = None,
    max_steps: int = 1000,
    progress: bool = False,
) -> MoPResult:
    """Prune ``model`` to ``ratio`` of its parameters removed by a path of depth and width steps.

    Args:
        model: the original model (left untouched; the result is a new model).
        calibration: ``(B, T)`` windows for width scores, the CBO QUBO and recovery.
        control: ``(B, T)`` windows on which the criterion compares candidates with the original.
        ratio: fraction of the original's parameters to remove, in (0, 1).
        criterion: ``cosine``, ``kl``, ``ppl`` or ``random`` (seeded by ``seed``).
        depth: ``antepenultimate`` (the paper), ``cbo`` (the QUBO picks the layer) or ``none`` (width only).
        width_score: a registered width score (default AMP, as in the paper).
        allocation: how a width step spreads its budget over layers (default: the score's own, see
            :func:`cbo.width.allocate.allocate`).
        recovery_steps / final_recovery_steps: optimizer steps after each candidate / at the end (0 = none).
        recovery: ``lora`` (peft) or ``full``.
        ref_logprobs: the original's log-probs on ``control`` (computed when omitted; used by ``kl``).

    Returns:
        A :class:`MoPResult` with the pruned model and the recorded path.

    Example:
        >>> r = mixture_of_pruners(model, calib, control, ratio=0.4, criterion="cosine", depth="cbo")  # doctest: +SKIP
    """
    from cbo.blocks import find_blocks
    from cbo.evaluate import count_parameters
    from cbo.surgery.depth import remove_blocks

    if criterion not in CRITERIA:
        raise CBOError(f"unknown MoP criterion {criterion!r}; use one of {CRITERIA}")
    if depth not in DEPTH_RULES:
        raise CBOError(f"unknown depth rule {depth!r}; use one of {DEPTH_RULES}")
    if not (isinstance(ratio, (int, float)) and 0.0 < float(ratio) < 1.0):
        raise InfeasibleError(f"ratio must be in (0, 1) (fraction of parameters to remove), got {ratio!r}")
    for name, w in (("calibration", calibration), ("control", control)):
        if not hasattr(w, "ndim") or w.ndim != 2 or w.shape[0] == 0:
            raise DataError(f"{name} must be (B, T) token windows, got {w!r}")

    p0 = count_parameters(model)
    target = int(round(ratio * p0))
    judge = _Criterion(criterion, model, control, batch_size, ref_logprobs) if criterion != "random" else None
    rng = np.random.default_rng(seed)
    alloc = dict(gqa=gqa, gamma=gamma, round_to=round_to, allocation=allocation, score_options=score_options)
    current = model
    path: list[MoPStep] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=target, desc="MoP", unit="param", leave=False)

    def fine_tune(candidate: Any, steps: int, k: int) -> Any:
        return recover(
            candidate, calibration, steps=steps, lr=recovery_lr, method=recovery, batch_size=batch_size, seed=seed + k
        )

    for step in range(max_steps):
        t0 = time.perf_counter()
        before = count_parameters(current)
        remaining = target - (p0 - before)
        if remaining <= 0:
            break
        blocks = find_blocks(current, "layer")
        mean_layer = sum(b.n_params for b in blocks) // len(blocks)
        if remaining < mean_layer / 2:  # less than half a layer left: one width step takes exactly the rest
            try:
                width_model, removed = _width_candidate(
                    current, calibration, remaining, width_score, batch_size, **alloc
                )
            except InfeasibleError:
                break
            if removed == 0:
                break  # the remainder is smaller than any chunk the allocation can take
            width_model = fine_tune(width_model, recovery_steps, 2 * step + 1)
            value = judge(width_model) if judge else None
            path.append(
                MoPStep(
                    step,
                    "width",
                    before,
                    before - removed,
                    None,
                    None,
                    0,
                    removed,
                    None,
                    value,
                    time.perf_counter() - t0,
                    True,
                )
            )
            current = width_model
            if bar:
                bar.update(removed)
            break
        layer = choose_depth_layer(
            current, depth, calibration, estimator=estimator, solver=solver, batch_size=batch_size, seed=seed
        )
        budget = blocks[layer].n_params if layer is not None else mean_layer
        base = current
        orig = _original_index(base, layer) if layer is not None else None
        if criterion == "random":  # a seeded coin picks the step; only that candidate is built
            wanted = ["width"] if layer is None or rng.random() < 0.5 else ["depth"]
        else:
            wanted = (["depth"] if layer is not None else []) + ["width"]
        built: dict[str, Any] = {}
        width_removed = 0
        if "width" in wanted:
            try:
                built["width"], width_removed = _width_candidate(
                    base, calibration, budget, width_score, batch_size, **alloc
                )
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
        path.append(
            MoPStep(
                step,
                chosen,
                before,
                after,
                layer,
                orig,
                budget if layer is not None else 0,
                width_removed,
                values.get("depth"),
                values.get("width"),
                time.perf_counter() - t0,
            )
        )
        if bar:
            bar.update(before - after)
    if bar:
        bar.close()
    if current is model:
        raise InfeasibleError(f"MoP could not remove anything from the model at ratio {ratio}")
    if final_recovery_steps > 0:
        current = fine_tune(current, final_recovery_steps, 10**6)
    return MoPResult(
        model=current,
        path=path,
        params_before=p0,
        params_after=count_parameters(current),
        target_params=target,
        criterion=criterion,
        depth=depth,
        width_score=width_score,
        seed=seed,
        info={
            "recovery": recovery if recovery_steps or final_recovery_steps else None,
            "recovery_steps": recovery_steps,
        },
    )
