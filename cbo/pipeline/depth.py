"""End-to-end depth pruning: text → calibration windows → Hessian → QUBO → ranked states → validation →
surgery → pruned model, with a report that holds the evidence for the choice.

Validation measures the candidates through the one measurer (:class:`cbo.measure.measurer.Measurer`): the
validation windows run once through the original model and every candidate from the recorded streams, without
copying the model; only the chosen state is physically removed.

Example:
    >>> report = prune_depth("smollm2-135m", remove=8, top_k=10, validate=5)   # doctest: +SKIP
    >>> report.print()                                                          # doctest: +SKIP
    >>> report.save_model("pruned/")                                            # doctest: +SKIP
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from cbo.checks import check_int
from cbo.errors import CBOError, InfeasibleError, InvalidOptionError
from cbo.pipeline.final_selection import check_select, finalists_of, no_fresh_windows, race_sets, selection_work
from cbo.pipeline.inputs import cache_dirs, check_run_options, model_and_tokenizer, token_splits
from cbo.pipeline.options import AUTO, Data, Estimate, Run, Search, option_groups, options_json
from cbo.pipeline.reports import DepthReport, ValidatedState
from cbo.qubo.block_qubo import BlockQUBO, Constraints
from cbo.search.budget import large_space, scaled_budget, space_options
from cbo.search.options import RefineOptions


def depth_methods() -> list[str]:
    """The depth methods ``prune_depth`` accepts: ``cbo`` and every registered baseline of ``cbo.baselines``."""
    from cbo.baselines import methods

    return ["cbo"] + [m for m in methods() if m != "cbo"]


def prune_blocks(model: Any, blocks: Sequence[Any], removed: Iterable[int]) -> Any:
    """A pruned copy of ``model`` without the given blocks (layer or sublayer indices into ``blocks``)."""
    from cbo.surgery.depth import remove_blocks, remove_sublayers

    removed = sorted(int(i) for i in removed)
    if all(blocks[i].part == "layer" for i in removed):
        return remove_blocks(model, [blocks[i].layer for i in removed])
    return remove_sublayers(model, [blocks[i] for i in removed])


def check_request(
    remove: Any,
    blocks: Sequence[Any],
    keep: Sequence[int],
    caps: dict[str, int] | None = None,
    budget_params: int | None = None,
) -> int:
    """M checked before any long work: the QUBO's own feasibility check (keep list, per-kind caps, parameter
    budget), and something of the model remains."""
    n = len(blocks)
    kinds = [b.kind for b in blocks]
    unknown = sorted(set(caps or {}) - set(kinds))
    if unknown:
        raise InfeasibleError(
            f"caps name block kinds {unknown} this model does not have; its kinds: {sorted(set(kinds))}."
        )
    check_int("budget_params (parameters to remove at most)", budget_params, lo=1, none_ok=True,
              error=InfeasibleError)  # fmt: skip
    # one rule, stated once: something of the model remains, and kept blocks stay
    kept = len(set(keep or ()))
    hi = min(n - 1, n - kept)
    where = f"the model has {n} blocks" + (f", {kept} of them kept" if kept else "")
    if hi < 1:
        raise InfeasibleError(f"nothing can be removed: {where}. Keep fewer blocks (keep= / --keep).")
    remove = check_int("remove (M)", remove, error=InfeasibleError)
    if not 1 <= remove <= hi:
        raise InfeasibleError(f"remove={remove} is out of range: {where}; use 1..{hi}.")
    shape = BlockQUBO(
        np.zeros((n, n)), kinds=kinds, sizes=[b.n_params for b in blocks], keep=keep, caps=dict(caps or {}),
        max_removed_params=budget_params,
    )  # fmt: skip
    shape.check_remove(remove)  # caps and the parameter budget
    return int(remove)


def prune_depth(
    model: Any = "smollm2-135m",
    tokenizer: Any = None,
    text: Any = None,
    *,
    remove: int = 8,
    method: str = "cbo",
    granularity: str = "layer",
    keep: Any = None,
    caps: dict[str, int] | None = None,
    budget_params: int | None = None,
    data: Data | None = None,
    estimate: Estimate | None = None,
    search: Search | None = None,
    run: Run | None = None,
    **options: Any,
) -> DepthReport:
    """Remove ``remove`` blocks of a causal LM chosen by constrained binary optimization, validated on held-out text.

    Steps: calibration/validation windows (by document) → Hessian of the gates (once, cached on disk) → the
    ``top_k`` lowest-energy states with exactly ``remove`` blocks removed → refinement rounds measured on the
    calibration windows (``refine``) → the best ``validate`` candidates measured on the validation split (KL to the
    original and perplexity) → a race of the validated states on fresh validation-document windows (``select``;
    without it the best by validation KL is chosen, the ground state when ``validate=0``) → a pruned copy. In a
    large space (``cbo.search.budget.large_space``, with ``refine="auto"``) the race comes first: its finalists are
    refine's best sets by calibration KL, and the validation split measures the chosen set alone.

    Args:
        model: ``"smollm2-135m"``, a local Hugging Face folder or hub id, or a loaded model.
        tokenizer: the model's tokenizer (loaded with the model when ``model`` is a name).
        text: the text source (file, folder, .jsonl, list of strings, datasets object); None = the Austen novels.
        remove: M, the number of blocks to remove.
        method: ``"cbo"``, or a baseline of ``cbo.baselines`` (e.g. ``"block_influence"``).
        granularity: ``"layer"`` or ``"sublayer"`` (attention and MLP halves).
        keep: blocks never removed (indices, names or kinds), e.g. ``[0, 29]`` or ``["mamba"]``.
        caps: at most this many removed blocks of a kind, e.g. ``{"attention": 4, "mlp": 2}`` (kinds of
            ``cbo.model.blocks.find_blocks``: ``attention``, ``mamba``, ``mlp``, ``moe``, combined ones such as
            ``"mamba+mlp"`` for hybrid layers, whose parts may be capped at 0); budget_params: at most this many
            parameters removed. Both constrain the solver (CBO only; the baselines rank without constraints).
        data / estimate / search / run: the option groups of :mod:`cbo.pipeline.options`; their fields may be
            given as flat keywords instead (``**options``), which replace the groups' ones:

            * ``Data``: ``splits`` (precomputed ``TokenSplits``; then ``text`` and the window counts are not used),
              ``n_calibration=32``, ``n_validation=32`` (windows per split), ``seq_len=128`` (tokens per window).
            * ``Estimate``: ``estimator`` (``cbo.hessian.names()``; default ``singles``, measured single-block
              removals; ``fisher`` is the cheapest), ``loss`` (``"kl"`` or ``"ce"``), ``estimator_options``.
            * ``Search``: ``solver="auto"``, ``solver_options``, ``top_k=10`` (states ranked), ``validate=10``
              (of them measured), ``refine``: a budget in forward-pass equivalents (one FPE: one full forward pass
              over one calibration window) for the refinement rounds after the estimate (``cbo.search.refine``):
              rounds of proposals from the solver layer are measured on the calibration windows and the QUBO is
              refit on them until the budget is spent; the measured sets with the lowest calibration loss are then
              the candidates validated. ``"auto"`` (default): 300 FPE for ``method="cbo"``; None: no refinement.
              The estimate and the validation are paid as without it; ``report.work["refine"]`` holds the rounds'
              cost. ``select``, ``select_options``: race the validated states on up to ``select`` fresh windows of
              the validation documents and choose the winner (:mod:`cbo.pipeline.final_selection`; options: a
              ``cbo.search.selection.SelectionOptions`` or a dict of its fields; default criterion: perplexity).
              ``"auto"`` (default): 96 windows for ``method="cbo"`` when at least two states are validated and the
              text is known (not precomputed ``splits``; then ``report.work["selection"]["skipped"]`` says why);
              None: the lowest validation KL is chosen. ``report.selection`` holds every finalist's interval,
              ``report.work["selection"]`` the cost, ``report.work["total_fpe"]`` everything charged.
            * ``Run``: ``seed=0`` (data sampling, label sampling, randomized solvers), ``batch_size=8``,
              ``progress=True``, ``cache_dir=True`` (where Hessians and measured validation losses are cached;
              True = ``CBO_HOME/cache``, None/False = no cache), ``device="cpu"`` and ``dtype`` (used when
              ``model`` is a name).

    Returns:
        A :class:`DepthReport`; ``report.options`` holds the groups and the constraints as used.

    Example:
        >>> report = prune_depth("smollm2-135m", remove=8, validate=5, keep=[0])   # doctest: +SKIP
        >>> report.pruned_model.config.num_hidden_layers                          # doctest: +SKIP
        22
        >>> prune_depth(model, tok, remove=4, search=Search(top_k=20), run=Run(seed=1))   # doctest: +SKIP
    """
    from cbo.evaluate import count_parameters
    from cbo.hessian import ESTIMATORS
    from cbo.measure.losses import check_loss
    from cbo.model.blocks import find_blocks, prunable_parameters, resolve_keep
    from cbo.model.families import check_caps_shape, resolve_caps
    from cbo.solvers import get as get_solver

    data, estimate, search, run = option_groups(
        options, who="prune_depth", unused=("n_test",), data=data, estimate=estimate, search=search, run=run
    )
    if text is not None:
        data = replace(data, text=text)
    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    methods = depth_methods()
    if method not in methods:
        raise CBOError(f"unknown method {method!r}; valid methods: {methods}.")
    for label, least in (("top_k", 1), ("validate", 0)):
        check_int(label, getattr(search, label), lo=least, error=CBOError)
    caps = check_caps_shape(caps)  # before the model loads
    n_calibration = data.n_calibration if data.splits is None else len(data.splits.calibration)
    auto_refine = search.refine == AUTO
    search = replace(search, refine=check_refine(search.refine, method, n_calibration))
    auto_select = search.select == AUTO
    select, select_options = check_select(search.select, search.select_options, method, search.validate)
    search = replace(search, select=select, select_options=select_options if select is not None else None)
    dtype, device = check_run_options(
        seq_len=data.seq_len, n_calibration=data.n_calibration, n_validation=data.n_validation,
        batch_size=run.batch_size, seed=run.seed, dtype=run.dtype, device=run.device, splits=data.splits,
    )  # fmt: skip

    t = time.perf_counter()
    model, tokenizer, model_label = model_and_tokenizer(
        model, tokenizer, dtype=dtype, device=device, quiet=not run.progress
    )
    timings["load"] = time.perf_counter() - t

    blocks = find_blocks(model, granularity)
    keep_idx = resolve_keep(keep, blocks)
    if caps:  # a cap may name a kind that combined kinds hold: "mamba" caps the "mamba+mlp" layers
        caps = resolve_caps(caps, [b.kind for b in blocks])
    remove = check_request(remove, blocks, keep_idx, caps, budget_params)
    if method != "cbo" and (caps or budget_params is not None):
        raise CBOError(f"caps and budget_params constrain CBO's solver; the baseline {method!r} does not take them.")
    constraints = Constraints(keep=tuple(keep_idx), caps=dict(caps or {}), max_removed_params=budget_params)
    n_candidates = len(blocks) - len(set(keep_idx))
    if auto_refine and search.refine is not None:  # the default budget grows with the space (cbo.search.budget)
        search = replace(search, refine=max(search.refine, scaled_budget(n_candidates, remove)))
    cheap_prior = auto_refine and search.refine is not None and large_space(n_candidates, remove)
    if method == "cbo":  # every option checked before the long work starts
        cls = ESTIMATORS.get(estimate.estimator)
        check_loss(estimate.loss)
        estimator_options = dict(estimate.estimator_options)
        for name, value in (("remove", remove), ("keep", keep_idx)):
            if name in cls.target_options:
                estimator_options.setdefault(name, value)
        ESTIMATORS.make_options(cls, estimator_options)
        estimate = replace(estimate, estimator_options=estimator_options)
        get_solver(search.solver)
    hessian_cache, measure_cache = cache_dirs(run.cache_dir)

    t = time.perf_counter()
    splits = token_splits(
        data.splits, tokenizer, data.text, model=model, seq_len=data.seq_len, n_calibration=data.n_calibration,
        n_validation=data.n_validation, n_test=0, seed=run.seed, who="prune_depth",
    )  # fmt: skip
    validate = search.validate
    work: dict[str, Any] = {}
    why = no_fresh_windows(tokenizer, splits) if auto_select and select is not None else None
    if why is not None:  # the default race needs fresh windows of a known text; said in the report, not raised
        work["selection"] = {"skipped": why}
        select = None
        search = replace(search, select=None, select_options=None)
    if splits.validation.shape[0] == 0 and (validate > 0 or method != "cbo"):
        raise CBOError("the validation split is empty; give n_validation >= 1 (or validate=0).")
    timings["data"] = time.perf_counter() - t

    qubo = states = None
    if method == "cbo":
        prior_windows = splits.calibration
        if cheap_prior:  # a large space: the estimate on refine's low-fidelity windows (cbo.search.budget)
            prior_windows = splits.calibration[: RefineOptions().windows(splits.calibration.shape[0])[0]]
        qubo, states = estimate_and_solve(
            model, tokenizer, prior_windows, blocks, remove, constraints, estimate, search, run, hessian_cache,
            timings,
        )  # fmt: skip
        work["estimate_fpe"] = qubo.metadata.get("fpe")
        work["estimate_windows"] = int(prior_windows.shape[0])
        if search.refine is not None:
            qubo, states, work["refine"] = refine_qubo(
                model, blocks, splits.calibration, qubo, remove, search, run, measure_cache,
                prior_windows=int(prior_windows.shape[0]),
                options=space_options(n_candidates, remove) if auto_refine else None,
            )  # fmt: skip
            timings["refine"] = work["refine"].pop("wall_time")
        candidates = [(s.rank, list(s.removed), s.energy) for s in states]
        if validate > len(candidates):
            n = len(candidates)
            if n >= math.comb(len(blocks) - len(keep_idx), remove):
                where, fix = f"the {n} possible removal sets", ""
            elif search.refine is not None:
                where, fix = f"the {n} sets refine measured", " A larger --refine budget measures more."
            else:
                where, fix = f"the top_k={search.top_k} ranked states", " Raise top_k (--top) to validate more."
            work["validated_fewer"] = f"validate={validate} asks for more candidates than {where}; validating {n}.{fix}"
            warnings.warn(work["validated_fewer"], stacklevel=2)
    else:
        from cbo.baselines import select_blocks

        t = time.perf_counter()
        chosen = select_blocks(
            method, model, splits, remove, granularity=granularity, keep=keep_idx, batch_size=run.batch_size,
            progress=run.progress,
        )  # fmt: skip
        timings["select"] = time.perf_counter() - t
        candidates = [(None, sorted(int(i) for i in chosen), None)]
        validate = max(validate, 1)

    def final_race(finalists: list[tuple[int | None, list[int]]]) -> Any:  # (rank, removed) of each, charged
        t = time.perf_counter()
        raced = race_sets(
            model, tokenizer, data.text, splits, blocks, [f[1] for f in finalists], [f[0] for f in finalists], select,
            select_options, seed=run.seed, batch_size=run.batch_size, cache_dir=measure_cache, progress=run.progress,
        )  # fmt: skip
        work["selection"], timings["selection"] = selection_work(raced), time.perf_counter() - t
        states.info["selection"] = raced.to_json()
        return raced

    selection = None
    if method == "cbo" and cheap_prior and select is not None:  # a large space: refine's best race first
        selection = final_race([(c[0], c[1]) for c in candidates[: min(validate, select_options.finalists)]])
        work["selection"]["finalists_from"] = "refine"  # by calibration KL; the validation measures the chosen set
        candidates, validate = [c for c in candidates if tuple(sorted(c[1])) == selection.chosen], 1

    t = time.perf_counter()
    validated, original_metrics, measured = [], {}, {}
    if splits.validation.shape[0]:
        validation = validate_candidates(
            model, blocks, splits.validation, candidates, validate, batch_size=run.batch_size,
            cache_dir=measure_cache, progress=run.progress,
        )  # fmt: skip
        validated, original_metrics, measured = validation.states, validation.original, validation.metrics
        work["validation"] = validation.work.to_json()
    timings["validate"] = time.perf_counter() - t
    if select is not None and validated and selection is None:
        selection = final_race([(v.rank, v.removed) for v in finalists_of(validated, select_options)])
    work["total_fpe"] = total_fpe(work, splits.calibration.shape[0], splits.validation.shape[0])
    if validated:
        best = min(validated, key=lambda v: (v.kl if math.isfinite(v.kl) else math.inf, v.rank or 0))
        if selection is not None:  # the race's choice
            best = next(v for v in validated if tuple(sorted(v.removed)) == selection.chosen)
        chosen_rank, chosen_blocks = best.rank, best.removed
    else:
        chosen_rank, chosen_blocks = candidates[0][0], candidates[0][1]

    t = time.perf_counter()
    pruned_model = prune_blocks(model, blocks, chosen_blocks)
    timings["prune"] = time.perf_counter() - t
    pruned_metrics = {}
    if measured:
        original_metrics["n_params"] = count_parameters(model)
        original_metrics["prunable_params"] = prunable_parameters(model)
        pruned_metrics = {**measured[tuple(sorted(chosen_blocks))], "n_params": count_parameters(pruned_model)}
    timings["total"] = time.perf_counter() - t_start

    return DepthReport(
        model_name=model_label,
        method=method,
        remove=remove,
        n_blocks=len(blocks),
        granularity=granularity,
        estimator=estimate.estimator if method == "cbo" else None,
        loss=estimate.loss if method == "cbo" else None,
        solver=(states.solver if states is not None else None),
        qubo=qubo,
        states=states,
        validation=validated,
        chosen_rank=chosen_rank,
        chosen_blocks=list(chosen_blocks),
        chosen_names=[blocks[i].name for i in chosen_blocks],
        pruned_model=pruned_model,
        tokenizer=tokenizer,
        original_metrics=original_metrics,
        pruned_metrics=pruned_metrics,
        timings=timings,
        work=work,
        data_info=dict(getattr(splits, "info", {}) or {}),
        options=options_json(
            data=data, estimate=estimate, search=replace(search, validate=validate), constraints=constraints, run=run
        ),
        selection=selection.to_json() if selection is not None else None,
    )


def check_refine(refine: Any, method: str, n_calibration: int) -> float | None:
    """The refine budget checked before any work: a positive FPE count (for the rounds after the estimate) that
    pays at least one round of :class:`cbo.search.options.RefineOptions`' defaults; ``"auto"`` (the default):
    ``DEFAULT_REFINE`` (at least one round) for method ``cbo``, none for a baseline. Once the blocks are known,
    ``prune_depth`` raises an ``"auto"`` budget to :func:`cbo.search.budget.scaled_budget` of the space."""
    from cbo.pipeline.options import DEFAULT_REFINE
    from cbo.search.options import check_budget

    if refine == AUTO:  # the default: refine CBO's QUBO, leave the baselines alone
        if method != "cbo":
            return None
        refine = max(DEFAULT_REFINE, RefineOptions().round_cost(max(int(n_calibration), 1), first=True))
    if refine is None:
        return None
    if method != "cbo":
        raise InvalidOptionError(f"refine applies to method='cbo' only, got method={method!r}; drop refine.")
    budget = check_budget(refine, "refine")
    opts = RefineOptions()
    n_pool = max(int(n_calibration), 1)
    one_round = opts.round_cost(n_pool, first=True)  # the first round pays its windows' original passes
    if budget < one_round:
        low, high = opts.windows(n_pool)
        raise InvalidOptionError(
            f"refine={refine!r} FPE cannot pay one round of refinement ({one_round:g} FPE with {n_calibration} "
            f"calibration windows: {opts.batch} sets on {low} windows, {opts.promote} on {high}); give "
            f"refine >= {one_round:g}."
        )
    return budget


def refine_qubo(
    model: Any,
    blocks: Sequence[Any],
    calibration: Any,
    prior: BlockQUBO,
    remove: int,
    search: Search,
    run: Run,
    cache: Path | None = None,
    prior_windows: int | None = None,
    options: RefineOptions | None = None,
) -> tuple[BlockQUBO, Any, dict[str, Any]]:
    """``prior`` refined with ``search.refine`` FPE of measurements on the calibration windows, through the one
    model-side entry point of the loop (:func:`cbo.search.refine.refine`). ``prior_windows``: the windows the prior
    was estimated on (charged per window; default: all the calibration windows). ``options``: the loop's
    :class:`RefineOptions` (default: its defaults; ``prune_depth``'s automatic budget gives
    :func:`cbo.search.budget.space_options`, a local search in a large space).

    Returns the refined QUBO, the ``RankedStates`` of the sets measured at high fidelity (lowest calibration KL
    first; these are the candidates to validate) and the work: the rounds' FPE, rounds, why it stopped. With a
    ``cache`` folder every round is checkpointed there, so an interrupted refinement resumes.
    """
    from cbo.data.windows import data_hash
    from cbo.model.fingerprint import model_fingerprint
    from cbo.progress import Incumbent, progress_bar
    from cbo.search.moves import SwapMoves
    from cbo.search.refine import refine
    from cbo.search.rounds import improving_rounds, neighbourhood, promotions

    t = time.perf_counter()
    budget = float(search.refine)
    checkpoint = None
    if cache is not None:
        key = f"{model_fingerprint(model)[:12]}-{data_hash(calibration)[:12]}-{blocks[0].kind}-M{remove}-s{run.seed}"
        checkpoint = Path(cache) / "refine" / f"{key}.json"
    bar = progress_bar(run.progress, total=int(budget), desc="refine", unit="FPE")
    incumbent = Incumbent()  # the postfix says which round found the best set and how many rounds improved it

    def report(info: dict[str, Any]) -> None:
        if bar is not None:
            bar.n = min(int(info["fpe"]), int(budget))
            fields = {"round": info["round"], **incumbent.update(info["round"], info["best"])}
            bar.set_postfix(fields, refresh=False)  # a dict keeps this order (keyword arguments are sorted)
            bar.refresh()

    prior_cost = float(prior.metadata.get("fpe") or 0.0) * int(prior_windows or calibration.shape[0])  # per window
    try:
        r = refine(
            model, blocks, calibration, None, remove, budget=budget, prior=prior, prior_cost=prior_cost,
            solver=search.solver, solver_options=search.solver_options, seed=run.seed, checkpoint=checkpoint,
            progress=report, options=options,
        )  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    used = RefineOptions.build(options)
    work = {
        "fpe": r.cost["rounds"],
        "budget": budget,
        # the proposal mix: shares of a batch from the trust region (swaps of the best `parents` sets) and from
        # posterior draws (the rest: the posterior mean's lowest states)
        "proposals": {"local": used.local, "thompson": used.thompson, "parents": used.local_parents},
        # promotions raced against the incumbent in `stages` steps (cbo.search.staged): how many stopped early
        "promotion": {"stages": used.stages, **promotions(r.rounds)},
        "rounds": len(r.rounds),
        "stopped": r.stopped,
        "improving_rounds": improving_rounds(r.rounds),  # later rounds that beat the incumbent
        # how much of the best set's one-swap neighbourhood the rounds measured (why no later round improved)
        "neighbourhood": neighbourhood(
            r.rounds, SwapMoves(prior.kinds, prior.constraints.keep + prior.constraints.force)
        ),
        "measured_sets": len(r.states),
        "best_calibration_kl": float(r.states.energies[0]),
        "prior_fpe": prior.metadata.get("fpe"),
        "wall_time": time.perf_counter() - t,
    }
    return r.qubo, r.states, work


def total_fpe(work: dict[str, Any], n_calibration: int, n_validation: int) -> float:
    """Everything ``work`` charged, in the one unit of a budget (one FPE: one full forward pass over one window).

    The estimate's and the validation's FPE count passes over all their windows (the estimate's: ``estimate_windows``
    when it used fewer than the calibration split); the refinement's rounds and the final selection count per window
    already.
    """
    total = float(work.get("estimate_fpe") or 0.0) * int(work.get("estimate_windows") or n_calibration)
    total += float((work.get("validation") or {}).get("fpe") or 0.0) * n_validation
    for key in ("refine", "selection"):
        total += float((work.get(key) or {}).get("fpe") or 0.0)
    return round(total, 2)


def estimate_and_solve(
    model: Any,
    tokenizer: Any,
    calibration: Any,
    blocks: Sequence[Any],
    remove: int,
    constraints: Constraints,
    estimate: Estimate,
    search: Search,
    run: Run,
    cache: Path | None,
    timings: dict[str, float],
) -> tuple[Any, Any]:
    """The QUBO of the calibration windows (cached), under ``constraints``, and its ``search.top_k`` ranked states
    with ``remove`` blocks removed; ``timings`` gets the seconds of the two steps."""
    from cbo.hessian import estimate_hessian
    from cbo.model.forward import torch_threads_kept
    from cbo.solvers import solve

    t = time.perf_counter()
    qubo = estimate_hessian(
        model,
        tokenizer,
        calibration,
        estimator=estimate.estimator,
        loss=estimate.loss,
        blocks=blocks,
        batch_size=run.batch_size,
        seed=run.seed,
        cache_dir=cache,
        progress=run.progress,
        **estimate.estimator_options,
    )
    timings["hessian"] = time.perf_counter() - t
    extra = {
        k: v for k, v in (("caps", dict(constraints.caps)), ("max_removed_params", constraints.max_removed_params)) if v
    }
    if constraints.keep or extra:
        qubo = qubo.with_constraints(keep=list(constraints.keep), **extra)
    t = time.perf_counter()
    with torch_threads_kept():
        states = solve(
            qubo, remove, search.solver, k=search.top_k, seed=run.seed, progress=run.progress, **search.solver_options
        )
    timings["solve"] = time.perf_counter() - t
    return qubo, states


@dataclass
class Validation:
    """Candidates measured on the validation windows.

    Attributes:
        states: the validated candidates, in the order given.
        original: the original model's metrics.
        metrics: the metrics of every measured set, by sorted block tuple.
        work: what the measurement cost (:class:`cbo.measure.measurer.Work`).
    """

    states: list[ValidatedState]
    original: dict[str, Any]
    metrics: dict[tuple[int, ...], dict[str, Any]]
    work: Any


def validate_candidates(
    model: Any,
    blocks: Sequence[Any],
    windows: Any,
    candidates: list[tuple[int | None, list[int], float | None]],
    validate: int,
    *,
    batch_size: int = 8,
    cache_dir: Path | None = None,
    progress: bool = False,
) -> Validation:
    """The first ``validate`` candidates ``(rank, removed, energy)`` measured on the validation windows through
    the measurer (no model copies); the first candidate is measured even when ``validate`` is 0 (it is the choice
    then). ``cache_dir`` keeps the measurements, so an interrupted or repeated validation measures only what is
    new."""
    from cbo.measure.measurer import MeasureCache, Measurer

    cache = MeasureCache(cache_dir, model, blocks) if cache_dir is not None else None
    measurer = Measurer(
        model, blocks, windows, batch_size=batch_size, cache=cache, retain=False, progress=progress, label="validation"
    )
    measured = candidates[: max(validate, 1)]
    out = measurer.losses([removed for _, removed, _ in measured])
    metrics = {key: out.metrics(k) for k, key in enumerate(out.sets)}
    states = []
    for (rank, removed, energy), key in zip(measured[:validate], out.sets):
        m = metrics[key]
        names = [blocks[i].name for i in removed]
        states.append(ValidatedState(rank, list(removed), names, energy, m["kl"], m["ppl"], m["agreement"]))
    return Validation(states, out.base_metrics(), metrics, measurer.work)
