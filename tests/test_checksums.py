"""Saved records carry a checksum that loading compares (issue 38): an edited removal set in a ranked-states file, an
edited figure in report.json and a consistently edited cbo_removed_layers in a pruned config are refused, where they
loaded as true results; records without a checksum (older files) still load."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_models import CharTokenizer, build_tiny_model
from tiny_texts import synthetic_novel

from cbo.errors import CorruptFileError
from cbo.pipeline import prune_depth
from cbo.pipeline.reports import DepthReport
from cbo.qubo.instances import random_block_qubo
from cbo.qubo.states import RankedStates
from cbo.solvers import solve
from cbo.surgery.depth import remove_blocks
from cbo.surgery.io import load_pruned, save_pruned
from cbo.surgery.record import CONFIG_CHECKSUM_KEY


def test_an_edited_removal_set_in_a_states_file_is_refused(tmp_path):
    states = solve(random_block_qubo(8, seed=2), 3, "enumerate", 5, seed=0)
    path = states.save(tmp_path / "states.json")
    data = json.loads(path.read_text())
    assert RankedStates.load(path).removed(0) == states.removed(0)
    free = next(i for i in range(8) if i not in data["removed"][4] and i not in data["removed"][0])
    data["removed"][0] = [*data["removed"][0][:2], free]  # still 3 distinct blocks, energies still increasing
    if sorted(data["removed"][0]) in [sorted(r) for r in data["removed"][1:]]:
        pytest.skip("the edit happened to repeat a listed state")
    path.write_text(json.dumps(data))
    with pytest.raises(CorruptFileError, match="checksum does not match"):
        RankedStates.load(path)
    del data["sha256"]  # an older file, without a checksum: its other checks only
    path.write_text(json.dumps(data))
    assert RankedStates.load(path).exact


def test_an_edited_report_figure_is_refused(tmp_path):
    model = build_tiny_model("llama", n_layers=4, vocab_size=259)
    text = synthetic_novel(n_chapters=4).split("\n\n\n")
    small = dict(solver="enumerate", top_k=2, validate=2, n_calibration=2, n_validation=2, seq_len=16)
    report = prune_depth(model, CharTokenizer(), text, remove=1, cache_dir=None, refine=None, select=None, progress=False,
                         **small)  # fmt: skip
    folder = report.save_model(tmp_path / "pruned", progress=False)
    assert DepthReport.load(folder, with_model=False).chosen_blocks == report.chosen_blocks
    file = folder / "report.json"
    data = json.loads(file.read_text())
    data["timings_s"]["validate"] = 0.001  # a figure nothing else in the report cross-checks
    file.write_text(json.dumps(data))
    with pytest.raises(CorruptFileError, match="checksum does not match"):
        DepthReport.load(folder, with_model=False)


def test_a_consistently_edited_pruned_config_is_refused(tmp_path):
    model = build_tiny_model("llama", n_layers=4)
    folder = save_pruned(remove_blocks(model, [1]), tmp_path / "pruned")
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    assert config["cbo_removed_layers"] == [1] and config["cbo_original_layers"] == [0, 2, 3]
    loaded = load_pruned(folder)
    assert not hasattr(loaded.config, CONFIG_CHECKSUM_KEY)  # a later plain save_pretrained carries no stale one
    loaded.save_pretrained(tmp_path / "plain")
    assert CONFIG_CHECKSUM_KEY not in json.loads((tmp_path / "plain" / "config.json").read_text())
    config |= {"cbo_removed_layers": [2], "cbo_original_layers": [0, 1, 3]}  # agrees with itself: only the sum sees it
    config_file.write_text(json.dumps(config))
    with pytest.raises(CorruptFileError, match="edited after CBO saved it.*cbo_removed_layers"):
        load_pruned(folder)
    del config[CONFIG_CHECKSUM_KEY]  # the fix the message names, for a change made on purpose
    config_file.write_text(json.dumps(config))
    assert load_pruned(folder).config.cbo_removed_layers == [2]
    assert np.array_equal(json.loads(config_file.read_text())["cbo_original_layers"], [0, 1, 3])
