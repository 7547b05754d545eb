"""The default pipeline (``prune_depth`` and ``cbo prune`` with no refine/select flags): refinement rounds after
the estimate, then a race of the validated states on fresh windows, both charged; off for the baselines and where
no fresh window can be cut; ``None`` / ``--no-refine --no-select`` give the validated path."""

from __future__ import annotations

import math

import pytest

from cbo.data.windows import TokenSplits
from cbo.errors import CBOError
from cbo.pipeline import prune_depth
from cbo.pipeline.options import AUTO, DEFAULT_REFINE, DEFAULT_SELECT, Search

SMALL = dict(seq_len=16, n_calibration=4, n_validation=4, solver="enumerate", progress=False, top_k=6, validate=6)


@pytest.fixture
def tokenizer():
    from tiny_tokenizers import byte_level_tokenizer

    return byte_level_tokenizer()


def test_the_default_refines_then_races_and_charges_both(tiny_model, novel_folder, tokenizer, tmp_path):
    assert Search().refine == AUTO and Search().select == AUTO
    model = tiny_model("llama", n_layers=6, seed=3, vocab_size=260)
    cache = tmp_path / "cache"
    report = prune_depth(model, tokenizer, novel_folder, remove=2, cache_dir=cache, **SMALL)
    search = report.options["search"]
    assert search["refine"] == DEFAULT_REFINE and search["select"] == DEFAULT_SELECT  # resolved, as used
    assert search["select_options"]["criterion"] == "ce"
    assert report.states.solver == "refine" and report.work["refine"]["budget"] == DEFAULT_REFINE
    assert report.selection is not None and report.selection["chosen"] == report.chosen_blocks
    work = report.work
    n_cal, n_val = 4, 4
    expected = work["estimate_fpe"] * n_cal + work["validation"]["fpe"] * n_val
    expected += work["refine"]["fpe"] + work["selection"]["fpe"]
    assert work["total_fpe"] == pytest.approx(expected, abs=0.01) and work["selection"]["fpe"] > 0
    assert work["refine"]["fpe"] > 0

    # the same as asking for both explicitly (a fresh measurement cache: charged the same)
    explicit = prune_depth(
        model, tokenizer, novel_folder, remove=2, cache_dir=tmp_path / "cache2", refine=DEFAULT_REFINE,
        select=DEFAULT_SELECT, **SMALL,
    )  # fmt: skip
    assert explicit.chosen_blocks == report.chosen_blocks
    assert explicit.selection["finalists"] == report.selection["finalists"]
    assert explicit.work["total_fpe"] == pytest.approx(work["total_fpe"])

    # refine=None, select=None: the validated path, the lowest validation KL chosen, only estimate + validation
    plain = prune_depth(model, tokenizer, novel_folder, remove=2, cache_dir=cache, refine=None, select=None, **SMALL)
    assert plain.selection is None and "refine" not in plain.work and "selection" not in plain.work
    assert plain.states.solver == "enumerate"
    best = min(plain.validation, key=lambda v: (v.kl if math.isfinite(v.kl) else math.inf, v.rank))
    assert plain.chosen_blocks == best.removed
    assert plain.options["search"]["refine"] is None and plain.options["search"]["select"] is None
    assert plain.work["total_fpe"] < work["total_fpe"]


def test_the_default_budget_follows_the_space_and_the_report_counts_improving_rounds(
    tiny_model, novel_folder, tokenizer, monkeypatch
):
    """ "auto" asks cbo.search.budget for the space's budget (candidates after the keep list, count removed); an
    explicit budget is used as given; the caption says how many later rounds improved the incumbent."""
    import cbo.pipeline.depth as depth
    from cbo.search.budget import scaled_budget

    asked = []

    def budget(n, k):
        asked.append((n, k))
        return 360.0

    monkeypatch.setattr(depth, "scaled_budget", budget)
    model = tiny_model("llama", n_layers=6, seed=3, vocab_size=260)
    report = prune_depth(model, tokenizer, novel_folder, remove=2, keep=[0], select=None, **SMALL)
    assert asked == [(5, 2)] and report.work["refine"]["budget"] == 360.0
    rounds, better = report.work["refine"]["rounds"], report.work["refine"]["improving_rounds"]
    assert all(2 <= r <= rounds for r in better) and better == sorted(set(better))
    assert f"{len(better)} of {rounds - 1} later rounds improved it" in report.table().caption
    around = report.work["refine"]["neighbourhood"]
    assert around["size"] == 2 * 3 and 0 <= around["high"] <= around["measured"] <= around["size"]
    assert f"{around['measured']} of its 6 one-swap neighbours measured" in report.table().caption
    asked.clear()
    explicit = prune_depth(model, tokenizer, novel_folder, remove=2, refine=320, select=None, **SMALL)
    assert asked == [] and explicit.work["refine"]["budget"] == 320
    assert scaled_budget(6, 2) == DEFAULT_REFINE and scaled_budget(60, 16) == 939  # 4/3 FPE per swap neighbour


def test_a_large_space_gets_a_cheap_prior_a_larger_budget_and_a_local_search(tiny_model, novel_folder, tokenizer):
    """16 of 32 sublayer halves (256 swap neighbours): the estimate runs on refine's one low-fidelity window and is
    charged for that window only; the budget is 4/3 FPE per neighbour; the rounds' proposals are mostly swaps of the
    incumbent alone, and the caption says so. An explicit budget keeps the full estimate and the default mix."""
    from cbo.search.budget import LOCAL_SEARCH, large_space, scaled_budget
    from cbo.search.options import RefineOptions

    model = tiny_model("llama", n_layers=16, seed=1, vocab_size=260)
    kw = dict(remove=16, granularity="sublayer", select=None, **{**SMALL, "validate": 2})
    assert large_space(32, 16) and scaled_budget(32, 16) == 342
    report = prune_depth(model, tokenizer, novel_folder, **kw)
    work = report.work
    assert work["estimate_windows"] == 1 and work["refine"]["budget"] == 342 and work["refine"]["fpe"] > 300
    expected = work["estimate_fpe"] * 1 + work["validation"]["fpe"] * 4 + work["refine"]["fpe"]
    assert work["total_fpe"] == pytest.approx(expected, abs=0.01)
    local = {"local": LOCAL_SEARCH["local"], "thompson": LOCAL_SEARCH["thompson"], "parents": 1}
    assert work["refine"]["proposals"] == local
    caption = report.table().caption
    assert "a local search: 85% of each round's proposals are swaps of the incumbent" in caption
    race = work["refine"]["promotion"]  # staged promotions: some stop behind the incumbent
    assert race["stages"] == 1 and race["finished"] >= 1
    tried = race["finished"] + race["dropped"]
    assert f"{race['dropped']} of {tried} promoted sets stopped early" in caption
    explicit = prune_depth(model, tokenizer, novel_folder, refine=300, **kw)
    assert explicit.work["estimate_windows"] == 4 and explicit.work["refine"]["budget"] == 300
    plain = RefineOptions()
    assert explicit.work["refine"]["proposals"] == {"local": plain.local, "thompson": plain.thompson, "parents": 3}
    assert "a local search" not in explicit.table().caption and "stopped early" not in explicit.table().caption
    assert explicit.work["refine"]["promotion"]["stages"] == 0 == explicit.work["refine"]["promotion"]["dropped"]
    assert explicit.work["estimate_fpe"] == pytest.approx(work["estimate_fpe"], rel=0.5)  # per window, alike


def test_in_a_large_space_refines_best_sets_race_first_and_only_the_chosen_one_is_validated(
    tiny_model, novel_folder, tokenizer, tmp_path
):
    """16 of 32 sublayer halves with the default race: its finalists are refine's best measured sets in order of
    calibration KL (no validation before it), and the validation windows measure the chosen set alone; the report
    charges the race and that one validation."""
    from cbo.search.selection import SelectionOptions

    model = tiny_model("llama", n_layers=16, seed=1, vocab_size=260)
    kw = dict(remove=16, granularity="sublayer", **{**SMALL, "validate": 4})
    report = prune_depth(model, tokenizer, novel_folder, cache_dir=tmp_path / "a", **kw)
    work, selection = report.work, report.selection
    assert work["selection"]["finalists_from"] == "refine" and selection["chosen"] == report.chosen_blocks
    best = [sorted(report.states.removed(k)) for k in range(4)]  # refine's measured sets, lowest calibration KL first
    raced = sorted((f["rank"], f["removed"]) for f in selection["finalists"])
    assert raced == [(k, best[k]) for k in range(min(4, SelectionOptions().finalists))]
    assert [v.removed for v in report.validation] == [report.chosen_blocks]  # the chosen set alone
    assert report.options["search"]["validate"] == 1
    assert "validation: original PPL" in report.table().caption  # the table renders with the one validated set
    expected = work["estimate_fpe"] * 1 + work["validation"]["fpe"] * 4 + work["refine"]["fpe"]
    assert work["total_fpe"] == pytest.approx(expected + work["selection"]["fpe"], abs=0.01)


def test_the_default_race_is_skipped_where_no_fresh_window_can_be_cut(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=5)
    splits = TokenSplits(*(tiny_windows(model, n=4, seq_len=16, seed=s) for s in (1, 2, 3)), {"source": "random"})
    report = prune_depth(model, None, remove=2, splits=splits, cache_dir=None, **SMALL)
    assert report.selection is None and report.options["search"]["select"] is None
    assert "precomputed" in report.work["selection"]["skipped"] or "tokenizer" in report.work["selection"]["skipped"]
    assert report.work["refine"]["fpe"] > 0  # refinement needs no fresh window: it still runs
    best = min(report.validation, key=lambda v: (v.kl if math.isfinite(v.kl) else math.inf, v.rank))
    assert report.chosen_blocks == best.removed
    # asked for explicitly, the same race is an error that says why and what to do
    with pytest.raises(CBOError, match="precomputed"):
        prune_depth(model, None, remove=2, splits=splits, cache_dir=None, select=40, refine=None, **SMALL)


def test_the_defaults_leave_baselines_and_single_validations_alone(tiny_model, novel_folder, tokenizer):
    model = tiny_model("llama", n_layers=5, vocab_size=260)
    sleb = prune_depth(model, tokenizer, novel_folder, remove=1, method="block_influence", cache_dir=None, **SMALL)
    assert sleb.selection is None and "refine" not in sleb.work and "selection" not in sleb.work
    assert sleb.options["search"]["refine"] is None and sleb.options["search"]["select"] is None
    one = prune_depth(
        model, tokenizer, novel_folder, remove=1, cache_dir=None, **{**SMALL, "validate": 1, "refine": None}
    )
    assert one.selection is None and one.options["search"]["select"] is None  # nothing to race


def test_cli_switches_refuse_a_value_with_its_off_flag():
    from cbo.cli.model_cmds import switch

    assert switch("--refine", None, False) == AUTO and switch("--refine", 200.0, False) == 200.0
    assert switch("--select", None, True) is None
    with pytest.raises(CBOError, match="--refine 200.0 and --no-refine"):
        switch("--refine", 200.0, True)
