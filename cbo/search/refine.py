"""The refinement loop: the QUBO as a learned surrogate of measured removal losses (BOCS / FMQA for blocks).

Start from a cheap prior QUBO (``singles``: each block's measured removal loss), then repeat:

1. **propose**: the solver layer (``cbo.solve(..., k=many)``) returns the lowest-energy states of the current
   surrogate's posterior mean, and of posterior draws (Thompson sampling) so that the search explores; a share of
   the batch comes from a trust region around the best measured sets instead: their swap mutations
   (``cbo.search.moves``, EvoPress's operator, every count kept) ranked by a posterior draw, the lowest taken; only sets
   never measured are kept;
2. **measure, multi-fidelity**: every proposal on a few calibration windows; the most promising of them (the
   lowest few on those windows) on the full set of high-fidelity windows;
3. **refit** the surrogate (``cbo.search.surrogate.BayesianQuadratic``) on every measurement so far;

until the budget in forward-pass equivalents (the prior's cost, the rounds and the final validation included)
is spent, or no round improves the best measured set for ``patience`` rounds, or the surrogate proposes nothing
new. Then the ``validate`` best sets by their high-fidelity calibration loss are measured on the validation
windows and the lowest is chosen. Nothing here reads a test split.

Every round is checkpointed (measurements, random stream, history): an interrupted loop resumes where it stopped,
loses no measurement, and ends as the uninterrupted loop would.

Example:
    >>> r = refine(model, blocks, splits.calibration, splits.validation, remove=8, budget=400)  # doctest: +SKIP
    >>> r.chosen, r.states[0].removed                                                          # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from cbo.checks import check_int
from cbo.errors import CBOError, InvalidOptionError
from cbo.qubo.block_qubo import BlockQUBO
from cbo.qubo.states import RankedStates
from cbo.search.moves import SwapMoves


@dataclass
class RefineResult:
    """What the loop found.

    Attributes:
        qubo: the refined surrogate (posterior mean) as a ``BlockQUBO``: loadable, solvable for other M.
        states: ``RankedStates`` of the sets measured at high fidelity, lowest calibration loss first (their
            ``energies`` are the measured losses; ``info["predicted"]`` the surrogate's values).
        chosen: the removed blocks chosen (lowest validation loss among the validated sets).
        validation: ``{"removed": [...], "loss": [...]}`` of the validated sets.
        rounds: one record per round: fpe spent, proposals, promoted, best measured loss and set, the surrogate's
            predictions of the round's sets made before measuring them, and its hyperparameters.
        fpe: forward-pass equivalents spent in all (prior + rounds + validation); ``cost`` breaks it down.
        stopped: ``"budget"``, ``"converged"`` (patience), ``"exhausted"`` (nothing new to propose) or ``"rounds"``.
    """

    qubo: BlockQUBO
    states: RankedStates
    chosen: list[int]
    validation: dict[str, Any]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    fpe: float = 0.0
    cost: dict[str, float] = field(default_factory=dict)
    stopped: str = "budget"


def refine_search(
    measure: Any,
    prior: BlockQUBO,
    remove: int,
    *,
    budget: float,
    validate_fn: Callable[[list[tuple[int, ...]]], tuple[np.ndarray, float]] | None = None,
    prior_cost: float = 0.0,
    low_windows: int = 1,
    high_windows: int = 16,
    batch: int = 24,
    promote: int = 4,
    thompson: float = 0.25,
    local: float = 0.5,
    local_parents: int = 3,
    screen: int = 512,
    validate: int = 10,
    validation_cost: float = 0.0,
    patience: int = 6,
    max_rounds: int = 1000,
    solver: str = "auto",
    solver_options: dict[str, Any] | None = None,
    seed: int = 0,
    checkpoint: str | Path | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> RefineResult:
    """The loop over a measuring callable (see :func:`refine` for the model-side entry point).

    Args:
        measure: ``measure(sets, windows) -> (n_sets, n_windows)`` losses on pool windows, with ``n_windows``,
            ``fpe``, ``state()`` and ``restore()`` (``cbo.measure.executors.Measurements``).
        prior: the prior QUBO (its constraints are the search's constraints).
        remove: M, blocks removed.
        budget: total forward-pass equivalents, ``prior_cost`` and the validation reserve included.
        validate_fn: ``validate_fn(sets) -> (per-set loss, fpe spent)`` on validation windows (None: choose by
            calibration loss).
        prior_cost: FPE already spent on the prior.
        low_windows / high_windows: windows of the two fidelities (the first ones of a seeded permutation of the
            pool; the low ones are a subset of the high ones).
        batch: proposals per round; ``promote`` of them go on to high fidelity (lowest low-fidelity loss).
        thompson: the share of proposals from posterior draws (global minima of one draw each).
        local: the share of proposals from the trust region: ``screen`` swap mutations of the ``local_parents``
            best sets measured at high fidelity, ranked by one posterior draw (the rest of the batch, after
            ``thompson`` and ``local``: the posterior mean's lowest states).
        validate: the best sets measured on validation at the end.
        validation_cost: the reserve kept for validation, in FPE (its estimate; the real cost is counted).
        patience: rounds without a better best set before stopping.
        solver / solver_options: how the surrogate is minimised (``cbo.solve``).
        seed: the random stream (window permutation, posterior draws, solver seeds).
        checkpoint: a JSON file written after every round.
        progress: called after each round with ``{"round", "best", "fpe", "budget", "measured"}``.
    """
    from cbo.measure.executors import SearchCheckpoint, set_key
    from cbo.search.surrogate import BayesianQuadratic
    from cbo.solvers import solve

    prior.check_remove(remove)
    n_pool = int(measure.n_windows)
    _check(low_windows, high_windows, batch, promote, thompson, validate, patience, n_pool, budget)
    _check_local(local, thompson, local_parents, screen)
    if prior_cost + validation_cost >= budget:
        raise InvalidOptionError(
            f"budget={budget} FPE does not cover the prior ({prior_cost:.1f} FPE) and the validation reserve "
            f"({validation_cost:.1f} FPE); raise the budget above {prior_cost + validation_cost:.0f}"
        )
    rng = np.random.default_rng(seed)
    lo_ids, hi_ids = fidelity_windows(n_pool, low_windows, high_windows, rng)
    settings = {
        "method": "refine",
        "remove": remove,
        "budget": budget,
        "prior": [prior.H.tolist(), prior.g.tolist()],
        "windows": [lo_ids, hi_ids],
        "batch": batch,
        "promote": promote,
        "thompson": thompson,
        "local": [local, local_parents, screen],
        "validate": validate,
        "patience": patience,
        "solver": solver,
        "seed": seed,
    }
    ckpt = SearchCheckpoint(checkpoint, settings) if checkpoint is not None else None
    saved = ckpt.load() if ckpt is not None else None
    rounds: list[dict[str, Any]] = []
    stopped = "rounds"
    if saved is not None:
        rng.bit_generator.state = saved["rng"]
        measure.restore(saved["measure"])
        rounds = saved["rounds"]
    surrogate = BayesianQuadratic(prior)
    moves = SwapMoves(prior.kinds, prior.constraints.keep + prior.constraints.force, rng)
    opts = dict(solver_options or {})

    def spent() -> float:
        return prior_cost + float(measure.fpe)

    def data() -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray, np.ndarray]:
        sets, ys, nws, lows = [], [], [], []
        for key in list(measure.values):
            if len(key) != remove or not prior.feasible(_row(key, prior.n), remove):
                continue
            known = set(measure.known(key))
            ids = hi_ids if set(hi_ids) <= known else lo_ids if set(lo_ids) <= known else None
            if ids is None:
                continue
            sets.append(key)
            ys.append(float(measure([key], ids).mean()))
            nws.append(len(ids))
            lows.append(ids is lo_ids and lo_ids != hi_ids)
        return sets, np.array(ys), np.array(nws), np.array(lows, dtype=float)

    def best_high() -> tuple[tuple[int, ...] | None, float]:
        sets, ys, _, lows = data()
        high = [(y, s) for s, y, lo in zip(sets, ys, lows) if not lo]
        return (min(high)[1], float(min(high)[0])) if high else (None, float("inf"))

    def near(count: int, measured: set[tuple[int, ...]], parents: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The trust region's share: mutations of ``parents`` (the best high-fidelity sets), lowest under one
        posterior draw."""
        if not parents or count < 1:
            return []
        pool: list[tuple[int, ...]] = []
        seen = set(measured)
        for i in range(screen):
            child = moves.mutate(parents[i % len(parents)], 3)
            if child not in seen:
                seen.add(child)
                pool.append(child)
        if not pool:
            return []
        X = _rows(pool, prior.n)
        ok = np.flatnonzero(prior.feasible(X, remove))
        score = surrogate.predict(X[ok], theta=surrogate.draw(rng))
        return [pool[ok[i]] for i in np.argsort(score, kind="stable")[:count]]

    def propose(fitted: bool, parents: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        measured = set(k for k in measure.values if len(k) == remove)
        want = batch
        out: list[tuple[int, ...]] = near(int(round(local * batch)), measured, parents) if fitted else []
        n_draws = int(round(thompson * batch)) if fitted else 0
        qubo = surrogate.qubo() if fitted else prior
        k = min(want + len(measured), 4096)
        states = solve(qubo, remove, solver=solver, k=k, seed=int(rng.integers(2**31)), **opts)
        for x in states.states:
            key = set_key(np.flatnonzero(x))
            if key not in measured and key not in out and len(out) < want - n_draws:
                out.append(key)
        for _ in range(n_draws):
            q = surrogate.qubo(surrogate.draw(rng))
            draws = solve(
                q,
                remove,
                solver=solver,
                k=min(len(out) + len(measured) + 1, 4096),
                seed=int(rng.integers(2**31)),
                **opts,
            )
            for x in draws.states:
                key = set_key(np.flatnonzero(x))
                if key not in measured and key not in out:
                    out.append(key)
                    break
        return out

    best_set, best = best_high()
    since = 0 if not rounds else int(rounds[-1].get("since_improved", 0))
    while True:
        if len(rounds) >= max_rounds:
            stopped = "rounds"
            break
        per_pair = measure.fpe / measure.pairs if measure.pairs else 1.0
        round_cost = per_pair * (batch * low_windows + promote * (high_windows - low_windows))
        if spent() + round_cost + validation_cost > budget:
            stopped = "budget"
            break
        if since >= patience:
            stopped = "converged"
            break
        sets, ys, nws, lows = data()
        fitted = len(sets) >= 2
        hyper: dict[str, float] = {}
        if fitted:
            hyper = surrogate.fit(_rows(sets, prior.n), ys, nws, lows).hyper
        parents = [s for _, s in sorted((y, s) for s, y, lo in zip(sets, ys, lows) if not lo)[:local_parents]]
        proposals = propose(fitted, parents)
        if not proposals:
            stopped = "exhausted"
            break
        predicted = surrogate.predict(_rows(proposals, prior.n)).tolist() if fitted else None
        low_loss = measure(proposals, lo_ids).mean(axis=1)
        ranked = [proposals[i] for i in np.argsort(low_loss, kind="stable")]
        promoted = ranked[:promote]
        high_loss = measure(promoted, hi_ids).mean(axis=1) if promoted else np.zeros(0)
        new_set, new_best = best_high()
        improved = new_best < best - 1e-12
        since = 0 if improved else since + 1
        best, best_set = new_best, new_set
        rounds.append(
            {
                "round": len(rounds) + 1,
                "fpe": spent(),
                "proposals": [list(p) for p in proposals],
                "predicted": predicted,
                "low_loss": low_loss.tolist(),
                "promoted": [list(p) for p in promoted],
                "high_loss": high_loss.tolist(),
                "best": best,
                "best_removed": list(best_set) if best_set else None,
                "since_improved": since,
                "hyper": hyper,
            }
        )
        if ckpt is not None:
            ckpt.save({"rng": rng.bit_generator.state, "measure": measure.state(), "rounds": rounds})
        if progress is not None:
            progress({"round": len(rounds), "best": best, "fpe": spent(), "budget": budget, "measured": len(sets)})
    sets, ys, nws, lows = data()
    if len(sets) >= 2:
        surrogate.fit(_rows(sets, prior.n), ys, nws, lows)
    qubo = surrogate.qubo(metadata=_metadata(prior, rounds)) if surrogate.fit_ is not None else prior
    high = sorted((y, s) for s, y, lo in zip(sets, ys, lows) if not lo)
    if not high:
        raise CBOError(
            f"the budget ({budget} FPE) left no room to measure a single set at high fidelity after the prior "
            f"({prior_cost:.1f} FPE) and the validation reserve ({validation_cost:.1f} FPE); raise the budget"
        )
    top = [s for _, s in high[:validate]]
    val_fpe = 0.0
    if validate_fn is not None:
        val_loss, val_fpe = validate_fn(top)
        chosen = list(top[int(np.argmin(val_loss))])
        validation = {"removed": [list(s) for s in top], "loss": [float(v) for v in val_loss]}
    else:
        chosen, validation = list(top[0]), {"removed": [], "loss": []}
    X = _rows([s for _, s in high], prior.n)
    states = RankedStates(
        X,
        [y for y, _ in high],
        names=prior.names,
        remove=remove,
        solver="refine",
        exact=False,
        info={"predicted": surrogate.predict(X).tolist() if surrogate.fit_ is not None else None},
    )
    cost = {"prior": prior_cost, "rounds": float(measure.fpe), "validation": float(val_fpe)}
    return RefineResult(qubo, states, chosen, validation, rounds, sum(cost.values()), cost, stopped)


def fidelity_windows(n_pool: int, low: int, high: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """The low- and high-fidelity windows: the first ``low`` / ``high`` of a permutation drawn from ``rng``."""
    order = [int(w) for w in rng.permutation(n_pool)]
    return sorted(order[:low]), sorted(order[:high])


def _row(key: Sequence[int], n: int) -> np.ndarray:
    x = np.zeros(n, dtype=np.uint8)
    x[list(key)] = 1
    return x


def _rows(keys: Sequence[Sequence[int]], n: int) -> np.ndarray:
    return np.stack([_row(k, n) for k in keys]) if keys else np.zeros((0, n), dtype=np.uint8)


def _metadata(prior: BlockQUBO, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        **{k: v for k, v in prior.metadata.items() if k in ("model", "model_fingerprint", "granularity", "loss")},
        "estimator": "refine",
        "prior_estimator": prior.metadata.get("estimator"),
        "rounds": len(rounds),
        "fpe": rounds[-1]["fpe"] if rounds else None,
        "energy": "E(x) = 0.5 x^T H x - g.x: the posterior-mean surrogate of the measured loss",
    }


def _check(low, high, batch, promote, thompson, validate, patience, n_pool, budget) -> None:
    for name, value in (("low_windows", low), ("high_windows", high), ("batch", batch), ("validate", validate)):
        check_int(name, value, 1)
    if not low <= high <= n_pool:
        raise InvalidOptionError(
            f"need low_windows <= high_windows <= calibration windows, got {low}, {high}, {n_pool}"
        )
    if not 0 <= promote <= batch:
        raise InvalidOptionError(f"promote must be in 0..batch={batch}, got {promote!r}")
    if not 0.0 <= thompson <= 1.0:
        raise InvalidOptionError(f"thompson must be a share in [0, 1], got {thompson!r}")
    check_int("patience", patience, 1)
    if not (isinstance(budget, (int, float)) and budget > 0):
        raise InvalidOptionError(f"budget must be a positive number of forward-pass equivalents, got {budget!r}")


def _check_local(local, thompson, parents, screen) -> None:
    if not 0.0 <= local <= 1.0 or local + thompson > 1.0:
        raise InvalidOptionError(
            f"local and thompson are shares of the batch with local + thompson <= 1, got {local!r}, {thompson!r}"
        )
    for name, value in (("local_parents", parents), ("screen", screen)):
        check_int(name, value, 1)


def refine(
    model: Any,
    blocks: Any,
    calibration: Any,
    validation: Any = None,
    remove: int = 8,
    *,
    budget: float,
    prior: str | BlockQUBO = "singles",
    prior_cost: float = 0.0,
    keep: Sequence[int] = (),
    caps: dict[str, int] | None = None,
    executor: Any = None,
    checkpoint: str | Path | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    seed: int = 0,
    **options: Any,
) -> RefineResult:
    """Refine a prior QUBO with measurements on the model until the budget is spent; choose by validation.

    Args:
        model: the causal LM (eval mode).
        blocks: ``"layer"``, ``"sublayer"`` or a block list (``cbo.model.blocks.find_blocks``).
        calibration: (W, T) calibration windows, or a ``TokenSplits`` (its calibration and validation splits).
        validation: (V, T) validation windows (None: a ``TokenSplits``' validation split; or choose by calibration).
        remove: M, blocks removed.
        budget: forward-pass equivalents in all (one FPE = one full forward pass over one window): the prior, the
            rounds and the final validation.
        prior: ``"singles"`` (each block's measured KL on the ``prior_windows``, the default), another
            estimator name (``cbo.estimate_hessian`` on the same windows), or a ``BlockQUBO`` (cost ``prior_cost``).
        keep / caps: blocks never removed; ``{kind: max removed}`` (sublayer: ``{"attention": M, "mlp": M}``
            with ``remove=2M`` removes M layers' worth of each).
        executor: a ``cbo.measure.executors`` executor on the calibration windows (default: in this process).
        checkpoint: a JSON file written after each round (resumes an interrupted loop).
        progress: called after each round (round, best measured loss, budget used).
        seed: the random stream.
        **options: options of :func:`refine_search` (``low_windows``, ``high_windows``, ``batch``, ``promote``,
            ``thompson``, ``local``, ``validate``, ``patience``, ``solver``, ...), and ``prior_windows``: ``"high"``
            (the prior is measured on the high-fidelity windows) or ``"low"`` (the default: on the low ones, a fraction
            of the cost; the rounds' measurements correct it).

    Example:
        >>> r = refine(model, "layer", splits, remove=8, budget=500)   # doctest: +SKIP
        >>> r.qubo.save("refined.cboq"); r.chosen                      # doctest: +SKIP
    """
    from cbo.measure.executors import InProcessExecutor, Measurements
    from cbo.model.blocks import find_blocks

    if hasattr(calibration, "calibration"):
        splits = calibration
        calibration = splits.calibration
        if validation is None and getattr(splits, "validation", None) is not None and len(splits.validation):
            validation = splits.validation
    block_list = find_blocks(model, blocks) if isinstance(blocks, str) else list(blocks)
    if not (isinstance(budget, (int, float)) and budget > 0):
        raise InvalidOptionError(f"budget must be a positive number of forward-pass equivalents, got {budget!r}")
    ex = executor if executor is not None else InProcessExecutor(model, block_list, calibration)
    measure = Measurements(ex)
    low = int(options.get("low_windows", 1))
    options["low_windows"] = low
    high = int(options.get("high_windows", min(16, measure.n_windows)))
    options["high_windows"] = high
    validate = int(options.get("validate", 10))
    _check(low, high, 1, 0, 0.5, validate, 1, measure.n_windows, budget)
    lo_ids, hi_ids = fidelity_windows(measure.n_windows, low, high, np.random.default_rng(seed))
    prior_windows = options.pop("prior_windows", "low")
    if prior_windows not in ("high", "low"):
        raise InvalidOptionError(
            f"prior_windows must be 'high' or 'low' (the fidelity the prior is measured at), got {prior_windows!r}"
        )
    validate_fn, reserve = None, 0.0
    if validation is not None:
        vmeasure = Measurements(InProcessExecutor(model, block_list, validation))
        # an upper bound, so the budget holds: a set costs at most one full pass per window, plus each window's
        # original pass
        reserve = float(validate * vmeasure.n_windows + vmeasure.n_windows)
        if reserve + float(prior_cost if isinstance(prior, BlockQUBO) else 0.0) >= budget:  # before the prior
            raise InvalidOptionError(
                f"budget={budget} FPE does not cover the validation reserve ({reserve:.0f} FPE: {validate} sets "
                f"on {vmeasure.n_windows} windows, plus their original passes) and the prior; raise the budget "
                "or validate fewer sets"
            )
    prior_ids = hi_ids if prior_windows == "high" else lo_ids
    prior_qubo, prior_cost = _prior(model, block_list, calibration, prior_ids, prior, prior_cost, measure)
    prior_qubo = prior_qubo.with_constraints(keep=tuple(keep), caps=dict(caps or {}))
    if validation is not None:

        def validate_fn(sets: list[tuple[int, ...]]) -> tuple[np.ndarray, float]:
            values = vmeasure(sets, list(range(vmeasure.n_windows))).mean(axis=1)
            return values, float(vmeasure.fpe)

    try:
        return refine_search(
            measure,
            prior_qubo,
            remove,
            budget=budget,
            validate_fn=validate_fn,
            prior_cost=prior_cost,
            validation_cost=reserve,
            seed=seed,
            checkpoint=checkpoint,
            progress=progress,
            **options,
        )
    finally:
        if executor is None:
            ex.close()


def _prior(model, blocks, calibration, hi_ids, prior, prior_cost, measure) -> tuple[BlockQUBO, float]:
    """(prior QUBO, its cost in FPE)."""
    names, kinds, sizes = [b.name for b in blocks], [b.kind for b in blocks], [int(b.n_params) for b in blocks]
    if isinstance(prior, BlockQUBO):
        if prior.n != len(blocks):
            raise InvalidOptionError(f"the prior QUBO has {prior.n} blocks but the block list has {len(blocks)}")
        return prior, float(prior_cost)
    if prior == "singles":
        before, pairs_before = measure.fpe, measure.pairs
        singles = [(i,) for i in range(len(blocks))]
        D = measure(singles, hi_ids).mean(axis=1)
        cost = float(measure.fpe - before)
        measure.fpe, measure.pairs = before, pairs_before  # the prior's cost is reported as its own item
        q = BlockQUBO(
            np.diag(2.0 * D),
            names=names,
            kinds=kinds,
            sizes=sizes,
            metadata={"estimator": "singles", "loss": "kl", "windows": list(hi_ids), "fpe": cost},
        )
        return q, cost
    if not isinstance(prior, str):
        raise InvalidOptionError(f"prior must be an estimator name or a BlockQUBO, got {type(prior).__name__}")
    from cbo.hessian import estimate_hessian

    q = estimate_hessian(model, None, calibration[hi_ids], estimator=prior, blocks=blocks, progress=False)
    meta = q.metadata
    per_batch = meta.get("fpe", meta.get("forward_passes", 0) + 2 * meta.get("backward_passes", 0))
    cost = float(per_batch) * min(int(meta.get("batch_size", 8)), len(hi_ids))
    return q, cost
