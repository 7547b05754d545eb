"""Which items of each task an evaluation runs: all of them, or a seeded random subset of ``limit`` items.

lm-eval's own ``--limit`` takes the first items of a split, which are often not a fair sample (HellaSwag's
validation split is ordered by source). For the tasks whose item counts CBO knows (the standard suite and the
local tasks) a limit draws a seeded random subset instead, the same items for every model, and every result says
how many items of how many it used. For any other task lm-eval's first-``limit`` rule applies, and the result says
so.

Example:
    >>> plan = subset_plan(["arc_easy"], 200, seed=0)        # doctest: +SKIP
    >>> plan.describe("arc_easy")                            # doctest: +SKIP
    'a seeded subset of 200 of 2376 items'
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from cbo.downstream.local_tasks import LOCAL_TAG, LOCAL_TASKS, local_task_items
from cbo.downstream.standard_tasks import ensure_standard_tasks, expand, installed_standard_tasks, standard_names


def known_counts(names: Sequence[str]) -> dict[str, dict[str, int] | None]:
    """``{name: {task: items}}`` for each name whose tasks' counts CBO knows, ``None`` for the others. The suite's
    task folder is written first when it is missing or stale (its manifest holds the counts), so a standard task
    never passes for one of unknown size."""
    standard = set(standard_names())
    manifest = None
    if any(n in standard for n in names):
        ensure_standard_tasks()
        manifest = installed_standard_tasks()
    local = local_task_items() if any(n in LOCAL_TASKS or n == LOCAL_TAG for n in names) else None
    out: dict[str, dict[str, int] | None] = {}
    for name in names:
        if name in standard and manifest is not None:
            out[name] = {t: int(manifest["items"][t]) for t in expand(name)}
        elif local is not None and (name in LOCAL_TASKS or name == LOCAL_TAG):
            tasks = LOCAL_TASKS if name == LOCAL_TAG else (name,)
            out[name] = {t: local[t] for t in tasks}
        else:
            out[name] = None
    return out


@dataclass
class SubsetPlan:
    """The items each task runs on: ``samples`` (lm-eval's doc indices per task, for known tasks under a limit),
    ``totals`` (items in each known task's split), ``members`` (the tasks of each name given) and ``first`` (a
    limit lm-eval applies as first-N, for tasks of unknown size)."""

    limit: int | float | None
    samples: dict[str, list[int]] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    first: int | float | None = None

    def describe(self, name: str) -> str:
        """How many items ``name`` runs on, in words (for progress lines and tables)."""
        tasks = [t for t in self.totals if t == name or t in self.members.get(name, ())]
        if not tasks:
            return "all items" if self.limit is None else f"lm-eval's first {self.limit} items (size unknown)"
        total = sum(self.totals[t] for t in tasks)
        if not any(t in self.samples for t in tasks):
            return f"all {total} items"
        used = sum(len(self.samples[t]) for t in tasks)
        per = f" ({self.limit} per task)" if len(tasks) > 1 else ""
        return f"a seeded subset of {used} of {total} items{per}"


def _subset_size(limit: int | float, n: int) -> int:
    return min(n, int(limit) if limit >= 1 else max(1, math.ceil(limit * n)))


def subset_plan(names: Sequence[str], limit: int | float | None, seed: int = 0) -> SubsetPlan:
    """The items of each task under ``limit`` (items per task, or a fraction below 1): a random subset drawn with
    ``seed`` from the task's own stream (the same items whatever else runs), kept in the split's order."""
    plan = SubsetPlan(limit)
    for name, counts in known_counts(names).items():
        if counts is None:
            plan.first = limit
            continue
        plan.members[name] = tuple(counts)
        for task, n in counts.items():
            plan.totals[task] = n
            if limit is None:
                continue
            k = _subset_size(limit, n)
            if k < n:
                rng = random.Random(f"{seed}:{task}")
                plan.samples[task] = sorted(rng.sample(range(n), k))
    return plan


__all__ = ["SubsetPlan", "known_counts", "subset_plan"]
