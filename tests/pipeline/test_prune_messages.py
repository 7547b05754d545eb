"""prune_depth and `cbo prune` say what they do with options that cannot apply as given (issue 38): validate > top_k
validates fewer and says so, caps that are not a mapping are refused before the model loads, and --no-refine /
--no-select with --width are no refusal (width pruning has neither)."""

from __future__ import annotations

import pytest
from tiny_models import CharTokenizer, build_tiny_model
from tiny_texts import synthetic_novel
from typer.testing import CliRunner

from cbo.errors import InvalidOptionError
from cbo.pipeline import prune_depth

TEXT = synthetic_novel(n_chapters=4).split("\n\n\n")
SMALL = dict(solver="enumerate", n_calibration=2, n_validation=2, seq_len=16, cache_dir=None, refine=None)
SMALL |= dict(select=None, progress=False)


@pytest.fixture(scope="module")
def model():
    return build_tiny_model("llama", n_layers=4, vocab_size=259)


def test_validate_beyond_top_k_validates_fewer_and_says_so(model):
    with pytest.warns(UserWarning, match=r"validate=5 asks for more candidates than the top_k=2 ranked .*--top"):
        report = prune_depth(model, CharTokenizer(), TEXT, remove=1, top_k=2, validate=5, **SMALL)
    assert len(report.validation) == 2 and "validated_fewer" in report.work
    with pytest.warns(UserWarning, match=r"than the 4 possible removal sets; validating 4\.$"):
        prune_depth(model, CharTokenizer(), TEXT, remove=1, top_k=4, validate=5, **SMALL)


def test_caps_that_are_not_a_mapping_are_refused_before_the_model_loads(model):
    for bad in ([1], {"attention": "2"}, {"attention": -1}, {3: 1}):
        with pytest.raises(InvalidOptionError, match="caps"):
            prune_depth("no-such-model-is-loaded", CharTokenizer(), TEXT, remove=1, caps=bad, **SMALL)


def test_no_refine_and_no_select_are_accepted_with_width(monkeypatch):
    import cbo.cli.model_cmds as commands
    from cbo.cli import app, register_commands

    register_commands()
    calls = []
    monkeypatch.setattr(commands, "_prune_width", lambda *args: calls.append(args))
    for flags in (["--no-refine"], ["--no-select"], ["--no-refine", "--no-select"]):
        res = CliRunner().invoke(app, ["prune", "m", "--width", "taylor", "--ratio", "0.2", *flags])
        assert res.exit_code == 0, res.output
    assert len(calls) == 3
    res = CliRunner().invoke(app, ["prune", "m", "--width", "taylor", "--ratio", "0.2", "--refine", "100"])
    assert res.exit_code == 2 and "--refine refines a depth QUBO" in res.output
