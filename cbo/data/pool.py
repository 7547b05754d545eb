"""Fresh windows: the windows of a split's documents that no split used, for evidence beyond the splits.

:func:`cbo.data.windows.make_splits` cuts each split's token stream into slots of ``seq_len`` tokens and samples
a few of them (32 of the ~1,700 slots of an Austen novel). The rest is unused text of the same documents:
:func:`fresh_windows` rebuilds the same slot grid from the splits' ``info``, drops every slot whose window equals one
already used, and returns the others in a seeded random order. The final selection
(:mod:`cbo.search.selection`) races its finalists on them. Only calibration and validation documents can be asked
for: a test split is never a source of choices.

Example:
    >>> splits = make_splits(tokenizer, seq_len=128, n_calibration=32, n_validation=32)            # doctest: +SKIP
    >>> pool = fresh_windows(tokenizer, None, splits.info, used=[splits.validation], seed=0)        # doctest: +SKIP
    >>> pool.shape                                                                                 # doctest: +SKIP
    torch.Size([1701, 128])
"""

from __future__ import annotations

import random
import re
from typing import Any, Iterable, Sequence

from cbo.data.windows import load_documents, tokenize
from cbo.errors import DataError

POOL_SPLITS = ("validation", "calibration")


def split_stream(tokenizer: Any, source: Any, info: dict[str, Any], split: str) -> list[int]:
    """The token stream a split's windows were cut from (its documents joined by the end-of-text token), as
    :func:`cbo.data.windows.make_splits` built it."""
    names = list((info.get("documents") or {}).get(split) or [])
    if not names:
        return []
    docs = load_documents(source)
    eos = getattr(tokenizer, "eos_token_id", None)
    sep = [int(eos)] if isinstance(eos, int) else []

    def join(texts: Iterable[str]) -> list[int]:
        stream: list[int] = []
        for i, text in enumerate(texts):
            stream += (sep if i else []) + tokenize(tokenizer, text)
        return stream

    if info.get("split_by") == "contiguous":
        match = re.fullmatch(r"tokens\[(\d+):(\d+)\]", names[0])
        if match is None:
            raise DataError(f"cannot read the {split} region {names[0]!r} of a contiguous split.")
        return join(t for _, t in docs)[int(match[1]) : int(match[2])]
    by_name = dict(docs)
    missing = [n for n in names if n not in by_name]
    if missing:
        raise DataError(
            f"the text has no documents {missing} that the {split} split was cut from; give the same text "
            "(text=) the splits were made of."
        )
    return join(by_name[n] for n in names)


def fresh_windows(
    tokenizer: Any,
    source: Any,
    info: dict[str, Any],
    *,
    splits: Sequence[str] = ("validation",),
    used: Iterable[Any] = (),
    seed: int = 0,
) -> Any:
    """Windows of the ``splits``' documents that none of ``used`` holds, in a random order fixed by ``seed``.

    Args:
        tokenizer: the tokenizer the splits were made with.
        source: the text source the splits were cut from (None: the default Austen text).
        info: the splits' ``TokenSplits.info`` (``seq_len``, ``prefix``, ``split_by``, ``documents``).
        splits: ``"validation"`` and/or ``"calibration"`` (never ``"test"``).
        used: (B, T) window tensors already used (every split's windows, to be safe).
        seed: the order in which the windows are drawn.

    Returns:
        A (P, T) int64 tensor (P may be 0).
    """
    import torch

    bad = [s for s in splits if s not in POOL_SPLITS]
    if bad:
        raise DataError(f"fresh windows come from {list(POOL_SPLITS)} documents only, not {bad}.")
    for key in ("seq_len", "documents"):
        if key not in info:
            raise DataError(
                f"the splits' info has no {key!r}: fresh windows need splits made by make_splits from a text "
                "(give text= and tokenizer=, not precomputed windows)."
            )
    prefix = [int(i) for i in info.get("prefix") or []]
    seq_len = int(info["seq_len"])
    body = seq_len - len(prefix)
    taken = {tuple(int(i) for i in row) for t in used for row in t.tolist() if len(row) == seq_len}
    windows: list[list[int]] = []
    for split in dict.fromkeys(splits):
        stream = split_stream(tokenizer, source, info, split)
        for k in range(len(stream) // body):
            w = prefix + stream[k * body : (k + 1) * body]
            if tuple(w) not in taken:
                taken.add(tuple(w))
                windows.append(w)
    random.Random(seed * 1000003 + 17).shuffle(windows)
    if not windows:
        return torch.empty((0, seq_len), dtype=torch.long)
    return torch.tensor(windows, dtype=torch.long)


__all__ = ["POOL_SPLITS", "fresh_windows", "split_stream"]
