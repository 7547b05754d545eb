"""The final selection: a race among near-tied finalists on growing numbers of fresh windows.

A search ends with a few removal sets whose losses differ by a few percent, less than the noise of the few
thousand validation tokens that ranked them. This stage gives the choice the evidence it needs (racing, Maron &
Moore 1994; successive halving, Jamieson & Talwalkar 2016):

1. every finalist still in the race is measured on the next round of **fresh** windows (windows no split used:
   32, then 64, 128, ... by default), the same windows for all of them;
2. the leader is the finalist with the lowest mean loss (cross-entropy, or KL to the original) so far; every other
   one is compared with it **paired by window** (common random numbers: the windows' shared difficulty cancels);
3. a finalist whose Bonferroni-corrected t interval of the per-window difference lies wholly above 0 is clearly
   worse and is dropped;
4. the race stops when one finalist is left (``"decided"``), when the window budget is spent (``"budget"``) or
   when no fresh window is left (``"windows"``); the leader is chosen, and finalists still in the race at the end
   are reported as tied with it.

The correction spends ``1 - confidence`` over every comparison the race can make (finalists − 1 per round, times
the rounds the budget allows), so the chance that the race ever drops the truly best finalist stays below it.
Measurement goes through a :class:`WindowSource`; :class:`PoolSource` is the one of a real model, through the one
measurer (:class:`cbo.measure.measurer.Measurer`, its prefix tree and cache), batch by batch: only per-window
losses are kept, never the original's next-token distributions of more than one batch, so more windows cost time,
not memory.

Example:
    >>> source = PoolSource(model, blocks, pool, criterion="ce", cache=cache)        # doctest: +SKIP
    >>> result = race([(3, 7), (3, 8), (4, 7)], source, budget=480)                   # doctest: +SKIP
    >>> result.chosen, result.stopped, result.finalists[1].ratio                      # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from cbo.checks import check_choice, check_float, check_int
from cbo.errors import InvalidOptionError

CRITERIA = ("ce", "kl")
TEXTS = ("validation", "validation+calibration")
STOPS = ("decided", "budget", "windows")


@dataclass(frozen=True)
class SelectionOptions:
    """How the final selection races its finalists.

    Attributes:
        criterion: ``"ce"`` (next-token cross-entropy, i.e. perplexity; default) or ``"kl"`` (KL to the original).
        first: fresh windows measured in the first round; each later round measures ``growth`` times the last.
        growth: factor between the window counts of consecutive rounds (>= 1).
        confidence: family-wise confidence of the race's decisions (Bonferroni over every comparison it can make).
        finalists: at most this many candidates enter the race (the best by the criterion on validation).
        text: where fresh windows come from: ``"validation"`` (the validation documents, beyond the windows the
            validation split used) or ``"validation+calibration"`` (also unused windows of the calibration
            documents). Never the test split.
    """

    criterion: str = "ce"
    first: int = 32
    growth: float = 2.0
    confidence: float = 0.95
    finalists: int = 8
    text: str = "validation"

    def __post_init__(self) -> None:
        check_choice("criterion (the selection's loss, --select-criterion)", self.criterion, CRITERIA)
        check_int("first (fresh windows of the first round)", self.first, lo=2)
        check_float("growth (window factor between rounds)", self.growth, lo=1.0)
        check_float("confidence", self.confidence, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        check_int("finalists (candidates that enter the race)", self.finalists, lo=2)
        check_choice("text (where fresh windows come from)", self.text, TEXTS)

    def schedule(self, budget: int, available: int) -> list[int]:
        """Windows per round: ``first``, ``first·growth``, ... until ``min(budget, available)`` is drawn (the last
        round takes what is left)."""
        total = min(int(budget), int(available))
        rounds, drawn, size = [], 0, float(self.first)
        while drawn < total:
            n = min(int(round(size)), total - drawn)
            rounds.append(n)
            drawn += n
            size *= self.growth
        return rounds


class WindowSource(Protocol):
    """Fresh windows in a fixed order, and the per-window loss of removal sets on a range of them.

    Attributes:
        n_windows: how many fresh windows there are.
        seq_len: tokens per window.
        fpe: FPE spent so far (one FPE: one full forward pass over one window).
    """

    n_windows: int
    seq_len: int
    fpe: float

    def measure(self, sets: list[tuple[int, ...]], start: int, stop: int) -> np.ndarray:
        """(len(sets), stop − start) per-window loss of each set on windows ``start..stop − 1``."""


@dataclass
class Finalist:
    """One finalist of the race and its paired interval against the chosen set.

    Attributes:
        removed: the removal set; ``rank``: its energy rank (None when unknown).
        mean: its mean loss over the windows it was measured on; ``windows``: how many.
        diff, low, high: mean per-window loss minus the chosen set's on the same windows, and its interval (at the
            race's corrected level); 0 for the chosen set itself.
        ratio, ratio_low, ratio_high: ``exp`` of the three (the perplexity ratio to the chosen set), criterion ce.
        status: ``"chosen"``, ``"dropped"`` (clearly worse; ``dropped_round`` says when) or ``"tied"`` (still in
            the race when it stopped without a decision).
    """

    removed: tuple[int, ...]
    rank: int | None
    mean: float
    windows: int
    diff: float
    low: float
    high: float
    status: str
    dropped_round: int | None = None
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "removed": list(self.removed),
            "rank": self.rank,
            "mean": self.mean,
            "windows": self.windows,
            "diff": self.diff,
            "low": self.low,
            "high": self.high,
            "status": self.status,
            "dropped_round": self.dropped_round,
        }
        if self.ratio is not None:
            out.update(ratio=self.ratio, ratio_low=self.ratio_low, ratio_high=self.ratio_high)
        return out


@dataclass
class Selection:
    """What the race decided.

    Attributes:
        chosen: the chosen removal set.
        stopped: ``"decided"`` (one finalist left), ``"budget"`` (the window budget is spent) or ``"windows"`` (no
            fresh window left).
        finalists: every finalist with its interval against the chosen set, chosen first, then by mean loss.
        tie: the finalists still in the race at the end besides the chosen one (empty when decided).
        criterion, confidence: the options; ``level``: the confidence of each single interval (Bonferroni).
        rounds: one record per round: windows, finalists measured, leader, dropped.
        windows, tokens: fresh windows (and their tokens) measured; ``fpe``: what it cost.
    """

    chosen: tuple[int, ...]
    stopped: str
    finalists: list[Finalist]
    tie: list[tuple[int, ...]]
    criterion: str
    confidence: float
    level: float
    rounds: list[dict[str, Any]] = field(default_factory=list)
    windows: int = 0
    tokens: int = 0
    fpe: float = 0.0
    budget: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": list(self.chosen),
            "stopped": self.stopped,
            "criterion": self.criterion,
            "confidence": self.confidence,
            "level": self.level,
            "budget_windows": self.budget,
            "windows": self.windows,
            "tokens": self.tokens,
            "fpe": round(self.fpe, 4),
            "tie": [list(s) for s in self.tie],
            "finalists": [f.to_json() for f in self.finalists],
            "rounds": self.rounds,
        }


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (scipy when installed, else a Cornish–Fisher
    expansion of the normal quantile, good to 1e-3 from df = 5)."""
    try:
        from scipy import stats

        return float(stats.t.ppf(p, df))
    except ImportError:
        from statistics import NormalDist

        z = NormalDist().inv_cdf(p)
        g1 = (z**3 + z) / 4
        g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
        g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
        return z + g1 / df + g2 / df**2 + g3 / df**3


def paired_interval(diff: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """``(mean, low, high)`` of a two-sided ``1 − alpha`` t interval of the mean of per-window differences."""
    n = int(diff.size)
    mean = float(diff.mean())
    if n < 2:
        return mean, -math.inf, math.inf
    sd = float(diff.std(ddof=1))
    half = t_quantile(1 - alpha / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def check_budget(budget: Any) -> int:
    """The selection budget: an integer number of fresh windows >= 2."""
    return check_int(
        "select (fresh windows the final selection may measure, --select)", budget, lo=2,
        hint="For example select=480 races the finalists on up to 480 fresh windows (32 + 64 + 128 + 256).",
    )  # fmt: skip


def race(
    finalists: Sequence[Sequence[int]],
    source: WindowSource,
    budget: int,
    options: SelectionOptions | None = None,
    *,
    ranks: Sequence[int | None] | None = None,
) -> Selection:
    """Race ``finalists`` on the fresh windows of ``source`` until one is left or ``budget`` windows are spent.

    Args:
        finalists: removal sets (duplicates are raced once); the first is the incumbent, which wins exact ties.
        source: the fresh windows and their measurement (:class:`PoolSource`, or a synthetic one in tests).
        budget: at most this many fresh windows are measured.
        options: :class:`SelectionOptions` (``first``, ``growth``, ``confidence``; ``criterion`` is the source's).
        ranks: the finalists' energy ranks, reported beside them.

    Returns:
        A :class:`Selection`: the chosen set, why the race stopped, every finalist's interval.
    """
    options = options or SelectionOptions()
    budget = check_budget(budget)
    sets: list[tuple[int, ...]] = []
    rank_of: dict[tuple[int, ...], int | None] = {}
    for k, s in enumerate(finalists):
        key = tuple(sorted(int(i) for i in s))
        if key not in rank_of:
            sets.append(key)
            rank_of[key] = None if ranks is None else ranks[k]
    if not sets:
        raise InvalidOptionError("the final selection needs at least one finalist.")
    fpe0 = float(source.fpe)
    schedule = options.schedule(budget, source.n_windows) if len(sets) > 1 else []
    comparisons = max(1, (len(sets) - 1) * max(len(schedule), 1))
    alpha = (1.0 - options.confidence) / comparisons
    losses: dict[tuple[int, ...], list[np.ndarray]] = {s: [] for s in sets}
    alive = list(sets)
    dropped: dict[tuple[int, ...], int] = {}
    rounds: list[dict[str, Any]] = []
    start = 0
    for r, n in enumerate(schedule):
        values = source.measure(list(alive), start, start + n)
        for k, s in enumerate(alive):
            losses[s].append(np.asarray(values[k], dtype=np.float64))
        start += n
        full = {s: np.concatenate(losses[s]) for s in alive}
        leader = min(alive, key=lambda s: (float(full[s].mean()), sets.index(s)))
        out = []
        for s in alive:
            if s != leader and paired_interval(full[s] - full[leader], alpha)[1] > 0:
                out.append(s)
                dropped[s] = r
        alive = [s for s in alive if s not in out]
        rounds.append(
            {"round": r, "windows": n, "measured": len(full), "leader": list(leader), "dropped": [list(s) for s in out]}
        )
        if len(alive) == 1:
            break
    if len(alive) == 1:
        stopped = "decided"
    else:
        stopped = "budget" if start >= budget else "windows"
    series = {s: np.concatenate(v) if v else np.zeros(0) for s, v in losses.items()}
    chosen = min(alive, key=lambda s: (float(series[s].mean()) if series[s].size else 0.0, sets.index(s)))
    records = []
    for s in sets:
        x = series[s]
        n_s = int(x.size)
        if s == chosen:
            mean, low, high = 0.0, 0.0, 0.0
        else:
            mean, low, high = paired_interval(x - series[chosen][:n_s], alpha) if n_s else (0.0, -math.inf, math.inf)
        status = "chosen" if s == chosen else "dropped" if s in dropped else "tied"
        f = Finalist(s, rank_of[s], float(x.mean()) if n_s else math.nan, n_s, mean, low, high, status, dropped.get(s))
        if options.criterion == "ce":
            f.ratio, f.ratio_low, f.ratio_high = (math.exp(min(v, 700.0)) for v in (mean, low, high))
        records.append(f)
    order = {"chosen": 0, "tied": 1, "dropped": 2}
    records.sort(key=lambda f: (order[f.status], f.diff))
    return Selection(
        chosen=chosen,
        stopped=stopped,
        finalists=records,
        tie=[f.removed for f in records if f.status == "tied"],
        criterion=options.criterion,
        confidence=options.confidence,
        level=1.0 - alpha,
        rounds=rounds,
        windows=start,
        tokens=start * int(source.seq_len),
        fpe=float(source.fpe) - fpe0,
        budget=budget,
    )


class PoolSource:
    """Fresh token windows of a real model measured through the one measurer, one round's windows at a time.

    Each call builds a :class:`cbo.measure.measurer.Measurer` over the round's windows that keeps nothing between
    batches (``retain=False``): one batch's original pass at a time, per-window losses out. With a ``cache`` the
    measured values are kept on disk, so a rerun with the same seed (the same pool, the same rounds) measures
    nothing new.

    Args:
        model, blocks: the model and its block list (removal sets index into it).
        pool: (P, T) fresh windows, in the order the race draws them.
        criterion: ``"ce"`` or ``"kl"``.
        batch_size: windows per batch; cache: a :class:`cbo.measure.cache.MeasureCache` (or None).
    """

    def __init__(
        self,
        model: Any,
        blocks: Sequence[Any],
        pool: Any,
        *,
        criterion: str = "ce",
        batch_size: int = 8,
        cache: Any = None,
        progress: bool = False,
    ) -> None:
        from cbo.measure.measurer import Work

        check_choice("criterion", criterion, CRITERIA)
        self.model, self.blocks, self.pool = model, list(blocks), pool
        self.criterion, self.batch_size, self.cache, self.progress = criterion, batch_size, cache, progress
        self.n_windows = int(pool.shape[0])
        self.seq_len = int(pool.shape[1])
        self.work = Work()

    @property
    def fpe(self) -> float:
        return self.work.fpe

    def measure(self, sets: list[tuple[int, ...]], start: int, stop: int) -> np.ndarray:
        from cbo.measure.measurer import Measurer

        windows = self.pool[start:stop]
        measurer = Measurer(
            self.model, self.blocks, windows, batch_size=self.batch_size, cache=self.cache, retain=False,
            unit_windows=1, progress=self.progress, label=f"race: windows {start}-{stop}",
        )  # fmt: skip
        out = measurer.losses(sets)
        self.work = self.work + measurer.work
        return np.array(getattr(out, self.criterion), dtype=np.float64)


__all__ = [
    "CRITERIA",
    "Finalist",
    "PoolSource",
    "Selection",
    "SelectionOptions",
    "WindowSource",
    "check_budget",
    "paired_interval",
    "race",
]
