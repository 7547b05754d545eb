"""The tiny teacher model and its training windows that the recovery tests share (one of each per module)."""

from __future__ import annotations

import pytest
from tiny_models import build_tiny_model, random_token_windows


@pytest.fixture(scope="module")
def teacher():
    return build_tiny_model("llama", n_layers=3)


@pytest.fixture(scope="module")
def windows(teacher):
    return random_token_windows(teacher, n=8, seq_len=16, seed=1)
