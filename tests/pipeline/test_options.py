"""The option groups of the pipelines: flat keywords and groups build the same options, once, at the entry point."""

from __future__ import annotations

import inspect
import json

import pytest

from cbo.data.windows import TokenSplits
from cbo.errors import InvalidOptionError
from cbo.pipeline import DEFAULT_ESTIMATOR, Data, DepthReport, Estimate, Run, Search, prune_depth
from cbo.pipeline.options import FIELDS, option_groups, upgrade_options


def test_flat_keywords_fill_the_groups():
    data, estimate, search, run = option_groups(
        {"seed": 3, "top_k": 5, "n_calibration": 8, "estimator": "fisher", "solver_options": None}, who="test"
    )
    assert (run.seed, search.top_k, data.n_calibration, estimate.estimator) == (3, 5, 8, "fisher")
    assert search.solver_options == {} and run.batch_size == Run().batch_size
    # a flat keyword replaces the given group's field; the group's other fields stay
    _, _, search, run = option_groups({"seed": 1}, who="test", run=Run(seed=9, batch_size=2), search=Search(top_k=7))
    assert (run.seed, run.batch_size, search.top_k) == (1, 2, 7)
    # an entry point's own defaults
    data, *_ = option_groups({}, who="test", defaults={"data": Data(n_test=32)})
    assert data.n_test == 32


def test_every_field_belongs_to_one_group():
    names = [f for cls in (Data, Estimate, Search, Run) for f in inspect.signature(cls).parameters]
    assert len(names) == len(set(names)) == len(FIELDS)
    assert Estimate().estimator == DEFAULT_ESTIMATOR


def test_unknown_and_unused_keywords_and_wrong_groups_are_refused():
    with pytest.raises(InvalidOptionError, match=r"no option\(s\) \['n_calibraton'\].*n_calibration"):
        option_groups({"n_calibraton": 4}, who="prune_depth")
    with pytest.raises(InvalidOptionError, match=r"compress has no option\(s\) \['top_k'\]"):
        option_groups({"top_k": 4}, who="compress", unused=("top_k",))
    with pytest.raises(InvalidOptionError, match="run= takes a Run"):
        option_groups({}, who="prune_depth", run={"seed": 1})


def test_prune_depth_takes_groups_or_flat_keywords_alike(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=5, seed=0)
    splits = TokenSplits(
        tiny_windows(model, n=3, seq_len=12, seed=1), tiny_windows(model, n=3, seq_len=12, seed=2), None, {}
    )
    flat = prune_depth(
        model, None, remove=2, splits=splits, estimator="fisher", solver="enumerate", top_k=4, validate=2, seed=1,
        batch_size=2, progress=False, cache_dir=None,
    )  # fmt: skip
    grouped = prune_depth(
        model, None, remove=2, data=Data(splits=splits), estimate=Estimate(estimator="fisher"),
        search=Search(solver="enumerate", top_k=4, validate=2), run=Run(seed=1, batch_size=2, progress=False,
        cache_dir=None),
    )  # fmt: skip
    assert flat.options == grouped.options and flat.chosen_blocks == grouped.chosen_blocks
    assert set(flat.options) == {"data", "estimate", "search", "constraints", "run"}
    assert flat.options["search"]["top_k"] == 4 and flat.options["run"]["seed"] == 1
    assert flat.options["data"]["splits"] == "given"
    again = DepthReport.from_json(json.loads(json.dumps(flat.to_json())))
    assert again.options == json.loads(json.dumps(flat.options))


def test_a_report_of_the_flat_options_reads_into_groups():
    old = {"top_k": 10, "validate": 5, "keep": [0], "caps": {}, "budget_params": None, "seed": 2, "batch_size": 8,
           "estimator_options": {}, "solver_options": {}, "requested_solver": "auto", "refine": None}  # fmt: skip
    new = upgrade_options(old)
    assert new["search"] == {"top_k": 10, "validate": 5, "solver_options": {}, "solver": "auto", "refine": None}
    assert new["constraints"] == {"keep": [0], "caps": {}, "max_removed_params": None}
    assert new["run"] == {"seed": 2, "batch_size": 8} and new["estimate"] == {"estimator_options": {}}
    assert upgrade_options(new) == new


def test_the_cli_defaults_use_the_one_default_estimator():
    from typer.main import get_command

    from cbo.cli import app, register_commands

    register_commands()
    commands = get_command(app).commands
    for name in ("prune", "hessian", "compress"):
        (param,) = [p for p in commands[name].params if p.name == "estimator"]
        assert param.default == DEFAULT_ESTIMATOR, name
    from cbo.pipeline.proposers import CBOProposer

    assert CBOProposer().estimator == DEFAULT_ESTIMATOR
