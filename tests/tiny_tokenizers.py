"""Tiny Hugging Face tokenizers built offline for tests.

* :func:`byte_level_tokenizer` -- a byte-level BPE (the 256 byte symbols, three merges, ``<|endoftext|>``) that
  encodes any text, like GPT-2's or SmolLM2's; it adds no start token.
* :func:`word_level_tokenizer` -- one id per word of :data:`WORDS` (plus ``[UNK]`` and ``[EOS]``), split on white
  space: the tokenizer of the tiny model folders the CLI tests save (with :func:`tiny_texts.word_texts`).
"""

from __future__ import annotations

WORDS = "the of and to a in that it was her his she he you not be had for with as but at on".split()


def byte_level_vocabulary() -> tuple[list[str], list[str]]:
    """Tokens (the 256 byte symbols, three merges, an end-of-text token) and the merges of a tiny BPE."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values()) + ["\u0120t", "he", "\u0120the", "<|endoftext|>"]
    return tokens, ["\u0120 t", "h e", "\u0120t he"]


def byte_level_tokenizer():
    """A ``PreTrainedTokenizerFast`` over :func:`byte_level_vocabulary` (260 ids; id 259 ends a text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens, merges = byte_level_vocabulary()
    bpe = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


def word_level_tokenizer():
    """A ``PreTrainedTokenizerFast`` with one id per word of :data:`WORDS` after ``[UNK]`` (0) and ``[EOS]`` (1)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "[EOS]", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", eos_token="[EOS]")
