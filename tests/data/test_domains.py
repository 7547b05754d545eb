"""The test domain that is not Austen (``cbo.data.domains``, ``cbo.data.pydocs``), from a tiny .deb built here
(no network)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from cbo.data.convert import MANIFEST
from cbo.data.domains import domain_dir, ensure_domain_text, load_test_domain
from cbo.data.pydocs import SOURCES_DIR, read_doc_sources, rst_to_prose
from cbo.errors import DataError

PAGE = """\
.. _tut-intro:

**********************
Whetting Your Appetite
**********************

If you do much work on computers, eventually you find that there's some task
you'd like to automate.  Perhaps you'd like to write a small :func:`custom <print>`
database, or a *specialized* GUI application, or a simple game.

For example, the :keyword:`!for` statement iterates over the items::

   for x in range(3):
       print(x)

.. code-block:: python

   import this

>>> 1 + 1
2

=====  =====
a      b
=====  =====
1      2
=====  =====

.. note::

   The ``print`` function writes to `standard output <https://example.org>`_.

* statement grouping is done by indentation instead of beginning and ending
  brackets;

.. index:: single: whatever
"""


def make_deb(path: Path, files: dict[str, str]) -> Path:
    """A minimal Debian package (ar archive: debian-binary, control.tar.xz, data.tar.xz) holding ``files``."""

    def tar_xz(entries: dict[str, bytes]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:xz") as tar:
            for name, data in entries.items():
                info = tarfile.TarInfo("./" + name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    members = {
        "debian-binary": b"2.0\n",
        "control.tar.xz": tar_xz({"control": b"Package: python3.11-doc\n"}),
        "data.tar.xz": tar_xz({name: text.encode() for name, text in files.items()}),
    }
    out = bytearray(b"!<arch>\n")
    for name, data in members.items():
        out += f"{name + '/':16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    path.write_bytes(bytes(out))
    return path


@pytest.fixture
def doc_deb(tmp_path):
    from tiny_texts import synthetic_novel

    prose = "\n\n".join(p.replace("\n", " ") for p in synthetic_novel(n_chapters=2, n_paragraphs=10).split("\n\n"))
    files = {
        SOURCES_DIR + "tutorial/appetite.rst.txt": PAGE,
        SOURCES_DIR + "faq/general.rst.txt": "General FAQ\n===========\n\n" + prose,
        SOURCES_DIR + "library/os.rst.txt": "The os module\n=============\n\nNot one of the prose sections at all.\n",
    }
    return make_deb(tmp_path / "python3.11-doc_3.11.2-6_all.deb", files)


def test_rst_to_prose_keeps_the_prose_and_drops_code_tables_and_markup():
    text = rst_to_prose(PAGE)
    paragraphs = text.strip().split("\n\n")
    assert paragraphs[0] == "Whetting Your Appetite"
    assert "small custom database, or a specialized GUI application" in text
    assert "For example, the for statement iterates over the items:" in text
    assert "The print function writes to standard output." in text
    assert "statement grouping is done by indentation instead of beginning and ending brackets;" in text
    for code in ("range(3)", "import this", ">>>", "=====", "tut-intro", "whatever", ":func:", "``", "**"):
        assert code not in text, code


def test_read_doc_sources_reads_the_prose_sections_of_the_package(doc_deb):
    pages = read_doc_sources(doc_deb)
    assert sorted(pages) == ["faq/general", "tutorial/appetite"]  # not the library reference
    with pytest.raises(DataError, match="no documentation sources"):
        read_doc_sources(doc_deb, sections=("whatsnew",))


def test_ensure_domain_text_installs_once_and_load_test_domain_draws_windows(doc_deb, cbo_home, monkeypatch):
    from tiny_tokenizers import byte_level_tokenizer

    from cbo.data import assets

    with pytest.raises(DataError, match="cbo setup"):
        load_test_domain("pydocs", byte_level_tokenizer())
    folder = ensure_domain_text("pydocs", progress=False, deb=doc_deb)
    assert folder == domain_dir("pydocs") and folder.is_relative_to(cbo_home)
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*.txt")) == [
        "faq/general.txt",
        "tutorial/appetite.txt",
    ]
    manifest = json.loads((folder / MANIFEST).read_text())
    assert "Python Software Foundation" in manifest["licence"] and "python3.11-doc" in manifest["source"]

    def no_network(*args, **kwargs):
        raise AssertionError("an installed domain is not downloaded again")

    monkeypatch.setattr(assets, "apt_download", no_network)
    assert ensure_domain_text("pydocs", progress=False) == folder

    tokenizer = byte_level_tokenizer()
    windows = load_test_domain("pydocs", tokenizer, n=8, seq_len=32, seed=0)
    assert windows.shape == (8, 32)
    again = load_test_domain("pydocs", tokenizer, n=8, seq_len=32, seed=0)
    assert (windows == again).all()
    text = tokenizer.decode(windows[0])
    assert all(c.isprintable() or c.isspace() for c in text)
    with pytest.raises(DataError, match="unknown test domain"):
        load_test_domain("wikipedia", tokenizer)
