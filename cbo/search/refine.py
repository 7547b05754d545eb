"""The refinement loop: the QUBO as a learned surrogate of measured removal losses (BOCS / FMQA for blocks).

Start from a cheap prior QUBO (``singles``: each block's measured removal loss), then repeat the three steps of
:class:`RefineLoop`:

1. **refit** the surrogate (``cbo.search.surrogate.BayesianQuadratic``) on every measurement so far;
2. **propose**: a share of the batch from a trust region around the best measured sets (their swap mutations,
   ``cbo.search.moves``, EvoPress's operator, every count kept, ranked by a posterior draw), the rest from the
   solver layer (``cbo.solve(..., k=many)``): the lowest-energy states of the surrogate's posterior mean and of
   posterior draws (Thompson sampling); only sets never measured are kept;
3. **measure**, multi-fidelity: every proposal on a few calibration windows; the most promising of them (the lowest
   few on those windows) on the full set of high-fidelity windows;

until the budget is spent. The budget counts the rounds only: the forward-pass equivalents (FPE) measured after the
prior; the prior's cost and the final validation are paid apart (``RefineResult.cost`` lists all three). The loop
spends what it is given: when no round has improved the best measured set for ``patience`` rounds it widens the
search (larger swaps, more posterior draws, restarts away from its incumbents) and narrows again after an
improvement; it stops early only when it has nothing new to propose (``"exhausted"``) or after ``max_rounds``
rounds (``"rounds"``), and otherwise when the next set would not fit into the budget (``"budget"``; the last round
is cut to what is left at the average cost of a set so far, so the rounds may end a few FPE over). Then the
``validate`` best sets by their high-fidelity calibration loss are measured on the validation windows and the
lowest is chosen. Nothing here reads a test split. Every default lives in
:class:`cbo.search.options.RefineOptions`.

Every round is checkpointed (measurements, random stream, history): an interrupted loop resumes where it stopped,
loses no measurement, and ends as the uninterrupted loop would.

Example:
    >>> r = refine(model, blocks, splits.calibration, splits.validation, remove=8, budget=400)  # doctest: +SKIP
    >>> r.chosen, r.states[0].removed, r.cost                                                  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from cbo.errors import CBOError, InvalidOptionError
from cbo.qubo.block_qubo import BlockQUBO
from cbo.qubo.states import RankedStates
from cbo.search.moves import SwapMoves
from cbo.search.options import RefineOptions, check_budget
from cbo.search.prior import measure_prior
from cbo.search.staged import race, stage_windows

SetKey = tuple[int, ...]
WIDEST = 3  # widening levels: each enlarges the swaps, adds posterior draws and restarts farther away
RESTART_SHARE = 0.25  # the share of a widened round's batch that restarts away from the incumbents


@dataclass
class RefineResult:
    """What the loop found.

    Attributes:
        qubo: the refined surrogate (posterior mean) as a ``BlockQUBO``: loadable, solvable for other M.
        states: ``RankedStates`` of the sets measured at high fidelity, lowest calibration loss first (their
            ``energies`` are the measured losses; ``info["predicted"]`` the surrogate's values).
        chosen: the removed blocks chosen (lowest validation loss among the validated sets).
        validation: ``{"removed": [...], "loss": [...]}`` of the validated sets.
        rounds: one record per round: the rounds' FPE spent so far, proposals, promoted, best measured loss and
            set, the surrogate's predictions of the round's sets made before measuring them, its hyperparameters,
            and the widening level after the round.
        fpe: forward-pass equivalents spent in all; ``cost`` breaks it down: ``prior``, ``rounds`` (what the
            budget counts) and ``validation``.
        stopped: ``"budget"`` (spent), ``"exhausted"`` (nothing new to propose) or ``"rounds"`` (``max_rounds``).
    """

    qubo: BlockQUBO
    states: RankedStates
    chosen: list[int]
    validation: dict[str, Any]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    fpe: float = 0.0
    cost: dict[str, float] = field(default_factory=dict)
    stopped: str = "budget"


LOOP_KEYWORDS = ("budget", "solver", "solver_options", "seed", "checkpoint", "progress")  # RefineLoop's own


class RefineLoop:
    """The loop over a measuring callable, one round at a time: :meth:`refit`, :meth:`propose`, :meth:`measure`.

    Lifecycle: ``RefineLoop(...)`` draws the fidelity windows and restores a checkpoint when one matches →
    :meth:`run` repeats :meth:`step` (``refit → propose → measure``, then the checkpoint) until a stop reason →
    :meth:`result` refits on everything, validates the best sets and ranks the measured ones.

    Args:
        measure: ``measure(sets, windows) -> (n_sets, n_windows)`` losses on pool windows, with ``n_windows``,
            ``fpe``, ``pairs``, ``values``, ``state()`` and ``restore()`` (``cbo.measure.executors.Measurements``).
        prior: the prior QUBO (its constraints are the search's constraints).
        remove: M, blocks removed.
        budget: FPE for the rounds (the measurements after the prior; see the module docstring).
        options: :class:`RefineOptions` (default: its defaults).
        solver / solver_options: how the surrogate is minimised (``cbo.solve``).
        seed: the random stream (window permutation, posterior draws, mutations, solver seeds).
        checkpoint: a JSON file written after every round.
        progress: called after each round with ``{"round", "best", "fpe", "budget", "measured"}``.
    """

    def __init__(
        self,
        measure: Any,
        prior: BlockQUBO,
        remove: int,
        *,
        budget: float,
        options: RefineOptions | None = None,
        solver: str = "auto",
        solver_options: dict[str, Any] | None = None,
        seed: int = 0,
        checkpoint: str | Path | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        from cbo.measure.executors import SearchCheckpoint
        from cbo.search.surrogate import BayesianQuadratic

        prior.check_remove(remove)
        self.options = o = RefineOptions.build(options)
        self.budget = check_budget(budget)
        self.measurements, self.prior, self.remove = measure, prior, int(remove)
        low, high = o.check(int(measure.n_windows))
        self.solver, self.solver_options, self.progress = solver, dict(solver_options or {}), progress
        self.rng = np.random.default_rng(seed)
        self.lo_ids, self.hi_ids = fidelity_windows(int(measure.n_windows), low, high, self.rng)
        self.steps = stage_windows(self.lo_ids, self.hi_ids, o.stages) if o.stages else [self.hi_ids]  # promotion
        settings = {
            "method": "refine",
            "remove": remove,
            "budget": self.budget,
            "prior": [prior.H.tolist(), prior.g.tolist()],
            "windows": [self.lo_ids, self.hi_ids],
            "options": dataclasses.asdict(o),
            "solver": solver,
            "seed": seed,
        }
        self.checkpoint = SearchCheckpoint(checkpoint, settings) if checkpoint is not None else None
        saved = self.checkpoint.load() if self.checkpoint is not None else None
        self.rounds: list[dict[str, Any]] = []
        if saved is not None:
            self.rng.bit_generator.state = saved["rng"]
            measure.restore(saved["measure"])
            self.rounds = saved["rounds"]
        last = self.rounds[-1] if self.rounds else {}
        self.since = int(last.get("since_improved", 0))  # rounds since the best measured set improved
        self.widen = int(last.get("widen", 0))  # 0: the plain search; up to WIDEST after stalls
        self.surrogate = BayesianQuadratic(prior)
        self.moves = SwapMoves(prior.kinds, prior.constraints.keep + prior.constraints.force, self.rng)
        self.best_set, self.best = self.best_high()
        self.fitted, self.hyper, self.parents = False, {}, []

    # ------------------------------------------------------------------ the loop
    def run(self) -> str:
        """Rounds until a stop reason: ``"budget"``, ``"exhausted"`` or ``"rounds"`` (returned)."""
        while True:
            stopped = self.step()
            if stopped is not None:
                return stopped

    def step(self) -> str | None:
        """One round (``refit → propose → measure``); the stop reason instead when none can run."""
        if len(self.rounds) >= self.options.max_rounds:
            return "rounds"
        count, promote = self.round_size()
        if count < 1:
            return "budget"
        self.refit()
        proposals = self.propose(count)
        while not proposals and self.widen < WIDEST:  # nothing new close by: look wider before giving up
            self.widen += 1
            proposals = self.propose(count)
        if not proposals:
            return "exhausted"
        self.measure(proposals, promote)
        return None

    def spent(self) -> float:
        """FPE of the rounds so far (what the budget counts)."""
        return float(self.measurements.fpe)

    def round_size(self) -> tuple[int, int]:
        """``(proposals, promoted)`` of the next round: the batch (enlarged to the round floor where measurements
        are cheap), cut to what the budget has left."""
        o, m = self.options, self.measurements
        per_pair = m.fpe / m.pairs if m.pairs and m.fpe > 0 else 1.0
        low, extra = len(self.lo_ids), len(self.hi_ids) - len(self.lo_ids)
        base = per_pair * (o.batch * low + o.promote * extra)
        scale = max(1.0, o.round_floor * self.budget / base) if base > 0 else 1.0
        batch, promote = math.ceil(o.batch * scale), math.ceil(o.promote * scale)
        originals = len(set(self.hi_ids) - set(m.original)) if hasattr(m, "original") else 0
        left = self.budget - self.spent() - originals  # a window's original pass is charged once (1 FPE)

        def cost(b: int, p: int) -> float:
            return per_pair * (b * low + p * extra)

        if cost(batch, promote) <= left:
            return batch, promote
        b = int(left // (per_pair * (low + extra)))  # the last round: as many sets as fit, each promoted
        if b >= 1:
            p = min(promote, b)
            while b < batch and cost(b + 1, p) <= left:
                b += 1
            return b, p
        return (int(left // (per_pair * low)) if per_pair * low > 0 else 0), 0  # low fidelity only

    # ------------------------------------------------------------------ the three steps
    def refit(self) -> None:
        """Fit the surrogate on every measurement so far; the best high-fidelity sets become the trust region's
        parents."""
        sets, ys, nws, lows = self.data()
        self.fitted = len(sets) >= 2
        self.hyper = (
            self.surrogate.fit(_rows(sets, self.prior.n), ys, nws, lows, self.grid()).hyper if self.fitted else {}
        )
        high = sorted((y, s) for s, y, lo in zip(sets, ys, lows) if not lo)
        self.parents = [s for _, s in high[: self.options.local_parents]]

    def propose(self, count: int) -> list[SetKey]:
        """Up to ``count`` sets never measured: the trust region's mutations of the best sets, restarts away from
        them (once widened), the posterior mean's lowest states and one minimum per posterior draw. Each widening
        level enlarges the swaps, adds draws and restarts farther."""
        o, w = self.options, self.widen
        measured = {k for k in self.measurements.values if len(k) == self.remove}
        out: list[SetKey] = []
        n_draws = 0
        if self.fitted:
            swaps = 3 + 2 * w
            out += self.near(round(o.local * count), measured, lambda p: self.moves.mutate(p, swaps))
            if w:
                far = max(2, math.ceil(self.remove * w / WIDEST))
                seen = measured | set(out)
                out += self.near(round(RESTART_SHARE * count), seen, lambda p: self.moves.jump(p, far), far)
            n_draws = min(count, round(o.thompson * count * (1 + w)))
        qubo = self.surrogate.qubo() if self.fitted else self.prior
        want = max(count - n_draws - len(out), 0)
        if want:
            states = self.solve(qubo, min(want + len(out) + len(measured), 4096))
            for x in states.states:
                key = _key(x)
                if key not in measured and key not in out and want:
                    out.append(key)
                    want -= 1
        for _ in range(n_draws):
            if len(out) >= count:
                break
            draws = self.solve(self.surrogate.qubo(self.surrogate.draw(self.rng)), len(out) + len(measured) + 1)
            for x in draws.states:
                key = _key(x)
                if key not in measured and key not in out:
                    out.append(key)
                    break
        return out[:count]

    def measure(self, proposals: list[SetKey], promote: int) -> dict[str, Any]:
        """Measure ``proposals`` on the low windows and the lowest ``promote`` of them on the high ones; update the
        best set, the patience and the widening; record and checkpoint the round (returned)."""
        n = self.prior.n
        predicted = self.surrogate.predict(_rows(proposals, n)).tolist() if self.fitted else None
        screen = self.screen_ids()
        low_loss = self.measurements(proposals, screen).mean(axis=1)
        ranked = [proposals[i] for i in np.argsort(low_loss, kind="stable")]
        promoted, high_loss, dropped = race(self.measurements, ranked[:promote], self.steps, self.best_set)
        new_set, new_best = self.best_high()
        improved = new_best < self.best - 1e-12
        self.best, self.best_set = new_best, new_set
        widen_used = self.widen
        if improved:  # a better set: search close to it again
            self.since, self.widen = 0, 0
        else:
            self.since += 1
        if self.since >= self.options.patience:  # patience ran out: widen instead of stopping
            self.since, self.widen = 0, min(self.widen + 1, WIDEST)
        record = {
            "round": len(self.rounds) + 1,
            "fpe": self.spent(),
            "proposals": [list(p) for p in proposals],
            "predicted": predicted,
            "low_loss": low_loss.tolist(),
            "screen": screen,
            "promoted": [list(p) for p in promoted],
            "high_loss": high_loss.tolist(),
            "dropped": dropped,  # promoted sets stopped at a stage, behind the incumbent there
            "best": self.best,
            "best_removed": list(self.best_set) if self.best_set else None,
            "since_improved": self.since,
            "widened": widen_used,
            "widen": self.widen,
            "hyper": self.hyper,
        }
        self.rounds.append(record)
        if self.checkpoint is not None:
            state = {"rng": self.rng.bit_generator.state, "measure": self.measurements.state(), "rounds": self.rounds}
            self.checkpoint.save(state)
        if self.progress is not None:
            info = {"round": len(self.rounds), "best": self.best, "fpe": self.spent(), "budget": self.budget}
            self.progress({**info, "measured": len(self.measurements.values)})
        return record

    # ------------------------------------------------------------------ helpers of the steps
    def solve(self, qubo: BlockQUBO, k: int) -> RankedStates:
        from cbo.solvers import solve

        seed = int(self.rng.integers(2**31))
        return solve(qubo, self.remove, solver=self.solver, k=min(k, 4096), seed=seed, **self.solver_options)

    def near(self, count: int, seen: set[SetKey], move: Callable[[SetKey], SetKey], distance: int = 0) -> list[SetKey]:
        """``count`` sets made by ``move`` from the parents (the best high-fidelity sets), never ``seen``, at least
        ``distance`` swaps from every parent, lowest under one posterior draw (out of ``screen`` tries)."""
        if not self.parents or count < 1:
            return []
        pool: list[SetKey] = []
        seen = set(seen)
        for i in range(self.options.screen):
            child = move(self.parents[i % len(self.parents)])
            if child in seen:
                continue
            seen.add(child)
            if distance and min(len(set(child) - set(p)) for p in self.parents) < distance:
                continue
            pool.append(child)
        if not pool:
            return []
        X = _rows(pool, self.prior.n)
        ok = np.flatnonzero(self.prior.feasible(X, self.remove))
        score = self.surrogate.predict(X[ok], theta=self.surrogate.draw(self.rng))
        return [pool[ok[i]] for i in np.argsort(score, kind="stable")[:count]]

    def screen_ids(self) -> list[int]:
        """The low-fidelity windows of the next round: the fixed low windows, or (``rotate_low``) the next ones of
        the high-fidelity windows in turn, so that no one window's quirks decide every promotion."""
        if not self.options.rotate_low:
            return list(self.lo_ids)
        low, hi = len(self.lo_ids), self.hi_ids
        start = len(self.rounds) * low
        return sorted({hi[(start + i) % len(hi)] for i in range(low)})

    def data(self) -> tuple[list[SetKey], np.ndarray, np.ndarray, np.ndarray]:
        """Every feasible set measured on all the high windows, or on low windows only: ``(sets, mean loss, windows,
        low)`` (``low``: 1.0 where only low windows are measured).

        A set measured on some of the high windows but not all (``rotate_low``: screened on that round's windows;
        ``stages``: stopped at a stage of its promotion) counts at low fidelity, its loss corrected for each window's
        offset (the window's mean loss minus the mean over the high windows, among the sets measured on all of them),
        so that sets screened on different windows can be compared."""
        lo, hi, hi_set = self.lo_ids, self.hi_ids, set(self.hi_ids)
        partial = self.options.rotate_low or self.options.stages > 0
        rows = []  # (set, its windows, its losses on them)
        for key in list(self.measurements.values):
            if len(key) != self.remove or not self.prior.feasible(_row(key, self.prior.n), self.remove):
                continue
            known = set(self.measurements.known(key))
            ids = hi if hi_set <= known else lo if set(lo) <= known else None
            if ids is not hi and partial:
                ids = sorted(known & hi_set) or ids
            if ids is not None:
                rows.append((key, ids, self.measurements([key], ids)[0]))
        offset = {}
        if partial:
            high = [values for _, ids, values in rows if ids is hi]
            offset = window_offsets(np.array(high), hi) if high else {}
        sets, ys, nws, lows = [], [], [], []
        for key, ids, values in rows:
            if ids is not hi and offset:
                values = values - np.array([offset.get(w, 0.0) for w in ids])
            sets.append(key)
            ys.append(float(values.mean()))
            nws.append(len(ids))
            lows.append(ids is not hi and lo != hi)
        return sets, np.array(ys), np.array(nws), np.array(lows, dtype=float)

    def grid(self) -> list[int] | None:
        """Where the last round's fit sat on the hyperparameter grid (a refit climbs from there; from the
        checkpointed rounds, so a resumed loop refits as the uninterrupted one)."""
        last = self.rounds[-1].get("hyper") if self.rounds else None
        return last.get("grid") if last else None

    def best_high(self) -> tuple[SetKey | None, float]:
        """The best set measured at high fidelity and its loss (None, inf before any)."""
        sets, ys, _, lows = self.data()
        high = [(y, s) for s, y, lo in zip(sets, ys, lows) if not lo]
        return (min(high)[1], float(min(high)[0])) if high else (None, float("inf"))

    # ------------------------------------------------------------------ the end
    def result(
        self,
        stopped: str,
        validate_fn: Callable[[list[SetKey]], tuple[np.ndarray, float]] | None = None,
        prior_cost: float = 0.0,
    ) -> RefineResult:
        """The refined QUBO (fit on every measurement), the high-fidelity sets ranked, the validated choice."""
        prior, n = self.prior, self.prior.n
        sets, ys, nws, lows = self.data()
        if len(sets) >= 2:
            self.surrogate.fit(_rows(sets, n), ys, nws, lows, self.grid())
        fitted = self.surrogate.fit_ is not None
        qubo = self.surrogate.qubo(metadata=_metadata(prior, self.rounds)) if fitted else prior
        high = sorted((y, s) for s, y, lo in zip(sets, ys, lows) if not lo)
        if not high:
            raise CBOError(
                f"the budget ({self.budget:g} FPE for the rounds) left no room to measure a single set at high "
                f"fidelity ({len(self.hi_ids)} windows); raise the budget"
            )
        top = [s for _, s in high[: self.options.validate]]
        val_fpe = 0.0
        if validate_fn is not None:
            val_loss, val_fpe = validate_fn(top)
            chosen = list(top[int(np.argmin(val_loss))])
            validation = {"removed": [list(s) for s in top], "loss": [float(v) for v in val_loss]}
        else:
            chosen, validation = list(top[0]), {"removed": [], "loss": []}
        X = _rows([s for _, s in high], n)
        states = RankedStates(
            X,
            [y for y, _ in high],
            names=prior.names,
            remove=self.remove,
            solver="refine",
            exact=False,
            info={"predicted": self.surrogate.predict(X).tolist() if fitted else None},
        )
        cost = {"prior": float(prior_cost), "rounds": self.spent(), "validation": float(val_fpe)}
        return RefineResult(qubo, states, chosen, validation, self.rounds, sum(cost.values()), cost, stopped)


def refine_search(
    measure: Any,
    prior: BlockQUBO,
    remove: int,
    *,
    options: RefineOptions | None = None,
    validate_fn: Callable[[list[SetKey]], tuple[np.ndarray, float]] | None = None,
    prior_cost: float = 0.0,
    **keywords: Any,
) -> RefineResult:
    """The loop over a measuring callable (see :func:`refine` for the model-side entry point): :class:`RefineLoop`
    run to its stop, then its result.

    Args:
        measure, prior, remove: as in :class:`RefineLoop`.
        options: :class:`RefineOptions`.
        validate_fn: ``validate_fn(sets) -> (per-set loss, fpe spent)`` on validation windows (None: choose by
            calibration loss).
        prior_cost: FPE already spent on the prior (reported).
        keywords: :class:`RefineLoop`'s own (``budget``, the FPE of the rounds, required; ``solver``,
            ``solver_options``, ``seed``, ``checkpoint``, ``progress``), and :class:`RefineOptions` fields
            (``batch=12``) that replace the ``options``' ones.
    """
    own = {k: keywords.pop(k) for k in LOOP_KEYWORDS if k in keywords}
    loop = RefineLoop(measure, prior, remove, options=RefineOptions.build(options, **keywords), **own)
    stopped = loop.run()
    return loop.result(stopped, validate_fn, prior_cost)


def window_offsets(values: np.ndarray, windows: Sequence[int]) -> dict[int, float]:
    """``{window: its mean loss minus the mean over all the windows}`` from ``values`` (sets × ``windows``)."""
    deviation = (values - values.mean(axis=1, keepdims=True)).mean(axis=0)
    return {int(w): float(d) for w, d in zip(windows, deviation)}


def fidelity_windows(n_pool: int, low: int, high: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """The low- and high-fidelity windows: the first ``low`` / ``high`` of a permutation drawn from ``rng``."""
    order = [int(w) for w in rng.permutation(n_pool)]
    return sorted(order[:low]), sorted(order[:high])


def _key(x: np.ndarray) -> SetKey:
    return tuple(int(i) for i in np.flatnonzero(x))


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
        "prior_options": prior.metadata.get("options"),  # the estimate's own options (None for a singles prior)
        "rounds": len(rounds),
        "fpe": rounds[-1]["fpe"] if rounds else None,
        "energy": "E(x) = 0.5 x^T H x - g.x: the posterior-mean surrogate of the measured loss",
    }


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
    solver: str = "auto",
    executor: Any = None,
    checkpoint: str | Path | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    seed: int = 0,
    **options: Any,
) -> RefineResult:
    """Refine a prior QUBO with measurements on the model until the budget is spent; choose by validation.

    The one model-side entry point of the loop (``cbo.prune_depth(refine=...)`` runs it too).

    Args:
        model: the causal LM (eval mode).
        blocks: ``"layer"``, ``"sublayer"`` or a block list (``cbo.model.blocks.find_blocks``).
        calibration: (W, T) calibration windows, or a ``TokenSplits`` (its calibration and validation splits).
        validation: (V, T) validation windows (None: a ``TokenSplits``' validation split; or choose by calibration).
        remove: M, blocks removed.
        budget: forward-pass equivalents for the rounds (one FPE = one full forward pass over one window): the
            measurements after the prior. The prior and the final validation are paid apart (``result.cost``).
        prior: ``"singles"`` (each block's measured KL on the ``prior_windows``, the default), another
            estimator name (``cbo.estimate_hessian`` on the same windows), or a ``BlockQUBO`` (cost ``prior_cost``;
            its constraints are kept unless ``keep`` / ``caps`` replace them).
        keep / caps: blocks never removed; ``{kind: max removed}`` (sublayer: ``{"attention": M, "mlp": M}``
            with ``remove=2M`` removes M layers' worth of each).
        solver: how the surrogate is minimised (``cbo.solve``).
        executor: a ``cbo.measure.executors`` executor on the calibration windows (default: in this process).
        checkpoint: a JSON file written after each round (resumes an interrupted loop).
        progress: called after each round (round, best measured loss, the rounds' FPE and the budget).
        seed: the random stream.
        **options: the fields of :class:`RefineOptions` (``low_windows``, ``high_windows``, ``batch``,
            ``promote``, ``thompson``, ``local``, ``validate``, ``patience``, ``prior_windows``, ...), or
            ``options=RefineOptions(...)``; and ``solver_options`` (passed to the solver).

    Example:
        >>> r = refine(model, "layer", splits, remove=8, budget=500)   # doctest: +SKIP
        >>> r.qubo.save("refined.cboq"); r.chosen, r.cost              # doctest: +SKIP
    """
    from cbo.measure.executors import InProcessExecutor, Measurements
    from cbo.model.blocks import find_blocks

    solver_options = options.pop("solver_options", None)
    opts = RefineOptions.build(options.pop("options", None), **options)
    if hasattr(calibration, "calibration"):
        splits = calibration
        calibration = splits.calibration
        if validation is None and getattr(splits, "validation", None) is not None and len(splits.validation):
            validation = splits.validation
    block_list = find_blocks(model, blocks) if isinstance(blocks, str) else list(blocks)
    check_budget(budget)
    ex = executor if executor is not None else InProcessExecutor(model, block_list, calibration)
    vex = InProcessExecutor(model, block_list, validation) if validation is not None else None
    try:
        measure = Measurements(ex)
        low, high = opts.check(measure.n_windows)
        # one round's worth at the least, checked before the prior is measured (an upper bound: a set costs at most
        # one full pass per window, plus each window's original pass)
        one_round = opts.round_cost(measure.n_windows, first=True)
        if budget < one_round:
            raise InvalidOptionError(
                f"budget={budget!r} FPE cannot pay one round of refinement ({one_round:g} FPE: {opts.batch} sets on "
                f"{low} windows, {opts.promote} on {high}, and the windows' original passes); give budget >= "
                f"{one_round:g}."
            )
        lo_ids, hi_ids = fidelity_windows(measure.n_windows, low, high, np.random.default_rng(seed))
        prior_ids = hi_ids if opts.prior_windows == "high" else lo_ids
        prior_qubo, prior_cost = measure_prior(block_list, calibration, prior_ids, prior, prior_cost, measure, model)
        changes = {k: v for k, v in (("keep", tuple(keep)), ("caps", dict(caps or {}))) if v}
        if changes:
            prior_qubo = prior_qubo.with_constraints(**changes)
        validate_fn = None
        if vex is not None:
            vmeasure = Measurements(vex)

            def validate_fn(sets: list[SetKey]) -> tuple[np.ndarray, float]:
                values = vmeasure(sets, list(range(vmeasure.n_windows))).mean(axis=1)
                return values, float(vmeasure.fpe)

        loop = RefineLoop(
            measure, prior_qubo, remove, budget=budget, options=opts, solver=solver, solver_options=solver_options,
            seed=seed, checkpoint=checkpoint, progress=progress,
        )  # fmt: skip
        stopped = loop.run()
        return loop.result(stopped, validate_fn, prior_cost)
    finally:
        if executor is None:
            ex.close()
        if vex is not None:
            vex.close()
