"""Synthetic texts for tests: a novel of chapters and paragraphs with recurring names and places."""

from __future__ import annotations

NAMES = ["Anne", "Wentworth", "Elliot", "Musgrove", "Russell", "Harville", "Benwick", "Croft"]
VERBS = ["walked", "spoke", "thought", "waited", "smiled", "listened", "wondered", "hoped"]
PLACES = ["garden", "harbour", "parlour", "shrubbery", "library", "village", "church", "lane"]


def synthetic_novel(n_chapters: int = 4, n_paragraphs: int = 30) -> str:
    """A synthetic novel: chapters of paragraphs of varied sentences with recurring names and places."""
    import random

    rng = random.Random(7)
    out = ["A SYNTHETIC NOVEL", ""]
    for c in range(n_chapters):
        out += [f"Chapter {c + 1}", ""]
        for _ in range(n_paragraphs):
            sentences = []
            for _ in range(rng.randint(2, 6)):
                words = [rng.choice(NAMES), rng.choice(VERBS), "towards the", rng.choice(PLACES)]
                words += ["and", "then", "the", rng.choice(NAMES), rng.choice(VERBS)]
                words += rng.sample(
                    ["quietly", "again", "before", "dinner", "with", "Mr.", "Elliot"], rng.randint(2, 6)
                )
                words.append(rng.choice(PLACES + NAMES))
                sentences.append(" ".join(words) + rng.choice([".", "!", "?"]))
            out += [" ".join(sentences), ""]
    return "\n".join(out)


def word_texts(folder, words_per_doc: int):
    """A new folder ``folder`` of four .txt documents of ``words_per_doc`` random words of
    :data:`tiny_tokenizers.WORDS` (seed 0); returns it."""
    import numpy as np
    from tiny_tokenizers import WORDS

    folder.mkdir()
    rng = np.random.default_rng(0)
    for k in range(4):
        (folder / f"doc{k}.txt").write_text(" ".join(rng.choice(WORDS, words_per_doc)))
    return folder
