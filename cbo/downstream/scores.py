"""What the standard suite's results add up to: each task's reported metric, the suite's average, and the paired
difference of two models on the same items.

The reported metric of each task is the one papers on structured pruning report (ARC-Challenge and HellaSwag
``acc_norm``, the others ``acc``; LAMBADA also reports perplexity). The average is the mean of the seven.

Example:
    >>> suite_average({"arc_easy": {"acc": 0.5}})          # not all seven tasks: no average
    >>> paired_difference({"piqa": {0: {"acc": 1.0}, 1: {"acc": 0.0}}},
    ...                   {"piqa": {0: {"acc": 0.0}, 1: {"acc": 0.0}}}, "piqa")[0]
    0.5
"""

from __future__ import annotations

from collections.abc import Mapping

from cbo.downstream.suite_data import ZEROSHOT_TASKS
from cbo.errors import DataError

REPORTED_METRIC: dict[str, str] = {task.name: task.metric for task in ZEROSHOT_TASKS}
REPORTED_METRIC.update({"mmlu": "acc", "arc_easy_validation": "acc", "arc_challenge_validation": "acc_norm"})


def reported(task: str) -> str:
    """The metric a task's figure is reported in (``acc`` for any task the suite does not name)."""
    return REPORTED_METRIC.get(task, "acc")


def suite_average(results: Mapping[str, Mapping[str, float]]) -> float | None:
    """Mean of the seven zero-shot tasks' reported metrics; None unless all seven are in ``results``."""
    return average(results, [task.name for task in ZEROSHOT_TASKS])


def average(results: Mapping[str, Mapping[str, float]], names: list[str]) -> float | None:
    """Mean of the reported metrics of ``names`` (tasks, or groups lm-eval aggregates such as ``mmlu``); None
    unless all of them are in ``results``."""
    if not names or not all(reported(n) in results.get(n, {}) for n in names):
        return None
    return sum(results[n][reported(n)] for n in names) / len(names)


def _pooled_contrast(terms, name: str):
    """Per-item ``sum(weight * score)`` of ``name``'s reported metric over the items every term's model was scored
    on (a group's subtasks pooled, as lm-eval's size-weighted mean pools them); ``terms``: ``(weight, scores)``."""
    import numpy as np

    from cbo.downstream.standard_tasks import expand

    metric = reported(name)
    parts = []
    for task in expand(name):
        ids = sorted(set.intersection(*(set(scores.get(task, {})) for _, scores in terms)))
        try:
            rows = [[float(scores[task][i][metric]) for i in ids] for _, scores in terms]
        except KeyError as exc:
            raise DataError(f"no per-item {metric} of {task} item {exc}; score both models on the same tasks") from exc
        parts.append(sum(w * np.asarray(r) for (w, _), r in zip(terms, rows)))
    diff = np.concatenate(parts) if parts else np.zeros(0)
    if not diff.size:
        raise DataError(f"no items of {name} scored for both models")
    return diff


def paired_contrast(
    terms: list[tuple[float, Mapping[str, Mapping[int, Mapping[str, float]]]]],
    task: str | list[str],
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``sum(weight * accuracy)`` over ``terms`` (``(weight, per-item scores)``) on the items all of them were scored
    on, with a paired bootstrap 95 % interval over items. ``[(1, a), (-1, b)]`` is ``a - b``;
    ``[(1, a2), (-1, b2), (-1, a1), (1, b1)]`` asks whether ``a``'s lead over ``b`` changed from one point to another.

    ``task`` is one task or group (a group's items pooled), ``"zeroshot"`` (the contrast of the seven tasks'
    average), or a list of tasks and groups (the contrast of their average): each bootstrap draw resamples the
    items of every one of them.
    """
    import numpy as np

    names = [t.name for t in ZEROSHOT_TASKS] if task == "zeroshot" else [task] if isinstance(task, str) else task
    rng = np.random.default_rng(seed)
    total, draws = 0.0, np.zeros(resamples)
    for name in names:
        diff = _pooled_contrast(terms, name)
        total += diff.mean() / len(names)
        draws += diff[rng.integers(0, diff.size, size=(resamples, diff.size))].mean(axis=1) / len(names)
    return float(total), float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975))


def paired_difference(
    a: Mapping[str, Mapping[int, Mapping[str, float]]],
    b: Mapping[str, Mapping[int, Mapping[str, float]]],
    task: str | list[str],
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Accuracy of ``a`` minus ``b`` over the items both were scored on, with a paired bootstrap 95 % interval over
    items (:func:`paired_contrast` of ``[(1, a), (-1, b)]``)."""
    return paired_contrast([(1.0, a), (-1.0, b)], task, resamples, seed)


__all__ = [
    "REPORTED_METRIC",
    "average",
    "paired_contrast",
    "paired_difference",
    "reported",
    "suite_average",
]
