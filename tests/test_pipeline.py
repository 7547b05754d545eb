"""prune_depth end to end on tiny models (and once on the real default model)."""

from __future__ import annotations

import json
import sys
import types
from importlib.machinery import ModuleSpec
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny_models import random_splits, save_word_model
from tiny_texts import word_texts

from cbo.errors import CBOError, InfeasibleError
from cbo.pipeline import DepthReport, prune_depth
from cbo.surgery.depth import remove_blocks

SOLVE = dict(solver="enumerate", progress=False, cache_dir=None, refine=None, select=None)  # the validated path


def _splits(model, tiny_windows, n_cal=4, n_val=4, seq_len=16):
    return random_splits(model, n_cal, n_val, seq_len)


def _kl_and_ppl(model, pruned, windows):
    """Independent measurement: mean KL(original || pruned) per position and perplexity."""
    with torch.no_grad():
        p = F.log_softmax(model(windows).logits.double(), -1)
        q = F.log_softmax(pruned(windows).logits.double(), -1)
    kl = float((p.exp() * (p - q)).sum(-1).mean())
    nll = float(F.nll_loss(q[:, :-1].reshape(-1, q.shape[-1]), windows[:, 1:].reshape(-1)))
    return kl, float(np.exp(nll))


def test_prune_depth_validates_the_top_states_and_returns_the_best_pruned_model(tiny_model, tiny_windows, tmp_path):
    model = tiny_model("llama", n_layers=6)
    splits = _splits(model, tiny_windows)
    report = prune_depth(model, None, splits=splits, remove=2, top_k=6, validate=4, **SOLVE)
    assert isinstance(report, DepthReport)
    assert len(report.states) == 6 and report.states.remove == 2
    assert [v.rank for v in report.validation] == [0, 1, 2, 3]
    for v in report.validation:  # validation numbers equal an independent measurement on the surgically pruned model
        kl, ppl = _kl_and_ppl(model, remove_blocks(model, v.removed), splits.validation)
        assert v.kl == pytest.approx(kl, rel=1e-4, abs=1e-7)
        assert v.ppl == pytest.approx(ppl, rel=1e-4)
        assert v.removed == report.states.removed(v.rank)
    best = min(report.validation, key=lambda v: v.kl)
    assert report.chosen_rank == best.rank and report.chosen_blocks == best.removed
    assert report.pruned_metrics["ppl"] == pytest.approx(_kl_and_ppl(model, report.pruned_model, splits.validation)[1])
    assert report.chosen_names == [f"layers.{i}" for i in best.removed]
    pruned = report.pruned_model
    assert pruned is not model and pruned.config.num_hidden_layers == 4
    assert len(model.model.layers) == 6  # the original is untouched
    assert report.pruned_metrics["kl"] == pytest.approx(best.kl)
    assert report.original_metrics["kl"] == pytest.approx(0.0, abs=1e-6)
    assert report.pruned_metrics["n_params"] < report.original_metrics["n_params"]
    assert report.qubo.metadata["estimator"] == "singles" and report.qubo.metadata["loss"] == "kl"  # the default
    assert {"hessian", "solve", "validate", "prune", "total"} <= set(report.timings)

    data = json.loads(json.dumps(report.to_json()))
    assert data["chosen"]["removed"] == best.removed and len(data["validation"]) == 4
    out = report.save_model(tmp_path / "out")
    assert (out / "report.json").exists() and (out / "qubo.cboq").exists() and (out / "config.json").exists()
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(splits.test).logits, pruned(splits.test).logits)


def test_validation_copies_no_model_and_only_the_choice_is_removed(tiny_model, tiny_windows, monkeypatch):
    import copy

    from cbo.surgery import depth as surgery

    model = tiny_model("llama", n_layers=5)
    copies, removals = [], []
    real_copy, real_remove = copy.deepcopy, surgery.remove_blocks
    monkeypatch.setattr(copy, "deepcopy", lambda obj, *a: (copies.append(type(obj).__name__), real_copy(obj, *a))[1])
    monkeypatch.setattr(
        surgery, "remove_blocks", lambda m, b, **kw: (removals.append(list(b)), real_remove(m, b, **kw))[1]
    )
    report = prune_depth(model, None, splits=_splits(model, tiny_windows), remove=2, top_k=5, validate=5, **SOLVE)
    assert len(report.validation) == 5
    assert removals == [report.chosen_blocks]  # one surgery: the chosen state's
    assert copies.count(type(model).__name__) == 1
    # the work: one original pass over the validation windows, then the states from the recorded streams
    work = report.work["validation"]
    assert work["original_passes"] == 1 and work["full_passes"] == 0 and work["sets"] == 5
    assert 1 < work["fpe"] < 1 + 5
    assert report.work["estimate_fpe"] == report.qubo.metadata["fpe"]
    # the total in the one unit of a budget (one forward over one window): the pool-relative figures scaled
    per_window = report.qubo.metadata["fpe"] * 4 + work["fpe"] * 4  # _splits: 4 calibration, 4 validation windows
    assert report.work["total_fpe"] == pytest.approx(per_window, abs=0.02) and report.work["total_fpe"] > 4


def test_sublayer_validation_equals_the_surgically_pruned_models(tiny_model, tiny_windows):
    from cbo.model.blocks import find_blocks
    from cbo.surgery.depth import remove_sublayers

    model = tiny_model("qwen2", n_layers=3)
    splits = _splits(model, tiny_windows)
    report = prune_depth(model, None, splits=splits, remove=2, granularity="sublayer", top_k=4, validate=4, **SOLVE)
    blocks = find_blocks(model, "sublayer")
    for v in report.validation:
        kl, ppl = _kl_and_ppl(model, remove_sublayers(model, [blocks[i] for i in v.removed]), splits.validation)
        assert v.kl == pytest.approx(kl, rel=1e-4, abs=1e-7) and v.ppl == pytest.approx(ppl, rel=1e-4)


def test_report_save_load_round_trip(tiny_model, tiny_windows, tmp_path):
    from cbo.errors import CorruptFileError

    model = tiny_model("llama", n_layers=4)
    splits = _splits(model, tiny_windows)
    report = prune_depth(model, None, splits=splits, remove=1, keep=[0], top_k=3, validate=2, **SOLVE)
    again = DepthReport.load(report.save(tmp_path / "r.json"))
    assert again.to_json() == report.to_json() and again.pruned_model is None
    assert again.qubo.constraints.keep == (0,)
    folder = report.save_model(tmp_path / "out")
    loaded = DepthReport.load(folder)
    assert loaded.to_json() == report.to_json()
    with torch.no_grad():
        torch.testing.assert_close(loaded.pruned_model(splits.test).logits, report.pruned_model(splits.test).logits)
    (tmp_path / "bad.json").write_text('{"format": "cbo.other"}')
    with pytest.raises(CorruptFileError, match="not a DepthReport"):
        DepthReport.load(tmp_path / "bad.json")
    with pytest.raises(CBOError, match="holds no model"):
        again.save_model(tmp_path / "nothing")


def test_edited_pruned_folders_are_refused_naming_the_field(tiny_model, tiny_windows, tmp_path):
    """Issue 27: a report, config or weights edited so that they disagree load as CorruptFileError naming the field
    (they loaded silently: the report's removed blocks against the model's config, an original_layers list of the
    wrong length, a layer count the weights do not fill)."""
    import json
    import shutil

    from cbo.errors import CorruptFileError
    from cbo.surgery.io import load_pruned

    model = tiny_model("llama", n_layers=4)
    report = prune_depth(model, None, splits=_splits(model, tiny_windows), remove=1, top_k=2, validate=2, **SOLVE)
    good = report.save_model(tmp_path / "good")
    DepthReport.load(good)  # the unedited folder loads

    def edited(name: str, file: str, change) -> Path:
        folder = tmp_path / name
        shutil.copytree(good, folder)
        data = json.loads((folder / file).read_text())
        change(data)
        (folder / file).write_text(json.dumps(data))
        return folder

    other = next(i for i in range(1, 4) if i not in report.chosen_blocks)

    def other_block(d):
        d["chosen"]["removed"] = [other]
        d["chosen"]["removed_names"] = [f"layers.{other}"]

    cases = [
        ("report", "report.json", other_block, "disagree.*removes the layers \\[" + str(other)),
        ("names", "report.json", lambda d: d["chosen"].update(removed=[other]), "removed_names"),
        ("range", "report.json", lambda d: d["chosen"].update(removed=[9]), "chosen.removed \\[9\\]"),
        ("original", "config.json", lambda d: d.update(cbo_original_layers=[0, 1]), "cbo_original_layers lists 2"),
        ("removed", "config.json", lambda d: d.update(cbo_removed_layers=[0]), "cbo_removed_layers \\[0\\]"),
        ("widths", "config.json", lambda d: d.update(num_hidden_layers=2, cbo_original_layers=[0, 1],
                                                    cbo_removed_layers=[2, 3]), "cbo_layer_widths lists 3"),
        ("layers", "config.json", lambda d: d.update(num_hidden_layers=2, cbo_original_layers=[0, 1],
                                                    cbo_removed_layers=[2, 3], cbo_layer_widths=None),
         "weights .* do not fit"),
    ]  # fmt: skip
    for name, file, change, match in cases:
        with pytest.raises(CorruptFileError, match=match):
            DepthReport.load(edited(name, file, change))
    with pytest.raises(CorruptFileError, match="cbo_original_layers"):
        load_pruned(tmp_path / "original")  # what `cbo widths` loads


def test_validate_zero_chooses_the_ground_state(tiny_model, tiny_windows):
    model = tiny_model("qwen2", n_layers=5)
    report = prune_depth(model, None, splits=_splits(model, tiny_windows), remove=2, top_k=3, validate=0, **SOLVE)
    assert report.validation == []
    assert report.chosen_rank == 0 and report.chosen_blocks == report.states.removed(0)
    assert report.pruned_metrics["kl"] > 0  # the chosen model is still evaluated


def test_keep_is_respected_and_names_work(tiny_model, tiny_windows):
    model = tiny_model("gpt2", n_layers=5)
    splits = _splits(model, tiny_windows)
    report = prune_depth(model, None, splits=splits, remove=3, keep=[0, "layers.4"], top_k=4, validate=2, **SOLVE)
    assert report.options["constraints"]["keep"] == [0, 4]
    for s in report.states:
        assert not {0, 4} & set(s.removed)
    assert report.chosen_blocks == [1, 2, 3]


def test_sublayer_granularity_removes_halves(tiny_model, tiny_windows):
    model = tiny_model("gemma3", n_layers=3)
    report = prune_depth(
        model, None, splits=_splits(model, tiny_windows), remove=2, granularity="sublayer", top_k=3, validate=2, **SOLVE
    )
    assert report.n_blocks == 6 and len(report.chosen_names) == 2
    assert all(n.endswith((".attn", ".mlp")) for n in report.chosen_names)
    assert report.pruned_metrics["n_params"] < report.original_metrics["n_params"]


def test_pipeline_from_text_with_a_tokenizer_and_the_hessian_cache(tiny_model, char_tokenizer, tmp_path):
    model = tiny_model("llama", n_layers=4, vocab_size=len(char_tokenizer))
    words = "the of and to a in that it was her his she he you not be had for with as".split()
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(words, 400)) for _ in range(4)]
    kw = dict(remove=1, top_k=3, validate=2, n_calibration=3, n_validation=3, seq_len=24, solver="enumerate")
    first = prune_depth(model, char_tokenizer, docs, cache_dir=tmp_path, progress=False, **kw)
    assert len(list(tmp_path.glob("*.cboq"))) == 1
    again = prune_depth(model, char_tokenizer, docs, cache_dir=tmp_path, progress=False, **kw)
    np.testing.assert_array_equal(again.qubo.H, first.qubo.H)
    assert again.chosen_blocks == first.chosen_blocks
    assert first.data_info["windows"]["calibration"] == 3


def test_bad_requests_are_refused(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=4)
    splits = _splits(model, tiny_windows)
    for remove, keep in ((0, None), (4, None), (-1, None), (3, [0, 1])):
        with pytest.raises(InfeasibleError, match=f"remove={remove} is out of range"):
            prune_depth(model, None, splits=splits, remove=remove, keep=keep, **SOLVE)
    with pytest.raises(InfeasibleError, match="out of range"):
        prune_depth(model, None, splits=splits, remove=1, keep=[7], **SOLVE)
    # one rule, one message whatever the size of the mistake (issue 27: "use 1..3" for 4, "M must be in 0..4"
    # for 30, and "M must be in 0..0" then M = 0 refused with every block kept)
    for remove in (4, 30):
        with pytest.raises(InfeasibleError, match=f"remove={remove} is out of range: the model has 4 blocks; use 1..3"):
            prune_depth(model, None, splits=splits, remove=remove, **SOLVE)
    with pytest.raises(InfeasibleError, match="4 blocks, 2 of them kept; use 1..2"):
        prune_depth(model, None, splits=splits, remove=3, keep=[0, 1], **SOLVE)
    with pytest.raises(InfeasibleError, match="nothing can be removed: the model has 4 blocks, 4 of them kept"):
        prune_depth(model, None, splits=splits, remove=1, keep=[0, 1, 2, 3], **SOLVE)
    with pytest.raises(CBOError, match=r"unknown method 'magic'; valid methods: \['cbo'"):
        prune_depth(model, None, splits=splits, remove=1, method="magic", **SOLVE)
    with pytest.raises(CBOError, match="validate must be"):
        prune_depth(model, None, splits=splits, remove=1, validate=-1, **SOLVE)
    from cbo.errors import InvalidOptionError, UnknownNameError

    with pytest.raises(UnknownNameError, match="unknown estimator 'newton'"):
        prune_depth(model, None, splits=splits, remove=1, estimator="newton", **SOLVE)
    with pytest.raises(InvalidOptionError, match="no option"):
        prune_depth(model, None, splits=splits, remove=1, estimator_options={"lables": 1}, **SOLVE)
    with pytest.raises(UnknownNameError, match="unknown solver 'magic'"):
        prune_depth(model, None, splits=splits, remove=1, **{**SOLVE, "solver": "magic"})
    with pytest.raises(CBOError, match="prune_depth needs a tokenizer"):
        prune_depth(model, None, remove=1, **SOLVE)


def test_other_methods_dispatch_to_the_baselines_module(tiny_model, tiny_windows, monkeypatch):
    calls = []
    fake = types.ModuleType("cbo.baselines")
    fake.__spec__ = ModuleSpec("cbo.baselines", None)
    fake.methods = lambda: ["block_influence"]

    def select_blocks(method, model, splits, remove, *, granularity, keep, batch_size, progress):
        calls.append((method, remove, granularity, keep))
        return [3, 1]

    fake.select_blocks = select_blocks
    monkeypatch.setitem(sys.modules, "cbo.baselines", fake)
    model = tiny_model("llama", n_layers=5)
    report = prune_depth(
        model, None, splits=_splits(model, tiny_windows), remove=2, method="block_influence", keep=[0], **SOLVE
    )
    assert calls == [("block_influence", 2, "layer", [0])]
    assert report.chosen_blocks == [1, 3] and report.qubo is None and report.states is None
    assert report.validation[0].rank is None and report.pruned_model.config.num_hidden_layers == 3
    from rich.console import Console

    console = Console(record=True, width=160)
    report.print(console)
    assert "block_influence" in console.export_text()


def test_report_table_marks_the_choice(tiny_model, tiny_windows):
    from rich.console import Console

    model = tiny_model("llama", n_layers=4)
    report = prune_depth(model, None, splits=_splits(model, tiny_windows), remove=1, top_k=4, validate=2, **SOLVE)
    console = Console(record=True, width=160)
    report.print(console)
    text = console.export_text()
    assert "chosen" in text and "val KL" in text and "rank" in text
    assert "remove 1 of 4" in text
    assert "DepthReport(" in repr(report)


@pytest.mark.model
def test_prune_depth_on_the_default_model(default_model, default_text, tmp_path):
    model, tokenizer = default_model
    report = prune_depth(
        model,
        tokenizer,
        default_text,
        remove=4,
        top_k=3,
        validate=2,
        n_calibration=4,
        n_validation=4,
        seq_len=64,
        solver="enumerate",
        cache_dir=tmp_path,
        progress=False,
        refine=None,  # the default refine and race on this model: tests/test_readme.py's Python example
        select=None,
    )
    assert report.n_blocks == 30
    assert report.pruned_model.config.num_hidden_layers == 26
    assert len(report.pruned_model.model.layers) == 26
    assert np.isfinite(report.pruned_metrics["kl"]) and report.pruned_metrics["kl"] > 0
    assert all(np.isfinite(v.kl) for v in report.validation)
    assert report.qubo.metadata["n_tokens"] == 4 * 64
    assert model.config.num_hidden_layers == 30  # the caller's model is untouched


# ------------------------------------------------------------------------------------------------ CLI
def _model_folder(tmp_path):
    """A tiny Llama with a word-level Hugging Face tokenizer, saved as a model folder, and a text folder."""
    save_word_model(tmp_path / "tiny-model", n_layers=4)
    return tmp_path / "tiny-model", word_texts(tmp_path / "text", 300)


def test_cli_hessian_and_prune(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands
    from cbo.qubo.block_qubo import BlockQUBO

    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))
    register_commands()
    folder, text = _model_folder(tmp_path)
    runner = CliRunner()
    small = ["--text", str(text), "--seq-len", "16", "--n-calibration", "3"]
    qfile = tmp_path / "q.cboq"
    hessian = ["hessian", str(folder), "-o", str(qfile), "--estimator", "fisher", "--option", "labels=empirical"]
    res = runner.invoke(app, [*hessian, "-q", *small])
    assert res.exit_code == 0, res.output
    q = BlockQUBO.load(qfile)
    assert q.n == 4 and q.metadata["options"]["labels"] == "empirical" and "wrote" in res.output

    out = tmp_path / "pruned"
    args = ["prune", str(folder), "--remove", "2", "--top", "4", "--validate", "2", "--solver", "enumerate"]
    res = runner.invoke(app, [*args, "--keep", "0", "--n-validation", "3", "--out", str(out), "-q", *small])
    assert res.exit_code == 0, res.output
    assert "chosen" in res.output and "val KL" in res.output
    report = json.loads((out / "report.json").read_text())
    assert report["remove"] == 2 and 0 not in report["chosen"]["removed"]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 2

    plots = tmp_path / "plots"
    res = runner.invoke(app, [*args, "--n-validation", "3", "--plots", str(plots), "-q", *small])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in plots.glob("*.png"))
    assert names == ["couplings.png", "energy_vs_kl.png", "hamming.png", "removal_map.png", "spectrum.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots.glob("*.png"))
    res = runner.invoke(app, [*args, "--method", "block_influence", "--plots", str(plots), "-q", *small])
    assert res.exit_code == 2 and "--plots needs the CBO method" in " ".join(res.output.split())

    res = runner.invoke(app, [*args, "--n-validation", "3", "--json", "-q", *small])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["format"] == "cbo.depthreport"

    res = runner.invoke(app, [*args, "--remove", "9", "-q", *small])
    assert res.exit_code == 2 and "remove=9 is out of range" in " ".join(res.output.split())
    res = runner.invoke(app, ["prune", str(tmp_path / "missing"), "-q"])
    assert res.exit_code == 2 and "does not exist" in " ".join(res.output.split())
