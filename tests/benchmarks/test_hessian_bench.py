"""benchmarks/hessian.py --quick on the default model: every case runs in its own process and its pass counts
are those of its estimator's definition (so the cost table measures what it names)."""

from __future__ import annotations

import json

import pytest
from bench_scripts import bench_module, run_script


@pytest.mark.model
@pytest.mark.slow
def test_hessian_bench_quick(installed, tmp_path):
    proc = run_script("hessian", "--quick", "--threads", "1", "--out", str(tmp_path))
    assert "÷ fwd+bwd" in proc.stdout
    assert "÷ fwd+bwd" in (tmp_path / "hessian.md").read_text()
    data = json.loads((tmp_path / "hessian.json").read_text())
    assert data["command"].startswith(".venv/bin/python -m benchmarks.hessian --quick")
    assert data["settings"]["n"] == 2 and data["settings"]["seq_len"] == 32
    r = data["results"]
    bench = bench_module("hessian")
    assert set(r) == set(bench.CASES)
    n = r["fisher"]["n_blocks"]
    for name, case in r.items():
        assert case["time_s"] > 0 and case["reference_s"] > 0, name
        assert case["ratio"] == pytest.approx(case["time_s"] / case["reference_s"])
        assert case["tokens"] == (32 if name == "exact@1" else 64), name
    # one forward and one backward per label draw; CE adds the gradient of its own loss
    assert (r["fisher"]["forward_passes"], r["fisher"]["backward_passes"]) == (1, 1)
    assert r["fisher-4draws"]["backward_passes"] == 4
    assert r["fisher-ce"]["backward_passes"] == 2
    # exact: the gate gradient, then one Hessian-vector product per block
    assert r["exact@1"]["backward_passes"] == n + 1
    # singles: no backward; N removals sharing prefixes cost between one and N + 1 full forwards
    assert r["singles"]["backward_passes"] == 0
    assert 1 < r["singles"]["forward_equivalents"] <= n + 1
    # pairwise: 1 + k + k(k - 1)/2 passes on the gated subset, the full count predicted from N
    p = r["pairwise@subset"]
    k = len(p["gated_blocks"])
    # every single and pair of the gated subset measured, through the measurer's prefix tree (original passes only)
    assert k == bench.PAIRWISE_SUBSET and p["passes_measured"] == 1 + k + k * (k - 1) // 2
    assert 1 <= p["forward_passes"] < p["passes_measured"]
    assert p["passes_full"] == 1 + n + n * (n - 1) // 2
    assert p["predicted_full_ratio"] == pytest.approx(
        p["time_s"] * p["passes_full"] / p["passes_measured"] / p["reference_s"]
    )
    # a forward without gradients is cheaper than the forward + backward it is compared with
    assert r["forward"]["ratio"] < 1
