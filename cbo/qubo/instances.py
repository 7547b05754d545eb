"""Synthetic QUBO instances shaped like block Hessians, for tests, benchmarks and the demo."""

from __future__ import annotations

from typing import Any

import numpy as np

from cbo.checks import check_choice, check_float, check_int, check_memory, check_seed
from cbo.errors import InvalidQUBOError
from cbo.qubo.block_qubo import BlockQUBO


def random_block_qubo(
    n: int,
    seed: int = 0,
    *,
    rank: int | None = None,
    coupling: float = 0.3,
    noise: float = 0.05,
    heavy_ends: bool = False,
    kinds: str | list[str] = "layer",
) -> BlockQUBO:
    """A random instance with the structure seen in real block Hessians.

    ``H = diag(d) + c·UUᵀ/r + ε`` with a heavy-tailed (log-normal) diagonal ``d`` (a few blocks
    matter much more than the rest), a low-rank PSD coupling ``UUᵀ`` of rank ``r`` (blocks that
    write into the same directions interact), and small symmetric noise ``ε`` that makes some
    couplings negative. ``heavy_ends`` makes the first and last block expensive to remove, as in
    real LLMs. ``g = 0`` (the KL loss has zero gradient at the unpruned model).

    Args:
        n: number of blocks.
        seed: the instance is a pure function of (n, seed, options).
        rank: rank of the coupling (default ``max(2, n // 8)``).
        coupling: scale of the low-rank coupling relative to the median diagonal.
        noise: scale of the symmetric noise relative to the median diagonal.
        heavy_ends: make blocks 0 and n-1 about 10x the largest diagonal.
        kinds: one kind for all blocks, or a list.

    Example:
        >>> q = random_block_qubo(30, seed=1, heavy_ends=True)
        >>> q.n
        30
    """
    n = check_int("n", n, lo=1, error=InvalidQUBOError)
    seed = check_seed("seed", seed, error=InvalidQUBOError)
    r = check_int("rank (of the coupling)", max(2, n // 8) if rank is None else rank, lo=1, hi=max(n, 2),
                  error=InvalidQUBOError)  # fmt: skip
    check_float("coupling", coupling, lo=0, error=InvalidQUBOError)
    check_float("noise", noise, lo=0, error=InvalidQUBOError)
    check_dense(n, r)
    rng = np.random.default_rng([int(n), int(seed)])
    d = rng.lognormal(mean=0.0, sigma=1.0, size=n)
    med = float(np.median(d))
    U = rng.normal(size=(n, r))
    H = np.diag(d) + coupling * med * (U @ U.T) / r
    E = rng.normal(scale=noise * med, size=(n, n))
    H = H + (E + E.T) / 2
    if heavy_ends and n >= 2:
        big = 10.0 * float(np.max(np.diag(H)))
        H[0, 0] += big
        H[-1, -1] += big
    names = [f"layers.{i}" for i in range(n)]
    params = {"rank": r, "coupling": coupling, "noise": noise, "heavy_ends": heavy_ends}
    return _synthetic(H, names, kinds, "random_block_qubo", seed, params)


DENSE_COPIES = 8  # n x n float64 matrices alive at once while an instance is drawn and checked


def check_dense(n: int, rank: int = 0) -> None:
    """InvalidQUBOError before drawing an ``n``-block instance that cannot fit in this machine's memory."""
    check_memory(
        f"a synthetic instance of n={n} blocks", DENSE_COPIES * 8 * n * n + 8 * n * rank, error=InvalidQUBOError,
        hint="Use a smaller n.",
    )  # fmt: skip


def _synthetic(H: np.ndarray, names: list[str], kinds: Any, generator: str, seed: int, params: dict) -> BlockQUBO:
    """A synthetic instance (``g = 0``) whose metadata names its generator and every parameter it was drawn with."""
    n = H.shape[0]
    meta = {"source": "synthetic", "generator": f"cbo.qubo.instances.{generator}", "n": int(n), "seed": int(seed)}
    return BlockQUBO(H, np.zeros(n), names=names, kinds=kinds, metadata={**meta, **params})


# Relative removal costs (variance of a block's gate gradient over the median block) at the two ends of the
# network, read off the committed SmolLM2-135M Fisher instances (benchmarks/instances/): the first blocks and
# the last MLPs carry most of the loss; the last attention block carries almost none.
_LAYER_HEAD = (4.0, 6.0, 2.5)
_LAYER_TAIL = (6.0, 11.0)
_SUBLAYER_HEAD = (8.0, 7.5, 13.0, 2.5)  # attn 0, mlp 0, attn 1, mlp 1
_SUBLAYER_TAIL = (0.5, 10.0, 0.35, 17.0)  # attn n-2, mlp n-2, attn n-1, mlp n-1
# Correlation of the last block's gradient with the blocks before it (nearest first): in the real instances
# the last block compensates its predecessors (SmolLM2 layers: 29 vs 28 −0.69, vs 27/26 ≈ −0.35).
_LAYER_TAIL_CORR = (-0.62, -0.3, -0.3)
_SUBLAYER_TAIL_CORR = (-0.45, -0.62, 0.0, -0.2)  # last mlp vs attn n-1, mlp n-2, attn n-2, mlp n-3


def fisher_block_qubo(
    n: int,
    seed: int = 0,
    *,
    samples: int = 32,
    granularity: str = "layer",
    spread: float = 0.45,
    attention_ratio: float = 0.55,
    coupling: float = 0.04,
    sequence_spread: float = 0.2,
    compensation: float = 0.9,
    tail_correlation: float = 1.0,
    mean_diagonal: float = 0.3,
) -> BlockQUBO:
    """A Fisher-shaped instance ``H = AᵀA / samples`` from simulated per-sequence gate gradients.

    Each row of ``A`` is one calibration sequence's gradient of the loss with respect to the N gates, drawn as
    ``a_s = w_s · σ ∘ z_s``: ``σ_i`` is block i's gradient scale (heavy first blocks and last MLPs, log-normal
    spread in between, attention halves cheaper than MLP halves at sublayer granularity), ``z_s`` a
    unit-variance vector with the population correlations of real blocks (the last block anti-correlated
    with its predecessors, weak random couplings elsewhere), and ``w_s`` a per-sequence scale (some
    sequences have much larger gradients). The sample estimate is what the project's ``fisher`` estimator
    returns: positive semidefinite, of rank ``min(n, samples)``, with the sampling noise of the couplings
    that makes real instances hard (most pairwise correlations are ±1/√samples noise). ``g = 0`` (KL loss).

    The defaults are fitted to the committed SmolLM2-135M instances (30 layers and 60 sublayers, 32
    calibration sequences): spectrum, diagonal profile, coupling-to-diagonal ratio and the last blocks'
    anti-correlation match within the tolerances of ``tests/test_instances.py`` (see
    :func:`fisher_statistics`).

    Args:
        n: number of blocks (even at sublayer granularity: attention and MLP halves alternate).
        seed: the instance is a pure function of (n, seed, options).
        samples: calibration sequences (rows of A); the rank of H is ``min(n, samples)``.
        granularity: ``"layer"`` (kinds ``layer``) or ``"sublayer"`` (kinds ``attention`` / ``mlp``).
        spread: log-normal spread of the middle blocks' gradient variances.
        attention_ratio: typical variance of an attention half over an MLP half (sublayer only).
        coupling: scale of the weak random population correlations between blocks.
        sequence_spread: log-normal spread of the per-sequence gradient scale.
        compensation: a common anti-correlation of about ``−compensation / n`` between all blocks (the real
            instances' mean correlation is slightly negative).
        tail_correlation: multiplies the last block's anti-correlation with its predecessors (0 removes it).
        mean_diagonal: the mean of diag(H) (sets the energy scale).

    Example:
        >>> q = fisher_block_qubo(80, seed=0)
        >>> q.n, int(np.linalg.matrix_rank(q.H))
        (80, 32)
    """
    n = check_int("n", n, lo=2, error=InvalidQUBOError)
    samples = check_int("samples", samples, lo=1, error=InvalidQUBOError)
    check_choice("granularity", granularity, ("layer", "sublayer"), error=InvalidQUBOError)
    if granularity == "sublayer" and n % 2:
        raise InvalidQUBOError(f"n={n} must be even at sublayer granularity (attention and MLP halves alternate).")
    for name, value in (("spread", spread), ("coupling", coupling), ("sequence_spread", sequence_spread)):
        check_float(name, value, lo=0, error=InvalidQUBOError)
    check_float("mean_diagonal", mean_diagonal, lo=0, lo_open=True, error=InvalidQUBOError)
    check_float("attention_ratio", attention_ratio, lo=0, lo_open=True, error=InvalidQUBOError)
    check_dense(n, samples)
    sub = granularity == "sublayer"
    rng = np.random.default_rng([int(n), int(seed), int(samples), 1 + sub])
    n = int(n)
    var = rng.lognormal(0.0, spread, size=n)
    if sub:
        var[0::2] *= attention_ratio
        head, tail, tail_corr = _SUBLAYER_HEAD, _SUBLAYER_TAIL, _SUBLAYER_TAIL_CORR
        kinds = ["attention", "mlp"] * (n // 2)
        names = [f"layers.{i // 2}.{'attn' if i % 2 == 0 else 'mlp'}" for i in range(n)]
    else:
        head, tail, tail_corr = _LAYER_HEAD, _LAYER_TAIL, _LAYER_TAIL_CORR
        kinds = ["layer"] * n
        names = [f"layers.{i}" for i in range(n)]
    med = float(np.median(var))
    head = head[: n // 2]
    tail = tail[max(0, len(tail) - (n - len(head))) :]
    for i, f in enumerate(head):
        var[i] = f * med * rng.lognormal(0.0, 0.1)
    for i, f in enumerate(tail):
        var[n - len(tail) + i] = f * med * rng.lognormal(0.0, 0.1)
    # population correlation: weak random low-rank couplings, then the last block tied to its predecessors
    rank = max(2, n // 8)
    U = rng.normal(size=(n, rank)) * (coupling / np.sqrt(rank))
    L = np.hstack([np.eye(n) - compensation / n, U])
    corr = np.array(tail_corr[: n - 1]) * tail_correlation
    room = max(0.0, 1.0 - float(corr @ corr))
    last = np.zeros(L.shape[1])
    for k, c in enumerate(corr):
        last += c * L[n - 2 - k] / np.linalg.norm(L[n - 2 - k])
    last += np.sqrt(room) * L[n - 1] / np.linalg.norm(L[n - 1])
    L[n - 1] = last
    L /= np.linalg.norm(L, axis=1, keepdims=True)
    Z = rng.normal(size=(samples, L.shape[1])) @ L.T
    w = rng.lognormal(0.0, sequence_spread, size=(samples, 1))
    A = w * Z * np.sqrt(var)
    H = A.T @ A / samples
    H *= mean_diagonal / float(np.mean(np.diag(H)))
    params = {"samples": int(samples), "granularity": granularity, "spread": spread}
    params |= {"attention_ratio": attention_ratio, "coupling": coupling, "sequence_spread": sequence_spread}
    params |= {"compensation": compensation, "tail_correlation": tail_correlation, "mean_diagonal": mean_diagonal}
    return _synthetic(H, names, kinds, "fisher_block_qubo", seed, params)


def fisher_statistics(H: np.ndarray) -> dict[str, float]:
    """Shape statistics of a Fisher-type block Hessian, the targets :func:`fisher_block_qubo` is fitted to.

    Returns a dict: ``top_eigenvalue`` and ``top5_eigenvalues`` / ``top10_eigenvalues`` (fractions of the
    trace), ``rank`` (relative tolerance 1e-9), ``max_diagonal`` / ``p90_diagonal`` (over the median
    diagonal), ``coupling_ratio`` (mean |H_ij|, i ≠ j, over the mean diagonal), ``negative_couplings`` (their
    fraction), ``correlation_sd`` (spread of the correlations H_ij/√(H_ii H_jj)) and ``last_correlation``
    (between the last two blocks).
    """
    H = np.asarray(H, dtype=np.float64)
    n = H.shape[0]
    d = np.diag(H)
    ev = np.linalg.eigvalsh(H)[::-1]
    tr = float(ev.sum())
    off = ~np.eye(n, dtype=bool)
    s = np.sqrt(np.maximum(d, 1e-300))
    C = H / np.outer(s, s)
    med = float(np.median(d))
    return {
        "top_eigenvalue": float(ev[0] / tr),
        "top5_eigenvalues": float(ev[:5].sum() / tr),
        "top10_eigenvalues": float(ev[:10].sum() / tr),
        "rank": float(np.sum(ev > 1e-9 * ev[0])),
        "max_diagonal": float(d.max() / med),
        "p90_diagonal": float(np.quantile(d, 0.9) / med),
        "coupling_ratio": float(np.abs(H[off]).mean() / d.mean()),
        "negative_couplings": float((H[off] < 0).mean()),
        "correlation_sd": float(C[off].std()),
        "last_correlation": float(C[-1, -2]),
    }
