"""benchmarks/cost_on_paper.py against direct computations: one row's FPE recomputed by hand from the published
shapes, the code's own budget and generation count, the calibration reproducing the committed measurements, the
GPU-time and memory arithmetic of one row, and the guide's command reproducing the committed table."""

from __future__ import annotations

import json
import math
import shlex

import pytest
from bench_scripts import ROOT, bench_module
from doc_examples import example

from cbo.baselines.evopress import default_generations
from cbo.search.budget import large_space, scaled_budget

COMMITTED = ROOT / "benchmarks" / "results" / "cost_on_paper" / "cost_on_paper.json"


@pytest.fixture(scope="module")
def P():
    return bench_module("cost_on_paper")


@pytest.fixture(scope="module")
def result():
    return json.loads(COMMITTED.read_text())


def llama70b_shares() -> tuple[float, float]:
    """(layer share, head share) of Llama-3.3-70B from its config: d 8192, d_ff 28672, 64 heads, 8 KV heads of 128."""
    layer = 8192 * 8192 * 2 + 8192 * 1024 * 2 + 3 * 8192 * 28672 + 2 * 8192
    head = 128256 * 8192
    full = 80 * layer + head
    return layer / full, head / full


def same(a, b) -> bool:
    """Nested JSON values equal, numbers to rounding."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def row(result, model, granularity, fraction):
    return next(
        r
        for r in result["rows"]
        if r["model"] == model and r["granularity"] == granularity and r["fraction"] == fraction
    )


def test_a_row_is_the_code_s_budget_and_generations_and_the_formulas_by_hand(P, result):
    r = row(result, "Llama-3.3-70B", "layer", 0.5)
    assert (r["n"], r["k"], r["neighbours"]) == (80, 40, 1600)
    assert r["budget"] == scaled_budget(80, 40) == math.ceil(4 / 3 * 1600) == 2134
    assert r["generations"] == default_generations(80, 40) == int(1600 / 1.5) == 1066
    ell, h = llama70b_shares()
    rho_set, rho_evo = (result["calibration"]["rho"][kind]["layer"] for kind in ("set", "evopress"))
    setup = 1 + ell + h  # the original pass and the replay's check (last layer and head)
    singles = ell * 80 * 79 / 2 + 80 * h  # block i reruns the layers after it, then the head
    c_set, c_evo = (h + rho * (1 - h) * 40 / 80 for rho in (rho_set, rho_evo))
    # a large space: the estimate on refine's one low-fidelity window, not the 32 calibration windows, and the race
    # before validation, which measures the chosen set alone
    assert large_space(80, 40)
    by_hand = {
        "estimate": 1 * (setup + singles),
        "validation": 32 * (setup + 1 * c_set),
        "refine": 2134,
        "race": (32 + 64) * (setup + 8 * c_set),
    }
    assert r["default"] == pytest.approx(by_hand, rel=1e-9)
    assert r["default_total"] == pytest.approx(sum(by_hand.values()), rel=1e-9)
    assert r["dominant"] == "refine"
    for name, offspring in (("fast", 16), ("published", 32)):
        evo = 32 + c_evo * (64 * 1 + 1066 * (offspring * 1 + 3 * 16))  # pool, initial, stage 1, stage 2
        assert r["evopress"][name]["total"] == pytest.approx(evo, rel=1e-9)
        assert r["ratio"][name] == pytest.approx(sum(by_hand.values()) / evo, rel=1e-9)
    # the whole table from the module's functions, as committed
    assert same(json.loads(json.dumps(P.table(result["calibration"]["rho"], P.defaults(), 2048, 0.40))), result["rows"])


def test_sublayer_evopress_counts_one_kind_and_the_budget_the_whole_space(result):
    r = row(result, "Llama-3.1-8B", "sublayer", 0.25)
    assert (r["n"], r["k"]) == (64, 16)
    assert r["generations"] == default_generations(32, 8) == 128  # 8 attention and 8 MLP halves of 32 each
    assert r["budget"] == scaled_budget(64, 16) == 1024


def test_the_calibration_reproduces_the_committed_measurements(P):
    d = P.defaults()
    cal = P.calibrate(P.RESULTS, d)
    rows = {(p, w): (m, v, ratio) for p, w, m, v, ratio in cal["rows"]}
    sub8 = json.loads((P.RESULTS / "final_choice" / "sub8-s0-select96.json").read_text())["rows"][0]
    # the measured column is the committed FPE
    for route in ("one-at-a-time", "validated", "raced", "refined"):
        assert rows[("sublayer M = 8, s0", route)][0] == sub8["fpe"][route]
    # the estimate is the measurer's own arithmetic: 19.0 and 37.63 passes per window on the 135M model
    assert rows[("layer M = 8, s0", "one-at-a-time")][1] == pytest.approx(608.0, abs=0.05)
    assert rows[("sublayer M = 8, s0", "one-at-a-time")][1] == pytest.approx(sub8["fpe"]["one-at-a-time"], abs=0.05)
    # rho of sublayer validation rests on one point, so that point's validated FPE is reproduced
    assert rows[("sublayer M = 8, s0", "validated")][1] == pytest.approx(sub8["fpe"]["validated"], abs=0.05)
    evo = json.loads((P.RESULTS / "search" / "full" / "sublayer-8-s0.point.json").read_text())["runs"]["evopress"]
    label = "evopress (16 offspring, stages [[2, 1], [1, 16]])"
    assert rows[("sublayer M = 8, s0", label)][0] == evo["fpe"]
    # every route within 5 %, every EvoPress run within 20 %
    for (point, what), (_, _, ratio) in rows.items():
        low, high = (0.8, 1.2) if what.startswith("evopress") else (0.95, 1.05)
        assert low < ratio < high, (point, what, ratio)
    # rho is the mean of the implied values: the sublayer set value from its one point, by hand
    a = P.MODELS["smollm2-135m"]
    h = a.head / a.full
    per_set = ((sub8["fpe"]["validated"] - sub8["fpe"]["one-at-a-time"]) / 32 - P.setup_fpe(a, True)) / 10
    assert cal["rho"]["set"]["sublayer"] == pytest.approx((per_set - h) / ((1 - h) * 44 / 60))


def test_gpu_time_and_memory_of_one_row_by_hand(P, result):
    r = row(result, "Llama-3.1-8B", "layer", 0.25)
    layer = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096
    full = 32 * layer + 128256 * 4096
    flops = 2048 * (2 * full + 4 * 2048 * 4096 * 32)  # one window of 2,048 tokens
    assert r["hours"]["default"] == pytest.approx(r["default_total"] * flops / (989.4e12 * 0.40) / 3600)
    assert 0.02 < r["hours"]["default"] < 0.05  # ≈ 1,500 FPE × 2,048 tokens at ≈ 24,600 tokens/s
    params = full + 4096 + 128256 * 4096  # untied input embedding, final norm
    assert params == pytest.approx(8.03e9, rel=1e-3)  # Llama-3.1-8B's published size
    state = 2048 * (128256 * 4 + 12) + 33 * 2048 * 4096 * 2  # teacher probabilities, streams into every layer
    evopress = 2 * params + 32 * state + 3 * 2048 * 14336 * 2
    assert r["memory_gb"]["evopress"] == pytest.approx(evopress / 1e9)
    default = 2 * params + max(8 * state + 3 * 8 * 2048 * 14336 * 2, 16 * state + 3 * 2048 * 14336 * 2)
    assert r["memory_gb"]["default"] == pytest.approx(default / 1e9)
    assert r["h100s"] == {"default": 1, "evopress": 1}
    big = row(result, "Llama-3.3-70B", "layer", 0.25)
    assert big["h100s"]["evopress"] == math.ceil(big["memory_gb"]["evopress"] / 80) == 4


def test_the_guide_s_command_reproduces_the_committed_table(P, result, tmp_path):
    line = next(x for x in example("cost-on-paper").splitlines() if "-m benchmarks.cost_on_paper" in x)
    args = shlex.split(line.split("-m benchmarks.cost_on_paper", 1)[1])
    out = tmp_path / "cost"
    args[args.index("--out") + 1] = str(out)
    P.main(args)
    fresh = json.loads((out / "cost_on_paper.json").read_text())
    for key in ("window", "mfu", "defaults", "calibration", "rows", "tokens_per_second"):
        assert same(fresh[key], result[key]), key
    text = (out / "cost_on_paper.md").read_text()
    assert text.split("\n", 3)[3] == (COMMITTED.with_suffix(".md")).read_text().split("\n", 3)[3]
    assert "| Llama-3.3-70B | sublayer | 50% | 160 | 80 | 6,400 | 8,534 |" in text


def test_the_guide_s_table_carries_the_committed_figures(result):
    guide = (ROOT / "docs" / "guides" / "big-models.md").read_text()
    for r in result["rows"]:
        p, e = r["default"], r["evopress"]
        parts = " + ".join(f"{p[x]:,.0f}" for x in ("estimate", "validation", "refine", "race"))
        assert f"| {r['budget']:,.0f} | {parts} = **{r['default_total']:,.0f}** |" in guide, r["model"]
        assert f"| {e['fast']['total']:,.0f} / {e['published']['total']:,.0f} |" in guide, r["model"]


def test_only_the_small_space_keeps_the_full_estimate(result):
    """8B layer at 25 % (192 swap neighbours, the floor's budget) keeps the estimate on 32 windows: 32 times the
    one-window estimate of the same model at 50 %, which is a large space."""
    small, large = row(result, "Llama-3.1-8B", "layer", 0.25), row(result, "Llama-3.1-8B", "layer", 0.5)
    assert not large_space(32, 8) and large_space(32, 16)
    assert small["default"]["estimate"] == pytest.approx(32 * large["default"]["estimate"], rel=1e-9)
    assert small["default"]["validation"] > 3 * large["default"]["validation"]  # ten sets validated, not the choice
