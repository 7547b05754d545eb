"""compress(): one-shot and MoP end to end on a tiny model, the report, saving, bad input."""

from __future__ import annotations

import io
import json

import pytest
import torch
from rich.console import Console
from tiny_models import CharTokenizer, build_tiny_model

from cbo.errors import CBOError, CorruptFileError, DataError, InfeasibleError, InvalidOptionError, UnknownNameError
from cbo.evaluate import count_parameters
from cbo.pipeline.compression import CompressionReport, compress
from cbo.surgery.io import load_pruned

TEXT = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife. "
    * 12,
    "However little known the feelings or views of such a man may be on his first entering a neighbourhood. " * 12,
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to unite. " * 12,
]
SMALL = dict(
    seq_len=24, n_calibration=6, n_validation=3, n_test=3, speed_options=dict(prompt_len=8, new_tokens=2, repeats=1)
)


@pytest.fixture(scope="module")
def model():
    return build_tiny_model("llama", n_layers=6, vocab_size=260)


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(width="afr", depth="antepenultimate", depth_share=0.5),
        dict(width="amp", select_calibration=2, gqa="query"),
        dict(scheduler="mop", criterion="kl"),
    ],
)
def test_compress_reports_and_saves(model, kw, tmp_path):
    before = count_parameters(model)
    r = compress(model, CharTokenizer(), TEXT, ratio=0.3, out=tmp_path / "m", **SMALL, **kw)
    assert count_parameters(model) == before  # the input model is not modified
    assert r.params_before == before and r.params_after == count_parameters(r.model)
    layer = before / 8  # about one layer's parameters (6 layers + embeddings)
    assert abs((r.params_before - r.params_after) - r.target_params) <= layer
    assert r.after["ppl"] > 0 and r.after["kl"] >= 0 and 0 <= r.after["agreement"] <= 1
    assert r.before["kl"] == 0.0 and r.speed_before and r.speed_after and r.speedup("decode") > 0
    assert len(r.widths) == 6 - len(r.removed_layers)
    if kw.get("depth") == "antepenultimate":
        assert r.removed_layers and max(r.removed_layers) == 3  # the layer just before the last two
    if kw.get("select_calibration"):
        assert r.calibration["index"] in (0, 1) and len(r.calibration["kl"]) == 2
    if kw.get("scheduler") == "mop":
        assert r.path and "MoP path" in r.summary()
    saved = json.loads((tmp_path / "m" / "report.json").read_text())
    assert saved["params_after"] == r.params_after and saved["settings"]["ratio"] == 0.3
    if not kw:  # the one-shot default is the best score measured on the default model (BENCHMARKS.md)
        assert saved["settings"]["width"] == "taylor"
    x = torch.randint(0, 260, (1, 10))
    assert torch.equal(load_pruned(tmp_path / "m")(input_ids=x).logits, r.model(input_ids=x).logits)
    assert "held-out ppl" in r.summary()
    loaded = CompressionReport.load(tmp_path / "m" / "report.json")  # the JSON alone rebuilds the report
    assert "sha256" in saved  # report.json carries a checksum of its content, compared on load
    unsigned = {k: v for k, v in saved.items() if k != "sha256"}
    assert loaded.model is None and loaded.to_json() == unsigned == r.to_json()
    console = Console(file=io.StringIO(), width=200)
    r.print(console)
    printed = console.file.getvalue()
    assert "compression report (test split)" in printed and f"{r.params_after:,}" in printed
    assert ("MoP path: " + r.path_string() in printed) == bool(r.path)


def test_bad_options_fail_before_any_forward_pass(model):
    calls = []
    handle = model.model.layers[0].register_forward_pre_hook(lambda m, a: calls.append(1))
    bad = [
        (UnknownNameError, "unknown width score 'wanda'", dict(width="wanda")),
        (InvalidOptionError, "has no option", dict(width="ntk", score_options={"p": 0.5})),
        (InvalidOptionError, "NTK output", dict(width="ntk", score_options={"output": "mean"})),
        (InvalidOptionError, "unknown allocation", dict(allocation="random")),
        (InvalidOptionError, "grouped-query mode", dict(gqa="heads")),
        (InvalidOptionError, "unknown MoP criterion", dict(scheduler="mop", criterion="bleu")),
        (InvalidOptionError, "unknown recovery method", dict(scheduler="mop", recovery="qlora")),
    ]
    try:
        for error, message, kw in bad:
            with pytest.raises(error, match=message):
                compress(model, CharTokenizer(), TEXT, **SMALL, **kw)
    finally:
        handle.remove()
    assert calls == []


def test_a_report_file_must_be_a_compression_report(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"format": "cbo.depthreport"}))
    with pytest.raises(CorruptFileError, match="not a CompressionReport"):
        CompressionReport.load(tmp_path / "bad.json")
    (tmp_path / "cut.json").write_text(json.dumps({"format": "cbo.compressionreport", "settings": {}}))
    with pytest.raises(CorruptFileError, match="lacks"):
        CompressionReport.load(tmp_path / "cut.json")


def test_compress_bad_input(model):
    with pytest.raises(InfeasibleError, match=r"ratio must be a finite number in \(0, 1\)"):
        compress(model, CharTokenizer(), TEXT, ratio=1.5)
    with pytest.raises(CBOError, match="unknown scheduler"):
        compress(model, CharTokenizer(), TEXT, scheduler="greedy")
    with pytest.raises(CBOError, match="unknown depth method"):
        compress(model, CharTokenizer(), TEXT, depth="random")
    with pytest.raises(DataError, match="needs a tokenizer"):
        compress(model, None, TEXT)
    with pytest.raises(InfeasibleError, match="leave a layer empty"):
        compress(
            model,
            CharTokenizer(),
            TEXT,
            ratio=0.95,
            measure_speed=False,
            **{k: v for k, v in SMALL.items() if k != "speed_options"},
        )


def test_public_names_resolve():
    import cbo
    import cbo.width
    from cbo.recovery.finetune import recover
    from cbo.width.prune import width_prune

    for name in cbo.width.__all__:
        assert callable(getattr(cbo.width, name))
    assert cbo.compress is compress and cbo.load_pruned is load_pruned
    assert cbo.width.width_prune is width_prune and cbo.width.recover is recover


def test_oneshot_cbo_depth_removes_the_proposers_layers(model):
    """depth="cbo" removes the QUBO's ground-state layers (the proposer, asked independently) and keeps threads."""
    from cbo.data.windows import make_splits
    from cbo.model.blocks import find_blocks
    from cbo.pipeline.proposers import CBOProposer

    splits = make_splits(CharTokenizer(), TEXT, seq_len=24, n_calibration=6, n_validation=3, n_test=3, seed=0)
    threads = torch.get_num_threads()
    r = compress(model, splits=splits, ratio=0.3, depth="cbo", depth_share=1.0, solver="enumerate", measure_speed=False)
    assert torch.get_num_threads() == threads
    per_layer = find_blocks(model, "layer")[0].n_params
    n = int(round(r.target_params / per_layer))
    assert n >= 1 and r.removed_layers == CBOProposer(solver="enumerate").layers(model, splits.calibration, n)
    assert r.settings["depth"] == "cbo" and len(r.widths) == 6 - n
