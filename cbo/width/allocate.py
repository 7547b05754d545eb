"""Global allocation of a width budget: which units go, across all layers and both module kinds.

The budget (parameters to remove) is split between attention and MLP with the ratio γ of their pruning
fractions, ``s_mlp = γ · s_attn`` (NIRVANA's adaptive allocation): with ``A`` and ``M`` the prunable
attention and MLP parameters, ``s_attn = R / (A + γ M)``. Within each kind, units of all layers are
ranked together by score and removed from the lowest up, under per-layer minimums, in *chunks* that keep
the layer valid:

* MLP: kept neurons stay a multiple of ``round_to`` (default 8, for Tensor-Core friendly shapes); a chunk
  is the next ``round_to`` lowest neurons of a layer, ranked by its highest score (so a chunk goes only
  when all its neurons would);
* attention, ``gqa="group"`` (or multi-head attention): a chunk is one KV group (one head);
* attention, ``gqa="query"``: a chunk is the next-lowest query head of *every* group of a layer, so all
  groups keep the same number of query heads.

The analytic default of γ is the ratio of MLP to attention parameters,
``γ = P_mlp / P_attn = 3·d_ff / (d_head · (2·n_heads + 2·n_kv_heads))`` for a gated MLP with
grouped-query attention: 3.0 for Llama-3.2-3B (the NIRVANA reference default for that model) and for
SmolLM2-135M, 4.2 for Llama-3.1-8B. The reference uses 3.36 for Llama-3.1-8B, which is 0.8 × the parameter
ratio and does not follow from the shapes; pass ``gamma=3.36`` to reproduce it.

``allocation="uniform"`` replaces the global ranking by the same fraction in every layer (ranking only
within each layer), for scores whose scale is not comparable across layers.

Example:
    >>> alloc = allocate(scores, ratio=0.2)      # doctest: +SKIP
    >>> pruned = prune_width(model, alloc.plan)  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cbo.errors import InfeasibleError
from cbo.evaluate import count_parameters
from cbo.extras import require
from cbo.model.structures import KINDS, ModelStructures
from cbo.surgery.width import WidthPlan
from cbo.width.scores.base import Key, UnitScores

torch = require("torch", "width allocation")

ALLOCATIONS = ("global", "uniform")


def gamma_for_shapes(*, intermediate: int, heads: int, kv_heads: int, head_dim: int, gated: bool = True) -> float:
    """γ = MLP parameters / attention parameters of one layer (weights only).

    Example:
        >>> round(gamma_for_shapes(intermediate=14336, heads=32, kv_heads=8, head_dim=128), 2)  # Llama-3.1-8B
        4.2
        >>> gamma_for_shapes(intermediate=8192, heads=24, kv_heads=8, head_dim=128)  # Llama-3.2-3B
        3.0
    """
    per_hidden_mlp = (3 if gated else 2) * intermediate
    per_hidden_attn = head_dim * (2 * heads + 2 * kv_heads)
    return per_hidden_mlp / per_hidden_attn


def default_gamma(structures: ModelStructures) -> float:
    """The analytic γ of a model: its prunable MLP parameters over its prunable attention parameters."""
    a = sum(s.n_params for s in structures.attention.values())
    m = sum(s.n_params for s in structures.mlp.values())
    if a == 0 or m == 0:
        return 1.0
    return m / a


@dataclass
class _Chunk:
    score: float
    cost: int
    key: Key
    order: int  # position within its layer (chunks of a layer must go in this order)
    units: list[int]


@dataclass
class Allocation:
    """What the allocator decided."""

    plan: WidthPlan
    target_params: int
    removed_params: int
    removed_by_kind: dict[str, int]
    budget_by_kind: dict[str, int]
    gamma: float
    removed_units: dict[Key, list[int]] = field(default_factory=dict)
    kept: dict[Key, int] = field(default_factory=dict)
    allocation: str = "global"

    def summary(self) -> str:
        a, m = self.removed_by_kind.get("attention", 0), self.removed_by_kind.get("mlp", 0)
        return (
            f"remove {self.removed_params:,} params (target {self.target_params:,}; attention {a:,}, MLP {m:,}; "
            f"gamma={self.gamma:.3g}, {self.allocation})"
        )


def check_ratio(ratio: float) -> float:
    """The fraction of parameters to remove: a number in (0, 1) (InfeasibleError otherwise)."""
    from cbo.checks import check_float

    return check_float("ratio", ratio, 0, 1, lo_open=True, hi_open=True, error=InfeasibleError,
                       hint="It is the fraction of parameters to remove.")  # fmt: skip


def _chunks(scores: UnitScores, key: Key, *, round_to: int, min_units: int, max_fraction: float | None) -> list[_Chunk]:
    layer, kind = key
    v = scores.values[key].detach().double().cpu()
    units = scores.units[key]
    n = units.n
    if kind == "mlp":
        if round_to > n:
            raise InfeasibleError(
                f"round_to={round_to} is larger than the MLP width {n} of layer {layer}; use round_to <= {n}"
            )
        floor_keep = max(min_units, round_to)
        floor_keep = -(-floor_keep // round_to) * round_to  # kept width stays a multiple of round_to
        if max_fraction is not None:
            floor_keep = max(floor_keep, -(-int(round(n * (1 - max_fraction))) // round_to) * round_to)
        order = torch.argsort(v, stable=True).tolist()
        out: list[_Chunk] = []
        start = 0
        keep = n
        first = n % round_to
        while True:
            size = first if (start == 0 and first) else round_to
            if keep - size < floor_keep or size == 0:
                break
            members = order[start : start + size]
            out.append(_Chunk(float(v[members].max()), size * units.params, key, len(out), members))
            start += size
            keep -= size
        return out
    if units.chunk == 1:  # whole KV groups, or heads of multi-head attention
        order = torch.argsort(v, stable=True).tolist()
        max_remove = n - max(min_units, 1)
        if max_fraction is not None:
            max_remove = min(max_remove, int(n * max_fraction))
        return [_Chunk(float(v[u]), units.params, key, i, [u]) for i, u in enumerate(order[: max(max_remove, 0)])]
    # query heads, the same number in every group: chunk j = the j-th lowest query head of each group
    s = scores.structures.attention[layer]
    g, nkv = s.group_size, s.n_kv_heads
    per_group = v.reshape(nkv, g)
    order = torch.argsort(per_group, dim=1, stable=True)
    max_remove = g - max(min_units, 1)
    if max_fraction is not None:
        max_remove = min(max_remove, int(g * max_fraction))
    out = []
    for j in range(max(max_remove, 0)):
        heads = [int(k * g + order[k, j]) for k in range(nkv)]
        out.append(_Chunk(float(v[heads].max()), nkv * units.params, key, j, heads))
    return out


def _take(chunks: list[_Chunk], budget: int) -> list[_Chunk]:
    """Lowest-scoring chunks first, stopping where the budget is met as closely as possible."""
    chunks = sorted(chunks, key=lambda c: (c.score, c.key[0], c.order))
    taken, removed = [], 0
    for c in chunks:
        if removed >= budget:
            break
        if removed + c.cost > budget and (removed + c.cost - budget) > (budget - removed):
            break  # overshooting by more than we would fall short
        taken.append(c)
        removed += c.cost
    return taken


def _take_uniform(chunks: list[_Chunk], budget: int, sizes: dict[Key, int]) -> list[_Chunk]:
    """Every layer gives the same share of its parameters; rounding carries over to the next layer."""
    total = sum(sizes.values())
    by_key: dict[Key, list[_Chunk]] = {}
    for c in chunks:
        by_key.setdefault(c.key, []).append(c)
    taken: list[_Chunk] = []
    carry = 0.0
    for key in sorted(sizes):
        share = budget * sizes[key] / total + carry if total else 0.0
        mine = _take(by_key.get(key, []), int(round(share))) if share > 0 else []
        taken += mine
        carry = share - sum(c.cost for c in mine)
    return taken


def allocate(
    scores: UnitScores,
    *,
    ratio: float | None = None,
    remove_params: int | None = None,
    gamma: float | None = None,
    round_to: int = 8,
    min_heads: int = 1,
    min_neurons: int | None = None,
    max_layer_fraction: float | None = None,
    total_params: int | None = None,
    allocation: str | None = None,
) -> Allocation:
    """Choose the units to remove so that about ``ratio`` of the model's parameters go.

    Args:
        scores: per-unit importances from :func:`cbo.width.scores.score_units`.
        ratio: fraction of the model's *total* parameters (embeddings included) to remove, in (0, 1).
        remove_params: the budget as a parameter count instead of ``ratio``.
        gamma: MLP-vs-attention pruning ratio ``s_mlp / s_attn``; default :func:`default_gamma`.
        round_to: kept MLP widths are multiples of this.
        min_heads: attention units each layer keeps at least (KV groups in ``gqa="group"`` mode, heads of
            multi-head attention, query heads per group in ``gqa="query"`` mode).
        min_neurons: MLP neurons each layer keeps at least (default ``round_to``).
        max_layer_fraction: optional cap on the fraction of a layer's units that may go.
        total_params: parameter count ``ratio`` refers to (default: the model's).
        allocation: ``"global"`` (rank units of all layers together, per kind) or ``"uniform"`` (every layer
            loses the same fraction of its attention and of its MLP parameters, ranking within the layer; for
            scores whose scale differs from layer to layer, such as activation magnitudes). Default: the
            score's ``default_allocation`` (uniform for AMP, global for the others).

    Raises:
        InfeasibleError: ratio outside (0, 1); ``round_to`` larger than an MLP width; or a budget that the
            per-layer minimums cannot meet (it would leave a layer empty).
    """
    structs = scores.structures
    if allocation is None:
        from cbo.width.scores import get as get_score

        allocation = get_score(scores.score).default_allocation
    if allocation not in ALLOCATIONS:
        raise InfeasibleError(f"unknown allocation {allocation!r}; use one of {ALLOCATIONS}")
    if round_to < 1:
        raise InfeasibleError(f"round_to must be >= 1, got {round_to}")
    if min_heads < 1:
        raise InfeasibleError(f"min_heads must be >= 1 (a layer cannot lose all its heads), got {min_heads}")
    if max_layer_fraction is not None and not 0.0 < max_layer_fraction <= 1.0:
        raise InfeasibleError(f"max_layer_fraction must be in (0, 1], got {max_layer_fraction}")
    total = total_params if total_params is not None else count_parameters(structs.model)
    if (ratio is None) == (remove_params is None):
        raise InfeasibleError("give exactly one of ratio= or remove_params=")
    if ratio is not None:
        check_ratio(ratio)
        target = int(round(float(ratio) * total))
    else:
        target = int(remove_params)
        if not 0 < target < total:
            raise InfeasibleError(f"remove_params must be in (0, {total}) for this model, got {remove_params}")
    g = default_gamma(structs) if gamma is None else float(gamma)
    if not g > 0:
        raise InfeasibleError(f"gamma must be > 0 (s_mlp / s_attn), got {gamma}")

    chunks: dict[str, list[_Chunk]] = {k: [] for k in KINDS}
    for key in scores.keys():
        mins = min_heads if key[1] == "attention" else (min_neurons if min_neurons is not None else round_to)
        chunks[key[1]] += _chunks(scores, key, round_to=round_to, min_units=mins, max_fraction=max_layer_fraction)
    cap = {k: sum(c.cost for c in chunks[k]) for k in KINDS}
    size = {
        "attention": sum(s.n_params for s in structs.attention.values() if (s.layer, "attention") in scores.values),
        "mlp": sum(s.n_params for s in structs.mlp.values() if (s.layer, "mlp") in scores.values),
    }
    if target > cap["attention"] + cap["mlp"]:
        most = cap["attention"] + cap["mlp"]
        raise InfeasibleError(
            f"removing {target:,} parameters ({target / total:.1%}) would leave a layer empty: with at least "
            f"{min_heads} attention unit(s) and {min_neurons or round_to} neuron(s) kept per layer, width pruning "
            f"can remove at most {most:,} ({most / total:.1%}). Lower the ratio, the minimums, or add depth pruning."
        )
    # split the budget: s_mlp = gamma * s_attn, then move what one kind cannot take to the other
    if size["attention"] == 0:
        budget = {"attention": 0, "mlp": target}
    elif size["mlp"] == 0:
        budget = {"attention": target, "mlp": 0}
    else:
        s_attn = target / (size["attention"] + g * size["mlp"])
        budget = {"attention": int(round(s_attn * size["attention"])), "mlp": 0}
        budget["mlp"] = target - budget["attention"]
    for kind, other in (("mlp", "attention"), ("attention", "mlp")):
        if budget[kind] > cap[kind]:
            budget[other] += budget[kind] - cap[kind]
            budget[kind] = cap[kind]

    plan = WidthPlan()
    removed_units: dict[Key, list[int]] = {}
    removed_by_kind = {}
    for kind in KINDS:
        if kind == "mlp":  # neurons are the fine-grained kind: they absorb the attention chunks' rounding
            budget["mlp"] = min(cap["mlp"], max(0, target - removed_by_kind["attention"]))
        if allocation == "global":
            taken = _take(chunks[kind], budget[kind])
        else:
            sizes = {k: structs.of_kind(kind)[k[0]].n_params for k in scores.keys() if k[1] == kind}
            taken = _take_uniform(chunks[kind], budget[kind], sizes)
        removed_by_kind[kind] = sum(c.cost for c in taken)
        for c in taken:
            removed_units.setdefault(c.key, []).extend(c.units)
    kept: dict[Key, int] = {}
    for key in scores.keys():
        layer, kind = key
        units = scores.units[key]
        gone = set(removed_units.get(key, []))
        kept_rows = [u for u in range(units.n) if u not in gone]
        kept[key] = len(kept_rows)
        if not gone:
            continue
        if kind == "mlp":
            plan.mlp[layer] = torch.tensor(kept_rows, dtype=torch.long)
        else:
            s = structs.attention[layer]
            q = units.q[kept_rows].reshape(-1)
            kv = units.kv[kept_rows].reshape(-1) if units.kv.shape[1] else torch.arange(s.n_kv_heads)
            plan.attention[layer] = (torch.sort(q).values, torch.sort(kv).values)
    return Allocation(
        plan=plan,
        target_params=target,
        removed_params=sum(removed_by_kind.values()),
        removed_by_kind=removed_by_kind,
        budget_by_kind=budget,
        gamma=g,
        removed_units={k: sorted(v) for k, v in removed_units.items()},
        kept=kept,
        allocation=allocation,
    )
