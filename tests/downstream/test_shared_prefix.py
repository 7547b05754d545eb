"""The shared-context scorer: a packed row and its mask written out by hand; each continuation's log-likelihood
and greedy flag equal a plain forward pass over ``context + continuation`` on several architectures and pruned
models; whole request lists come back in order and equal lm-eval's own ``HFLM``; a model the packed rows do not
fit (a short sliding window, a wrong answer) falls back to ``HFLM`` for the rest of the run, with a warning; the
requests left to ``HFLM`` run in batches whose logits stay under the budget."""

from __future__ import annotations

import logging

import pytest
import torch
from tiny_tokenizers import byte_level_tokenizer

pytest.importorskip("lm_eval")

from cbo.downstream import shared_prefix  # noqa: E402
from cbo.downstream.harness import harness_model  # noqa: E402
from cbo.downstream.shared_prefix import (  # noqa: E402
    packed_batches,
    packed_mask,
    packed_row,
    plain_batch_sizes,
    score_shared_contexts,
    shared_groups,
)


def test_a_packed_row_and_its_mask():
    tokens, positions, starts = packed_row([10, 11, 12], [[20, 21, 22], [30], [40, 41]])
    assert tokens == [10, 11, 12, 20, 21, 40]
    assert positions == [0, 1, 2, 3, 4, 3]
    assert starts == [3, 5, 5]
    mask = packed_mask(6, 3, [(3, 2), (5, 0), (5, 1)], width=8).int().tolist()
    assert mask == [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],  # the first continuation sees the context and itself
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0, 1, 0, 0],  # the third never sees the first
        [0, 0, 0, 0, 0, 0, 1, 0],  # padding sees itself only
        [0, 0, 0, 0, 0, 0, 0, 1],
    ]


def test_groups_and_batches():
    requests = [(None, [1, 2], [3]), (None, [5], [6]), (None, [1, 2], [4, 4]), (None, [7], [8] * 9), (None, [7], [9])]
    shared, alone = shared_groups(requests, max_length=8)
    assert shared == {(1, 2): [0, 2]} and alone == [1, 3, 4]  # (7,) has a request longer than 8 + 1 tokens
    assert packed_batches([10, 9, 9, 8, 2], rows=2, vocab=1) == [[0, 1], [2, 3], [4]]
    assert packed_batches([10, 9, 9], rows=8, vocab=100, budget=2000) == [[0, 1], [2]]


def _plain(model, context, continuation):
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([context + continuation[:-1]])).logits.float(), dim=-1)[0]
    rows, cont = logp[len(context) - 1 :], torch.tensor(continuation)
    return float(rows.gather(-1, cont[:, None]).sum()), bool((rows.argmax(-1) == cont).all())


def _groups(vocab, seed=0):
    g = torch.Generator().manual_seed(seed)

    def draw(n):
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    return [
        (draw(9), [draw(4), draw(1), draw(6), draw(2)]),
        (draw(3), [draw(5), draw(5)]),
        (draw(14), [draw(1), draw(1), draw(1)]),
    ]


def _pruned(model, kind):
    from cbo.surgery.depth import remove_blocks, remove_sublayers
    from cbo.surgery.width import WidthPlan, prune_width

    if kind == "depth":
        return remove_blocks(model, [1])
    if kind == "sublayer":
        return remove_sublayers(model, [(0, "attn"), (2, "mlp")])
    if kind == "width":
        return prune_width(model, WidthPlan(mlp={0: list(range(16)), 2: list(range(40))}))
    return model


@pytest.mark.parametrize(
    "arch,kind",
    [("llama", None), ("qwen3", None), ("gpt2", None), ("gpt_neox", None), ("gemma3", None)]
    + [("llama", k) for k in ("depth", "sublayer", "width")],
)
def test_each_continuation_equals_a_plain_forward_pass(tiny_model, arch, kind):
    overrides = {"sliding_window": 64} if arch == "gemma3" else {}
    model = _pruned(tiny_model(arch, n_layers=3, **overrides), kind)
    groups = _groups(model.config.vocab_size)
    with torch.no_grad():
        got = score_shared_contexts(model, groups)
    for (context, conts), answers in zip(groups, got, strict=True):
        for cont, (ll, greedy) in zip(conts, answers, strict=True):
            want_ll, want_greedy = _plain(model, context, cont)
            assert ll == pytest.approx(want_ll, abs=1e-4)
            assert greedy == want_greedy


def _requests(vocab, n=23, seed=1):
    """A shuffled mix: shared contexts (several choices, one-token and longer), and contexts asked once."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        context = torch.randint(3, vocab, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist()
        for _ in range(1 if i % 4 == 0 else 3):
            size = int(torch.randint(1, 5, (1,), generator=g))
            out.append((("ctx", f"cont{len(out)}"), context, torch.randint(3, vocab, (size,), generator=g).tolist()))
    order = torch.randperm(len(out), generator=g).tolist()
    return [out[i] for i in order]


def _whole(model, tokenizer, requests):
    return harness_model(model, tokenizer, batch_size=4, shared_contexts=False)._loglikelihood_tokens(
        requests, disable_tqdm=True
    )


def test_request_lists_come_back_in_order_and_equal_hflm(tiny_model):
    tokenizer = byte_level_tokenizer()
    model = tiny_model("llama", n_layers=2, vocab_size=len(tokenizer))
    requests = _requests(len(tokenizer))
    lm = harness_model(model, tokenizer, batch_size=4)
    got = lm._loglikelihood_tokens(requests, disable_tqdm=True)
    assert lm.shared_ok is True
    want = _whole(model, tokenizer, requests)
    assert [g[1] for g in got] == [w[1] for w in want]
    assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=1e-4)


def test_a_short_sliding_window_keeps_long_requests_whole(tiny_model):
    """Gemma 3's sliding layers see 8 tokens here: longer requests are not packed, and all scores stay right."""
    tokenizer = byte_level_tokenizer()
    model = tiny_model("gemma3", n_layers=2, vocab_size=len(tokenizer))
    requests = _requests(len(tokenizer))
    lm = harness_model(model, tokenizer, batch_size=4)
    assert lm.shared_length == 8
    got = lm._loglikelihood_tokens(requests, disable_tqdm=True)
    want = _whole(model, tokenizer, requests)
    assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=1e-4)


def test_a_model_that_fails_the_check_is_scored_whole(tiny_model, monkeypatch, caplog):
    tokenizer = byte_level_tokenizer()
    model = tiny_model("llama", n_layers=2, vocab_size=len(tokenizer))
    requests = _requests(len(tokenizer))
    real = shared_prefix.score_shared_contexts

    def off_by_one(*args, **kwargs):
        return [[(ll + 1.0, greedy) for ll, greedy in group] for group in real(*args, **kwargs)]

    monkeypatch.setattr(shared_prefix, "score_shared_contexts", off_by_one)
    lm = harness_model(model, tokenizer, batch_size=4)
    with caplog.at_level(logging.WARNING, logger=shared_prefix.__name__):
        got = lm._loglikelihood_tokens(requests, disable_tqdm=True)
    assert lm.shared_ok is False and "scoring each request whole" in caplog.text
    want = _whole(model, tokenizer, requests)  # the same loop, other batches: equal up to float rounding
    assert [g[1] for g in got] == [w[1] for w in want]
    assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=1e-5)


def test_plain_batches_keep_their_logits_under_the_budget():
    """Requests of 3, 10, 2, 6, 7 and 2 tokens (inputs one shorter), vocabulary 10, budget 100 logits, 4 rows at
    most, longest first: [9] alone, [6] alone (two rows of 6 tokens: 120), [5, 2] (2 x 5 x 10 = 100), [1, 1]; runs
    of one batch size go to HFLM together. Cut at max_length 4, the four longest share a batch."""
    lengths = {0: 3, 1: 10, 2: 2, 3: 6, 4: 7, 5: 2}
    requests = [(None, [1] * (n - 1), [2]) for _, n in sorted(lengths.items())]
    runs = plain_batch_sizes(requests, rows=4, vocab=10, max_length=100, budget=100)
    assert runs == [(1, [1, 4]), (2, [3, 0, 2, 5])]
    assert plain_batch_sizes(requests, rows=4, vocab=10, max_length=4, budget=10**6) == [(4, [1, 4, 3, 0]), (2, [2, 5])]


def test_requests_left_to_hflm_run_in_batches_under_the_budget(tiny_model, monkeypatch):
    """With a budget of 20 tokens' logits a batch of HFLM's loop holds rows x tokens <= 20 (a longer request runs
    alone), and the scores equal the unbounded loop's."""
    from lm_eval.models.huggingface import HFLM

    tokenizer = byte_level_tokenizer()
    model = tiny_model("gemma3", n_layers=2, vocab_size=len(tokenizer))  # sliding window 8: long requests alone
    requests = _requests(len(tokenizer))
    want = _whole(model, tokenizer, requests)
    shapes = []
    real = HFLM._model_call

    def record(self, inps, *args, **kwargs):
        shapes.append(tuple(inps.shape))
        return real(self, inps, *args, **kwargs)

    monkeypatch.setattr(HFLM, "_model_call", record)
    lm = harness_model(model, tokenizer, batch_size=4)
    lm._loglikelihood_tokens(requests, disable_tqdm=True)
    assert max(rows for rows, _ in shapes) == 4  # the default budget lets tiny batches be whole
    shapes.clear()
    monkeypatch.setattr(shared_prefix, "LOGITS_BUDGET", 20 * len(tokenizer))  # 20 tokens' logits
    lm = harness_model(model, tokenizer, batch_size=4)
    got = lm._loglikelihood_tokens(requests, disable_tqdm=True)
    assert shapes and all(rows == 1 or rows * length <= 20 for rows, length in shapes)
    assert any(rows > 1 for rows, _ in shapes)  # short requests still share a batch
    assert lm.batch_size_per_gpu == 4  # restored
    assert [g[1] for g in got] == [w[1] for w in want]
    assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=1e-4)
