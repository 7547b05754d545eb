"""Per-kind caps and a parameter budget from prune_depth and `cbo prune --max-kind/--budget-params`, checked before
any long work and respected by the chosen blocks."""

from __future__ import annotations

import json

import pytest
from tiny_models import CharTokenizer, build_tiny_model
from tiny_texts import synthetic_novel
from tiny_tokenizers import byte_level_tokenizer

from cbo.errors import CBOError, InfeasibleError
from cbo.model.blocks import find_blocks
from cbo.pipeline import prune_depth

TEXT = synthetic_novel(n_chapters=4).split("\n\n\n")
SMALL = dict(
    solver="enumerate",
    top_k=3,
    validate=2,
    n_calibration=2,
    n_validation=2,
    seq_len=16,
    cache_dir=None,
    refine=None,
    select=None,
)
SMALL |= dict(progress=False)


@pytest.fixture(scope="module")
def model():
    return build_tiny_model("llama", n_layers=4, vocab_size=259)


def test_caps_and_budget_bound_the_chosen_blocks(model):
    blocks = find_blocks(model, "sublayer")
    attn = blocks[0].n_params
    r = prune_depth(model, CharTokenizer(), TEXT, remove=3, granularity="sublayer", caps={"attention": 1}, **SMALL)
    kinds = [blocks[i].kind for i in r.chosen_blocks]
    assert kinds.count("attention") <= 1 and len(kinds) == 3
    assert all([blocks[i].kind for i in s.removed].count("attention") <= 1 for s in r.states)
    budget = 2 * attn + 1  # two attention halves fit; any pair with an MLP half does not
    assert blocks[1].n_params + attn > budget
    r = prune_depth(model, CharTokenizer(), TEXT, remove=2, granularity="sublayer", budget_params=budget, **SMALL)
    assert sum(blocks[i].n_params for i in r.chosen_blocks) <= budget
    assert [blocks[i].kind for i in r.chosen_blocks] == ["attention", "attention"]
    assert r.options["constraints"]["max_removed_params"] == budget


def test_bad_constraints_fail_before_any_work(model):
    with pytest.raises(InfeasibleError, match="mamba"):
        prune_depth(model, CharTokenizer(), TEXT, remove=2, caps={"mamba": 1}, **SMALL)
    with pytest.raises(InfeasibleError):  # two layers cannot fit in the parameters of less than one
        prune_depth(model, CharTokenizer(), TEXT, remove=2, budget_params=10, **SMALL)
    with pytest.raises(CBOError, match="baseline"):
        prune_depth(model, CharTokenizer(), TEXT, remove=2, method="block_influence", budget_params=10**9, **SMALL)


def test_cli_max_kind_and_budget(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))
    tokenizer = byte_level_tokenizer()
    model = build_tiny_model("llama", n_layers=4, vocab_size=len(tokenizer))
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    text = tmp_path / "text"
    text.mkdir()
    for k, doc in enumerate(TEXT):
        (text / f"doc{k}.txt").write_text(doc)
    register_commands()
    args = ["prune", str(folder), "--remove", "3", "--granularity", "sublayer", "--solver", "enumerate", "--top", "3"]
    args += ["--validate", "2", "--seq-len", "16", "--n-calibration", "2", "--n-validation", "2", "--no-cache"]
    args += ["--text", str(text), "-q"]
    res = CliRunner().invoke(app, [*args, "--max-kind", "attention=0", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert all(name.endswith(".mlp") for name in data["chosen"]["removed_names"])
    assert data["options"]["constraints"]["caps"] == {"attention": 0}
    res = CliRunner().invoke(app, [*args, "--max-kind", "attention"])
    assert res.exit_code == 2 and "KIND=N" in res.output
    res = CliRunner().invoke(app, [*args, "--max-kind", "mamba=1"])
    assert res.exit_code == 2 and "mamba" in res.output
