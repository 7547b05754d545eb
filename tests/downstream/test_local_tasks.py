"""The local lm-eval tasks: sentence splitting, items that are what they claim (the cloze word occurs in its
context, the right continuation is the sentence that follows), deterministic files in lm-eval's YAML format that
lm-eval itself loads, regenerated only when the text changes."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from tiny_texts import synthetic_novel

from cbo.downstream.local_tasks import (
    CHOICE,
    CLOZE,
    LOCAL_TAG,
    LOCAL_TASKS,
    TaskSizes,
    choice_items,
    cloze_items,
    ensure_local_tasks,
    split_sentences,
)
from cbo.errors import DataError


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_split_sentences():
    text = 'Mr. Elliot came in. "Yes," said she, "it is so!" And Mrs. Clay left? Then A. B. went. "Oh!" She sat.'
    assert split_sentences(text) == [
        "Mr. Elliot came in.",
        '"Yes," said she, "it is so!"',
        "And Mrs. Clay left?",
        "Then A. B. went.",
        '"Oh!"',
        "She sat.",
    ]


def test_cloze_items_need_their_context():
    text = synthetic_novel()
    items = cloze_items(text, 10**6)
    assert len(items) > 20
    flat = _flat(text)
    last_end = -1
    for item in items:
        context, target = item["context"], item["target"]
        assert item["text"] == f"{context} {target}"
        assert re.fullmatch(r"[A-Za-z]{3,}", target)
        assert target.lower() in re.findall(r"[a-z]+", context.lower())  # the word occurs in the context
        assert 50 <= len(context.split()) <= 200
        where = flat.find(item["text"])
        assert where > last_end  # a passage of the text, after the previous one: passages do not overlap
        last_end = where + len(item["text"])
    assert cloze_items(text, 5, seed=3) == cloze_items(text, 5, seed=3) != cloze_items(text, 5, seed=4)
    assert len(cloze_items(text, 5)) == 5


def test_choice_items_hold_the_true_continuation():
    text = synthetic_novel()
    items = choice_items(text, 10**6)
    assert len(items) > 20
    flat = _flat(text)
    labels = set()
    for item in items:
        choices, label = item["choices"], item["label"]
        assert len(choices) == 4 and len(set(choices)) == 4
        assert f"{item['context']} {choices[label]}" in flat  # the right one is the sentence that follows
        wrong = [c for k, c in enumerate(choices) if k != label]
        assert all(f"{item['context']} {c}" not in flat for c in wrong)
        n = len(choices[label].split())
        assert all(abs(len(c.split()) - n) <= 0.25 * n for c in wrong)
        assert len(item["context"].split()) >= 30
        labels.add(label)
    assert labels == {0, 1, 2, 3}  # the answer's position is shuffled
    assert choice_items(text, 6, seed=1) == choice_items(text, 6, seed=1)


def test_files_in_lm_eval_format(tmp_path):
    novel = tmp_path / "novel.txt"
    novel.write_text(synthetic_novel(), encoding="utf-8")
    folder = ensure_local_tasks(tmp_path / "tasks", text=novel, sizes=TaskSizes(cloze=12, choice=10))
    assert sorted(p.name for p in folder.iterdir()) == [
        "austen_choice.jsonl",
        "austen_choice.yaml",
        "austen_cloze.jsonl",
        "austen_cloze.yaml",
        "cbo-tasks.json",
    ]
    cloze = yaml.safe_load((folder / "austen_cloze.yaml").read_text())
    assert cloze["task"] == CLOZE and cloze["tag"] == [LOCAL_TAG] and cloze["output_type"] == "loglikelihood"
    assert cloze["dataset_kwargs"]["data_files"]["test"] == str(folder.resolve() / "austen_cloze.jsonl")
    choice = yaml.safe_load((folder / "austen_choice.yaml").read_text())
    assert choice["output_type"] == "multiple_choice" and choice["doc_to_choice"] == "{{choices}}"
    rows = [json.loads(line) for line in (folder / "austen_cloze.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and rows == cloze_items(novel.read_text(), 12)
    manifest = json.loads((folder / "cbo-tasks.json").read_text())
    assert manifest["items"] == {CLOZE: 12, CHOICE: 10}

    assert _lm_eval_docs(folder) == [(r["context"], " " + r["target"]) for r in rows]  # lm-eval reads them

    # idempotent, and redone when the text changes (lm-eval then reads the new items, not a cached copy)
    stamp = (folder / "austen_cloze.jsonl").stat().st_mtime_ns
    assert ensure_local_tasks(tmp_path / "tasks", text=novel, sizes=TaskSizes(cloze=12, choice=10)) == folder
    assert (folder / "austen_cloze.jsonl").stat().st_mtime_ns == stamp
    novel.write_text(synthetic_novel(n_chapters=5), encoding="utf-8")
    ensure_local_tasks(tmp_path / "tasks", text=novel, sizes=TaskSizes(cloze=12, choice=10))
    assert json.loads((folder / "cbo-tasks.json").read_text())["text_sha256"] != manifest["text_sha256"]
    new_rows = cloze_items(novel.read_text(), 12)
    assert new_rows != rows
    assert _lm_eval_docs(folder) == [(r["context"], " " + r["target"]) for r in new_rows]


def _lm_eval_docs(folder):
    """``(prompt, target)`` of each document of the cloze task as lm-eval loads it."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(folder), include_defaults=False)
    assert set(LOCAL_TASKS) | {LOCAL_TAG} <= set(manager.all_tasks)
    task = next(iter(manager.load([CLOZE])["tasks"].values()))
    return [(task.doc_to_text(doc), task.doc_to_target(doc)) for doc in task.test_docs()]


def test_missing_or_short_text(tmp_path, cbo_home):
    with pytest.raises(DataError, match="make setup"):
        ensure_local_tasks()
    short = tmp_path / "short.txt"
    short.write_text("Chapter 1\n\nIt was a fine day. Anne walked out.\n")
    with pytest.raises(DataError, match="no items"):
        ensure_local_tasks(tmp_path / "t", text=short)
    with pytest.raises(DataError, match="not found"):
        ensure_local_tasks(tmp_path / "t", text=tmp_path / "missing_folder")


@pytest.mark.model
def test_tasks_from_the_default_text(default_text, tmp_path):
    folder = ensure_local_tasks(tmp_path / "tasks")
    manifest = json.loads((folder / "cbo-tasks.json").read_text())
    assert manifest["items"][CLOZE] > 200 and manifest["items"][CHOICE] == 500
    assert "persuasion" in manifest["source"]
    rows = [json.loads(line) for line in (folder / "austen_cloze.jsonl").read_text().splitlines()]
    persuasion = _flat((default_text / "persuasion.txt").read_text(encoding="utf-8"))
    assert all(row["text"] in persuasion for row in rows[:50])  # every item is held-out text
