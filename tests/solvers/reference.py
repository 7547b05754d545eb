"""Brute-force reference and random instances for solver tests.

``tests/solvers`` is on ``sys.path`` while its tests run (pytest imports its conftest from there), so
solver tests import this module directly::

    from reference import brute_force_topk, make_instance

Instance kinds (``make_instance(kind, n, seed)``):

* ``"block"``: :func:`cbo.qubo.instances.random_block_qubo` (heavy-tailed diagonal, low-rank coupling).
* ``"integer"``: small integer H and g, so that many states tie in energy.
* ``"negative"``: dense symmetric couplings of both signs, many strongly negative.
* ``"heavy_ends"``: a block instance with expensive first and last blocks.
"""

from __future__ import annotations

import itertools

import numpy as np

from cbo.qubo.block_qubo import BlockQUBO
from cbo.qubo.instances import random_block_qubo

INSTANCE_KINDS = ("block", "integer", "negative", "heavy_ends")


def all_feasible(qubo: BlockQUBO, M: int) -> tuple[np.ndarray, np.ndarray]:
    """Every feasible state with exactly M removed, sorted by energy: (states (B, N) uint8, energies)."""
    n = qubo.n
    combos = list(itertools.combinations(range(n), M)) if 0 <= M <= n else []
    X = np.zeros((len(combos), n), dtype=np.uint8)
    for row, removed in enumerate(combos):
        X[row, list(removed)] = 1
    X = X[qubo.feasible(X, M)] if len(X) else X
    E = np.asarray(qubo.energy(X), dtype=np.float64) if len(X) else np.zeros(0)
    order = np.argsort(E, kind="stable")
    return X[order], E[order]


def brute_force_topk(qubo: BlockQUBO, M: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k lowest-energy feasible states with exactly M removed (ties in any order)."""
    X, E = all_feasible(qubo, M)
    return X[:k], E[:k]


def make_instance(kind: str, n: int, seed: int, **constraints) -> BlockQUBO:
    """A random BlockQUBO of the given kind (see the module docstring); constraints pass through."""
    rng = np.random.default_rng([n, seed, INSTANCE_KINDS.index(kind)])
    if kind == "block":
        q = random_block_qubo(n, seed)
        H, g = q.H, q.g
    elif kind == "heavy_ends":
        q = random_block_qubo(n, seed, heavy_ends=True)
        H, g = q.H, q.g
    elif kind == "integer":
        A = rng.integers(-2, 3, size=(n, n)).astype(float)
        H = A + A.T
        g = rng.integers(-2, 3, size=n).astype(float)
    else:  # "negative"
        A = rng.normal(size=(n, n))
        B = np.abs(rng.normal(size=(n, n)))
        H = (A + A.T) - (B + B.T)
        g = rng.normal(size=n)
    return BlockQUBO(H, g, **constraints)


def make_constrained(n: int, seed: int) -> BlockQUBO:
    """A block instance with two kinds, varied sizes, a keep and a force block, a cap and a budget."""
    rng = np.random.default_rng([n, seed, 99])
    q = random_block_qubo(n, seed)
    kinds = ["attention" if i % 2 == 0 else "mlp" for i in range(n)]
    sizes = rng.integers(1, 6, size=n)
    return BlockQUBO(
        q.H,
        q.g,
        kinds=kinds,
        sizes=sizes,
        keep=[0],
        force=[int(rng.integers(1, n))],
        caps={"attention": 3},
        max_removed_params=int(sizes.sum() * 0.45),
    )
