"""Shared fixtures: tiny random models built from configs, random token windows, a character tokenizer, and the
real default model (skipped when `make setup` has not installed it).

Use them from any test module:

    def test_something(tiny_model, tiny_windows):
        model = tiny_model("llama", n_layers=4)
        windows = tiny_windows(model, n=4, seq_len=16)

    @pytest.mark.parametrize("arch", TINY_ARCHS)   # from tiny_models import TINY_ARCHS
"""

from __future__ import annotations

import os

import pytest

# Nothing is downloaded in tests: the Hub is off for transformers, datasets and lm-eval alike (set before any of
# them is imported, since they read it once).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from tiny_models import (  # noqa: E402, F401  (re-exported for fixtures)
    EXTRA_ARCHS,
    TINY_ARCHS,
    TINY_VOCAB,
    CharTokenizer,
    build_tiny_model,
    random_token_windows,
)


@pytest.fixture
def tiny_model():
    """Factory: ``tiny_model(arch="llama", n_layers=4, seed=0, **config_overrides)`` -> fresh model."""
    return build_tiny_model


@pytest.fixture
def tiny_windows():
    """Factory: ``tiny_windows(model_or_vocab, n=4, seq_len=16, seed=0)`` -> (n, seq_len) int64 windows."""
    return random_token_windows


@pytest.fixture(params=TINY_ARCHS)
def any_arch(request) -> str:
    """Each tiny architecture name in turn."""
    return request.param


@pytest.fixture
def char_tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture
def novel_folder(tmp_path):
    """Three documents (the chapters of a synthetic novel): calibration and validation get whole documents."""
    from tiny_texts import synthetic_novel

    folder = tmp_path / "novel"
    folder.mkdir()
    chapters = synthetic_novel(n_chapters=3, n_paragraphs=12).split("Chapter ")[1:]
    for k, text in enumerate(chapters):
        (folder / f"part{k}.txt").write_text("Chapter " + text)
    return folder


@pytest.fixture(scope="module")
def gemma():
    """(model, tokenizer) of Gemma 3 270M, once a test module; skips where it is not installed."""
    from cbo.errors import ModelError
    from cbo.model.loading import load_model

    try:
        return load_model("gemma3-270m", quiet=True)
    except ModelError as exc:
        pytest.skip(f"gemma3-270m not installed ({exc}); `cbo setup gemma3-270m` installs it")


@pytest.fixture
def quiet_kernel_fallbacks():
    """transformers at ERROR only: it says once per kernel that the reference PyTorch implementation of the Mamba2
    scan is used (the hybrid tests)."""
    import logging

    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.fixture
def cbo_home(tmp_path, monkeypatch):
    """A fresh, empty CBO_HOME for the test."""
    home = tmp_path / "cbo_home"
    monkeypatch.setenv("CBO_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def default_model():
    """``(model, tokenizer)`` of the real default model; skips when `make setup` has not been run."""
    from cbo.errors import ModelError
    from cbo.model.loading import load_model

    try:
        return load_model("smollm2-135m")
    except ModelError as exc:
        pytest.skip(f"default model not installed ({exc})")


@pytest.fixture(scope="session")
def default_text():
    """Folder of the six Austen novels; skips when `make setup` has not been run."""
    from cbo.data.assets import default_text_path
    from cbo.errors import DataError

    try:
        return default_text_path()
    except DataError as exc:
        pytest.skip(f"default text not installed ({exc})")


@pytest.fixture(scope="session")
def installed():
    """Skip unless `make setup` installed the default model and text (for scripts that load them themselves)."""
    from cbo.data.assets import default_text_path
    from cbo.errors import DataError, ModelError
    from cbo.model.loading import resolve_model

    try:
        resolve_model("smollm2-135m")
        default_text_path()
    except (ModelError, DataError) as exc:
        pytest.skip(f"default model or text not installed ({exc})")
