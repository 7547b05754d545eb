"""Width pruning of the real default model (SmolLM2-135M: 9 query heads in 3 KV groups, MLP width 1536)."""

from __future__ import annotations

import pytest
import torch

from cbo.data.windows import random_windows
from cbo.evaluate import count_parameters
from cbo.model.structures import layer_widths
from cbo.surgery.io import load_pruned, save_pruned
from cbo.width.prune import width_prune


@pytest.mark.model
def test_prune_save_reload_default_model(default_model, tmp_path):
    gqa = "query"  # the same number of query heads removed in each of the 3 groups (whole groups: tiny tests)
    model, tokenizer = default_model
    windows = random_windows(2, 32, model.config.vocab_size, seed=0)
    pruned, alloc = width_prune(model, windows, ratio=0.1, score="amp", gqa=gqa)
    assert count_parameters(model) - count_parameters(pruned) == alloc.removed_params
    widths = layer_widths(pruned)
    assert all(w["intermediate"] % 8 == 0 and w["heads"] % w["kv_heads"] == 0 for w in widths)
    if gqa == "query":
        assert all(w["kv_heads"] == 3 for w in widths) and any(w["heads"] < 9 for w in widths)
    folder = save_pruned(pruned, tmp_path / "m", tokenizer)
    loaded = load_pruned(folder)
    x = random_windows(1, 16, model.config.vocab_size, seed=1)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=x).logits, pruned(input_ids=x).logits)
    kw = dict(max_new_tokens=4, do_sample=False)
    assert torch.equal(loaded.generate(x, **kw), pruned.generate(x, **kw))
