"""Multiple-choice log-likelihoods with each context run once: the scorer behind :func:`cbo.evaluate_tasks`.

A multiple-choice item asks lm-eval for ``log p(choice | context)`` of every choice, and lm-eval's ``HFLM`` runs
the whole ``context + choice`` once per choice. Here the requests that share a context are packed into one row:
the context once, then each choice's tokens after it with position ids that go on from the context's end, under a
mask that lets a choice see the context and itself, never another choice; several items' rows run in one forward
pass. A HellaSwag item (a long context, four endings) costs about half the tokens; an ARC item about a third.

The results are the same log-likelihoods and greedy flags, up to float rounding (about 1e-5 on a sum of
log-probabilities). The first shared context of a model is also scored the plain way and compared: a model that
packed rows do not fit (a mismatch or an error) is scored by ``HFLM``'s own loop for the rest of the run, with a
warning. Requests whose context is not shared (LAMBADA, WinoGrande's partial scoring, rolling perplexity, and every
request longer than a sliding window) go to ``HFLM``'s batched loop, in batches whose logits stay under the same
budget as a packed batch's (:func:`packed_batches`): ``HFLM`` holds a batch's logits and their log-softmax over the
whole vocabulary, so eight 1,250-token BoolQ requests of a 262k-token model would need 21 GB.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.models.huggingface import HFLM

from cbo.progress import progress_bar

log = logging.getLogger(__name__)

Request = tuple[tuple[str, str] | None, list[int], list[int]]
Answer = tuple[float, bool]

#: how far a shared-context log-likelihood may be from the plain one in the first group's check
ATOL, RTOL = 2e-3, 1e-4
#: the most logits (batch rows x tokens x vocabulary) one forward pass may hold: 1 GiB of float32
LOGITS_BUDGET = 1 << 28


def shared_groups(requests: Sequence[Request], max_length: int) -> tuple[dict[tuple[int, ...], list[int]], list[int]]:
    """``({context tokens: [request indices]}, [indices of the rest])``: contexts asked for by two or more requests
    whose inputs fit ``max_length`` tokens are shared; every other request stays on its own."""
    by_context: dict[tuple[int, ...], list[int]] = {}
    for i, (_, context, _) in enumerate(requests):
        by_context.setdefault(tuple(context), []).append(i)
    shared: dict[tuple[int, ...], list[int]] = {}
    alone: list[int] = []
    for context, members in by_context.items():
        fits = all(len(context) + len(requests[i][2]) <= max_length + 1 for i in members)
        if len(members) > 1 and fits and context:
            shared[context] = members
        else:
            alone.extend(members)
    return shared, sorted(alone)


def packed_row(
    context: Sequence[int], continuations: Sequence[Sequence[int]]
) -> tuple[list[int], list[int], list[int]]:
    """One input row for a context and its continuations: ``context + c1[:-1] + c2[:-1] + ...`` with its position
    ids (each continuation goes on from the context's end) and where each continuation's segment starts."""
    tokens, positions, starts = list(context), list(range(len(context))), []
    for cont in continuations:
        starts.append(len(tokens))
        tokens.extend(cont[:-1])
        positions.extend(range(len(context), len(context) + len(cont) - 1))
    return tokens, positions, starts


def packed_mask(length: int, context: int, spans: Sequence[tuple[int, int]], width: int) -> torch.Tensor:
    """``[width, width]`` booleans (True: may attend) for a packed row: the context causal, each continuation's
    segment ``(start, length)`` sees the context and itself causally, never another segment; padding sees itself."""
    mask = torch.zeros(width, width, dtype=torch.bool)
    mask[:context, :context] = torch.ones(context, context, dtype=torch.bool).tril()
    for start, size in spans:
        mask[start : start + size, :context] = True
        mask[start : start + size, start : start + size] = torch.ones(size, size, dtype=torch.bool).tril()
    idx = torch.arange(length, width)
    mask[idx, idx] = True
    return mask


def score_shared_contexts(
    model: Any,
    groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]],
    *,
    device: Any = "cpu",
) -> list[list[Answer]]:
    """For each ``(context, continuations)``: ``[(log p(continuation | context), whether greedy decoding gives the
    continuation)]``, all groups in one forward pass of ``model``, one packed row per group (:func:`packed_row`)
    under a mask that keeps the continuations apart (:func:`packed_mask`)."""
    rows = [packed_row(ctx, conts) for ctx, conts in groups]
    width = max(len(tokens) for tokens, _, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    pos = torch.zeros(len(rows), width, dtype=torch.long)
    allowed = torch.zeros(len(rows), 1, width, width, dtype=torch.bool)
    for r, ((ctx, conts), (tokens, positions, starts)) in enumerate(zip(groups, rows, strict=True)):
        ids[r, : len(tokens)] = torch.tensor(tokens)
        pos[r, : len(tokens)] = torch.tensor(positions)
        spans = [(s, len(c) - 1) for s, c in zip(starts, conts, strict=True)]
        allowed[r, 0] = packed_mask(len(tokens), len(ctx), spans, width)
    dtype = next(model.parameters()).dtype
    bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    logits = model(
        input_ids=ids.to(device), position_ids=pos.to(device), attention_mask=bias.to(device), use_cache=False
    ).logits
    out = []
    for r, ((ctx, conts), (_, _, starts)) in enumerate(zip(groups, rows, strict=True)):
        answers = []
        for start, cont in zip(starts, conts, strict=True):
            where = torch.tensor([len(ctx) - 1, *range(start, start + len(cont) - 1)], device=logits.device)
            logprobs = F.log_softmax(logits[r, where].float(), dim=-1)
            tokens = torch.tensor(list(cont), dtype=torch.long, device=logits.device)
            total = float(logprobs.gather(-1, tokens.unsqueeze(-1)).sum())
            answers.append((total, bool((logprobs.argmax(-1) == tokens).all())))
        out.append(answers)
    return out


def packed_batches(sizes: Sequence[int], rows: int, vocab: int, budget: int = LOGITS_BUDGET) -> list[list[int]]:
    """Indices of groups in batches of at most ``rows`` rows whose logits (rows x longest x vocab floats) stay
    under ``budget`` elements; ``sizes`` are the packed lengths, longest first."""
    batches: list[list[int]] = []
    for i in range(len(sizes)):
        if batches and len(batches[-1]) < rows and (len(batches[-1]) + 1) * sizes[batches[-1][0]] * vocab <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def plain_batch_sizes(
    requests: Sequence[Request], rows: int, vocab: int, max_length: int, budget: int = LOGITS_BUDGET
) -> list[tuple[int, list[int]]]:
    """``[(batch size, request indices)]`` for ``HFLM``'s loop: the requests longest first (``HFLM``'s own order),
    cut into runs that share a batch size, each at most ``rows`` and small enough that a batch's logits (size x its
    longest input x ``vocab``) stay under ``budget``; a request too long for any batch runs alone."""
    order = sorted(range(len(requests)), key=lambda i: (-len(requests[i][1]) - len(requests[i][2]), i))
    sizes = [min(len(requests[i][1]) + len(requests[i][2]), max_length + 1) - 1 for i in order]
    runs: list[tuple[int, list[int]]] = []
    for batch in packed_batches(sizes, rows, vocab, budget):
        if runs and runs[-1][0] == len(batch):
            runs[-1][1].extend(order[k] for k in batch)
        else:
            runs.append((len(batch), [order[k] for k in batch]))
    return runs


def _agree(a: Sequence[Answer], b: Sequence[Answer]) -> bool:
    return all(x[1] == y[1] and math.isclose(x[0], y[0], rel_tol=RTOL, abs_tol=ATOL) for x, y in zip(a, b, strict=True))


class SharedPrefixLM(HFLM):
    """lm-eval's ``HFLM`` whose log-likelihood requests that share a context run that context once."""

    shared_ok: bool | None = None  # None: not yet checked on this model; False: the plain loop for good

    @property
    def logits_width(self) -> int:
        """The model's vocabulary as its logits have it (the configuration's, not the tokenizer's)."""
        return int(self.model.config.get_text_config().vocab_size)

    @property
    def shared_length(self) -> int:
        """The longest request scored in a packed row: the model's length, or its sliding attention window when it
        has one (a packed row's own mask replaces the model's, so no request may reach past the window)."""
        window = getattr(self.model.config.get_text_config(), "sliding_window", None)
        return min(self.max_length, int(window)) if window else self.max_length

    def _loglikelihood_tokens(
        self, requests: list[Request], disable_tqdm: bool = False, override_bs: int | None = None
    ) -> list[Answer]:
        if self.backend != "causal" or self.shared_ok is False:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        shared, alone = shared_groups(requests, self.shared_length)
        results: list[Answer | None] = [None] * len(requests)

        def plain(indices: list[int]) -> None:
            if indices:
                scored = self._bounded([requests[i] for i in indices], disable_tqdm, override_bs)
                for i, answer in zip(indices, scored, strict=True):
                    results[i] = answer

        plain(alone)
        # a packed row's length: the context, then each continuation but its last token (as packed_row lays it out)
        length = {ctx: len(ctx) + sum(len(requests[i][2]) - 1 for i in members) for ctx, members in shared.items()}
        groups = sorted(shared.items(), key=lambda item: -length[item[0]])
        sizes = [length[ctx] for ctx, _ in groups]
        rows = self.batch_size if isinstance(self.batch_size, int) else 8
        bar = progress_bar(
            not disable_tqdm and self.rank == 0,
            total=sum(len(m) for _, m in groups),
            desc="Running loglikelihood requests (shared contexts)",
        )
        for batch in packed_batches(sizes, max(1, rows), self.logits_width, LOGITS_BUDGET):
            chunk = [groups[g] for g in batch]
            answers = self._score_batch([(ctx, [requests[i] for i in members]) for ctx, members in chunk])
            if answers is None:  # the check failed: everything left goes the plain way
                plain([i for _, members in groups[batch[0] :] for i in members])
                break
            for (_, members), group_answers in zip(chunk, answers, strict=True):
                for i, answer in zip(members, group_answers, strict=True):
                    results[i] = answer
                    if requests[i][0] is not None:
                        self.cache_hook.add_partial("loglikelihood", requests[i][0], answer)
                bar.update(len(members))
        bar.close()
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            raise RuntimeError(f"{len(missing)} log-likelihood requests were not scored")
        return results  # type: ignore[return-value]

    def _bounded(self, requests: list[Request], disable_tqdm: bool, override_bs: int | None) -> list[Answer]:
        """``HFLM``'s own loop over ``requests``, in batches of at most ``batch_size`` whose logits stay under
        :data:`LOGITS_BUDGET` (:func:`plain_batch_sizes`); the answers in the requests' order."""
        rows = self.batch_size_per_gpu
        if not isinstance(rows, int):  # "auto": lm-eval sizes its batches itself
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        results: list[Answer | None] = [None] * len(requests)
        try:
            for size, indices in plain_batch_sizes(requests, rows, self.logits_width, self.max_length, LOGITS_BUDGET):
                self.batch_size_per_gpu = size
                scored = super()._loglikelihood_tokens([requests[i] for i in indices], disable_tqdm=disable_tqdm)
                for i, answer in zip(indices, scored, strict=True):
                    results[i] = answer
        finally:
            self.batch_size_per_gpu = rows
        return results  # type: ignore[return-value]

    def _score_batch(self, chunk: list[tuple[tuple[int, ...], list[Request]]]) -> list[list[Answer]] | None:
        """The groups' answers, or None when this model fails the check on its first group (then never shared)."""
        try:
            with (
                torch.no_grad(),
                torch.autocast(
                    device_type=self.device.type,
                    dtype=self.mixed_precision_dtype,
                    enabled=self.mixed_precision_dtype is not None,
                ),
            ):
                answers = score_shared_contexts(
                    self.model, [(ctx, [r[2] for r in group]) for ctx, group in chunk], device=self.device
                )
        except (RuntimeError, TypeError, ValueError, AttributeError, IndexError) as exc:
            self.shared_ok = False
            log.warning(
                "contexts are not shared on this model (%s: %s); scoring each request whole", type(exc).__name__, exc
            )
            return None
        if self.shared_ok is None:  # the first group, scored the plain way too
            whole = self._bounded(chunk[0][1], True, None)
            self.shared_ok = _agree(answers[0], whole)
            if not self.shared_ok:
                log.warning(
                    "shared-context scores differ from whole-request scores on this model; scoring each request whole"
                )
                return None
        return answers


__all__ = [
    "LOGITS_BUDGET",
    "SharedPrefixLM",
    "packed_batches",
    "packed_mask",
    "packed_row",
    "plain_batch_sizes",
    "score_shared_contexts",
    "shared_groups",
]
