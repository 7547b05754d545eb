"""Text sources -> token windows: every source kind, deterministic disjoint splits, clear errors."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from cbo.data.windows import (
    TokenSplits,
    check_tokenizer,
    check_windows,
    data_hash,
    load_documents,
    make_splits,
    random_windows,
    special_prefix,
    tokenize,
    window_prefix,
)
from cbo.errors import DataError

WORDS = "the of and to a in that it was her not be he his as had with for she you".split()


def _text(seed: int, n_words: int) -> str:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(WORDS), (n_words,), generator=g)
    return " ".join(WORDS[i] for i in idx)


class _Dataset:
    """Duck-typed stand-in for a datasets.Dataset."""

    def __init__(self, rows, column="text"):
        self._rows, self.column_names = rows, [column, "id"]
        self._column = column

    def __len__(self):
        return len(self._rows)

    def __getitem__(self, key):
        assert key == self._column
        return list(self._rows)


# ------------------------------------------------------------------------------------------ sources


def test_load_documents_from_files_and_folders(tmp_path):
    (tmp_path / "b.txt").write_text("second book")
    (tmp_path / "a.md").write_text("first book")
    (tmp_path / "skip.csv").write_text("x,y")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "row one"}) + "\n\n" + json.dumps({"text": "row two"}) + "\n")
    docs = load_documents(tmp_path)
    assert docs == [("a", "first book"), ("b", "second book"), ("c:1", "row one"), ("c:3", "row two")]
    assert load_documents(tmp_path / "b.txt") == [("b", "second book")]
    assert load_documents(str(tmp_path / "c.jsonl"))[1] == ("c:3", "row two")


def test_load_documents_from_python_objects():
    assert load_documents(["x", "  ", "y"]) == [("doc0", "x"), ("doc2", "y")]
    assert load_documents([{"text": "t", "name": "n"}, ("m", "u")]) == [("n", "t"), ("m", "u")]
    assert load_documents(_Dataset(["p", None, "q"])) == [("row0", "p"), ("row2", "q")]


def test_dataset_dict_and_iterable_dataset():
    class _DatasetDict(dict):
        @property
        def column_names(self):
            return {k: v.column_names for k, v in self.items()}

    with pytest.raises(DataError, match=r"ds\['train'\]"):
        load_documents(_DatasetDict(train=_Dataset(["a"]), test=_Dataset(["b"])))

    class _Iterable:
        column_names = None

        def __getitem__(self, key):
            raise TypeError("not subscriptable")

        def __iter__(self):
            return iter([{"text": "first"}, {"text": "second"}])

    assert load_documents(_Iterable()) == [("row0", "first"), ("row1", "second")]


def test_same_stem_in_subfolders_keeps_names_distinct(tmp_path):
    for sub in ("x", "y"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "book.txt").write_text(f"text {sub}")
    names = [n for n, _ in load_documents(tmp_path)]
    assert len(set(names)) == 2


@pytest.mark.parametrize(
    "source, match",
    [
        ("/no/such/file.txt", "not an existing file"),
        ("Just some words", r"pass it in a list"),
        ([], "contains no text"),
        (["   "], "contains no text"),
        ([3], "give strings"),
        (42, "unknown text source"),
        (_Dataset(["a"], column="content"), "no 'text' column"),
    ],
)
def test_bad_sources(source, match):
    with pytest.raises(DataError, match=match):
        load_documents(source)


def test_bad_jsonl(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2"):
        load_documents(tmp_path / "bad.jsonl")
    (tmp_path / "nofield.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(DataError, match="'text'"):
        load_documents(tmp_path / "nofield.jsonl")


def test_empty_folder(tmp_path):
    with pytest.raises(DataError, match="no text files"):
        load_documents(tmp_path)


# ------------------------------------------------------------------------------------------- splits


def _corpus(n_docs=6, n_words=400):
    return [_text(i, n_words) for i in range(n_docs)]


def _contains(stream, window):
    w = window.tolist()
    return any(stream[i : i + len(w)] == w for i in range(len(stream) - len(w) + 1))


def test_splits_are_whole_documents_and_disjoint(char_tokenizer):
    docs = _corpus()
    splits = make_splits(char_tokenizer, docs, seq_len=64, n_calibration=12, n_validation=6, n_test=6, seed=3)
    assert isinstance(splits, TokenSplits)
    assert splits.calibration.shape == (12, 64) and splits.calibration.dtype == torch.long
    assert splits.validation.shape == (6, 64) and splits.test.shape == (6, 64)
    names = splits.info["documents"]
    assert splits.info["split_by"] == "document"
    assigned = [set(names[s]) for s in ("calibration", "validation", "test")]
    assert all(a for a in assigned) and not (
        assigned[0] & assigned[1] or assigned[0] & assigned[2] or assigned[1] & assigned[2]
    )
    streams = {f"doc{i}": tokenize(char_tokenizer, d) for i, d in enumerate(docs)}
    for split in ("calibration", "validation", "test"):
        joined = []
        for k, name in enumerate(names[split]):
            joined += ([2] if k else []) + streams[name]
        for window in splits[split]:
            assert _contains(joined, window)
    # windows inside a split never overlap: they are distinct slots of the joined stream
    assert len({tuple(w.tolist()) for w in splits.calibration}) == 12


def test_splits_are_deterministic(char_tokenizer):
    docs = _corpus()
    kwargs = dict(seq_len=32, n_calibration=4, n_validation=2, n_test=2)
    a = make_splits(char_tokenizer, docs, seed=1, **kwargs)
    b = make_splits(char_tokenizer, docs, seed=1, **kwargs)
    c = make_splits(char_tokenizer, docs, seed=2, **kwargs)
    assert all(torch.equal(a[s], b[s]) for s in ("calibration", "validation", "test"))
    assert a.info["hash"] == b.info["hash"]
    assert not torch.equal(a.calibration, c.calibration)


def test_single_document_falls_back_to_contiguous_regions(char_tokenizer):
    text = _text(0, 600)
    with pytest.warns(UserWarning, match="contiguous"):
        splits = make_splits(char_tokenizer, [text], seq_len=50, n_calibration=4, n_validation=2, n_test=2)
    assert splits.info["split_by"] == "contiguous"
    stream = tokenize(char_tokenizer, text)
    regions = {}
    for s in ("calibration", "validation", "test"):
        start, stop = (int(v) for v in splits.info["documents"][s][0][len("tokens[") : -1].split(":"))
        regions[s] = (start, stop)
        for w in splits[s]:
            assert _contains(stream[start:stop], w)
    assert regions["calibration"][1] <= regions["validation"][0] and regions["validation"][1] <= regions["test"][0]


def test_contiguous_regions_with_skewed_requests(char_tokenizer):
    text = _text(1, 60)  # 200-250 tokens: 4 windows of 50
    with pytest.warns(UserWarning, match="not enough text"):
        splits = make_splits(
            char_tokenizer, [text], seq_len=50, n_calibration=100, n_validation=1, n_test=1, split_by="contiguous"
        )
    assert [splits[s].shape[0] for s in ("calibration", "validation", "test")] == [2, 1, 1]


def test_too_little_text_says_how_much(char_tokenizer):
    with pytest.raises(DataError, match=r"has 11 tokens but needs at least 192"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make_splits(char_tokenizer, ["short text."], seq_len=64)


def test_shortfall_is_reported(char_tokenizer):
    docs = _corpus(3, 100)  # ~500 tokens each
    with pytest.warns(UserWarning, match="not enough text"):
        splits = make_splits(char_tokenizer, docs, seq_len=64, n_calibration=50, n_validation=1, n_test=1)
    assert 0 < splits.calibration.shape[0] < 50
    assert splits.info["shortfall"]["calibration"]["wanted"] == 50


def test_empty_split_and_bad_arguments(char_tokenizer):
    docs = _corpus(2)
    splits = make_splits(char_tokenizer, docs, seq_len=16, n_calibration=3, n_validation=0, n_test=0)
    assert splits.validation.shape == (0, 16) and splits.calibration.shape == (3, 16)
    with pytest.raises(DataError, match="split_by"):
        make_splits(char_tokenizer, docs, split_by="random")
    with pytest.raises(DataError, match="seq_len"):
        make_splits(char_tokenizer, docs, seq_len=1)
    with pytest.raises(DataError, match="n_calibration, n_validation and n_test"):
        make_splits(char_tokenizer, docs, n_calibration=0, n_validation=0, n_test=0)
    with pytest.raises(KeyError):
        splits["train"]


def test_tokenizer_model_mismatch(tiny_model, char_tokenizer):
    model = tiny_model("llama", n_layers=2)  # 128 embeddings, the char tokenizer has 259 ids
    with pytest.raises(DataError, match="259 tokens but model"):
        check_tokenizer(model, char_tokenizer)
    with pytest.raises(DataError, match="do not match"):
        make_splits(char_tokenizer, _corpus(), model=model)
    check_tokenizer(tiny_model("llama", n_layers=2, vocab_size=300), char_tokenizer)


def _word_tokenizer(bos: bool, with_bos_token: bool = True):
    """A word-level Hugging Face tokenizer over WORDS; with ``bos`` its post-processor puts ``<bos>`` first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "<bos>", "<eos>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    special = {"bos_token": "<bos>"} if with_bos_token else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>", **special)


def test_hf_tokenizer_path():
    hf = _word_tokenizer(bos=False)
    splits = make_splits(hf, _corpus(4, 200), seq_len=20, n_calibration=2, n_validation=2, n_test=2)
    assert int(splits.calibration.max()) < len(WORDS) + 3 and int(splits.calibration.min()) >= 3
    assert splits.info["prefix"] == []


def test_special_prefix_is_read_from_the_tokenizer(tmp_path, char_tokenizer):
    with_bos, without = _word_tokenizer(bos=True), _word_tokenizer(bos=False)
    assert with_bos("the of")["input_ids"] == [1, 3, 4]  # the tokenizer itself adds <bos>
    assert special_prefix(with_bos) == [1] and special_prefix(without) == []
    assert special_prefix(char_tokenizer) == []
    with_bos.save_pretrained(tmp_path / "tok")  # the convention survives a save and reload
    from transformers import AutoTokenizer

    assert special_prefix(AutoTokenizer.from_pretrained(tmp_path / "tok")) == [1]
    assert window_prefix(without, bos=True) == [1] and window_prefix(with_bos, bos=False) == []
    with pytest.raises(DataError, match="no beginning-of-sequence token"):
        window_prefix(_word_tokenizer(bos=False, with_bos_token=False), bos=True)


def test_windows_start_with_bos_where_the_tokenizer_adds_one():
    docs = _corpus(6, 300)
    kwargs = dict(seq_len=24, n_calibration=6, n_validation=4, n_test=4, seed=5)
    with_bos = make_splits(_word_tokenizer(bos=True), docs, **kwargs)
    plain = make_splits(_word_tokenizer(bos=False), docs, **kwargs)
    streams = {f"doc{i}": tokenize(_word_tokenizer(bos=False), d) for i, d in enumerate(docs)}
    assert with_bos.info["prefix"] == [1] and plain.info["prefix"] == []
    for split in ("calibration", "validation", "test"):
        w, p = with_bos[split], plain[split]
        assert w.shape == p.shape == (kwargs[f"n_{split}"], 24)
        assert (w[:, 0] == 1).all() and not (w[:, 1:] == 1).any()  # <bos> first, and only there
        assert not (p == 1).any()
        joined = []
        for k, name in enumerate(with_bos.info["documents"][split]):
            joined += ([2] if k else []) + streams[name]
        for window in w:
            assert _contains(joined, window[1:])  # 23 consecutive text tokens after <bos>
    # the same windows as a tokenizer without the convention, with the start token forced or dropped
    forced = make_splits(_word_tokenizer(bos=False), docs, bos=True, **kwargs)
    dropped = make_splits(_word_tokenizer(bos=True), docs, bos=False, **kwargs)
    for split in ("calibration", "validation", "test"):
        assert torch.equal(forced[split], with_bos[split])
        assert torch.equal(dropped[split], plain[split])
    assert with_bos.info["hash"] != plain.info["hash"]


def test_bos_windows_in_contiguous_regions_and_their_errors():
    tok = _word_tokenizer(bos=True)
    text = _text(2, 400)
    splits = make_splits(tok, [text], seq_len=10, n_calibration=3, n_validation=2, n_test=2, split_by="contiguous")
    stream = tokenize(tok, text)
    for s in ("calibration", "validation", "test"):
        start, stop = (int(v) for v in splits.info["documents"][s][0][len("tokens[") : -1].split(":"))
        assert (stop - start) % 9 == 0  # regions are cut in windows of 9 text tokens
        for w in splits[s]:
            assert int(w[0]) == 1 and _contains(stream[start:stop], w[1:])
    two = make_splits(tok, [text], seq_len=2, n_calibration=2, n_validation=1, n_test=1, split_by="contiguous")
    assert (two.calibration[:, 0] == 1).all() and two.calibration.shape == (2, 2)
    with pytest.raises(DataError, match=r"needs at least 27 \(one window of seq_len=10 = 1 start token"):
        make_splits(tok, ["the of and to a in that it was her"], seq_len=10, split_by="contiguous")


def test_data_hash_and_windows_checks(tiny_model):
    x = random_windows(3, 8, 50, seed=1)
    assert data_hash(x) == data_hash(x.clone())
    assert data_hash(x) != data_hash(x[:2]) and data_hash(x) != data_hash(x.int())
    y = x.clone()
    y[0, 0] = (y[0, 0] + 1) % 50
    assert data_hash(x) != data_hash(y)
    assert check_windows(x.int()).dtype == torch.long
    with pytest.raises(DataError, match="out of range"):
        check_windows(torch.full((1, 4), 200), tiny_model("llama", 2))


@pytest.mark.model
def test_default_austen_splits(default_model, default_text):
    _, tokenizer = default_model
    splits = make_splits(tokenizer)
    assert splits.info["documents"] == {
        "calibration": ["emma"],
        "validation": ["mansfield_park"],
        "test": ["persuasion"],
    }
    assert splits.calibration.shape == (32, 128) and splits.test.shape == (64, 128)
    again = make_splits(tokenizer, n_validation=0, n_test=0)
    assert torch.equal(again.calibration, splits.calibration)
    # SmolLM2's tokenizer adds no start token, so its windows (and every cache keyed by their hash) are the
    # plain text slices they were before windows followed the tokenizer's convention
    assert (
        special_prefix(tokenizer) == []
        and tokenizer("a")["input_ids"] == tokenizer("a", add_special_tokens=False)["input_ids"]
    )
    assert splits.info["prefix"] == []
    assert splits.info["hash"] == {
        "calibration": "3bb65a0ff3b4563f",
        "validation": "df1e565f35fe9928",
        "test": "1d3b9448bc5b770a",
    }
