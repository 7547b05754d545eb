"""EvoPress (Sieberling et al. 2024): a (1 + λ) elitist evolutionary search over removal sets.

As the authors' code runs it (``evo_drop_search.py`` with ``scripts/run_drop_search.sh``):

* start: ``initial`` = 64 distinct random sets with the target count of each kind, scored on ``initial_windows``
  windows; the best is the parent (population 1);
* mutation: ``min(U{1..3}, U{1..3})`` swaps, each of a kind drawn uniformly (attention or MLP at sublayer
  granularity; the one kind at layer granularity): one kept unit of that kind is removed and one removed unit of
  that kind restored, so every count stays fixed; an offspring equal to another offspring or to the parent is
  rejected and drawn again; ``offspring`` = λ = 32 per generation (16 in the fast setting);
* multi-step selection: every stage draws a fresh random minibatch of windows; stage 1 scores all offspring
  on ``stages[0][1]`` windows and keeps ``stages[0][0]`` = 2; the last stage adds the parent and scores them on
  ``stages[-1][1]`` windows (16× stage 1's tokens, as 2048 → 32768 there); the best survives;
* fitness: mean KL to the unpruned model; generations: ``int(k (n − k) / 1.5)`` with ``n`` units of a kind and
  ``k`` removed of it.

Token counts are in windows of the pool here (the code counts tokens; the pool's windows all have one length).
Every generation is checkpointed; a resumed run continues with the same random stream and gives the same result.

Example:
    >>> from cbo.measure.executors import InProcessExecutor, Measurements     # doctest: +SKIP
    >>> m = Measurements(InProcessExecutor(model, blocks, calibration))   # doctest: +SKIP
    >>> evopress(m, kinds=[b.kind for b in blocks], remove=8).removed   # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from cbo.baselines.base import BASELINES, Baseline, RankContext
from cbo.baselines.ranking import Ranking, json_number
from cbo.checks import check_float, check_int, check_seed, is_int
from cbo.errors import InfeasibleError, InvalidOptionError
from cbo.search.moves import SwapMoves

FAST = {"offspring": 16}  # the published fast setting


@dataclass
class EvoPressResult:
    """The survivor of the last generation and how the search got there.

    Attributes:
        removed: the removed block indices (sorted).
        fitness: its fitness on the last selection stage's windows of the last generation.
        generations: generations run.
        fpe: forward-pass equivalents spent (see ``cbo.measure.executors``), the initial population included.
        history: one record per generation: ``{"generation", "fpe", "removed", "fitness"}`` (generation 0 is the
            initial selection).
        stopped: ``"generations"`` (ran its count) or ``"budget"``.
    """

    removed: list[int]
    fitness: float
    generations: int
    fpe: float
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped: str = "generations"


def default_generations(n: int, k: int) -> int:
    """The published generation count ``int(k (n − k) / 1.5)`` (n units of a kind, k removed of it)."""
    return int(k * (n - k) / 1.5)


def check_counts(kinds: Sequence[str], remove: int | Mapping[str, int], keep: Sequence[int] = ()) -> dict[str, int]:
    """``{kind: removed count}``; an int applies to every kind (EvoPress removes k of each at sublayer level)."""
    present = list(dict.fromkeys(kinds))
    counts = {kind: int(remove) for kind in present} if not isinstance(remove, Mapping) else dict(remove)
    unknown = sorted(set(counts) - set(present))
    if unknown:
        raise InvalidOptionError(f"remove names kinds {unknown} that no block has; kinds present: {present}")
    free: dict[str, int] = {}
    for kind in present:
        free[kind] = sum(1 for i, k in enumerate(kinds) if k == kind and i not in set(keep))
        c = counts.setdefault(kind, 0)
        if not is_int(c) or not 0 <= c <= free[kind]:
            raise InvalidOptionError(
                f"cannot remove {c!r} of kind {kind!r}: {free[kind]} removable; use 0..{free[kind]}"
            )
    if sum(counts.values()) < 1:
        raise InvalidOptionError(f"remove={remove!r} removes nothing; remove at least one block")
    if not any(0 < counts[k] < free[k] for k in present):
        raise InvalidOptionError(
            f"cannot remove {counts}: every kind is removed entirely or not at all, so there is nothing to search; "
            "remove fewer blocks"
        )
    return counts


def _minibatch(rng: np.random.Generator, n_pool: int, count: int) -> list[int]:
    return sorted(int(w) for w in rng.choice(n_pool, size=min(count, n_pool), replace=False))


def _select(measure: Any, search: SwapMoves, candidates: list[tuple[int, ...]], survive: int, windows: int):
    ids = _minibatch(search.rng, measure.n_windows, windows)
    fitness = measure(candidates, ids).mean(axis=1)
    order = np.argsort(fitness, kind="stable")[:survive]
    return [candidates[i] for i in order], [float(fitness[i]) for i in order]


def evopress(
    measure: Any,
    kinds: Sequence[str],
    remove: int | Mapping[str, int],
    *,
    offspring: int = 32,
    generations: int | None = None,
    initial: int = 64,
    initial_windows: int = 1,
    stages: Sequence[tuple[int, int]] = ((2, 1), (1, 16)),
    max_mutations: int = 3,
    keep: Sequence[int] = (),
    budget: float | None = None,
    seed: int = 0,
    checkpoint: str | Path | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> EvoPressResult:
    """Run EvoPress over blocks of the given kinds with a measuring callable.

    Args:
        measure: ``measure(sets, windows) -> (n_sets, n_windows)`` KL to the original on pool windows, with
            attributes ``n_windows`` and ``fpe`` and ``state()`` / ``restore()`` (``cbo.measure.executors.Measurements``).
        kinds: the kind of each block (``[b.kind for b in blocks]``).
        remove: units removed: an int (of each kind present) or ``{kind: count}``.
        offspring: λ, offspring per generation (32 published; 16 the fast setting).
        generations: default ``int(k (n − k) / 1.5)`` for the kind with the most removed.
        initial: random sets drawn for the initial population (the best one is the parent).
        initial_windows: windows the initial sets are scored on.
        stages: ``((survivors, windows), ...)`` of the multi-step selection; the last keeps 1 and includes the
            parent.
        max_mutations: the largest swap count drawn (3 published).
        keep: block indices never removed.
        budget: stop once this many forward-pass equivalents are spent (None: run every generation).
        seed: the random stream (sets, mutations, minibatches).
        checkpoint: a JSON file written after every generation; a run with the same settings resumes from it.
        progress: called after each generation with ``{"generation", "generations", "fitness", "fpe", "removed"}``.
    """
    counts = check_counts(kinds, remove, keep)
    stages = [(int(s), int(w)) for s, w in stages]
    _check_options(generations, offspring, initial, initial_windows, stages, max_mutations, measure.n_windows)
    search = SwapMoves(kinds, keep, np.random.default_rng(seed))
    mutable = [k for k in counts if 0 < counts[k] < len(search.units[k])]
    if not mutable:
        raise InvalidOptionError(f"every kind is removed entirely or not at all ({counts}); nothing can be swapped")
    if generations is None:
        kind = max((c, k) for k, c in counts.items())[1]
        generations = default_generations(len(search.units[kind]), counts[kind])
    settings = {
        "kinds": list(kinds),
        "counts": counts,
        "offspring": offspring,
        "generations": generations,
        "initial": initial,
        "initial_windows": initial_windows,
        "stages": stages,
        "max_mutations": max_mutations,
        "keep": sorted(int(i) for i in keep),
        "seed": seed,
        "n_windows": measure.n_windows,
    }
    from cbo.measure.executors import SearchCheckpoint

    ckpt = SearchCheckpoint(checkpoint, {"method": "evopress", **settings}) if checkpoint is not None else None
    saved = ckpt.load() if ckpt is not None else None
    if saved is not None:
        search.rng.bit_generator.state = saved["rng"]
        measure.restore(saved["measure"])
        parent, fitness, history = tuple(saved["parent"]), float(saved["fitness"]), saved["history"]
        start = int(saved["generation"])
    else:
        population: list[tuple[int, ...]] = []
        seen: set[tuple[int, ...]] = set()
        limit = math.prod(math.comb(len(search.units[k]), c) for k, c in counts.items())
        while len(population) < min(initial, limit):
            s = search.random_set(counts)
            if s not in seen:
                seen.add(s)
                population.append(s)
        (best,), (fitness,) = _select(measure, search, population, 1, initial_windows)
        parent, start = best, 0
        history = [{"generation": 0, "fpe": measure.fpe, "removed": list(parent), "fitness": fitness}]
    stopped = "generations"
    for gen in range(start, generations):
        if budget is not None and measure.fpe >= budget:
            stopped = "budget"
            break
        children: list[tuple[int, ...]] = []
        tries = 0
        while len(children) < offspring and tries < 1000 * offspring:  # a tiny space may hold fewer neighbours
            tries += 1
            child = search.mutate(parent, max_mutations, mutable)
            if child != parent and child not in children:
                children.append(child)
        for k, (survive, windows) in enumerate(stages):
            if k == len(stages) - 1 and parent not in children:
                children.append(parent)  # elitist: the parent competes in the last stage
            children, scores = _select(measure, search, children, survive, windows)
        parent, fitness = children[0], scores[0]
        history.append({"generation": gen + 1, "fpe": measure.fpe, "removed": list(parent), "fitness": fitness})
        if ckpt is not None:
            ckpt.save(
                {
                    "rng": search.rng.bit_generator.state,
                    "measure": measure.state(),
                    "parent": list(parent),
                    "fitness": fitness,
                    "history": history,
                    "generation": gen + 1,
                }
            )
        if progress is not None:
            progress({"generation": gen + 1, "generations": generations, "fitness": fitness, "fpe": measure.fpe})
    return EvoPressResult(
        removed=list(parent),
        fitness=fitness,
        generations=int(history[-1]["generation"]),
        fpe=float(measure.fpe),
        history=history,
        stopped=stopped,
    )


def _check_options(generations, offspring, initial, initial_windows, stages, max_mutations, n_windows) -> None:
    check_int("generations", generations, 0, none_ok=True)
    for name, value in (("offspring", offspring), ("initial", initial), ("max_mutations", max_mutations)):
        check_int(name, value, 1)
    if not stages or stages[-1][0] != 1:
        raise InvalidOptionError(f"stages must end with one survivor, e.g. ((2, 1), (1, 16)); got {stages!r}")
    for survive, windows in stages:
        if survive < 1 or windows < 1:
            raise InvalidOptionError(f"each stage needs survivors >= 1 and windows >= 1, got {(survive, windows)}")
    for w in [initial_windows] + [w for _, w in stages]:
        if w > n_windows:
            raise InvalidOptionError(f"a stage asks for {w} windows but the pool has {n_windows}; give more windows")


def evopress_blocks(
    model: Any,
    blocks: Sequence[Any],
    calibration: Any,
    remove: int | Mapping[str, int],
    *,
    executor: Any = None,
    **options: Any,
) -> EvoPressResult:
    """EvoPress on a model: the thin adapter from blocks and calibration windows to :func:`evopress`.

    Args:
        model: the causal LM.
        blocks: ``cbo.model.blocks.find_blocks(model, granularity)``.
        calibration: (W, T) calibration windows (the pool the minibatches are drawn from).
        remove: as in :func:`evopress`.
        executor: a ``cbo.measure.executors`` executor (default: in this process).
        **options: options of :func:`evopress`.
    """
    from cbo.measure.executors import InProcessExecutor, Measurements

    ex = executor if executor is not None else InProcessExecutor(model, blocks, calibration)
    return evopress(Measurements(ex), [b.kind for b in blocks], remove, **options)


# ---------------------------------------------------------------------------------------------- the baseline
def kind_counts(
    kinds: Sequence[str], remove: int, keep: Sequence[int] = (), caps: Mapping[str, int] | None = None
) -> dict[str, int]:
    """How many blocks of each kind a set of ``remove`` blocks holds when EvoPress runs through the registry.

    EvoPress keeps every per-kind count fixed while it searches, so the counts are chosen first: an even split
    over the kinds present (the remainder to the later kinds in block order: the MLP halves at sublayer level),
    each kind capped by ``caps`` and by its removable blocks, the overflow moved to the kinds with room.

    Raises:
        InfeasibleError: the kinds' room (caps, kept blocks) holds fewer than ``remove`` blocks.
    """
    present = list(dict.fromkeys(kinds))
    room = {k: sum(1 for i, kk in enumerate(kinds) if kk == k and i not in set(keep)) for k in present}
    for k, limit in dict(caps or {}).items():
        room[k] = min(room.get(k, 0), int(limit))
    if sum(room.values()) < remove:
        raise InfeasibleError(
            f"evopress: {remove} blocks do not fit the per-kind room {room} (caps {dict(caps or {})}, kept "
            f"{list(keep)}); remove at most {sum(room.values())}"
        )
    base, extra = divmod(int(remove), len(present))
    want = {k: base + (1 if j >= len(present) - extra else 0) for j, k in enumerate(present)}
    counts = {k: min(want[k], room[k]) for k in present}
    left = int(remove) - sum(counts.values())
    for k in reversed(present):  # the overflow goes to the kinds with room left, the later kinds first
        more = min(left, room[k] - counts[k])
        counts[k] += more
        left -= more
    return counts


@dataclass
class EvoPressOptions:
    """Options of the ``evopress`` baseline (the published setting by default; ``offspring=16`` the fast one).

    ``final_windows`` calibration windows score the last selection stage (16× the first stage's one window, as
    2048 → 32768 tokens in the paper); the calibration windows must number at least that many.
    """

    offspring: int = 32
    generations: int | None = None
    initial: int = 64
    initial_windows: int = 1
    survivors: int = 2
    final_windows: int = 16
    max_mutations: int = 3
    budget: float | None = None
    seed: int = 0

    def stages(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return ((self.survivors, self.initial_windows), (1, self.final_windows))

    def validate(self) -> None:
        check_float("budget (FPE)", self.budget, 0, lo_open=True, none_ok=True)
        check_seed("seed", self.seed)
        limit = 10**9  # the pool size is checked in rank(), once the windows are known
        opts = (self.generations, self.offspring, self.initial, self.initial_windows)
        _check_options(*opts, self.stages(), self.max_mutations, limit)


@BASELINES.register
class EvoPress(Baseline):
    """EvoPress for M = ``max_remove`` (a per-M search: the ranking answers that M only), per-kind counts from
    :func:`kind_counts`; the search itself is :func:`evopress` on a ``cbo.measure.executors`` in-process executor."""

    name = "evopress"
    description = "EvoPress: (1+λ) evolutionary search over removal sets with KL fitness and multi-step selection"
    Options = EvoPressOptions
    ranks_up_to_max_remove = True

    def rank(self, ctx: RankContext) -> Ranking:
        from cbo.measure.executors import InProcessExecutor, Measurements

        o = self.options
        kinds = [b.kind for b in ctx.blocks]
        counts = kind_counts(kinds, ctx.max_remove, ctx.keep, ctx.caps)
        n_windows = int(ctx.windows.shape[0])
        _check_options(o.generations, o.offspring, o.initial, o.initial_windows, o.stages(), o.max_mutations, n_windows)
        units = {k: [i for i in ctx.free() if kinds[i] == k] for k in counts}
        if not any(0 < c < len(units[k]) for k, c in counts.items()):  # one set fits: nothing to search
            only = sorted(i for k, c in counts.items() if c for i in units[k])
            r = EvoPressResult(removed=only, fitness=math.nan, generations=0, fpe=0.0, stopped="single set")
        else:
            executor = InProcessExecutor(ctx.model, ctx.blocks, ctx.windows)
            try:
                r = evopress(
                    Measurements(executor),
                    kinds,
                    counts,
                    offspring=o.offspring,
                    generations=o.generations,
                    initial=o.initial,
                    initial_windows=o.initial_windows,
                    stages=o.stages(),
                    max_mutations=o.max_mutations,
                    keep=ctx.keep,
                    budget=o.budget,
                    seed=o.seed,
                )
            finally:
                executor.close()
        ranking = ctx.ranking(sets={ctx.max_remove: r.removed})
        ranking.info.update({"fpe": r.fpe, "generations": r.generations, "stopped": r.stopped, "counts": counts})
        ranking.info["fitness"] = json_number(r.fitness)
        return ranking
