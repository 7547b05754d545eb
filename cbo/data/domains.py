"""Test domains that are not Austen: text that benchmarks measure and no choice ever sees.

The pipeline's calibration, validation and final selection read the Austen novels only; a method that chose well
on them should also hold on prose of another kind. A test domain is installed once into
``CBO_HOME/text/<name>/`` (``cbo setup`` does it) and read by :func:`load_test_domain` as test windows only.

Domains:

* ``pydocs``: the Python 3.11 documentation (tutorial, FAQ, HOWTOs, language reference), English prose extracted
  from the reStructuredText sources in the Debian package ``python3.11-doc`` (:mod:`cbo.data.pydocs`); Python
  Software Foundation License Version 2.

Example:
    >>> ensure_domain_text("pydocs")                                           # doctest: +SKIP
    >>> windows = load_test_domain("pydocs", tokenizer, n=64, seq_len=128)      # doctest: +SKIP
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cbo.data.convert import MANIFEST
from cbo.errors import DataError
from cbo.model.loading import cbo_home, staged_folder, writable_dir


@dataclass(frozen=True)
class Domain:
    """A test domain: where its text comes from and under what licence."""

    name: str
    package: str
    licence: str
    description: str


DOMAINS = {
    "pydocs": Domain(
        "pydocs",
        "python3.11-doc",
        "Python Software Foundation License Version 2 (documentation © Python Software Foundation)",
        "the Python 3.11 tutorial, FAQ, HOWTOs and language reference (English prose, code removed)",
    ),
}


def check_domain(name: str) -> Domain:
    if name not in DOMAINS:
        raise DataError(f"unknown test domain {name!r}; known: {sorted(DOMAINS)}.")
    return DOMAINS[name]


def domain_dir(name: str) -> Path:
    """Where a test domain is installed: ``CBO_HOME/text/<name>``."""
    return cbo_home() / "text" / check_domain(name).name


def domain_installed(name: str) -> bool:
    folder = domain_dir(name)
    return (folder / MANIFEST).is_file() and any(folder.rglob("*.txt"))


def ensure_domain_text(name: str = "pydocs", progress: bool = True, deb: str | Path | None = None) -> Path:
    """Install a test domain's text as one ``.txt`` file per page; returns its folder (idempotent).

    Args:
        name: the domain (:data:`DOMAINS`).
        progress: print what happens.
        deb: an already downloaded .deb of the domain's package (default: download it with apt-get).

    Raises:
        SourceUnavailableError: the Debian package cannot be downloaded.
        DataError: the package holds no text of the domain.
    """
    from cbo.data import assets
    from cbo.data.pydocs import read_doc_sources, rst_to_prose

    domain = check_domain(name)
    target = domain_dir(name)
    if domain_installed(name):
        assets.say(progress, f"text: test domain {name} already installed in {target}")
        return target
    parent = writable_dir(target.parent, "text cache")
    with assets.install_lock(parent, name):
        if domain_installed(name):
            return target
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="cbo-deb-") as tmp:
            if deb is None:
                assets.say(progress, f"text: downloading the Debian package {domain.package}")
                deb_path = assets.apt_download(domain.package, Path(tmp), progress)
            else:
                deb_path = Path(deb)
            pages = read_doc_sources(deb_path)
            source = deb_path.name
        words = {}
        with staged_folder(target, "text cache") as staging:
            for page, rst in pages.items():
                text = rst_to_prose(rst)
                if not text.strip():
                    continue
                path = staging / f"{page}.txt"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                words[page] = len(text.split())
            if not words:
                raise DataError(f"{source} holds no prose for the test domain {name!r}.")
            manifest = {
                "domain": name,
                "source": f"Debian package {domain.package} ({source})",
                "licence": domain.licence,
                "description": domain.description,
                "words": words,
                "total_words": sum(words.values()),
            }
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    assets.say(
        progress,
        f"text: wrote {len(words)} pages ({sum(words.values()):,} words) of {name} to {target} "
        f"({time.perf_counter() - t0:.1f} s)",
    )
    return target


def load_test_domain(
    name: str, tokenizer: Any, *, n: int = 64, seq_len: int = 128, seed: int = 0, model: Any = None
) -> Any:
    """``n`` test windows of ``seq_len`` tokens from an installed test domain (for benchmarks; no choice reads them).

    The windows are drawn as :func:`cbo.data.windows.make_splits` draws a test split (whole pages, in a random
    order fixed by ``seed``; each window starts as the tokenizer starts a text).

    Raises:
        DataError: the domain is not installed (says how to install it), or holds too little text.
    """
    from cbo.data.windows import make_splits

    folder = domain_dir(name)
    if not domain_installed(name):
        raise DataError(
            f"the test domain {name!r} is not installed in {folder}; run `cbo setup` (or "
            f"cbo.data.domains.ensure_domain_text({name!r}))."
        )
    splits = make_splits(
        tokenizer, folder, seq_len=seq_len, n_calibration=0, n_validation=0, n_test=n, seed=seed, model=model
    )
    return splits.test


__all__ = ["DOMAINS", "Domain", "domain_dir", "domain_installed", "ensure_domain_text", "load_test_domain"]
