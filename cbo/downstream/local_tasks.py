"""Downstream tasks made locally from the held-out novel of the default text, in lm-eval's own YAML format.

Nothing is downloaded: the items come from *Persuasion*, the test novel of the default splits, which no choice
of CBO ever sees (calibration is *Emma*, validation *Mansfield Park*). Two tasks, written to
``CBO_HOME/tasks/austen`` (a folder lm-eval reads with ``--include_path``; the tag ``austen`` runs both):

* ``austen_cloze`` -- LAMBADA-style last-word prediction (``loglikelihood``; accuracy of the greedy word and
  perplexity of the word). A passage of at least 50 words ends with a sentence whose last word is a content
  word that already occurs earlier in the passage, so the passage's context is needed to predict it.
* ``austen_choice`` -- multiple-choice continuation, like HellaSwag or StoryCloze (``multiple_choice``; acc and
  acc_norm): after two to four sentences, choose the sentence that follows among four, the other three being
  sentences of similar length from distant parts of the novel.

Generation is deterministic (sentence splitting, a fixed seed) and takes well under a second.

Example:
    >>> folder = ensure_local_tasks()                    # doctest: +SKIP
    >>> sorted(p.name for p in folder.glob("*.yaml"))    # doctest: +SKIP
    ['austen_choice.yaml', 'austen_cloze.yaml']
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

from cbo.data.assets import AUSTEN_ROLES, default_text_path
from cbo.errors import DataError
from cbo.model.loading import cbo_home, staged_folder

LOCAL_TAG = "austen"
CLOZE, CHOICE = "austen_cloze", "austen_choice"
LOCAL_TASKS = (CLOZE, CHOICE)
GENERATOR_VERSION = 1
MANIFEST = "cbo-tasks.json"

_ABBREVIATIONS = {"mr", "mrs", "dr", "st", "esq", "capt", "col", "gen", "lieut", "sir", "messrs", "no"}
_STOPWORDS = set(
    "the a an and or but of to in on at by for with from as that this these those it its is was were be been "
    "being am are has had have having do did does not no nor so than then there their them they he him his "
    "she her hers we us our you your i me my myself himself herself itself which who whom whose what when "
    "where why how all any each few more most other some such only own same too very can will just should "
    "would could might must shall may one two upon into about over again also ever never now here said say "
    "much well yet".split()
)
_WORD = re.compile(r"[A-Za-z]+")
_BOUNDARY = re.compile(r"([.!?])([\"'\u2019\u201d)]*)\s+(?=[\"'\u2018\u201c(]*[A-Z])")
_CHAPTER = re.compile(r"^\s*(chapter|volume)\b", re.IGNORECASE)


@dataclass(frozen=True)
class TaskSizes:
    """How many items each local task gets (fewer when the text has fewer candidates)."""

    cloze: int = 500
    choice: int = 500
    seed: int = 0


def local_tasks_dir() -> Path:
    """Where the local tasks live: ``CBO_HOME/tasks/austen``."""
    return cbo_home() / "tasks" / LOCAL_TAG


# ------------------------------------------------------------------------------------------ text


def chapters(text: str) -> list[list[str]]:
    """Paragraphs (whitespace collapsed) of each chapter; the headings, and the title page before the first
    heading, dropped."""
    out: list[list[str]] = [[]]
    headed = False
    for block in re.split(r"\n\s*\n", text):
        para = " ".join(block.split())
        if not para:
            continue
        if _CHAPTER.match(para) and len(para.split()) <= 4:
            if out[-1] or not headed:
                out.append([])
            headed = True
            continue
        out[-1].append(para)
    if headed:
        out = out[1:]
    return [c for c in out if c]


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of a paragraph: cut after ``.``/``!``/``?`` (and closing quotes) before a capital, except after
    a title such as ``Mr.``."""
    pieces, start = [], 0
    for match in _BOUNDARY.finditer(paragraph):
        before = paragraph[start : match.start()].split()
        last = before[-1].strip("\"'(").lower() if before else ""
        if match.group(1) == "." and (last in _ABBREVIATIONS or len(last) == 1):
            continue
        end = match.end(2)
        pieces.append(paragraph[start:end].strip())
        start = match.end()
    pieces.append(paragraph[start:].strip())
    return [p for p in pieces if p]


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _sentence_runs(text: str) -> list[list[str]]:
    """Sentences of each chapter, in order (passages never cross a chapter)."""
    return [[s for para in chapter for s in split_sentences(para)] for chapter in chapters(text)]


# ----------------------------------------------------------------------------------------- items


def _last_word(sentence: str) -> tuple[str, str] | None:
    """``(sentence without its last word, the word)`` when the sentence ends in a plain word and punctuation."""
    match = re.search(r"\s([A-Za-z]+)([.!?;,\"'\u2019\u201d)]*)$", sentence)
    if match is None:
        return None
    return sentence[: match.start()], match.group(1)


def cloze_items(
    text: str, n: int, seed: int = 0, *, min_context_words: int = 50, max_context_words: int = 200
) -> list[dict]:
    """LAMBADA-style items ``{"context", "target", "text"}``: the target is the passage's last word, a content
    word of three or more letters that already occurs in the context; the context is the shortest run of whole
    sentences (at least ``min_context_words``, at most ``max_context_words``) that contains it. Passages do not
    overlap."""
    candidates = []
    for sentences in _sentence_runs(text):
        free_from = 0
        sizes = [len(s.split()) for s in sentences]
        vocab = [set(_words(s)) for s in sentences]
        for i, sentence in enumerate(sentences):
            cut = _last_word(sentence)
            if cut is None or len(cut[1]) < 3 or cut[1].lower() in _STOPWORDS:
                continue
            head, word = cut
            start, found = i, None
            n_words, seen = len(head.split()), set(_words(head))
            while n_words <= max_context_words:
                if n_words >= min_context_words and word.lower() in seen:
                    found = " ".join([*sentences[start:i], head]).strip()
                    break
                if start == free_from:
                    break
                start -= 1
                n_words += sizes[start]
                seen |= vocab[start]
            if found is not None:
                candidates.append({"context": found, "target": word, "text": f"{found} {word}"})
                free_from = i + 1
    return _pick(candidates, n, seed)


def choice_items(text: str, n: int, seed: int = 0, *, n_choices: int = 4, min_context_words: int = 30) -> list[dict]:
    """Continuation items ``{"context", "choices", "label"}``: the sentence that follows two to four sentences,
    among sentences of similar length (within 25 %) from at least 50 sentences away. Items do not overlap."""
    runs = _sentence_runs(text)
    flat = [(c, k, s) for c, run in enumerate(runs) for k, s in enumerate(run)]
    position = {(c, k): idx for idx, (c, k, _) in enumerate(flat)}
    by_length: dict[int, list[int]] = {}
    for j, (_, _, sentence) in enumerate(flat):
        by_length.setdefault(len(sentence.split()), []).append(j)
    rng = random.Random(seed)
    candidates = []
    for c, run in enumerate(runs):
        i = 2
        while i < len(run):
            ending = run[i]
            n_words = len(ending.split())
            start = i - 2
            while start > 0 and i - start < 4 and len(" ".join(run[start:i]).split()) < min_context_words:
                start -= 1
            context = " ".join(run[start:i])
            if not 6 <= n_words <= 60 or len(context.split()) < min_context_words:
                i += 1
                continue
            here = position[(c, i)]
            near = range(math.ceil(0.75 * n_words), math.floor(1.25 * n_words) + 1)
            pool = sorted(j for k in near for j in by_length.get(k, ()) if abs(j - here) > 50 and flat[j][2] != ending)
            if len(pool) < n_choices - 1:
                i += 1
                continue
            choices = [ending] + [flat[j][2] for j in rng.sample(pool, n_choices - 1)]
            order = list(range(n_choices))
            rng.shuffle(order)
            candidates.append({"context": context, "choices": [choices[k] for k in order], "label": order.index(0)})
            i += 4  # the next item starts after this one's ending
    return _pick(candidates, n, seed)


def _pick(candidates: list[dict], n: int, seed: int) -> list[dict]:
    """``n`` candidates chosen at random (seeded), kept in text order."""
    if n >= len(candidates):
        return candidates
    chosen = sorted(random.Random(seed + 1).sample(range(len(candidates)), n))
    return [candidates[i] for i in chosen]


# ------------------------------------------------------------------------------------------ YAML


def _yaml(value: object, indent: int = 0) -> str:
    """YAML for nested dicts/lists of scalars; strings double-quoted (JSON escapes are YAML escapes)."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:\n{_yaml(item, indent + 2)}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            if isinstance(item, dict):
                body = _yaml(item, indent + 2)
                lines.append(f"{pad}- {body[indent + 2 :]}")
            else:
                lines.append(f"{pad}- {_scalar(item)}")
        return "\n".join(lines)
    return pad + _scalar(value)


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(str(value), ensure_ascii=False)


def task_configs(folder: Path, source: str) -> dict[str, dict]:
    """lm-eval task configs of the local tasks whose data files lie in ``folder``."""

    def data(name: str) -> dict:
        return {
            "dataset_path": "json",
            "dataset_kwargs": {
                "data_files": {"test": str(folder / f"{name}.jsonl")},
                "cache_dir": str(folder / ".datasets-cache"),
            },
            "test_split": "test",
        }

    meta = {"version": float(GENERATOR_VERSION), "source": source}

    def task(name: str, output_type: str, **fields: object) -> dict:
        head = {"task": name, "tag": [LOCAL_TAG], **data(name), "output_type": output_type}
        return {**head, "doc_to_text": "{{context}}", **fields, "metadata": meta}

    return {
        CLOZE: task(
            CLOZE,
            "loglikelihood",
            doc_to_target="{{' ' + target}}",
            metric_list=[
                {"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
                {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            ],
        ),
        CHOICE: task(
            CHOICE,
            "multiple_choice",
            doc_to_choice="{{choices}}",
            doc_to_target="{{label}}",
            metric_list=[
                {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
            ],
        ),
    }


# -------------------------------------------------------------------------------------- install
def _text_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _current(folder: Path, expected: dict) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return all(manifest.get(k) == v for k, v in expected.items()) and all(
        (folder / f"{name}.{ext}").is_file() for name in LOCAL_TASKS for ext in ("yaml", "jsonl")
    )


def installed_local_tasks(folder: str | Path | None = None) -> Path | None:
    """The folder of local tasks written earlier (by ``cbo setup`` or a first use), whatever text they were made
    from; None when they are missing, incomplete, or were written for another folder."""
    folder = Path(folder).expanduser() if folder is not None else local_tasks_dir()
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("version") != GENERATOR_VERSION or manifest.get("folder") != str(folder.resolve()):
        return None
    files = [folder / f"{name}.{ext}" for name in LOCAL_TASKS for ext in ("yaml", "jsonl")]
    return folder if all(f.is_file() for f in files) else None


def local_task_items(folder: str | Path | None = None) -> dict[str, int] | None:
    """``{task: items}`` of the local tasks written earlier; None when they are not written."""
    found = installed_local_tasks(folder)
    if found is None:
        return None
    manifest = json.loads((found / MANIFEST).read_text())
    return {name: int(manifest["items"][name]) for name in LOCAL_TASKS}


def ensure_local_tasks(
    folder: str | Path | None = None, *, text: str | Path | None = None, sizes: TaskSizes | None = None
) -> Path:
    """Write the local tasks (YAML + JSONL) from the held-out novel of the default text; returns their folder.

    Idempotent: a folder made from the same text, sizes and generator version is kept as it is.

    Args:
        folder: where to write (default ``CBO_HOME/tasks/austen``).
        text: the novel(s) to make items from: a text file or a folder whose held-out novel is used (default:
            the installed Austen folder, *Persuasion*).
        sizes: items per task and the seed.

    Raises:
        DataError: the default text is not installed, or the text yields no items.
    """
    sizes = sizes or TaskSizes()
    folder = Path(folder).expanduser() if folder is not None else local_tasks_dir()
    source = Path(text).expanduser() if text is not None else default_text_path()
    paths = [source] if source.is_file() else [source / f"{t}.txt" for t in AUSTEN_ROLES["test"]]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"cannot make the local tasks: {missing} not found")
    expected = {
        "version": GENERATOR_VERSION,
        "text_sha256": _text_digest(paths),
        "sizes": [sizes.cloze, sizes.choice, sizes.seed],
        "folder": str(folder.resolve()),
    }
    if _current(folder, expected):
        return folder
    raw = "\n\n".join(p.read_text(encoding="utf-8") for p in paths)
    items = {CLOZE: cloze_items(raw, sizes.cloze, sizes.seed), CHOICE: choice_items(raw, sizes.choice, sizes.seed)}
    empty = [name for name, rows in items.items() if not rows]
    if empty:
        raise DataError(f"the text {[p.name for p in paths]} yields no items for {empty}; give a longer text")
    source_note = f"CBO local task from {', '.join(p.name for p in paths)} (held out of every CBO choice)"
    configs = task_configs(folder.resolve(), source_note)
    with staged_folder(folder, "tasks") as staging:
        for name, rows in items.items():
            with (staging / f"{name}.jsonl").open("w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            (staging / f"{name}.yaml").write_text(_yaml(configs[name]) + "\n", encoding="utf-8")
        manifest = {**expected, "items": {name: len(rows) for name, rows in items.items()}, "source": source_note}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return folder


__all__ = [
    "CHOICE",
    "CLOZE",
    "LOCAL_TAG",
    "LOCAL_TASKS",
    "TaskSizes",
    "choice_items",
    "cloze_items",
    "ensure_local_tasks",
    "installed_local_tasks",
    "local_task_items",
    "local_tasks_dir",
    "split_sentences",
    "task_configs",
]
