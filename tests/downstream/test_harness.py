"""The lm-eval adapter: its log-likelihoods equal cbo.evaluate's on the same windows; the local tasks run on a
tiny in-memory model and their metrics match a direct computation; nothing is printed when quiet; the model
and tokenizer come back unchanged; `cbo eval` prints result lines only with -q."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from tiny_texts import synthetic_novel
from tiny_tokenizers import byte_level_tokenizer

from cbo.data.windows import random_windows
from cbo.downstream.harness import evaluate_tasks, parse_tasks, task_manager, window_loglikelihoods
from cbo.downstream.local_tasks import CHOICE, CLOZE, TaskSizes, ensure_local_tasks
from cbo.errors import DataError, InvalidOptionError, UnknownNameError
from cbo.evaluate import evaluate

pytest.importorskip("lm_eval")


@pytest.fixture
def tiny_lm(tiny_model):
    """A tiny Llama over the byte-level tokenizer (long enough positions for the local tasks' contexts)."""
    tokenizer = byte_level_tokenizer()
    model = tiny_model("llama", n_layers=2, vocab_size=len(tokenizer), max_position_embeddings=2048)
    return model, tokenizer


@pytest.fixture
def local_tasks_home(cbo_home, tmp_path):
    """A CBO_HOME whose local tasks are made from a synthetic novel (no installed text needed)."""
    novel = tmp_path / "novel.txt"
    novel.write_text(synthetic_novel(), encoding="utf-8")
    ensure_local_tasks(text=novel, sizes=TaskSizes(cloze=6, choice=6))
    return cbo_home


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_window_loglikelihoods_equal_cbo_evaluate(tiny_model, arch):
    model = tiny_model(arch, n_layers=2, vocab_size=260)
    windows = random_windows(5, 24, 260, seed=3)
    lls = window_loglikelihoods(model, byte_level_tokenizer(), windows, batch_size=2)
    assert len(lls) == 5
    nll = evaluate(model, windows)["nll"]
    assert -sum(lls) / (5 * 23) == pytest.approx(nll, rel=1e-5)
    for k in range(5):  # per window too
        assert -lls[k] / 23 == pytest.approx(evaluate(model, windows[k : k + 1])["nll"], rel=1e-5)


def _loglikelihood(model, tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """log p(continuation | context) and whether it is the greedy continuation, computed directly."""
    whole = tokenizer(context + continuation)["input_ids"]
    n_ctx = len(tokenizer(context)["input_ids"])
    ids = torch.tensor([whole])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), dim=-1)[0]
    cont = whole[n_ctx:]
    rows = logp[n_ctx - 1 : len(whole) - 1]
    ll = float(rows.gather(-1, torch.tensor(cont)[:, None]).sum())
    return ll, bool((rows.argmax(-1) == torch.tensor(cont)).all())


def test_local_tasks_match_a_direct_computation(tiny_lm, local_tasks_home, capfd):
    model, tokenizer = tiny_lm
    pad_before = tokenizer.pad_token
    capfd.readouterr()
    results = evaluate_tasks(model, tokenizer, "austen_cloze,austen_choice", batch_size=4, progress=False)
    out = capfd.readouterr()
    assert out.out == "" and out.err == ""  # quiet: no bars, no logs, no git messages
    assert set(results) == {CLOZE, CHOICE}
    assert results[CLOZE]["n"] == 6 and results[CHOICE]["n"] == 6
    assert not model.training and tokenizer.pad_token == pad_before  # handed back unchanged

    folder = local_tasks_home / "tasks" / "austen"
    cloze = [json.loads(line) for line in (folder / "austen_cloze.jsonl").read_text().splitlines()]
    scored = [_loglikelihood(model, tokenizer, row["context"], " " + row["target"]) for row in cloze]
    assert results[CLOZE]["perplexity"] == pytest.approx(math.exp(-sum(ll for ll, _ in scored) / 6), rel=1e-4)
    assert results[CLOZE]["acc"] == pytest.approx(sum(g for _, g in scored) / 6)
    choice = [json.loads(line) for line in (folder / "austen_choice.jsonl").read_text().splitlines()]
    right = 0
    for row in choice:
        lls = [_loglikelihood(model, tokenizer, row["context"], " " + c)[0] for c in row["choices"]]
        right += int(max(range(len(lls)), key=lls.__getitem__) == row["label"])
    assert results[CHOICE]["acc"] == pytest.approx(right / 6)
    assert 0 <= results[CHOICE]["acc_norm"] <= 1 and results[CHOICE]["acc_stderr"] >= 0

    limited = evaluate_tasks(model, tokenizer, ["austen"], limit=2, progress=False)  # the tag runs both
    assert list(limited) == [CHOICE, CLOZE] and limited[CLOZE]["n"] == 2
    assert list(evaluate_tasks(model, tokenizer, [CHOICE, CLOZE], limit=1, progress=False)) == [CHOICE, CLOZE]


def test_bad_task_names_fail_before_the_model_runs(tiny_lm, local_tasks_home):
    model, tokenizer = tiny_lm
    with pytest.raises(DataError, match="no task names"):
        parse_tasks(" , ")
    assert parse_tasks("austen_cloze, austen_choice,austen_cloze") == [CLOZE, CHOICE]
    with pytest.raises(InvalidOptionError, match="batch_size"):
        evaluate_tasks(model, tokenizer, [CLOZE], batch_size=0)


@pytest.mark.slow
def test_unknown_task_is_named(local_tasks_home):
    with pytest.raises(UnknownNameError, match="no_such_task.*austen_cloze"):
        task_manager(["austen_cloze", "no_such_task"])


def test_local_tasks_are_made_on_first_use(tiny_lm, cbo_home, default_text):
    """With the default text installed, the local tasks are written to CBO_HOME when first named."""
    shutil.copytree(default_text, cbo_home / "text" / "austen")
    model, tokenizer = tiny_lm
    results = evaluate_tasks(model, tokenizer, [CLOZE], limit=3, progress=False)
    assert results[CLOZE]["n"] == 3 and (cbo_home / "tasks" / "austen" / "austen_cloze.yaml").is_file()


def test_cli_eval_quiet(tiny_lm, local_tasks_home, tmp_path):
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    model, tokenizer = tiny_lm
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    register_commands()
    out_json = tmp_path / "results.json"
    args = ["eval", str(tmp_path / "tiny"), "--tasks", "austen_cloze,austen_choice", "--limit", "3", "-q"]
    result = CliRunner().invoke(app, [*args, "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert [line.split()[:2] for line in lines] == [
        [CLOZE, "perplexity"],
        [CLOZE, "acc"],
        [CHOICE, "acc"],
        [CHOICE, "acc_norm"],
    ]
    assert all("(n=3 of 6)" in line for line in lines) and "it/s" not in result.output  # a seeded subset, stated
    saved = json.loads(out_json.read_text())
    assert saved["tasks"] == [CLOZE, CHOICE] and saved["results"][CLOZE]["n"] == 3
    assert saved["settings"]["limit"] == 3 and saved["settings"]["seed"] == 0  # what reproduces the run
    bad = CliRunner().invoke(app, ["eval", str(tmp_path / "tiny"), "--tasks", "austen_cloze", "--limit", "1.5"])
    assert bad.exit_code == 1 and "limit (--limit) must be a whole number" in bad.output and "1.5" in bad.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--limit", "nan"], "limit (--limit) must be a finite number > 0 or None, got nan"),
        (["--limit", "inf"], "limit (--limit) must be a finite number > 0 or None, got inf"),
        (["--num-fewshot", "-1"], "num_fewshot (--num-fewshot, examples per prompt) must be an integer >= 0"),
        (["--include-path", "MISSING-FOLDER"], "--include-path 'MISSING-FOLDER' is not a folder"),
    ],
)
def test_bad_eval_options_are_refused_before_the_model(args, words, monkeypatch):
    """Issue 27: `--limit nan` / `inf` crashed inside lm-eval, `--num-fewshot -1` was accepted and a missing
    `--include-path` ignored; each is refused, naming the option, before the model loads."""
    from typer.testing import CliRunner

    import cbo.model.loading
    from cbo.cli import app, register_commands

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(cbo.model.loading, "load_model", no_model)
    register_commands()
    res = CliRunner().invoke(app, ["eval", "unused-model", "--tasks", "austen_cloze", *args])
    assert res.exit_code == 1 and words in " ".join(res.output.split()), res.output
