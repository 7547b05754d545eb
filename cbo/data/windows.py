"""Text sources -> fixed-length token windows, split into calibration / validation / test by document.

Sources: a text file, a folder of text files (``.txt``, ``.md``, ``.jsonl``), a JSONL file (one object with a
``"text"`` field per line), a list of strings, or a ``datasets.Dataset`` with a ``"text"`` column. ``None``
means the default text: the six Austen novels installed by ``make setup`` (calibration from *Emma*,
validation from *Mansfield Park*, test from *Persuasion*).

Every window follows the tokenizer's own convention for the start of a sequence: where the tokenizer puts a
beginning-of-sequence token before a text (Gemma, Llama 2/3, ...), each window starts with it and holds
``seq_len - 1`` text tokens; where it adds none (SmolLM2, GPT-2, Qwen), a window is ``seq_len`` text tokens.

Example:
    >>> splits = make_splits(tokenizer, seq_len=128, n_calibration=32)   # doctest: +SKIP
    >>> splits.calibration.shape                                            # doctest: +SKIP
    torch.Size([32, 128])
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbo.checks import check_int, is_int
from cbo.data import assets
from cbo.errors import DataError
from cbo.extras import require

torch = require("torch", "token windows")

TEXT_SUFFIXES = (".txt", ".text", ".md", ".jsonl")
SPLITS = ("calibration", "validation", "test")
SPLIT_BY = ("document", "contiguous")


@dataclass
class TokenSplits:
    """Token windows for calibration, validation and test (each ``(B, T)`` int64), never overlapping."""

    calibration: Any
    validation: Any
    test: Any
    info: dict = field(default_factory=dict)  # documents per split, seq_len, data hash, tokenizer name, ...

    def __getitem__(self, split: str) -> Any:
        if split not in SPLITS:
            raise KeyError(f"unknown split {split!r}; use one of {SPLITS}")
        return getattr(self, split)


# ------------------------------------------------------------------------------------------- sources


def _read_jsonl(path: Path) -> list[tuple[str, str]]:
    docs = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno} is not valid JSON ({exc.msg})") from exc
            if isinstance(obj, str):
                text = obj
            elif isinstance(obj, dict) and isinstance(obj.get("text"), str):
                text = obj["text"]
            else:
                raise DataError(f"{path}:{lineno} has no string field 'text' (JSONL lines must be {{\"text\": ...}})")
            docs.append((f"{path.stem}:{lineno}", text))
    return docs


def _read_file(path: Path) -> list[tuple[str, str]]:
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    try:
        return [(path.stem, path.read_text(encoding="utf-8"))]
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def _is_dataset(obj: Any) -> bool:
    return hasattr(obj, "column_names") and hasattr(obj, "__getitem__") and not isinstance(obj, (str, bytes))


def load_documents(source: Any) -> list[tuple[str, str]]:
    """Documents ``(name, text)`` of a text source.

    Args:
        source: a file path (text or ``.jsonl``), a folder (its ``.txt``/``.text``/``.md``/``.jsonl`` files,
            sorted by path), a list of strings, or a ``datasets.Dataset`` with a ``"text"`` column;
            ``None`` for the default Austen folder.

    Raises:
        DataError: the source does not exist, has no text, or is of an unknown type.
    """
    if source is None:
        source = assets.default_text_path()
    if isinstance(source, (str, os.PathLike)):
        path = Path(source).expanduser()
        try:
            kind = "dir" if path.is_dir() else "file" if path.is_file() else None
        except OSError:  # a raw text passed as a path: "File name too long"
            kind = None
        if kind == "dir":
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
            if not files:
                raise DataError(f"folder {str(path)!r} has no text files ({', '.join(TEXT_SUFFIXES)})")
            docs = [d for p in files for d in _read_file(p)]
            if len({n for n, _ in docs}) < len(docs):  # same stem in two subfolders: use relative paths
                docs = [
                    (str(p.relative_to(path).with_suffix("")) + n[len(p.stem) :], t)
                    for p in files
                    for n, t in _read_file(p)
                ]
        elif kind == "file":
            docs = _read_file(path)
        else:
            hint = " (to use a string as text, pass it in a list: [text])" if isinstance(source, str) else ""
            raise DataError(f"text source {short_repr(source)} is not an existing file or folder{hint}")
    elif _is_dataset(source):
        names = source.column_names
        if isinstance(names, dict):  # a DatasetDict: one entry per split
            raise DataError(f"give one split of the dataset (e.g. ds['train']), not all of {sorted(names)}")
        if names is not None and "text" not in list(names):
            raise DataError(
                f"the dataset has no 'text' column (columns: {list(names)}); rename the column holding the text "
                "to 'text' (ds.rename_column(name, 'text'))"
            )
        texts = source["text"] if names is not None else (row.get("text") for row in source)  # iterable datasets
        docs = [(f"row{i}", str(t)) for i, t in enumerate(texts) if t is not None]
    elif isinstance(source, Sequence) and not isinstance(source, (bytes, bytearray)):
        docs = []
        for i, item in enumerate(source):
            if isinstance(item, str):
                docs.append((f"doc{i}", item))
            elif isinstance(item, dict) and isinstance(item.get("text"), str):
                docs.append((str(item.get("name", f"doc{i}")), item["text"]))
            elif isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
                docs.append(item)
            else:
                raise DataError(
                    f"text item {i} is a {type(item).__name__}; give strings, (name, text) or {{'text': ...}}"
                )
    else:
        raise DataError(
            f"unknown text source of type {type(source).__name__}; give a file, a folder, a .jsonl file, "
            "a list of strings or a datasets.Dataset with a 'text' column"
        )
    docs = [(n, t) for n, t in docs if t.strip()]
    if not docs:
        raise DataError(f"the text source {short_repr(source)} contains no text")
    warn_if_binary(docs)
    return docs


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr`` of ``str(value)``, cut to ``limit`` characters with the full length noted (never a whole text in
    an error message)."""
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


# control characters that do not occur in text (tab, newline, carriage return and form feed do)
_CONTROL = {chr(c) for c in range(32)} - set("\t\n\r\f") | {"\x7f"}


def warn_if_binary(docs: list[tuple[str, str]]) -> None:
    """Warn about documents with NUL bytes or many control characters: binary data read as text gives
    meaningless perplexities (and Hessians), so the user should know before trusting them."""
    for name, text in docs:
        bad = sum(text.count(c) for c in _CONTROL)
        if "\x00" in text or bad > 0.001 * len(text):
            warnings.warn(
                f"text {name!r} holds {bad} control characters ({text.count(chr(0))} NUL) in {len(text)}: it looks "
                "like binary data, not text; give a plain-text file (results measured on it mean little).",
                stacklevel=3,
            )


# ------------------------------------------------------------------------------------------ tokens


def tokenize(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (Hugging Face tokenizer or any callable/encoder)."""
    if _is_hf_tokenizer(tokenizer):
        out = tokenizer(text, add_special_tokens=False, return_attention_mask=False, verbose=False)
        return list(out["input_ids"])
    if hasattr(tokenizer, "encode"):
        return list(tokenizer.encode(text))
    if callable(tokenizer):
        out = tokenizer(text)
        return list(out["input_ids"] if isinstance(out, dict) else out)
    raise DataError(f"{type(tokenizer).__name__} is not a tokenizer (needs __call__ or encode)")


def _is_hf_tokenizer(tokenizer: Any) -> bool:
    return hasattr(tokenizer, "backend_tokenizer") or hasattr(tokenizer, "model_max_length")


def special_prefix(tokenizer: Any) -> list[int]:
    """The ids a tokenizer puts before every text on its own (``[bos_id]`` for Gemma or Llama 3; ``[]`` for
    SmolLM2, GPT-2 or a plain encoder).

    Read from the tokenizer itself: what ``tokenizer(text)`` adds in front of ``tokenizer(text,
    add_special_tokens=False)``. Tokenizers that are not Hugging Face tokenizers add nothing.

    Example:
        >>> special_prefix(AutoTokenizer.from_pretrained(gemma_folder))   # doctest: +SKIP
        [2]
    """
    if not _is_hf_tokenizer(tokenizer):
        return []
    probe = "a"
    plain = list(tokenizer(probe, add_special_tokens=False, return_attention_mask=False)["input_ids"])
    full = list(tokenizer(probe, return_attention_mask=False)["input_ids"])
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start]
    return []


def window_prefix(tokenizer: Any, bos: bool | None = None) -> list[int]:
    """The ids each token window starts with.

    Args:
        bos: ``None`` follows the tokenizer (:func:`special_prefix`); ``True`` starts every window with the
            tokenizer's ``bos_token_id``; ``False`` starts windows with text.

    Raises:
        DataError: ``bos=True`` for a tokenizer that has no beginning-of-sequence token.
    """
    if bos is None:
        return special_prefix(tokenizer)
    if not bos:
        return []
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if not isinstance(bos_id, int):
        raise DataError(
            f"tokenizer {tokenizer_name(tokenizer)!r} has no beginning-of-sequence token; use bos=None "
            "(follow the tokenizer) or bos=False"
        )
    return [bos_id]


def tokenizer_name(tokenizer: Any) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def data_hash(tensor: Any) -> str:
    """A short, stable hash of a token tensor (shape, dtype and values)."""
    t = tensor.detach().cpu().contiguous()
    h = hashlib.sha256(f"{tuple(t.shape)}|{t.dtype}".encode())
    h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def model_vocab_size(model: Any) -> int:
    """Rows of the model's input embedding (the largest valid token id + 1)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is not None and hasattr(emb, "num_embeddings"):
        return int(emb.num_embeddings)
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    if size is None:
        raise DataError(f"cannot tell the vocabulary size of {type(model).__name__}")
    return int(size)


def model_max_positions(model: Any) -> int | None:
    """The most positions the model was built for (``max_position_embeddings`` / ``n_positions``), or None."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, key, None)
        if is_int(value) and value > 0:
            return value
    return None


def check_seq_len(model: Any, seq_len: int) -> None:
    """DataError when windows of ``seq_len`` tokens are longer than the model's positions."""
    limit = model_max_positions(model)
    if limit is not None and seq_len > limit:
        raise DataError(
            f"seq_len={seq_len} is beyond the {limit} positions the model handles (max_position_embeddings); "
            f"use --seq-len {limit} (seq_len={limit}) or less."
        )


def check_tokenizer(model: Any, tokenizer: Any) -> None:
    """Raise DataError when ``tokenizer`` can produce ids the model has no embedding for."""
    vocab = model_vocab_size(model)
    n_tok = len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer, "vocab_size", None)
    if n_tok is not None and n_tok > vocab:
        raise DataError(
            f"tokenizer {tokenizer_name(tokenizer)!r} has {n_tok} tokens but model "
            f"{getattr(model, 'name_or_path', type(model).__name__)!r} embeds only {vocab}: they do not match. "
            "Load the tokenizer saved with the model (load_model returns both)."
        )


def check_windows(windows: Any, model: Any | None = None) -> Any:
    """Validate token windows: a 2-D integer tensor ``(B, T)``, ids in ``[0, vocab)`` when ``model`` is given.

    Returns the windows as int64. Raises DataError naming the problem.
    """
    if not isinstance(windows, torch.Tensor):
        raise DataError(f"token windows must be a torch.Tensor of shape (B, T), got {type(windows).__name__}")
    if windows.dtype.is_floating_point or windows.dtype == torch.bool or windows.dtype.is_complex:
        raise DataError(f"token windows must hold integer ids (int64), got dtype {windows.dtype}")
    if windows.dim() != 2 or windows.shape[0] == 0 or windows.shape[1] < 2:
        raise DataError(f"token windows must have shape (B, T) with B >= 1 and T >= 2, got {tuple(windows.shape)}")
    windows = windows.long()
    lo, hi = int(windows.min()), int(windows.max())
    if lo < 0:
        raise DataError(f"token windows contain a negative id ({lo})")
    if model is not None:
        check_seq_len(model, int(windows.shape[1]))
        vocab = model_vocab_size(model)
        if hi >= vocab:
            raise DataError(
                f"token id {hi} is out of range for a model with {vocab} embeddings: the windows were made "
                "with a different tokenizer than the model's"
            )
    return windows


# ------------------------------------------------------------------------------------------- splits


class _Doc:
    """A document whose tokens are computed on first use."""

    def __init__(self, name: str, text: str, tokenizer: Any):
        self.name, self.text, self._tok, self._ids = name, text, tokenizer, None

    @property
    def ids(self) -> list[int]:
        if self._ids is None:
            self._ids = tokenize(self._tok, self.text)
        return self._ids


def _join(docs: list[_Doc], sep: list[int]) -> list[int]:
    """The token streams of ``docs`` concatenated, separated by ``sep`` (the end-of-text token, if any)."""
    stream: list[int] = []
    for i, d in enumerate(docs):
        if i:
            stream += sep
        stream += d.ids
    return stream


def _sample_windows(stream: list[int], body: int, n: int, rng: random.Random, prefix: list[int]) -> Any:
    """``n`` distinct windows of ``prefix`` + ``body`` tokens of a stream (the bodies never overlap), chosen at
    random, kept in text order."""
    slots = len(stream) // body
    chosen = sorted(rng.sample(range(slots), n)) if n < slots else list(range(slots))
    if not chosen:
        return torch.empty((0, len(prefix) + body), dtype=torch.long)
    return torch.tensor([prefix + stream[k * body : (k + 1) * body] for k in chosen], dtype=torch.long)


def _assign_documents(
    docs: list[_Doc], wanted: dict[str, int], body: int, roles: dict | None, seed: int
) -> dict[str, list[_Doc]] | None:
    """Whole documents per split (windows of ``body`` text tokens); None when there are too few documents to give
    every split its own."""
    assigned: dict[str, list[_Doc]] = {s: [] for s in SPLITS}
    pool = list(docs)
    if roles is None:
        random.Random(seed).shuffle(pool)
    order = [s for s in ("test", "validation", "calibration") if wanted[s] > 0]
    for k, split in enumerate(order):
        preferred_names = (roles or {}).get(split, ())
        preferred = sorted((d for d in pool if d.name in preferred_names), key=lambda d: preferred_names.index(d.name))
        candidates = preferred + [d for d in pool if d not in preferred]
        have, n_later = 0, len(order) - k - 1
        for d in candidates:
            if have >= wanted[split] * body:
                break
            if assigned[split] and len(pool) <= n_later:
                break  # leave one document for each later split
            assigned[split].append(d)
            pool.remove(d)
            have += len(d.ids)
        if have < body:
            return None
    return assigned


def make_splits(
    tokenizer: Any,
    source: Any = None,
    *,
    seq_len: int = 128,
    n_calibration: int = 32,
    n_validation: int = 32,
    n_test: int = 64,
    split_by: str = "document",
    seed: int = 0,
    model: Any | None = None,
    bos: bool | None = None,
) -> TokenSplits:
    """Tokenize a text source and cut it into calibration / validation / test windows of ``seq_len`` tokens.

    Args:
        tokenizer: the model's tokenizer.
        source: see :func:`load_documents`; ``None`` is the default Austen text.
        seq_len: tokens per window, the beginning-of-sequence token included where there is one.
        n_calibration, n_validation, n_test: windows per split (0 leaves a split empty).
        split_by: ``"document"`` (each document goes wholly to one split; falls back to ``"contiguous"`` with a
            warning when there are too few documents) or ``"contiguous"`` (the concatenated token stream is
            cut into consecutive regions: calibration first, then validation, then test).
        seed: chooses which windows (and, for non-default sources, which documents) each split gets.
        model: if given, the tokenizer is checked against it.
        bos: what each window starts with (see :func:`window_prefix`): ``None`` (default) follows the
            tokenizer, ``True`` forces its beginning-of-sequence token, ``False`` none.

    Raises:
        DataError: the text is shorter than the windows needed (says how many tokens were found and needed),
            or the tokenizer does not match ``model``.
    """
    if split_by not in SPLIT_BY:
        raise DataError(f"unknown split_by {split_by!r}; use one of {SPLIT_BY}")
    check_int("seq_len (tokens per window, --seq-len)", seq_len, lo=2, error=DataError)
    wanted = {"calibration": n_calibration, "validation": n_validation, "test": n_test}
    for split, n in wanted.items():
        check_int(f"n_{split} ({split} windows, --n-{split})", n, lo=0, error=DataError)
    if sum(wanted.values()) == 0:
        raise DataError(
            "n_calibration, n_validation and n_test (--n-calibration, ...) are all 0: ask for at least one window."
        )
    if model is not None:
        check_tokenizer(model, tokenizer)
        check_seq_len(model, seq_len)
    prefix = window_prefix(tokenizer, bos)
    body = seq_len - len(prefix)  # text tokens per window
    if body < 1:
        raise DataError(f"seq_len={seq_len} leaves no room for text after the {len(prefix)} start token(s)")
    is_default = source is None
    raw = load_documents(source)
    docs = [_Doc(n, t, tokenizer) for n, t in raw]
    roles = assets.AUSTEN_ROLES if is_default else None

    assigned = _assign_documents(docs, wanted, body, roles, seed) if split_by == "document" else None
    if split_by == "document" and assigned is None:
        n_docs = len(docs)
        warnings.warn(
            f"{n_docs} document(s) cannot give every split whole documents; splitting the token stream "
            "into contiguous regions instead (split_by='contiguous')",
            stacklevel=2,
        )
    sep = _separator(tokenizer)
    if assigned is None:
        split_by_used = "contiguous"
        stream = _join(docs, sep)
        active = [s for s in SPLITS if wanted[s] > 0]
        if len(stream) < len(active) * body:
            raise DataError(
                f"the text has {len(stream)} tokens but needs at least {len(active) * body} "
                f"(one window of seq_len={seq_len}{_prefix_note(prefix)} for each of {len(active)} split(s); "
                f"{sum(wanted.values()) * body} for all requested windows). Give more text or a smaller seq_len."
            )
        total = len(stream) // body
        n_wanted = sum(wanted.values())
        # each split gets one window, then a share of the rest proportional to its request; windows are
        # sampled inside each region
        rest = total - len(active)
        shares = {s: (1 + wanted[s] * rest // n_wanted) if wanted[s] else 0 for s in SPLITS}
        for s in sorted(active, key=lambda s: -wanted[s])[: total - sum(shares.values())]:
            shares[s] += 1  # windows left over by rounding go to the largest requests
        streams, names, start = {}, {}, 0
        for s in SPLITS:
            streams[s] = stream[start * body : (start + shares[s]) * body]
            names[s] = [f"tokens[{start * body}:{(start + shares[s]) * body}]"]
            start += shares[s]
    else:
        split_by_used = "document"
        streams = {s: _join(assigned[s], sep) for s in SPLITS}
        names = {s: [d.name for d in assigned[s]] for s in SPLITS}

    out, shortfall = {}, {}
    for i, s in enumerate(SPLITS):
        available = len(streams[s]) // body
        n = min(wanted[s], available)
        if n < wanted[s]:
            shortfall[s] = {"wanted": wanted[s], "got": n}
        out[s] = _sample_windows(streams[s], body, n, random.Random(seed * 1000003 + i), prefix)
        if wanted[s] > 0 and n == 0:
            raise DataError(
                f"the {s} split has {len(streams[s])} tokens but needs at least {body} "
                f"for one window{_prefix_note(prefix)}; give more text or a smaller seq_len"
            )
    if shortfall:
        warnings.warn(f"not enough text for all requested windows: {shortfall}", stacklevel=2)
    info = {
        "source": "austen (default)" if is_default else _describe(source),
        "seq_len": seq_len,
        "prefix": prefix,
        "split_by": split_by_used,
        "seed": seed,
        "tokenizer": tokenizer_name(tokenizer),
        "documents": {s: names[s] if wanted[s] > 0 else [] for s in SPLITS},
        "windows": {s: int(out[s].shape[0]) for s in SPLITS},
        "tokens_available": {s: len(streams[s]) for s in SPLITS},
        "hash": {s: data_hash(out[s]) for s in SPLITS},
        "shortfall": shortfall,
    }
    return TokenSplits(out["calibration"], out["validation"], out["test"], info)


def _prefix_note(prefix: list[int]) -> str:
    return f" = {len(prefix)} start token(s) {prefix} + text" if prefix else ""


def _separator(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return [int(eos)] if isinstance(eos, int) else []


def _describe(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    if _is_dataset(source):
        return f"dataset ({len(source) if hasattr(source, '__len__') else '?'} rows)"
    if isinstance(source, Iterable):
        return f"{type(source).__name__} of {len(source) if hasattr(source, '__len__') else '?'} texts"
    return type(source).__name__


def random_windows(n: int, seq_len: int, vocab_size: int, *, seed: int = 0) -> Any:
    """Random token windows ``(n, seq_len)`` (a tokenizer-free source for tests and timing)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n, seq_len), generator=g, dtype=torch.long)
