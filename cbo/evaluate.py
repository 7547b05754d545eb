"""Evaluation of a (pruned) causal LM: held-out perplexity, KL to the original, next-token agreement,
parameter count, and prefill / decode throughput.

All losses are computed in float32 whatever the model dtype. Windows are ``(B, T)`` int64 token ids; every
position but the last predicts the next token (``B * (T - 1)`` predictions).

Example:
    >>> ref = reference_logits(model, splits.test)                 # doctest: +SKIP
    >>> evaluate(pruned, splits.test, ref)                           # doctest: +SKIP
    {'ppl': 52.1, 'nll': 3.95, 'kl': 0.21, 'agreement': 0.83, 'n_params': 120000000, 'n_tokens': 8128}
"""

from __future__ import annotations

import inspect
import math
import resource
import statistics
import time
from typing import Any

from cbo.data.windows import check_windows
from cbo.errors import DataError
from cbo.extras import require
from cbo.model.forward import input_device, window_batches
from cbo.model.head import position_logits

torch = require("torch", "evaluation")
F = torch.nn.functional


def _check_ref(windows: Any, ref_logprobs: Any) -> None:
    b, t = windows.shape
    if not isinstance(ref_logprobs, torch.Tensor) or ref_logprobs.dim() != 3 or tuple(ref_logprobs.shape[:2]) != (b, t):
        shape = tuple(ref_logprobs.shape) if isinstance(ref_logprobs, torch.Tensor) else type(ref_logprobs).__name__
        raise DataError(f"reference log-probs must have shape ({b}, {t}, vocab) for these windows, got {shape}")


@torch.no_grad()
def reference_logits(model: Any, windows: Any, *, batch_size: int = 8, dtype: Any = None) -> Any:
    """Log-probabilities of the (unpruned) teacher model, ``(B, T, V)`` on the CPU.

    Computed once and reused for KL and agreement of every candidate. ``dtype`` (default float32) may be set to
    bfloat16/float16 to halve the memory of large references; comparisons are always done in float32. The
    logits are computed a few positions at a time (:mod:`cbo.model.head`), so the only full-size tensor is the result.
    """
    windows = check_windows(windows, model)
    dtype = torch.float32 if dtype is None else dtype
    device = input_device(model)
    out = None
    for start, batch in window_batches(windows, batch_size):
        for pos, logits in position_logits(model, batch.to(device)):
            logp = F.log_softmax(logits.float(), dim=-1).to("cpu", dtype)
            if out is None:
                out = torch.empty((*windows.shape, logp.shape[-1]), dtype=dtype)
            out[start : start + batch.shape[0], pos : pos + logp.shape[1]] = logp
    return out


@torch.no_grad()
def _scores(model: Any, windows: Any, ref_logprobs: Any | None, batch_size: int) -> dict[str, Any]:
    windows = check_windows(windows, model)
    if ref_logprobs is not None:
        _check_ref(windows, ref_logprobs)
    device = input_device(model)
    nll_sum, kl_sum, agree, n_pred, n_pos = 0.0, 0.0, 0, 0, 0
    t = windows.shape[1]
    for start, batch in window_batches(windows, batch_size):
        batch = batch.to(device)
        rows = slice(start, start + batch.shape[0])
        # every sum below runs over chunks of positions: the (B, T, V) logits never exist at once
        for pos, logits in position_logits(model, batch):
            logp = F.log_softmax(logits.float(), dim=-1)
            stop = pos + logp.shape[1]
            predicting = min(stop, t - 1) - pos  # the last position of a window predicts nothing
            if predicting > 0:
                target = batch[:, pos + 1 : pos + 1 + predicting].to(logp.device)
                nll_sum += float(-logp[:, :predicting].gather(-1, target.unsqueeze(-1)).sum())
                n_pred += target.numel()
            if ref_logprobs is not None:
                ref = ref_logprobs[rows, pos:stop].to(logp.device, torch.float32)
                p_ref = ref.exp()
                kl_sum += float(torch.where(p_ref > 0, p_ref * (ref - logp), torch.zeros_like(p_ref)).sum())
                agree += int((ref.argmax(-1) == logp.argmax(-1)).sum())
                n_pos += ref.shape[0] * ref.shape[1]
    if not math.isfinite(nll_sum):
        raise DataError("the model produced a non-finite loss on these windows")
    out = {"nll": nll_sum / n_pred, "n_tokens": n_pred}
    out["ppl"] = math.exp(out["nll"]) if out["nll"] < 700 else math.inf
    if ref_logprobs is not None:
        out["kl"] = kl_sum / n_pos
        out["agreement"] = agree / n_pos
    return out


def perplexity(model: Any, windows: Any, *, batch_size: int = 8) -> float:
    """Perplexity ``exp(mean next-token NLL)`` over all ``B * (T - 1)`` predictions of the windows."""
    return _scores(model, windows, None, batch_size)["ppl"]


def kl_to_reference(model: Any, windows: Any, ref_logprobs: Any, *, batch_size: int = 8) -> float:
    """Mean ``KL(ref || model)`` per token position, in nats (all ``B * T`` positions)."""
    return _scores(model, windows, ref_logprobs, batch_size)["kl"]


def next_token_agreement(model: Any, windows: Any, ref_logprobs: Any, *, batch_size: int = 8) -> float:
    """Fraction of positions where the model's most likely next token equals the reference's."""
    return _scores(model, windows, ref_logprobs, batch_size)["agreement"]


def count_parameters(model: Any) -> int:
    """Number of parameters, shared (tied) tensors counted once."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def evaluate(model: Any, windows: Any, ref_logprobs: Any = None, *, batch_size: int = 8) -> dict[str, Any]:
    """Perplexity, mean NLL, and (with ``ref_logprobs``) KL to the reference and next-token agreement.

    Returns:
        ``{"ppl", "nll", "n_tokens", "n_params"}`` plus ``"kl"`` and ``"agreement"`` when a reference is given
        (``None`` otherwise).
    """
    out = _scores(model, windows, ref_logprobs, batch_size)
    out.setdefault("kl", None)
    out.setdefault("agreement", None)
    out["n_params"] = count_parameters(model)
    return out


# ------------------------------------------------------------------------------------------ speed


def _cache_kwarg(model: Any) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _returned_cache(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _sync(device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def _one_run(model: Any, prompt: Any, new_tokens: int, cache_kw: str) -> tuple[float, float]:
    device = prompt.device
    _sync(device)
    t0 = time.perf_counter()
    out = model(input_ids=prompt, use_cache=True)
    _sync(device)
    t_prefill = time.perf_counter() - t0
    cache = _returned_cache(out)
    token = out.logits[:, -1:].argmax(-1)
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        out = model(input_ids=token, use_cache=True, **{cache_kw: cache})
        cache = _returned_cache(out)
        token = out.logits[:, -1:].argmax(-1)
    _sync(device)
    return t_prefill, time.perf_counter() - t0


def throughput(
    model: Any,
    *,
    prompt_len: int = 128,
    new_tokens: int = 32,
    batch_size: int = 1,
    repeats: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Prefill and decode speed: one forward over the prompt, then greedy decoding with the KV cache.

    Random prompts of ``prompt_len`` tokens; one warm-up run, then the median of ``repeats`` runs.

    Returns:
        ``prefill_tokens_per_s`` (prompt tokens / prefill time), ``decode_tokens_per_s`` (generated tokens /
        decode time), the median times, ``peak_memory_bytes`` (``torch.cuda.max_memory_allocated`` on a GPU;
        the process's peak resident memory on the CPU, which never goes down, see ``memory_kind``), the device
        and the settings.
    """
    if prompt_len < 1 or new_tokens < 1 or batch_size < 1 or repeats < 1:
        raise DataError("prompt_len, new_tokens, batch_size and repeats must all be >= 1")
    device = input_device(model)
    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (batch_size, prompt_len), generator=g).to(device)
    cache_kw = _cache_kwarg(model)
    was_training = model.training
    model.eval()
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _one_run(model, prompt, min(new_tokens, 2), cache_kw)  # warm-up
        runs = [_one_run(model, prompt, new_tokens, cache_kw) for _ in range(repeats)]
    finally:
        model.train(was_training)
    t_prefill = statistics.median(r[0] for r in runs)
    t_decode = statistics.median(r[1] for r in runs)
    if device.type == "cuda":
        peak, kind = int(torch.cuda.max_memory_allocated(device)), "cuda max_memory_allocated"
    else:
        peak, kind = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process peak RSS"
    return {
        "prefill_tokens_per_s": batch_size * prompt_len / t_prefill,
        "decode_tokens_per_s": batch_size * new_tokens / t_decode,
        "prefill_s": t_prefill,
        "decode_s": t_decode,
        "peak_memory_bytes": peak,
        "memory_kind": kind,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "batch_size": batch_size,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "repeats": repeats,
    }
