"""The model fingerprint keys every Hessian and measurement cache: equal for the same computation in any process
(thread count, load folder, runtime flags), different after any change of a weight or of the architecture."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cbo.model.fingerprint import bit_sum, config_digest, model_fingerprint


class _Big(torch.nn.Module):
    """Parameters large enough for torch to split their reductions over threads (with these values a float32
    sum of several of them rounds differently with one and two threads on the development machine)."""

    def __init__(self, n: int = 1_000_000, count: int = 6) -> None:
        super().__init__()
        self.w = torch.nn.ParameterList()
        for seed in range(count):
            g = torch.Generator().manual_seed(seed)
            self.w.append(torch.nn.Parameter(torch.randn(n, generator=g) * 0.05 + 0.01))


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_fingerprint_does_not_depend_on_the_thread_count(threads):
    model = _Big()
    prints = set()
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        prints.add(model_fingerprint(model))
    assert len(prints) == 1


def test_any_single_weight_change_changes_the_fingerprint():
    model = _Big()
    before = model_fingerprint(model)
    with torch.no_grad():
        # index 1 is outside the strided sample (every n // 1024-th value): only the sum can see it
        w = model.w[0].data
        w[1] = torch.nextafter(w[1], torch.tensor(float("inf")))
    assert model_fingerprint(model) != before
    with torch.no_grad():
        w[1] = torch.nextafter(w[1], torch.tensor(float("-inf")))
    assert model_fingerprint(model) == before


@pytest.mark.parametrize(
    "dtype, view",
    [(torch.float32, np.int32), (torch.float64, np.int32), (torch.bfloat16, np.int16), (torch.int8, np.uint8)],
)
def test_bit_sum_is_the_integer_sum_of_the_raw_words(dtype, view):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(1001, 3, generator=g) * 50).to(dtype)
    raw = np.frombuffer(x.contiguous().view(torch.uint8).numpy().tobytes(), dtype=view)
    assert bit_sum(x) == int(raw.astype(np.int64).sum()) % 2**32
    assert bit_sum(x.flip(0)) == bit_sum(x) == bit_sum(x.t())  # any order, any layout
    assert bit_sum(torch.ones(5, dtype=torch.bool)) == 5


def test_load_folder_and_runtime_flags_do_not_matter_but_the_architecture_does(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_model("llama", n_layers=2, seed=0)
    model.save_pretrained(tmp_path / "a")
    model.save_pretrained(tmp_path / "b")
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "b")
    assert a.config._name_or_path != b.config._name_or_path
    b.config.use_cache = not b.config.use_cache
    b.config.output_hidden_states = True
    assert model_fingerprint(a) == model_fingerprint(b) == model_fingerprint(model)
    b.config.rms_norm_eps = b.config.rms_norm_eps * 2  # computes something else with the same weights
    assert model_fingerprint(b) != model_fingerprint(a)
    assert "_name_or_path" not in config_digest(a.config) and "rms_norm_eps" in config_digest(a.config)
