"""Gemma 3 270M (installed by `cbo setup gemma3-270m`) pruned end to end at small settings: `<bos>` windows, the
measured validation losses equal the pruned model's own, the pruned folder reloads with plain transformers and
generates. The held-out comparison with block influence at larger settings is benchmarks/gemma.py."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_gemma_prunes_end_to_end(gemma, tmp_path):
    import transformers as tf

    from cbo.data.windows import make_splits
    from cbo.evaluate import evaluate
    from cbo.pipeline import prune_depth
    from cbo.surgery.io import save_pruned

    model, tok = gemma
    splits = make_splits(tok, seq_len=32, n_calibration=2, n_validation=2, n_test=0, seed=0, model=model)
    assert (splits.calibration[:, 0] == tok.bos_token_id).all() and (splits.validation[:, 0] == tok.bos_token_id).all()
    report = prune_depth(
        model, tok, splits=splits, remove=4, top_k=3, validate=3, batch_size=2, cache_dir=None, progress=False,
        refine=None, select=None,  # the validated path: the default's refine and race are tested on tiny models
    )  # fmt: skip
    pruned = report.pruned_model
    assert pruned.config.num_hidden_layers == 14 and len(pruned.config.layer_types) == 14
    assert len(report.chosen_blocks) == 4
    # the measurer's values (chunked over positions) equal a plain evaluation of the pruned model
    direct = evaluate(pruned, splits.validation, batch_size=2)
    assert report.pruned_metrics["ppl"] == pytest.approx(direct["ppl"], rel=1e-4)
    assert math.isfinite(report.pruned_metrics["kl"]) and report.pruned_metrics["kl"] > 0
    folder = save_pruned(pruned, tmp_path / "gemma-pruned", tok)
    plain = tf.AutoModelForCausalLM.from_pretrained(folder).eval()
    x = splits.validation[:1, :16]
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=x).logits, pruned(input_ids=x).logits, atol=1e-4)
        out = plain.generate(x, max_new_tokens=4, do_sample=False, use_cache=True)
    assert out.shape == (1, 20)
