"""Synthetic QUBO instances shaped like block Hessians, for tests, benchmarks and the demo."""

from __future__ import annotations

import numpy as np

from cbo.errors import InvalidQUBOError
from cbo.qubo import BlockQUBO


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
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidQUBOError(f"n must be an integer >= 1, got {n!r}.")
    rng = np.random.default_rng([int(n), int(seed)])
    r = max(2, n // 8) if rank is None else int(rank)
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
    return BlockQUBO(
        H,
        np.zeros(n),
        names=names,
        kinds=kinds,
        metadata={
            "source": "synthetic",
            "generator": "cbo.instances.random_block_qubo",
            "n": int(n),
            "seed": int(seed),
            "rank": r,
            "coupling": coupling,
            "noise": noise,
            "heavy_ends": heavy_ends,
        },
    )
