"""The manual's Python examples run as written (tests/doc_examples.py finds them by name). Those on a model run on a
tiny saved one: only the model (a name or folder), M where a tiny model cannot lose as many blocks, and the window
counts are replaced; every other argument is passed as the page writes it, so a renamed option fails here."""

from __future__ import annotations

import functools
import json
import os

import pytest
from doc_examples import ROOT, example

# the pipeline at tiny sizes: fewer and shorter windows, and the validated path only (refine and the race are run
# by tests/test_readme.py and tests/test_readme_refine.py; here the examples' own arguments are the point)
SMALL_DEPTH = dict(seq_len=16, n_calibration=4, n_validation=3, solver="enumerate", progress=False)
VALIDATED_PATH = dict(refine=None, select=None)


def run(code: str) -> dict:
    """Run an example's code as a module would, and return its names."""
    scope = {"__name__": "docs_example"}
    exec(compile(code, "docs example", "exec"), scope)
    return scope


def test_the_solvers_example_runs(capsys):
    run(example("solvers"))
    out = capsys.readouterr().out
    assert out.count("recall of the exact top-10") == 2 and "swap-sa recall of the exact top-10: 1.0" in out


def test_the_figures_example_runs(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")
    (tmp_path / "docs" / "concepts" / "img").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    run(example("figures"))
    for name in ("spectrum", "removal-map", "hamming"):
        assert (tmp_path / "docs" / "concepts" / "img" / f"{name}.png").stat().st_size > 1000
        assert (ROOT / "docs" / "concepts" / "img" / f"{name}.png").is_file()  # the page shows what the code draws


@pytest.fixture
def tiny_folder(tmp_path, monkeypatch):
    """A tiny saved Llama of 8 layers with its tokenizer, and a folder of text, in a working directory."""
    from tiny_models import build_tiny_model
    from tiny_texts import synthetic_novel
    from tiny_tokenizers import byte_level_tokenizer

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))
    folder = tmp_path / "tiny-model"
    build_tiny_model("llama", n_layers=8, vocab_size=260).save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    texts = tmp_path / "my_texts"
    texts.mkdir()
    for i in range(3):
        (texts / f"book{i}.txt").write_text(synthetic_novel(n_chapters=3 + i))
    return folder, texts


def on_tiny(real, folder, **fixed):
    """``real`` with the model name replaced by the tiny folder and small window counts added."""

    @functools.wraps(real)
    def call(model, *args, **kw):
        return real(str(folder), *args, **{**kw, **fixed})

    return call


def test_the_own_model_example_runs(tiny_folder, monkeypatch):
    import cbo

    folder, _texts = tiny_folder
    code = example("own-model")
    assert '"path/to/hf-folder"' in code and 'text="my_texts/"' in code
    monkeypatch.setattr(cbo, "prune_depth", on_tiny(cbo.prune_depth, folder, **SMALL_DEPTH, **VALIDATED_PATH))
    scope = run(example("own-model"))
    assert len(scope["report"].chosen_blocks) == 6 and 0 not in scope["report"].chosen_blocks
    saved = json.loads((folder.parent / "pruned-mine" / "report.json").read_text())
    assert "my_texts" in json.dumps(saved["options"]["data"])
    assert cbo.load_pruned(folder.parent / "pruned-mine").config.num_hidden_layers == 2


def test_the_compress_example_runs(tiny_folder, monkeypatch):
    import cbo

    folder, texts = tiny_folder
    small = dict(text=str(texts), seq_len=24, n_calibration=6, n_validation=3, n_test=3, measure_speed=False)
    monkeypatch.setattr(cbo, "compress", on_tiny(cbo.compress, folder, **small))
    scope = run(example("compress"))
    report = scope["report"]
    assert report.path and set(report.path_string()) <= {"D", "W"}
    assert (folder.parent / "pruned-mop" / "report.json").is_file()


@pytest.mark.slow
@pytest.mark.usefixtures("quiet_kernel_fallbacks")
def test_the_caps_example_runs(tmp_path, monkeypatch):
    """The Python twin of the hybrid guide's command line, on a tiny GraniteMoeHybrid of 4 layers (8 halves, two of
    them Mamba): M = 3 instead of 6, the caps and keep lists as written."""
    from tiny_models import build_tiny_hybrid
    from tiny_texts import synthetic_novel
    from tiny_tokenizers import byte_level_tokenizer

    import cbo

    folder, text = tmp_path / "tiny-hybrid", tmp_path / "novel.txt"
    build_tiny_hybrid("granitemoehybrid", n_layers=4, vocab_size=260).save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    text.write_text(synthetic_novel())
    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))
    code = example("caps")
    assert '"ibm-granite/granite-4.0-h-tiny"' in code
    real = cbo.prune_depth

    def tiny(model, *args, **kw):
        small = {**SMALL_DEPTH, **VALIDATED_PATH, "validate": 2}
        return real(str(folder), *args, **{**kw, "remove": 3, "text": str(text), **small})

    monkeypatch.setattr(cbo, "prune_depth", tiny)
    names = run(example("caps"))["report"].chosen_names
    assert len(names) == 3 and not any("mamba" in n for n in names)
    assert sum(n.endswith(".attn") for n in names) <= 2


def test_examples_do_not_leave_files_in_the_repository():
    assert not (ROOT / "pruned-mine").exists() and not (ROOT / "pruned-mop").exists()
    assert os.path.isdir(ROOT / "docs")
