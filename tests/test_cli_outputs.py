"""Every command that writes checks its outputs before its work: an output under a file, a folder given for a
file, a missing folder of an output file, and a non-empty folder CBO did not write (refused unless --overwrite)
end the command with a clear error naming the path, and the work (mocked here, so that it would fail loudly)
never starts. Paths with rich markup characters are printed as they are."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from cbo.cli import app, register_commands
from cbo.files import WRITTEN_MARKER

register_commands()


class WorkStarted(Exception):
    """Raised by the mocked work: the output check should have stopped the command first."""


def _forbid(*args, **kwargs):
    raise WorkStarted("the work started before the outputs were checked")


@pytest.fixture
def no_work(monkeypatch):
    """Every long piece of work a writing command starts, replaced by one that raises WorkStarted."""
    import cbo.model.loading
    import cbo.pipeline
    import cbo.pipeline.compression
    import cbo.solvers.sweep

    monkeypatch.setattr(cbo.pipeline, "prune_depth", _forbid)
    monkeypatch.setattr(cbo.pipeline, "compress", _forbid)
    monkeypatch.setattr(cbo.pipeline.compression, "compress", _forbid)
    monkeypatch.setattr(cbo.model.loading, "load_model", _forbid)
    monkeypatch.setattr(cbo.solvers.sweep, "make_grid", _forbid)
    return WorkStarted


def _run(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "300"})


def _file_commands(out: str) -> dict[str, list[str]]:
    """Commands whose output ``out`` is a file."""
    return {
        "hessian": ["hessian", "smollm2-135m", "-o", out],
        "compress --json": ["compress", "--json", out],
        "sweep --out": ["sweep", "-i", "synthetic:8:0", "-s", "sa", "-m", "2", "--out", out],
        "sweep --table": ["sweep", "-i", "synthetic:8:0", "-s", "sa", "-m", "2", "--table", out],
        "eval --json": ["eval", "smollm2-135m", "--json", out],
        "qubo random": ["qubo", "random", "--n", "8", "-o", out],
    }


def _folder_commands(out: str) -> dict[str, list[str]]:
    """Commands whose output ``out`` is a folder."""
    return {
        "prune --out": ["prune", "--out", out],
        "prune --plots": ["prune", "--plots", out],
        "prune --width --out": ["prune", "--width", "taylor", "--ratio", "0.2", "--out", out],
        "compress --out": ["compress", "--out", out],
        "demo --out": ["demo", "--out", out],
        "convert -o": ["convert", "model.gguf", "-o", out],
    }


def _refused(res, path, *words: str) -> None:
    assert res.exit_code in (1, 2), res.output
    assert not isinstance(res.exception, WorkStarted), res.output
    assert str(path) in res.output, res.output
    for word in words:
        assert word in res.output, res.output


def test_an_output_under_a_file_is_refused_before_the_work(tmp_path, no_work):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args in {**_file_commands(str(blocker / "x.out")), **_folder_commands(str(blocker / "out"))}.values():
        _refused(_run(*args), blocker, "is a file")


def test_an_output_file_that_is_a_folder_or_has_no_folder_is_refused(tmp_path, no_work):
    for args in _file_commands(str(tmp_path)).values():
        _refused(_run(*args), tmp_path, "is a folder")
    missing = tmp_path / "missing" / "x.out"
    for name, args in _file_commands(str(missing)).items():
        if name.startswith("sweep"):  # the sweep creates the folders of its record and table
            assert isinstance(_run(*args).exception, WorkStarted), name
        else:
            _refused(_run(*args), missing, "does not exist")


def test_an_unwritable_output_is_refused(tmp_path, no_work, monkeypatch):
    """Permissions as the check reads them (this suite may run as root, for whom every folder is writable)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(locked) else real(p, mode))
    for args in {**_file_commands(str(locked / "x.out")), **_folder_commands(str(locked / "out"))}.values():
        _refused(_run(*args), locked, "permission denied")


def test_a_foreign_non_empty_folder_is_refused_unless_overwrite(tmp_path, no_work):
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    (foreign / "model-00001-of-00002.safetensors").write_bytes(b"x")
    for name, args in _folder_commands(str(foreign)).items():
        _refused(_run(*args), foreign, "not empty", "--overwrite")
        if name == "prune --plots":
            continue  # --overwrite covers every folder of the command: checked with --out
        res = _run(*args, "--overwrite")
        # past the check: the (mocked) work starts, or, for convert, the missing GGUF file is reported
        assert isinstance(res.exception, WorkStarted) or "model.gguf" in res.output, (name, res.output)
    assert (foreign / "config.json").read_text() == "{}"
    assert (foreign / "model-00001-of-00002.safetensors").read_bytes() == b"x"


def test_a_folder_cbo_wrote_is_written_again_without_overwrite(tmp_path, no_work):
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "config.json").write_text("{}")
    (ours / WRITTEN_MARKER).write_text(json.dumps({"files": ["config.json"]}))
    res = _run("prune", "--out", str(ours))
    assert isinstance(res.exception, WorkStarted), res.output


def test_paths_with_markup_are_printed_as_they_are(tmp_path, no_work):
    odd = tmp_path / "out[bold]x"
    odd.write_text("")
    res = _run("prune", "--out", str(odd / "m"))
    _refused(res, odd, "is a file")
    res = _run("qubo", "info", str(tmp_path / "x[/y].cboq"))  # the file name (a folder "x[" here)
    assert res.exit_code == 2 and "x[/y].cboq" in res.output and "MarkupError" not in repr(res.exception), res.output


def test_solvers_lists_the_extras_with_their_brackets():
    res = _run("solvers")
    assert res.exit_code == 0, res.output
    for line in res.output.splitlines():
        if "pip install 'cbo" in line:
            assert "pip install 'cbo[" in line, line


def test_a_model_folder_an_earlier_cbo_saved_is_written_again(tmp_path, no_work):
    """A pruned folder saved before the record existed (its config says it is CBO's) is not a foreign folder."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "config.json").write_text(json.dumps({"cbo_pruned_format": 1, "model_type": "llama"}))
    (earlier / "model.safetensors").write_bytes(b"x")
    assert isinstance(_run("demo", "--out", str(earlier)).exception, WorkStarted)


def test_an_existing_output_file_is_replaced_only_with_overwrite(tmp_path):
    """`qubo random -o`, `solve --out` and `solve --plot` refuse a file that exists, naming it and --overwrite,
    and replace it with --overwrite (issue 27: they overwrote a user's file silently)."""
    path = tmp_path / "q.cboq"
    res = _run("qubo", "random", "--n", "6", "--seed", "0", "-o", str(path))
    assert res.exit_code == 0, res.output
    before = path.read_bytes()
    res = _run("qubo", "random", "--n", "6", "--seed", "1", "-o", str(path))
    _refused(res, path, "exists", "--overwrite")
    assert path.read_bytes() == before
    res = _run("qubo", "random", "--n", "6", "--seed", "1", "-o", str(path), "--overwrite")
    assert res.exit_code == 0 and path.read_bytes() != before, res.output
    for option, name in (("--out", "states.json"), ("--plot", "spectrum.png")):
        out = tmp_path / name
        out.write_text("old")
        args = ["solve", str(path), "--remove", "2", "--solver", "enumerate", option, str(out)]
        _refused(_run(*args), out, "exists", "--overwrite")
        assert out.read_text() == "old"
        res = _run(*args, "--overwrite")
        assert res.exit_code == 0, res.output
        assert out.read_bytes() != b"old"


@pytest.mark.parametrize("command", ["prune", "hessian"])
def test_the_cache_option_says_what_the_cache_holds(command):
    """The cache holds measured losses and refine checkpoints beside the Hessians; --cache's help says so."""
    res = _run(command, "--help")
    assert res.exit_code == 0
    text = " ".join(res.output.replace("│", " ").split())
    assert "Hessians and their checkpoints, measured losses and refine checkpoints" in text


def test_the_prune_table_never_cuts_the_removed_set():
    """Printed at 80 columns (piped to a file), the removed blocks wrap instead of ending in "…" (issue 27: the
    column showed "3,4,5,6,7,12,13,14,15…")."""
    import io

    from rich.console import Console

    from cbo.pipeline.reports import DepthReport, ValidatedState

    removed = [3, 4, 5, 6, 7, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26]
    names = [f"layers.{i}" for i in removed]
    report = DepthReport(
        model_name="a-model-with-a-long-name", method="block_influence", remove=len(removed), n_blocks=30,
        granularity="layer", estimator=None, loss=None, solver=None, qubo=None, states=None,
        validation=[ValidatedState(None, removed, names, None, 0.1234, 12.34, 0.876)], chosen_rank=None,
        chosen_blocks=removed, chosen_names=names, pruned_model=None, tokenizer=None,
        original_metrics={"ppl": 10.0, "n_params": 1e8}, pruned_metrics={"ppl": 12.34, "kl": 0.1234, "n_params": 6e7},
        timings={},
    )  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=80).print(report.table())
    text = out.getvalue()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    cells = [line.split("│")[2] for line in text.splitlines() if line.count("│") >= 7]
    assert [int(v) for v in ",".join(cells).replace(",", " ").split()] == removed
