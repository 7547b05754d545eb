"""Issue 38, outputs: one rule for every command that writes (cbo.cli.common.claim_outputs).

An output that is, holds or lies inside an input model is refused, --overwrite or not (`cbo prune --out` into the
installed default model replaced it); a model `cbo setup` or `cbo convert` wrote is not an earlier output. A place
that cannot be written is found by a real write before the work (os.access says yes to root and on read-only
mounts: a raw FileNotFoundError came from the lock, a 42 s Hessian was lost at its final write). Every command holds
its outputs while it runs (two heals into one folder both said "saved"). SIGTERM ends a command as Ctrl-C does,
and a later save removes what a killed one left. A save lists everything it writes (an earlier run's qubo.cboq
survived a later one), and the files get the mode the umask gives (weights and reports were 0600).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cbo.cli import app, register_commands
from cbo.errors import OutputPathError
from cbo.files import WRITTEN_MARKER, check_output_dir, check_output_file, output_folder, output_lock

register_commands()
REPO = Path(__file__).resolve().parents[1]


class WorkStarted(Exception):
    """Raised by the mocked work: the output rule should have stopped the command first."""


def _forbid(*args, **kwargs):
    raise WorkStarted("the work started before the outputs were checked")


@pytest.fixture
def no_work(monkeypatch):
    """The long work of every writing command, replaced by one that raises WorkStarted."""
    import cbo.model.loading
    import cbo.pipeline
    import cbo.pipeline.compression
    import cbo.qubo.instances
    import cbo.solvers
    import cbo.solvers.sweep

    for module, name in (
        (cbo.pipeline, "prune_depth"),
        (cbo.pipeline, "compress"),
        (cbo.pipeline.compression, "compress"),
        (cbo.model.loading, "load_model"),
        (cbo.solvers.sweep, "make_grid"),
        (cbo.solvers, "solve"),
        (cbo.qubo.instances, "random_block_qubo"),
    ):
        monkeypatch.setattr(module, name, _forbid)


def _run(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "300"})


def _refused(res, path, *words: str) -> None:
    assert res.exit_code in (1, 2), res.output
    assert not isinstance(res.exception, WorkStarted), res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)  # an error message, not a raw exception
    text = " ".join(res.output.split())
    assert str(path) in text, res.output
    for word in words:
        assert word in text, res.output


def _installed_model(home: Path, record: dict) -> Path:
    """A model folder as `cbo setup` leaves it in CBO_HOME (its manifest and CBO's record of the files)."""
    folder = home / "models" / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "cbo-manifest.json").write_text("{}")
    (folder / WRITTEN_MARKER).write_text(json.dumps(record))
    return folder


LEGACY_RECORD = {"files": ["cbo-manifest.json", "config.json", "model.safetensors"]}  # what setup wrote before


@pytest.mark.parametrize("record", [LEGACY_RECORD, {**LEGACY_RECORD, "kind": "model"}], ids=["legacy", "kind"])
def test_an_output_that_is_holds_or_lies_inside_the_input_model_is_refused(record, tmp_path, monkeypatch, no_work):
    """`cbo prune --out <the installed default model>` replaced it with a 28-layer one: refused, --overwrite or not,
    by every command that reads a model and writes (prune, compress, heal, convert, demo, hessian, eval, solve)."""
    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))
    model = _installed_model(tmp_path / "home", record)
    qubo = tmp_path / "q.cboq"
    from cbo.qubo.block_qubo import BlockQUBO

    BlockQUBO(np.diag([1.0, 2.0, 3.0])).save(qubo)
    gguf = tmp_path / "g" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    cases = {
        "is": model,
        "lies inside": model / "pruned",
        "holds": model.parent,
    }
    for relation, out in cases.items():
        for extra in ([], ["--overwrite"]):
            for args in (
                ["prune", "smollm2-135m", "--out", str(out), *extra],
                ["prune", str(model), "--width", "taylor", "--ratio", "0.2", "--out", str(out), *extra],
                ["prune", "--plots", str(out), *extra],
                ["compress", str(model), "--out", str(out), *extra],
                ["demo", "--out", str(out), *extra],
            ):
                _refused(_run(*args), out, relation, "the input", "not even with --overwrite")
        _refused(_run("heal", str(model), "-t", "smollm2-135m", "-n", "1", "--out", str(out)), out, relation)
    for args, out in (
        (["hessian", "smollm2-135m", "-o", str(model / "q.cboq")], model / "q.cboq"),
        (["eval", "smollm2-135m", "--json", str(model / "config.json")], model / "config.json"),
        (["solve", str(qubo), "-m", "1", "--out", str(qubo), "--overwrite"], qubo),
        (["convert", str(gguf), "-o", str(gguf.parent), "--overwrite"], gguf.parent),
        (["sweep", "-i", str(qubo), "-s", "sa", "-m", "1", "--out", str(qubo)], qubo),
    ):
        _refused(_run(*args), out, "the input")
    assert (model / "model.safetensors").read_bytes() == b"weights"
    assert qubo.stat().st_size > 100 and gguf.read_bytes() == b"GGUF"


@pytest.mark.parametrize("record", [LEGACY_RECORD, {**LEGACY_RECORD, "kind": "model"}], ids=["legacy", "kind"])
def test_a_model_setup_or_convert_wrote_is_not_an_earlier_output(record, tmp_path, no_work):
    """A converted model's record made it count as "our own output", written again without --overwrite."""
    model = _installed_model(tmp_path, record)
    res = _run("prune", "some/other-model", "--out", str(model))
    _refused(res, model, "not empty", "`cbo setup` or `cbo convert`", "--overwrite")
    with pytest.raises(OutputPathError, match="not empty"):
        check_output_dir(model)
    assert isinstance(_run("prune", "some/other-model", "--out", str(model), "--overwrite").exception, WorkStarted)


def test_convert_records_its_folder_as_a_model(tmp_path):
    from cbo.data.convert import MANIFEST

    with output_folder(tmp_path / "m", kind="model") as staging:
        (staging / "config.json").write_text("{}")
        (staging / MANIFEST).write_text("{}")
    assert json.loads((tmp_path / "m" / WRITTEN_MARKER).read_text())["kind"] == "model"
    source = (REPO / "cbo" / "data" / "convert.py").read_text()
    assert "output_folder(output, kind=MODEL_KIND)" in source


UNWRITABLE = [p for p in ("/proc/cbo-out", "/sys/kernel/cbo-out") if Path(p).parent.is_dir()]


@pytest.mark.skipif(not UNWRITABLE, reason="no /proc or /sys here")
@pytest.mark.parametrize("place", UNWRITABLE)
def test_a_place_that_cannot_be_written_is_refused_before_the_work(place, monkeypatch, no_work):
    """os.access says yes (as for root, or on a read-only mount); a real write says no. `--out /proc/x` raised a
    raw FileNotFoundError from the lock; `hessian -o /sys/kernel/h.cboq` computed, then lost its result."""
    monkeypatch.setattr(os, "access", lambda path, mode: True)
    folder = Path(place)
    file = folder.parent / "h.cboq"
    for args, path in (
        (["prune", "--out", str(folder)], folder),
        (["compress", "--out", str(folder)], folder),
        (["demo", "--out", str(folder)], folder),
        (["convert", "model.gguf", "-o", str(folder)], folder),
        (["hessian", "smollm2-135m", "-o", str(file)], file),
        (["eval", "smollm2-135m", "--json", str(file)], file),
        (["qubo", "random", "--n", "4", "-o", str(file)], file),
        (["compress", "--json", str(file)], file),
        (["sweep", "-i", "synthetic:8:0", "-s", "sa", "-m", "2", "--out", str(file)], file),
    ):
        _refused(_run(*args), path, "cannot write")
    with pytest.raises(OutputPathError, match="cannot write the output file"):
        check_output_file(file)
    with pytest.raises(OutputPathError, match="cannot write"):
        check_output_dir(folder / "sub")
    with pytest.raises(OutputPathError, match="cannot"):
        with output_lock(folder):
            pass


def test_every_writing_command_holds_its_output(tmp_path, no_work):
    """While one run writes an output, a second one is refused before its work (two `cbo heal` into one folder
    both reported "saved"; only prune took the lock)."""
    from cbo.qubo.block_qubo import BlockQUBO

    qubo = tmp_path / "q.cboq"
    BlockQUBO(np.diag([1.0, 2.0, 3.0])).save(qubo)
    pruned = tmp_path / "pruned"
    pruned.mkdir()
    (pruned / "config.json").write_text("{}")
    busy = tmp_path / "busy"
    commands = {
        "prune": ["prune", "--out", str(busy)],
        "prune --plots": ["prune", "--plots", str(busy)],
        "compress": ["compress", "--out", str(busy)],
        "compress --json": ["compress", "--json", str(busy)],
        "demo": ["demo", "--out", str(busy)],
        "heal": ["heal", str(pruned), "-t", "smollm2-135m", "-n", "1", "--out", str(busy)],
        "convert": ["convert", "model.gguf", "-o", str(busy)],
        "hessian": ["hessian", "smollm2-135m", "-o", str(busy)],
        "eval": ["eval", "smollm2-135m", "--json", str(busy)],
        "solve --out": ["solve", str(qubo), "-m", "1", "--out", str(busy)],
        "solve --plot": ["solve", str(qubo), "-m", "1", "--plot", str(busy)],
        "qubo random": ["qubo", "random", "--n", "4", "-o", str(busy)],
        "sweep": ["sweep", "-i", "synthetic:8:0", "-s", "sa", "-m", "2", "--out", str(busy)],
    }
    with output_lock(busy):  # a run in progress (this process) holds it
        for args in commands.values():
            _refused(_run(*args), busy, f"another CBO run (process {os.getpid()})")
    assert not (tmp_path / ".busy.cbo-lock").exists()
    for name, args in commands.items():  # free again: each command gets past the rule to its (mocked) work
        res = _run(*args)
        assert isinstance(res.exception, WorkStarted) or "model.gguf" in res.output, (name, res.output)
        assert not (tmp_path / ".busy.cbo-lock").exists(), name  # released after the run
        assert not busy.exists(), name


def _tiny_report(with_qubo: bool, removed: int = 1):
    from tiny_models import build_tiny_model

    from cbo.pipeline.reports import DepthReport, ValidatedState
    from cbo.qubo.block_qubo import BlockQUBO
    from cbo.surgery.depth import remove_blocks

    model = build_tiny_model("llama", n_layers=3)
    names = [f"layers.{removed}"]
    return DepthReport(
        model_name="tiny", method="cbo" if with_qubo else "block_influence", remove=1, n_blocks=3,
        granularity="layer", estimator=None, loss=None, solver=None,
        qubo=BlockQUBO(np.diag([3.0, 1.0, 2.0]), names=["layers.0", "layers.1", "layers.2"]) if with_qubo else None,
        states=None, validation=[ValidatedState(None, [removed], names, None, 0.1, 12.0, 0.9)], chosen_rank=None,
        chosen_blocks=[removed], chosen_names=names, pruned_model=remove_blocks(model, [removed]), tokenizer=None,
        original_metrics={"ppl": 10.0}, pruned_metrics={"ppl": 12.0, "kl": 0.1}, timings={},
    )  # fmt: skip


def test_a_save_lists_everything_it_writes_and_removes_an_earlier_runs_qubo(tmp_path):
    """report.json and qubo.cboq were written after the staging, unlisted: a later run into the folder left the old
    QUBO beside its own model. Everything now goes through the staging and is listed."""
    out = tmp_path / "out"
    _tiny_report(with_qubo=True).save_model(out)
    listed = json.loads((out / WRITTEN_MARKER).read_text())["files"]
    assert {"report.json", "qubo.cboq", "config.json", "model.safetensors"} <= set(listed)
    _tiny_report(with_qubo=False).save_model(out)
    assert not (out / "qubo.cboq").exists()
    assert json.loads((out / "report.json").read_text())["method"] == "block_influence"
    assert "report.json" in json.loads((out / WRITTEN_MARKER).read_text())["files"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".staging", ".cbo-lock"))]


def test_the_tasks_and_the_plots_of_prune_are_listed_too(tmp_path):
    """`cbo prune --tasks` wrote tasks.json and `--plots` its images straight into their folders, after the save."""
    out = tmp_path / "out"
    _tiny_report(with_qubo=True).save_model(out, extra_files={"tasks.json": "{}\n"})
    assert "tasks.json" in json.loads((out / WRITTEN_MARKER).read_text())["files"]
    _tiny_report(with_qubo=True).save_model(out)
    assert not (out / "tasks.json").exists()
    source = (REPO / "cbo" / "cli" / "model_cmds.py").read_text()
    assert "with output_folder(plots) as staging:" in source


def test_a_failed_save_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    """The model was moved in before report.json was written: a failure there left a new model beside the old
    report."""
    out = tmp_path / "out"
    _tiny_report(with_qubo=True, removed=1).save_model(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    report = _tiny_report(with_qubo=False, removed=0)

    def broken(self, path):
        raise OSError("No space left on device")

    monkeypatch.setattr(type(report), "save", broken)
    with pytest.raises(OSError, match="No space left"):
        report.save_model(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_written_files_get_the_mode_the_umask_gives(umask, tmp_path):
    """Weights, report.json and states files were 0600 beside a 0644 config.json (temporary files are 0600)."""
    from cbo.files import atomic_write_text
    from cbo.qubo.block_qubo import BlockQUBO
    from cbo.solvers import solve

    previous = os.umask(umask)
    try:
        out = tmp_path / "out"
        _tiny_report(with_qubo=True).save_model(out)
        atomic_write_text(tmp_path / "plain.txt", "x")
        solve(BlockQUBO(np.diag([3.0, 1.0, 2.0])), 1, "enumerate", 2).save(tmp_path / "states.json")
    finally:
        os.umask(previous)
    want = 0o666 & ~umask
    files = [*out.iterdir(), tmp_path / "plain.txt", tmp_path / "states.json"]
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in files if p.is_file()}
    assert set(modes.values()) == {oct(want)}, modes
    assert {"model.safetensors", "report.json", "qubo.cboq", "config.json", WRITTEN_MARKER} <= set(modes)


def test_a_later_save_removes_what_a_killed_run_left(tmp_path):
    """A staging folder and a lock left by a run that was killed are removed by the next save of that folder; the
    staging folder of another output beside it is kept."""
    from tiny_models import build_tiny_model

    from cbo.surgery.io import save_pruned

    out = tmp_path / "pruned"
    left = [tmp_path / ".pruned.abc_1234.staging", tmp_path / ".pruned-abcd1234.staging"]  # today's and older names
    kept = [tmp_path / ".pruned.v2.abcd1234.staging", tmp_path / ".pruned-v2-abcd1234.staging"]
    for folder in left + kept:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x" * 100)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".pruned.cbo-lock").write_text(ended.stdout.strip())
    save_pruned(build_tiny_model("llama", n_layers=2), out)
    assert (out / "config.json").is_file()
    assert not any(f.exists() for f in left) and all(f.exists() for f in kept)
    assert not (tmp_path / ".pruned.cbo-lock").exists()


SIGTERM_DURING_SAVE = """
import os, signal, sys, time
from pathlib import Path
from cbo.cli import stop_on_sigterm
from cbo.files import output_folder

stop_on_sigterm()
out = Path(sys.argv[1])
try:
    with output_folder(out) as staging:
        (staging / "model.safetensors").write_bytes(b"x" * 10000)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
except KeyboardInterrupt:
    sys.exit(130)
"""

SIGTERM_IN_A_COMMAND = """
import os, signal, sys, time
import cbo.cli
import cbo.qubo.instances

def terminated(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)

cbo.qubo.instances.random_block_qubo = terminated
sys.argv = ["cbo", "qubo", "random", "--n", "4", "-o", sys.argv[1]]
cbo.cli.main()
"""


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("script", [SIGTERM_DURING_SAVE, SIGTERM_IN_A_COMMAND], ids=["save", "command"])
def test_sigterm_ends_a_run_as_ctrl_c_does(script, tmp_path):
    """SIGTERM during a save left a hidden staging folder (the model's size) and the lock; it now unwinds as
    Ctrl-C does: nothing is left but what was there before."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(out)], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode not in (0, -signal.SIGTERM), (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], res.stderr
