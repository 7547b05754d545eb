"""``trust``: the trust-region refinement against brute force over losses measured on surgically pruned models."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hessian_reference import logits_of, ref_loss_per_sequence, teacher_logprobs
from tiny_models import build_tiny_model, random_token_windows

from cbo.errors import CBOError
from cbo.hessian import estimate_hessian
from cbo.surgery.depth import remove_blocks

N, M = 5, 2


@pytest.fixture(scope="module")
def setup():
    model = build_tiny_model("llama", n_layers=N, seed=2)
    windows = random_token_windows(model, n=4, seq_len=10, seed=1)
    teacher = teacher_logprobs(model, windows)
    with torch.no_grad():
        measured = {
            s: float(
                ref_loss_per_sequence(logits_of(remove_blocks(model, list(s)), windows), windows, "kl", teacher).mean()
            )
            for r in (M - 1, M, M + 1)
            for s in itertools.combinations(range(N), r)
        }
    return model, windows, measured


def _x(removed):
    x = np.zeros(N)
    x[list(removed)] = 1
    return x


def test_exhaustive_trust_region_ends_in_a_measured_local_minimum(setup):
    model, windows, measured = setup
    q = estimate_hessian(
        model, None, windows, estimator="trust", remove=M, proposals=100, max_steps=20, batch_size=2, progress=False
    )
    path = q.metadata["trust_path"]
    final = tuple(q.metadata["trust_final"]["removed"])
    # each step lowers the measured loss; the values are the surgically measured ones
    losses = [p["loss"] for p in path]
    assert all(b < a for a, b in zip(losses, losses[1:]))
    for p in path:
        assert p["loss"] == pytest.approx(measured[tuple(p["removed"])], abs=1e-5)
    # no swap (restore one block, remove another) improves the final state
    for a in final:
        for b in set(range(N)) - set(final):
            swapped = tuple(sorted(set(final) - {a} | {b}))
            assert measured[swapped] >= measured[final] - 1e-6
    # the start is the hybrid QUBO's ground state
    hybrid = estimate_hessian(model, None, windows, estimator="hybrid", batch_size=2, progress=False)
    best = min(itertools.combinations(range(N), M), key=lambda s: hybrid.energy(_x(s)))
    assert tuple(path[0]["removed"]) == best


def test_returned_qubo_is_exact_on_flips_and_measured_swaps(setup):
    model, windows, measured = setup
    q = estimate_hessian(
        model, None, windows, estimator="trust", remove=M, proposals=3, max_steps=4, batch_size=2, progress=False
    )
    final = tuple(q.metadata["trust_final"]["removed"])
    flips = {int(i): v for i, v in q.metadata["trust_final"]["flips"].items()}
    single = [measured[(i,)] for i in range(N)]
    for i in range(N):  # measured: every removed block, and every kept one not screened out
        assert (i in flips) == (i in final or single[i] <= 4.0 * max(single[j] for j in final))
    e0 = q.energy(_x(final))
    for i in flips:
        flipped = tuple(sorted(set(final) ^ {i}))
        assert flips[i] == pytest.approx(measured[flipped], abs=1e-5)
        assert q.energy(_x(flipped)) - e0 == pytest.approx(measured[flipped] - measured[final], abs=1e-5)
    # every swap neighbour measured during the last step is exact too
    exact = 0
    for a in final:
        for b in set(range(N)) - set(final):
            s = tuple(sorted(set(final) - {a} | {b}))
            if abs(q.energy(_x(s)) - e0 - (measured[s] - measured[final])) < 1e-5:
                exact += 1
    assert exact >= 1


def test_keep_locality_and_options(setup):
    model, windows, _ = setup
    q = estimate_hessian(
        model, None, windows, estimator="trust", remove=M, keep=[0, N - 1], locality=1.0, batch_size=2, progress=False
    )
    for p in q.metadata["trust_path"]:
        assert not {0, N - 1} & set(p["removed"])
    final = q.metadata["trust_final"]["removed"]
    # with a locality penalty the final state is the QUBO's ground state among states that keep the kept blocks
    free = [i for i in range(N) if i not in (0, N - 1)]
    best = min(itertools.combinations(free, M), key=lambda s: q.energy(_x(s)))
    assert list(best) == final
    with pytest.raises(CBOError, match="remove=M"):
        estimate_hessian(model, None, windows, estimator="trust", progress=False)
    with pytest.raises(CBOError, match="out of range"):
        estimate_hessian(model, None, windows, estimator="trust", remove=N, progress=False)


def test_prune_depth_passes_remove_to_the_estimator(setup):
    from cbo.data.windows import TokenSplits
    from cbo.model.blocks import find_blocks
    from cbo.pipeline import prune_depth

    model, windows, _ = setup
    splits = TokenSplits(windows, windows[:2], windows[:0], {})
    report = prune_depth(
        model,
        None,
        remove=M,
        estimator="trust",
        splits=splits,
        top_k=3,
        validate=2,
        progress=False,
        cache_dir=None,
        refine=None,  # report.qubo is then the estimator's own
    )
    assert len(report.chosen_blocks) == M
    assert report.qubo.metadata["options"]["remove"] == M
    assert len(find_blocks(report.pruned_model)) == N - M


@pytest.mark.parametrize("name", ["fit", "trust"])
def test_targeted_estimators_name_themselves_in_option_errors(name):
    from cbo.hessian.base import get

    options = get(name).Options
    with pytest.raises(CBOError, match=f"estimator '{name}' needs remove=M"):
        options().validate()
    with pytest.raises(CBOError, match="keep must be a list of integer indices"):
        options(remove=2, keep="0").validate()
