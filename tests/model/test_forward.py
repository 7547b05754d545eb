"""cbo.model.forward: the input device, batches of windows, logits, and torch's thread count kept across a numba solve."""

from __future__ import annotations

import pytest
import torch

from cbo.errors import CBOError
from cbo.model.forward import input_device, model_logits, torch_threads_kept, window_batches


def test_batches_cover_every_window_once():
    windows = torch.arange(14).reshape(7, 2)
    spans = [(start, batch[:, 0].tolist()) for start, batch in window_batches(windows, 3)]
    assert spans == [(0, [0, 2, 4]), (3, [6, 8, 10]), (6, [12])]
    for bad in (0, -1, 2.0, True):
        with pytest.raises(CBOError, match="batch_size must be an integer >= 1"):
            list(window_batches(windows, bad))


def test_logits_and_device_of_a_tiny_model(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=2)
    x = tiny_windows(model, n=2, seq_len=6)
    assert input_device(model) == torch.device("cpu")
    with torch.no_grad():
        torch.testing.assert_close(model_logits(model, x), model(input_ids=x).logits)


def test_the_thread_count_is_restored_even_on_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError), torch_threads_kept():
        torch.set_num_threads(max(1, before + 1))
        raise RuntimeError("the solve failed")
    assert torch.get_num_threads() == before
