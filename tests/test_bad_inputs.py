"""Bad input as a new user gives it (the "also" list of issue 18), one row each: every case ends in a clear
CBOError that names the bad value and the fix, before any long work, or in the warning or behaviour stated.

The rows on the command line run on a tiny model folder (a word-level tokenizer, 128 positions), so they take
seconds; the long work that must not start is replaced by a function that raises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import save_word_model
from tiny_texts import word_texts
from typer.testing import CliRunner

import cbo
from cbo.cli import app, register_commands
from cbo.data.windows import make_splits
from cbo.errors import CBOError, DataError, InvalidQUBOError, UnknownSolverError
from cbo.qubo.instances import random_block_qubo

register_commands()
ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--seq-len", "16", "--n-calibration", "4", "--n-validation", "2", "--batch-size", "2"]


class WorkStarted(Exception):
    """The long work started although the input was bad."""


def _forbid(*args, **kwargs):
    raise WorkStarted("the long work started before the input was checked")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Llama folder (6 layers, 128 positions) with its tokenizer, and a folder of text for it."""
    root = tmp_path_factory.mktemp("bad-inputs")
    model, tok = save_word_model(root / "tiny-model", n_layers=6)
    return root / "tiny-model", word_texts(root / "text", 400), model, tok


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "300"})


def _subprocess_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300", "OMP_NUM_THREADS": "1"}
    code = "from cbo.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600)


# ---------------------------------------------------------------------------------------------- the table
def row_seq_len_beyond_positions(folder, monkeypatch):
    """--seq-len beyond the model's positions: a DataError naming both numbers and the option, before work."""
    path, text, model, tok = folder
    import cbo.hessian
    from cbo.hessian import driver

    monkeypatch.setattr(cbo.hessian, "estimate_hessian", _forbid)
    res = _cli("hessian", str(path), "-o", "unused.cboq", "--text", str(text), "--seq-len", "200", "--no-cache")
    assert res.exit_code == 2 and not isinstance(res.exception, WorkStarted), res.output
    assert "seq_len=200" in res.output and "128 positions" in res.output and "--seq-len 128" in res.output
    with pytest.raises(DataError, match=r"seq_len=129 is beyond the 128 positions"):  # the API, raw windows
        driver.estimate_hessian(model, None, torch.zeros(2, 129, dtype=torch.long), progress=False)
    with pytest.raises(DataError, match=r"seq_len=500 .*use --seq-len 128"):
        make_splits(tok, str(text), seq_len=500, n_calibration=2, n_validation=0, n_test=0, model=model)


def row_nul_bytes_warn(folder, monkeypatch):
    """4000 NUL bytes as text: a warning that names the document and says it looks like binary data."""
    from cbo.data.windows import load_documents

    with pytest.warns(UserWarning, match=r"'junk' holds 4000 control characters \(4000 NUL\).*binary data"):
        load_documents([("junk", "\0" * 4000)])
    with pytest.warns(UserWarning, match="binary data"):
        load_documents(["ordinary words " * 50 + "\0"])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_documents(["Tabs\tand\nnew lines\r\n and form feeds\f are text. " * 40])


def row_unknown_solver_before_the_hessian(folder, monkeypatch):
    """An unknown solver is reported before the Hessian is estimated."""
    path, text, model, tok = folder
    import cbo.pipeline.depth

    monkeypatch.setattr(cbo.pipeline.depth, "estimate_hessian", _forbid, raising=False)
    monkeypatch.setattr(cbo.hessian, "estimate_hessian", _forbid)
    res = _cli("prune", str(path), "--text", str(text), "--solver", "nope", "--remove", "2", "--no-cache", *SMALL)
    assert res.exit_code == 2 and not isinstance(res.exception, WorkStarted), res.output
    assert "'nope'" in res.output and "enumerate" in res.output  # names the value and what would be valid
    with pytest.raises(UnknownSolverError):
        cbo.solve(random_block_qubo(6, 0), 2, "nope")


def row_huge_values_are_refused(folder, monkeypatch):
    """Values of 1e308 overflow after symmetrizing: an InvalidQUBOError naming the entry, not inf later."""
    H = np.zeros((3, 3))
    H[0, 1] = H[1, 0] = 1e308
    with pytest.raises(InvalidQUBOError, match="finite|overflow|large"):
        cbo.BlockQUBO(H * 1.5, np.zeros(3))


def row_keep_as_a_scalar_and_a_name(folder, monkeypatch):
    """keep=3 is one block, and keep="layers.3" is one block name (not read letter by letter)."""
    names = [f"layers.{i}" for i in range(6)]
    q = random_block_qubo(6, 0)
    q = cbo.BlockQUBO(q.H, q.g, names=names)
    for keep in (3, "layers.3", [3]):
        states = cbo.solve(q, 5, "enumerate", k=1, keep=keep)
        assert list(states[0].removed) == [0, 1, 2, 4, 5], keep
    with pytest.raises(CBOError, match="layers.9"):
        cbo.solve(q, 2, "enumerate", keep="layers.9")


def row_quiet_prints_no_progress(folder, monkeypatch):
    """`-q` leaves no progress line (no transformers loading bar, no estimator or validation bar) on stderr."""
    path, text, model, tok = folder
    res = _subprocess_cli(
        "prune",
        str(path),
        "--text",
        str(text),
        "--remove",
        "2",
        "--estimator",
        "fisher",
        "--top",
        "2",
        "--validate",
        "2",
        "--no-cache",
        "-q",
        *SMALL,
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == "", res.stderr
    assert "removed" in res.stdout.lower() or "layers." in res.stdout, res.stdout


def row_ctrl_c_in_prune_says_what_is_kept(folder, monkeypatch, tmp_path):
    """Ctrl-C during `cbo prune`: exit 130, saying the finished work is kept in the cache and how to resume."""
    import cbo.pipeline

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home[x]"))
    monkeypatch.setattr(cbo.pipeline, "prune_depth", interrupted)
    model = str(folder[0])  # a local folder: `cbo prune` loads it before the (interrupted) pipeline
    res = _cli("prune", model, "--remove", "2")
    assert res.exit_code == 130, res.output
    assert "kept in" in res.output and str(tmp_path / "home[x]" / "cache") in res.output
    assert "run the same command again to resume" in res.output
    res = _cli("prune", model, "--remove", "2", "--no-cache")
    assert res.exit_code == 130 and "nothing is kept" in res.output, res.output


# ------------------------------------------------------------------------- issue 27 (second round)
def row_string_tokenizer_is_resolved_or_refused(folder, monkeypatch):
    """A tokenizer given as a string: a model folder loads its tokenizer; anything else is a DataError that shows
    the string shortened (it raised LookupError "unknown encoding: <the whole text>")."""
    path, text, model, tok = folder
    import cbo.pipeline.depth

    monkeypatch.setattr(cbo.pipeline.depth, "estimate_and_solve", _forbid)
    with pytest.raises(WorkStarted):  # the folder's tokenizer cut the text: the work was reached
        cbo.prune_depth(model, str(path), text=str(text), remove=2, cache_dir=None, progress=False,
                        seq_len=16, n_calibration=4, n_validation=2)  # fmt: skip
    long = "It is a truth universally acknowledged. " * 200
    for bad, match in (("tiny6\n", "tokenizer='tiny6\\\\n' is not a model name"), (long, r"… \(8000 characters\)"),
                       (str(path / "missing"), "cannot load a tokenizer")):  # fmt: skip
        with pytest.raises(DataError, match=match) as info:
            cbo.prune_depth(model, bad, text=str(text), remove=2, cache_dir=None, progress=False)
        assert len(str(info.value)) < 1000


def row_python_api_values_are_cbo_errors(folder, monkeypatch):
    """Wrong types and impossible values in the Python API are CBOErrors naming the option (they were TypeError,
    AssertionError, OSError with the whole text, or a complex H silently made real)."""
    path, text, model, tok = folder
    q = random_block_qubo(6, 0)
    for kwargs, match in (({"seed": "x"}, "seed must be an integer in 0..4294967295, got 'x' \\(a str\\)"),
                          ({"time_limit": "1"}, "time_limit \\(seconds\\) must be a number > 0 or None, got '1'"),
                          ({"k": 2.5}, "k must be an integer >= 1, got 2.5")):  # fmt: skip
        with pytest.raises(CBOError, match=match):
            cbo.solve(q, 2, "enumerate", **kwargs)
    kw = dict(remove=2, cache_dir=None, progress=False)
    for kwargs, match in (
        ({"seq_len": 32.5}, r"seq_len \(tokens per window, --seq-len\) must be an integer >= 2, got 32.5"),
        ({"n_calibration": 0}, r"n_calibration \(calibration windows, --n-calibration\) must be an integer >= 1"),
        ({"device": "cuda:7"}, "device 'cuda:7'"),
        ({"device": "nonsense"}, "is not a torch device"),
        ({"dtype": "float13"}, "dtype .* must be one of 'float32', 'bfloat16', 'float16', 'float64'; got 'float13'"),
        ({"text": "A long raw text. " * 2000}, r"text source 'A long raw text.*… \(34000 characters\) is not an"),
    ):
        with pytest.raises(CBOError, match=match) as info:
            cbo.prune_depth(model, tok, **{"text": str(text), **kw, **kwargs})
        assert len(str(info.value)) < 1000
    H = np.eye(3) + 1j * np.eye(3)
    with pytest.raises(InvalidQUBOError, match="H holds complex numbers"):
        cbo.BlockQUBO(H)
    with pytest.raises(InvalidQUBOError, match="g holds complex numbers"):
        cbo.BlockQUBO(np.eye(2), [1j, 0])


def row_qubo_random_ranges_and_memory(folder, monkeypatch, tmp_path):
    """`qubo random --rank -2` / `--rank 0` and `--n 100000` are refused before any array is drawn, naming the
    option and, for sizes, the memory they need (they raised ValueError, printed "H contains nan", or tried to
    allocate 74.5 GiB)."""
    import cbo.checks

    out = str(tmp_path / "q.cboq")
    for rank in ("-2", "0"):
        res = _cli("qubo", "random", "--n", "8", "--rank", rank, "-o", out)
        assert res.exit_code == 2 and f"rank (of the coupling) must be an integer in 1..8, got {rank}" in res.output
    res = _cli("qubo", "random", "--n", "100000", "-o", out)
    assert res.exit_code == 2 and "n=100000 blocks needs about 605.4 GiB of memory" in res.output, res.output
    monkeypatch.setattr(cbo.checks, "available_memory", lambda: 2**30)  # whatever this machine has
    with pytest.raises(InvalidQUBOError, match=r"n=5000 blocks needs about 1.5 GiB of memory, but 1.0 GiB"):
        random_block_qubo(5000, 0)
    from cbo.qubo.instances import fisher_block_qubo

    with pytest.raises(InvalidQUBOError, match=r"n=5000 blocks needs about"):
        fisher_block_qubo(5000, 0)
    assert not os.path.exists(out)


def row_prune_outputs_locked_ratio_needs_width_and_tokenizer_named(folder, monkeypatch, tmp_path):
    """Two `cbo prune` runs into the same --out at once: the second is refused before its work (both reported
    success); a lock left by a run that ended is taken over. `--ratio` without `--width` is refused (it silently
    did width pruning). A saved folder is reported with its tokenizer (the line said only model and report)."""
    import cbo.pipeline
    from cbo.files import output_lock

    path, text, model, tok = folder
    out = tmp_path / "pruned"
    args = ["prune", str(path), "--text", str(text), "--remove", "2", "--no-cache", "--out", str(out), *SMALL]
    with output_lock(out):  # a run in progress (this process) holds the folder
        with monkeypatch.context() as m:
            m.setattr(cbo.pipeline, "prune_depth", _forbid)
            res = _cli(*args)
    assert res.exit_code == 2 and not isinstance(res.exception, WorkStarted), res.output
    assert "another CBO run (process" in res.output and str(out) in res.output
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".pruned.cbo-lock").write_text(ended.stdout.strip())  # left by a process that has ended
    res = _cli(*args, "--top", "2", "--validate", "2", "-q")
    assert res.exit_code == 0, res.output
    assert "saved the pruned model, its tokenizer and report.json" in " ".join(res.output.split())
    assert not (tmp_path / ".pruned.cbo-lock").exists()
    res = _cli("prune", str(path), "--ratio", "0.2", "--no-cache")
    assert res.exit_code == 2 and "--ratio 0.2 is a width-pruning fraction: give --width NAME" in res.output


def row_remove_out_of_range_says_one_rule(folder, monkeypatch, tmp_path):
    """A removal count out of range gets one message with one range, however far off (`cbo solve` said "M must be
    in 0..6" where `cbo prune` said "use 1..5"), and a range it states is one it accepts (with every block kept:
    "use 0..0", and M = 0 solves)."""
    six, kept = tmp_path / "six.cboq", tmp_path / "kept.cboq"
    cbo.BlockQUBO(np.diag([3.0, 1.0, 2.0, 1.0, 1.0, 1.0])).save(six)
    cbo.BlockQUBO(np.diag([3.0, 1.0, 2.0]), keep=[0, 1, 2]).save(kept)
    for m in ("7", "30", "-1"):
        res = _cli("solve", str(six), "--remove", m)
        assert res.exit_code != 0 and f"remove={m} is out of range: the QUBO has 6 blocks; use 0..6." in res.output
    res = _cli("solve", str(kept), "--remove", "1")
    assert "remove=1 is out of range: the QUBO has 3 blocks, 3 of them kept; use 0..0." in res.output, res.output
    assert _cli("solve", str(kept), "--remove", "0").exit_code == 0
    path, text, model, tok = folder
    from cbo import baselines

    for m in (6, 30):
        with pytest.raises(CBOError, match=f"max_remove={m} is out of range: the model has 6 blocks; use 1..5."):
            baselines.rank_blocks("block_influence", model, torch.zeros(2, 8, dtype=torch.long), max_remove=m)


def row_window_counts_name_their_option(folder, monkeypatch, tmp_path):
    """`cbo hessian --n-calibration 0` names the option before the model loads (it loaded the model, cut windows and
    said "window counts must be >= 0 and not all 0"); make_splits names the option of a bad count too."""
    import cbo.model.loading

    path, text, model, tok = folder
    with monkeypatch.context() as m:
        m.setattr(cbo.model.loading, "load_model", _forbid)
        res = _cli("hessian", str(path), "-o", str(tmp_path / "q.cboq"), "--text", str(text), "--n-calibration", "0")
    assert res.exit_code == 2 and not isinstance(res.exception, WorkStarted), res.output
    assert "n_calibration (calibration windows, --n-calibration) must be an integer >= 1, got 0" in res.output
    for kwargs, match in (({"n_validation": -1}, r"n_validation \(validation windows, --n-validation\)"),
                          ({"n_calibration": 0, "n_validation": 0}, "are all 0: ask for at least one window")):  # fmt: skip
        with pytest.raises(DataError, match=match):
            make_splits(tok, str(text), **{"seq_len": 16, "n_calibration": 2, "n_validation": 2, "n_test": 0, **kwargs})


ROWS = [v for k, v in sorted(globals().items()) if k.startswith("row_")]


@pytest.mark.parametrize("row", ROWS, ids=[r.__name__[4:] for r in ROWS])
def test_bad_input(row, folder, monkeypatch, tmp_path):
    kwargs = {"tmp_path": tmp_path} if "tmp_path" in row.__code__.co_varnames[: row.__code__.co_argcount] else {}
    row(folder, monkeypatch, **kwargs)
