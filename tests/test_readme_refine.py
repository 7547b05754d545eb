"""The refine examples of the manual (docs/guides/prune.md, moved there from the README) run: the Python call and the
command line, as written, on a tiny model.

The model and M are the only things replaced (a tiny saved Llama of 5 layers cannot lose 15); every other
option of the docs line is passed unchanged, so a renamed option or a changed report key fails here.
"""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import pytest
from doc_examples import example

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "prune.md"


def _python_refine_example() -> list[str]:
    code = example("readme-refine")
    assert "refine=" in code, "the refine example should call prune_depth with refine="
    return [line for line in code.splitlines() if line.strip()]


def _cli_refine_example() -> list[str]:
    lines = [
        ln
        for ln in GUIDE.read_text().splitlines()
        if ln.startswith("cbo prune") and "--refine" in ln.split("#")[0].split()
    ]
    assert len(lines) == 1, "docs/guides/prune.md should hold one `cbo prune --refine` line"
    return shlex.split(lines[0].split("#")[0])


@pytest.fixture
def tiny_folder(tiny_model, tmp_path):
    from tiny_texts import synthetic_novel
    from tiny_tokenizers import byte_level_tokenizer

    folder, text = tmp_path / "tiny-model", tmp_path / "novel.txt"
    tiny_model("llama", n_layers=5, vocab_size=260).save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    text.write_text(synthetic_novel())
    return folder, text


def test_the_python_refine_example_runs(tiny_folder, tmp_path, monkeypatch, capsys):
    import cbo

    folder, text = tiny_folder
    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))
    lines = _python_refine_example()
    call = ast.parse(lines[0]).body[0].value
    assert isinstance(call, ast.Call) and ast.unparse(call.func) == "cbo.prune_depth"
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert kwargs["refine"] > 0
    small = dict(text=str(text), seq_len=16, n_calibration=4, n_validation=3, solver="enumerate", progress=False)
    real = cbo.prune_depth

    def tiny_prune_depth(model, *args, **kw):
        return real(str(folder), *args, **{**kw, "remove": 2, **small})

    monkeypatch.setattr(cbo, "prune_depth", tiny_prune_depth)
    scope = {"cbo": cbo}
    for line in lines:
        exec(line, scope)  # the example's lines, in order
    report = scope["report"]
    assert report.options["search"]["refine"] == kwargs["refine"] and report.work["refine"]["rounds"] >= 1
    assert "best_calibration_kl" in capsys.readouterr().out


def test_the_cli_refine_example_runs(tiny_folder, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    folder, text = tiny_folder
    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))
    register_commands()
    argv = _cli_refine_example()[1:]  # drop "cbo"
    assert argv[:2] == ["prune", "smollm2-135m"]
    argv[1] = str(folder)
    argv[argv.index("--remove") + 1] = "2"
    out = tmp_path / argv[argv.index("--out") + 1]
    argv[argv.index("--out") + 1] = str(out)
    small = ["--text", str(text), "--seq-len", "16", "--n-calibration", "4", "--n-validation", "3", "-q"]
    res = CliRunner().invoke(app, [*argv, "--solver", "enumerate", *small])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["options"]["search"]["refine"] == float(argv[argv.index("--refine") + 1])
