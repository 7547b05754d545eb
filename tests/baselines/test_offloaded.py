"""Baselines on a model dispatched with accelerate whose first weights are offloaded (on the meta device between
passes): the inputs go where the model computes (``cbo.model.forward.input_device``), never to ``meta``, and the
ranking is the plain model's."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

accelerate = pytest.importorskip("accelerate")
from accelerate import dispatch_model  # noqa: E402

from cbo import baselines as B  # noqa: E402
from cbo.model.forward import input_device  # noqa: E402


def _offloaded(model, folder):
    """``model`` with its embedding (its first parameter) offloaded to disk: on "meta" outside a forward pass."""
    device_map = {"model.embed_tokens": "disk", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    device_map |= {f"model.layers.{i}": "cpu" for i in range(len(model.model.layers))}
    d = dispatch_model(copy.deepcopy(model), device_map=device_map, force_hooks=True, offload_dir=str(folder))
    assert next(d.parameters()).device.type == "meta"  # what the old helper sent the inputs to
    return d


@pytest.mark.parametrize("method", ["taylor", "block_influence", "angular"])
def test_baselines_rank_an_offloaded_model_like_the_plain_one(tiny_model, tiny_windows, tmp_path, method):
    model = tiny_model("llama", n_layers=4, seed=3, tie_word_embeddings=False)
    windows = tiny_windows(model, n=4, seq_len=10, seed=1)
    offloaded = _offloaded(model, tmp_path)
    assert input_device(offloaded) == torch.device("cpu")
    options = {"protect": None} if method == "taylor" else {}
    ref = B.rank_blocks(method, model, windows, max_remove=2, batch_size=2, **options)
    got = B.rank_blocks(method, offloaded, windows, max_remove=2, batch_size=2, **options)
    assert got.select(2) == ref.select(2)
    if ref.scores is not None:
        np.testing.assert_allclose(got.scores, ref.scores, rtol=1e-5, atol=1e-7)
