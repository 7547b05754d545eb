"""The depth benchmarks' --quick modes on the default model: they run, write their outputs, and the rows obey
the rules they claim (M blocks removed, choices made on the validation split only, sublayer parameter parity)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from bench_scripts import bench_module, run_script


def test_estimator_specs_parse_run_keys_and_options():
    C = bench_module("depth_harness")
    spec = C.EstimatorSpec.parse("pairwise:windows=8:couplings=raw:coupling_scale=0.5:loss=ce")
    assert (spec.name, spec.windows, spec.loss) == ("pairwise", 8, "ce")
    assert spec.options == {"couplings": "raw", "coupling_scale": 0.5}
    assert spec.tag() == "pairwise:coupling_scale=0.5:couplings=raw:loss=ce:w=8"
    assert spec.tag(with_loss=False) == "pairwise:coupling_scale=0.5:couplings=raw:w=8"
    assert C.EstimatorSpec.parse("fisher:label=F").tag() == "F"
    with pytest.raises(SystemExit):
        C.EstimatorSpec.parse("fisher:samples")


def test_random_sets_and_fidelity():
    E = bench_module("estimators")
    sets = E.random_sets(10, 3, 50, seed=0)
    assert len(sets) == len(set(sets)) == 50 and all(len(s) == 3 and list(s) == sorted(s) for s in sets)
    assert sets == E.random_sets(10, 3, 50, seed=0) != E.random_sets(10, 3, 50, seed=1)
    assert len(E.random_sets(5, 4, 100, seed=0)) == 5  # only C(5, 4) exist
    f = E.fidelity([1, 2, 3, 4], [10, 20, 40, 30])
    assert f["spearman"] == pytest.approx(0.8) and f["kendall"] == pytest.approx(4 / 6) and f["n"] == 4
    assert math.isnan(E.fidelity([1, 1, 1], [1, 2, 3])["spearman"])


def test_report_only_needs_the_json_and_tolerates_unfinished_runs(tmp_path):
    C = bench_module("harness")
    with pytest.raises(SystemExit, match="run the benchmark without --report first"):
        C.report_only(tmp_path, "depth_quality", lambda r: "")
    assert "did not finish" in C.timing_line({})
    line = C.timing_line({"wall_time_s": 12.4, "cpu_time_s": 20.0, "new_measurements": 3})
    assert line.startswith("Wall time: 12 s, 20 s of CPU time") and "3 new measurements" in line
    (tmp_path / "x.json").write_text(json.dumps({"rows": [1, 2]}))
    C.report_only(tmp_path, "x", lambda r: f"{len(r['rows'])} rows")
    assert (tmp_path / "x.md").read_text() == "2 rows"


def test_cached_solve_keeps_the_first_runs_states(tmp_path):
    """A rerun reads the states of the first solve (an inexact solve would differ), keyed by QUBO, M and solver."""
    from cbo.jsonable import with_checksum
    from cbo.qubo.block_qubo import BlockQUBO
    from cbo.solvers import solve

    C = bench_module("depth_harness")
    rng = np.random.default_rng(3)
    A = rng.normal(size=(8, 8))
    q = BlockQUBO(A @ A.T, rng.normal(size=8))
    first = C.cached_solve(q, 3, "enumerate", k=4, seed=0, cache_dir=tmp_path)
    assert [list(s.removed) for s in first] == [list(s.removed) for s in solve(q, 3, "enumerate", k=4)]
    (path,) = tmp_path.iterdir()
    data = json.loads(path.read_text())
    data["removed"][0] = [0, 1, 2]  # what another machine's inexact solve might have returned (signed as CBO signs)
    path.write_text(json.dumps(with_checksum(data)))
    assert list(C.cached_solve(q, 3, "enumerate", k=4, seed=0, cache_dir=tmp_path)[0].removed) == [0, 1, 2]
    C.cached_solve(q, 4, "enumerate", k=4, seed=0, cache_dir=tmp_path)
    C.cached_solve(q.with_constraints(keep=[0]), 3, "enumerate", k=4, seed=0, cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 3
    path.write_text("{")  # damaged: solved again
    again = C.cached_solve(q, 3, "enumerate", k=4, seed=0, cache_dir=tmp_path)
    assert [list(s.removed) for s in again] == [list(s.removed) for s in first]


@pytest.mark.model
@pytest.mark.slow
def test_depth_quality_quick(installed, tmp_path):
    out = tmp_path / "dq"
    common = ["--quick", "--threads", "1", "--no-progress", "--out", str(out), "--hessian-cache", str(tmp_path / "h")]
    run_script("depth_quality", *common)
    data = json.loads((out / "depth_quality.json").read_text())
    assert (out / "depth_quality.md").read_text().startswith("# Depth quality")
    assert (out / "depth_quality.png").stat().st_size > 1000
    labels = {r["label"] for r in data["rows"]}
    for method in ("block_influence", "angular", "sleb", "taylor", "ppl"):
        assert method in labels
    assert {
        "cbo[singles] best-of-4",
        "cbo[fisher] ground",
        "cbo[fisher] best-of-4",
        "cbo[fisher sublayer] ground",
    } <= labels
    layer_params = data["rows"][0]["n_removed_params"] / data["rows"][0]["remove"]
    for r in data["rows"]:
        assert r["remove"] in (2, 4)
        assert math.isfinite(float(r["test"]["ppl"])) and r["test"]["ppl"] > data["original"]["test"]["ppl"] * 0.5
        if r["granularity"] == "layer":
            assert len(r["removed"]) == r["remove"]
        else:  # 2M halves, at most M attention, at least the parameters of M layers
            assert len(r["removed"]) == 2 * r["remove"]
            assert sum(n.endswith(".attn") for n in r["removed_names"]) <= r["remove"]
            assert r["n_removed_params"] >= layer_params * r["remove"] - 1
    # the validated choice is the lowest validation KL among the validated states, never a test-split choice
    for v in data["cbo_validation"]:
        kls = [float(s["validation"]["kl"]) for s in v["states"]]
        assert v["chosen"] == v["states"][kls.index(min(kls))]["rank"]
    # a rerun measures nothing new: rankings, Hessians and measurements come from the caches
    run_script("depth_quality", *common)
    again = json.loads((out / "depth_quality.json").read_text())
    assert again["new_measurements"] == 0
    assert [r["removed"] for r in again["rows"]] == [r["removed"] for r in data["rows"]]
    # --report rewrites the Markdown from the JSON alone
    report = (out / "depth_quality.md").read_text()
    (out / "depth_quality.md").unlink()
    run_script("depth_quality", "--report", "--no-plot", "--out", str(out))
    assert (out / "depth_quality.md").read_text() == report


@pytest.mark.model
@pytest.mark.slow
def test_estimators_quick(installed, tmp_path):
    out = tmp_path / "est"
    run_script(
        "estimators",
        "--quick",
        "--threads",
        "1",
        "--no-progress",
        "--out",
        str(out),
        "--hessian-cache",
        str(tmp_path / "h"),
    )
    data = json.loads((out / "estimators.json").read_text())
    assert "| estimator | loss | M |" in (out / "estimators.md").read_text()
    assert {(r["estimator"], r["loss"], r["remove"]) for r in data["fidelity"]} == {
        ("fisher", loss, m) for loss in ("kl", "ce") for m in (2, 4)
    }
    for r in data["fidelity"]:
        assert -1.0 <= r["all"]["spearman"] <= 1.0 and -1.0 <= r["all"]["kendall"] <= 1.0
        assert r["best_low_kl"] <= r["ground_kl"]
        low = data["sets"][str(r["remove"])]["low"][f"{r['estimator']}|{r['loss']}"]
        energies = [e for _, e, _ in low]
        assert energies == sorted(energies) and len(low[0][0]) == r["remove"]
    for c in data["costs"]:
        assert c["forward"] >= 1 and c["backward"] >= 1
    # --report rewrites the Markdown from the JSON alone, also that of an unfinished run
    partial = {k: v for k, v in data.items() if k not in ("wall_time_s", "cpu_time_s", "new_measurements")}
    (out / "estimators.json").write_text(json.dumps(partial))
    run_script("estimators", "--report", "--out", str(out))
    assert "the run did not finish" in (out / "estimators.md").read_text()
    assert (out / "estimators.png").exists()


@pytest.mark.model
@pytest.mark.slow
def test_speed_quick(installed, tmp_path):
    out = tmp_path / "speed"
    run_script("speed", "--quick", "--threads", "1", "--out", str(out))
    data = json.loads((out / "speed.json").read_text())
    v = data["variants"]
    assert set(v) == {"original", "depth", "width", "combined"}
    assert v["depth"]["n_layers"] == v["original"]["n_layers"] - 8 == v["combined"]["n_layers"]
    assert v["combined"]["n_params"] < min(v["depth"]["n_params"], v["width"]["n_params"]) < v["original"]["n_params"]
    assert abs(v["width"]["removed_params"] - 0.25 * v["original"]["n_params"]) < 0.02 * v["original"]["n_params"]
    for variant in v.values():
        run = variant["runs"][0]
        assert run["prefill_tokens_per_s"] > 0 and run["decode_tokens_per_s"] > 0
        assert 0 < variant["peak_rss_mb"] < 64 * 1024
    assert data["ideal_depth_speedup"] == pytest.approx(30 / 22)


@pytest.mark.model
@pytest.mark.slow
def test_fidelity_quick(installed, tmp_path):
    out = tmp_path / "fid"
    run_script("fidelity", "--quick", "--threads", "1", "--no-progress", "--out", str(out))
    data = json.loads((out / "results-quick.json").read_text())
    rows = data["table"]["4"]
    assert {"block_influence", "angular", "sleb", "taylor", "ppl"} <= set(rows)
    for v in ("fisher", "singles", "hybrid"):
        entry = data["variants"][v]["4"]
        assert entry["energies"] == sorted(entry["energies"]) and all(len(s) == 4 for s in entry["states"])
        ground, best = rows[f"{v} (ground)"], rows[f"{v} (best of top-5)"]
        # the choice is made on the validation split only: the lowest validation KL among the top-K states
        assert best["val_kl"] <= ground["val_kl"] and best["set"] == entry["states"][best["rank"]]
        f = data["fidelity"][v]["4"]["all"]
        assert -1.0 <= f["spearman"] <= 1.0 and f["n"] >= 6
    for r in rows.values():
        assert len(r["set"]) == 4 and math.isfinite(r["test_kl"]) and r["test_kl"] > 0
    # the table measures exactly the sets the baselines chose
    assert data["baselines"]["ppl"]["sets"]["4"] == rows["ppl"]["set"]
    run_script("fidelity", "--quick", "--stage", "report", "--out", str(out))
    assert "| method | removed | val KL | test KL | test PPL |" in (out / "results-quick.md").read_text()


def test_make_instances_from_fidelity_result(tmp_path):
    """Variants shared by every M give one instance file; variants fitted per M give one per M, each loadable."""
    from cbo.qubo.block_qubo import BlockQUBO

    MI = bench_module("make_instances")
    rng = np.random.default_rng(0)

    def entry(H):
        return {"qubo": {"H": H.tolist(), "g": [0.0] * 5}, "cost": {"forward_passes": 1}}

    A = rng.random((5, 5))
    A = A + A.T
    B = A + 1.0
    result = {
        "setup": {"calibration": [8, 128], "documents": {"calibration": ["emma"]}},
        "variants": {"shared": {"2": entry(A), "3": entry(A)}, "perm": {"2": entry(A), "3": entry(B)}},
    }
    (tmp_path / "r.json").write_text(json.dumps(result))
    written = MI.from_fidelity(tmp_path / "r.json", tmp_path, "m")
    assert sorted(p.name for p in written) == [
        "m_layer_perm-kl-w8_M2.cboq",
        "m_layer_perm-kl-w8_M3.cboq",
        "m_layer_shared-kl-w8.cboq",
    ]
    q = BlockQUBO.load(tmp_path / "m_layer_perm-kl-w8_M3.cboq")
    assert np.allclose(q.H, B) and q.metadata["instance"]["fitted_for_remove"] == 3


@pytest.mark.model
def test_make_instances_estimates_layer_and_sublayer_files(installed, tmp_path):
    """The default run's path at tiny settings: one loadable file per spec, named for it, with its source data."""
    from cbo.qubo.block_qubo import BlockQUBO

    out = tmp_path / "instances"
    proc = run_script(
        "make_instances",
        *("--calibration", "2", "--seq-len", "32", "--specs", "fisher", "--sublayer-specs", "fisher"),
        *("--threads", "1", "--no-progress", "--out", str(out), "--hessian-cache", str(tmp_path / "h")),
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "smollm2-135m_layer_fisher-kl.cboq",
        "smollm2-135m_sublayer_fisher-kl.cboq",
    ], proc.stdout
    layer = BlockQUBO.load(out / "smollm2-135m_layer_fisher-kl.cboq")
    sub = BlockQUBO.load(out / "smollm2-135m_sublayer_fisher-kl.cboq")
    assert layer.n == 30 and set(layer.kinds) == {"layer"}
    assert sub.n == 60 and sorted(set(sub.kinds)) == ["attention", "mlp"]
    for q in (layer, sub):
        assert np.allclose(q.H, q.H.T) and np.all(np.diag(q.H) > 0)
        info = q.metadata["instance"]
        assert info["source"] == "benchmarks/make_instances.py" and info["seq_len"] == 32
        assert q.metadata["n_sequences"] == 2 and q.metadata["estimator"] == "fisher"


@pytest.mark.model
@pytest.mark.slow
def test_default_pipeline_quick(installed, tmp_path):
    run_script("default_pipeline", "--quick", "--threads", "1", "--out", str(tmp_path))
    data = json.loads((tmp_path / "default_pipeline.json").read_text())
    assert data["quick"] and data["command"].startswith(".venv/bin/python -m benchmarks.default_pipeline --quick")
    point = data["points"]["2"]
    assert len(point["chosen"]) == 2 and point["test_windows"] == 2
    assert point["test_ppl"] > 1 and point["test_kl"] > 0
    assert (tmp_path / "default_pipeline.md").read_text().startswith("# The default pipeline")


def test_paper_variants_and_the_paired_ratio_interval():
    F = bench_module("fidelity")
    assert F.variant_entry("paper-n256") == ("paper", {}, False)
    assert F.variant_entry("singles") == F.VARIANTS["singles"]
    rng = np.random.default_rng(0)
    b = rng.normal(3.0, 0.3, size=40)
    lo, hi = F.paired_ratio_interval(b + np.log(2.0), b, 500, seed=1)
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)  # a constant shift: no spread when paired
    a = b + rng.normal(0.1, 0.2, size=40)
    lo, hi = F.paired_ratio_interval(a, b, 2000, seed=1)
    assert lo < np.exp(np.mean(a - b)) < hi and hi / lo < 1.3
    assert all(math.isnan(v) for v in F.paired_ratio_interval(a[:3], b, 100, seed=1))


def test_nested_paper_sizes_equal_the_estimator_on_each_prefix(tmp_path):
    from tiny_models import build_tiny_model, random_token_windows

    from cbo.hessian import estimate_hessian

    P = bench_module("paper_sizes")
    model = build_tiny_model("llama", n_layers=3, seed=1)
    pool = random_token_windows(model, n=8, seq_len=8, seed=4)
    qubos = P.paper_qubos(model, None, pool, [4, 8], tmp_path, batch_size=2, progress=False, chunk=2)
    for n in (4, 8):
        direct = estimate_hessian(model, None, pool[:n], estimator="paper", loss="ce", batch_size=2, progress=False)
        np.testing.assert_allclose(qubos[n].H, direct.H, rtol=1e-12, atol=0)
        assert np.all(qubos[n].g == 0) and qubos[n].metadata["n_sequences"] == n
    # disjoint chunks: the estimates of windows 0-1, 2-3, 4-5, 6-7 and of 0-3, 4-7
    for n in (2, 4):
        chunks = P.chunk_estimates(tmp_path, n)
        assert len(chunks) == 8 // n
        for k, H in enumerate(chunks):
            direct = estimate_hessian(
                model, None, pool[k * n : (k + 1) * n], estimator="paper", loss="ce", batch_size=2, progress=False
            )
            np.testing.assert_allclose(H, direct.H, rtol=1e-10, atol=1e-14)
    with pytest.raises(ValueError, match="multiples of batch_size"):
        P.paper_qubos(model, None, pool, [3], tmp_path, batch_size=2, progress=False)


@pytest.mark.model
@pytest.mark.slow
def test_final_choice_quick(installed, tmp_path):
    reference = tmp_path / "reference.json"  # another method's set at the same point, measured beside
    reference.write_text(
        json.dumps({"point": {"remove": 2, "seed": 0}, "methods": {"other": {"removed": [10, 11], "fpe": 99.0}}})
    )
    out = tmp_path / "out"
    run_script(
        "final_choice", "--quick", "--threads", "1", "--refine", "60", "--reference", str(reference), "--out", str(out)
    )
    data = json.loads((out / "final_choice.json").read_text())
    assert data["model"] == "smollm2-135m"  # the suite grid prunes the model the file names
    (row,) = data["rows"]
    sets, fpe = row["sets"], row["fpe"]
    assert row["remove"] == 2 and set(sets) == {"validated", "raced", "refined", "other", "one-at-a-time"}
    assert all(len(s) == 2 for s in sets.values()) and sets["other"] == [10, 11] and fpe["other"] == 99.0
    assert 0 < fpe["one-at-a-time"] < fpe["validated"]  # the estimate alone, no validation
    assert (
        row["selection"]["raced"]["chosen"] == sets["raced"]
        and row["selection"]["refined"]["chosen"] == sets["refined"]
    )
    # every route measured anew and charged in one unit: the race adds its windows, refine its rounds on top
    assert fpe["raced"] == pytest.approx(fpe["validated"] + row["selection"]["raced"]["fpe"], rel=1e-3)
    assert fpe["refined"] > fpe["validated"] + row["refine"]["fpe"]
    austen = row["test"]["austen"]
    assert austen["windows"] == 8
    for key in ("raced/validated", "refined/validated", "validated/other", "refined/other", "refined/one-at-a-time"):
        ratio, low, high = austen["ratio"][key]
        name, base = key.split("/")
        assert low <= ratio <= high and math.isclose(ratio, austen["ppl"][name] / austen["ppl"][base], rel_tol=1e-9)
    assert (out / "final_choice.md").read_text().startswith("# The final choice")


def test_final_choice_reads_the_search_grids_points(tmp_path):
    from benchmarks import final_choice as F

    assert F.budget_arg("auto") == "auto" and F.budget_arg("60") == 60.0  # --refine: the default's, or a number

    grid = tmp_path / "point.json"  # benchmarks.search's point.json: the spec and each method's evaluation
    grid.write_text(
        json.dumps(
            {
                "spec": {"name": "layer-12-s1", "granularity": "layer", "remove": 12, "seed": 1},
                "evaluations": {
                    "evopress": {"removed": [3, 1], "fpe": 2500.0, "test_ppl": 1.0},
                    "sleb": {"removed": [4, 2], "fpe": 2360},
                    "evopress@refine-fpe": {"removed": [5, 6], "fpe": 600.0},  # the anytime comparison: not a method
                },
            }
        )
    )
    sub = tmp_path / "sub.json"
    sub.write_text(json.dumps({"spec": {"granularity": "sublayer", "remove": 12, "seed": 1}, "evaluations": {"x": {}}}))
    plain = tmp_path / "plain.json"
    plain.write_text(
        json.dumps({"point": {"remove": 12, "seed": 1}, "methods": {"validated": {}, "other": {"fpe": 1}}})
    )
    args = F.parse(["--reference", f"{grid},{sub},{plain}"])
    refs = F.references(args, 12, 1)
    assert sorted(refs) == ["evopress", "other", "sleb"]  # the routes' own names and the sublayer point left out
    assert refs["evopress"]["removed"] == [3, 1] and refs["sleb"]["fpe"] == 2360
    assert F.references(args, 12, 0) == {} and F.references(args, 15, 1) == {}
    sublayer = F.parse(["--reference", f"{grid},{sub}", "--granularity", "sublayer"])
    assert F.references(sublayer, 12, 1) == {"x": {}}


@pytest.mark.model
@pytest.mark.slow
def test_final_choice_quick_sublayer(installed, tmp_path):
    out = tmp_path / "out"
    run_script("final_choice", "--quick", "--threads", "1", "--granularity", "sublayer", "--out", str(out))
    (row,) = json.loads((out / "final_choice.json").read_text())["rows"]
    assert row["granularity"] == "sublayer" and set(row["sets"]) == {"validated", "raced", "one-at-a-time"}
    for s in row["sets"].values():  # M = 2: two attention and two MLP halves of the 60 (even: attention)
        assert len(s) == 4 and sum(i % 2 == 0 for i in s) == 2
    assert row["selection"]["raced"]["chosen"] == row["sets"]["raced"]
    assert "sublayer" in (out / "final_choice.md").read_text()


@pytest.mark.model
def test_final_choice_splits_per_seed_share_the_test_windows(installed):
    import torch

    from benchmarks import final_choice as F
    from cbo.data.windows import make_splits
    from cbo.model.loading import resolve_model
    from cbo.surgery.io import load_tokenizer

    tok = load_tokenizer(resolve_model("smollm2-135m"))
    args = F.parse(["--quick"])
    zero, one = (F.splits_for(args, tok, None, s) for s in (0, 1))
    kw = dict(seq_len=args.seq_len, n_calibration=args.calibration, n_validation=args.validation)
    grid = make_splits(tok, **kw, n_test=0, seed=1)  # what benchmarks.search's point at seed 1 draws
    assert torch.equal(one.calibration, grid.calibration) and torch.equal(one.validation, grid.validation)
    assert not torch.equal(one.calibration, zero.calibration)
    assert torch.equal(one.test, zero.test) and one.info["hash"]["test"] == zero.info["hash"]["test"]
    assert one.info["seed"] == 1 and one.info["documents"] == zero.info["documents"]


def test_final_choice_summary_checks_each_point(tmp_path, capsys):
    from benchmarks import final_choice_summary as S

    def row(remove, evo_fpe, evo, sleb, ones):
        ratios = {"refined/evopress": evo, "refined/sleb": sleb, "refined/one-at-a-time": ones}
        return {
            "remove": remove,
            "seed": 0,
            "sets": {"validated": [1], "refined": [2], "evopress": [3], "sleb": [4], "one-at-a-time": [5]},
            "fpe": {"validated": 800, "refined": 1400, "evopress": evo_fpe, "sleb": 2700, "one-at-a-time": 600},
            "test": {d: {"ratio": ratios} for d in ("austen", "pydocs")},
        }

    good = row(15, 2843, [1.01, 0.97, 1.04], [0.9, 0.85, 0.95], [0.95, 0.9, 0.99])  # a tie with EvoPress
    costly = row(12, 2000, [0.99, 0.95, 1.02], [0.9, 0.8, 1.01], [0.9, 0.85, 0.95])  # 70 % of EvoPress's FPE
    worse = row(8, 2843, [1.05, 1.02, 1.08], [0.9, 0.8, 0.95], [0.9, 0.85, 0.95])  # beyond noise
    old = {"remove": 8, "seed": 1, "sets": {"default": [1], "refined": [2]}, "fpe": {"default": 1, "refined": 2}}
    old["test"] = {"austen": {"ratio": {"refined/default": [0.9, 0.8, 1.0]}}}  # the first files' name
    sub = {**row(8, 3000, [0.98, 0.95, 1.01], None, None), "granularity": "sublayer"}  # BlockPruner beside
    sub["test"] = {
        d: {"ratio": {"refined/evopress": [0.98, 0.95, 1.01], "refined/blockpruner": [0.9, 0.85, b]}}
        for d, b in (("austen", 0.97), ("pydocs", 1.02))
    }
    files = []
    for k, rows in enumerate(([good, costly, sub], [worse, old])):
        files.append(tmp_path / f"r{k}.json")
        named = {"model": "smollm2-135m"} if k else {}  # files name their model now; the first ones did not
        files[-1].write_text(json.dumps({"rows": rows, "select": 96, **named}))
    files.append(tmp_path / "gemma.json")  # another model's point: labelled with it, after the default model's
    files[-1].write_text(json.dumps({"model": "gemma3-270m", "rows": [{**good, "remove": 4}], "select": 96}))
    rows = S.rows_of([str(f) for f in files])
    assert [(r["remove"], r["seed"]) for r in rows] == [(8, 0), (8, 1), (12, 0), (15, 0), (8, 0), (4, 0)]
    assert [S.checks(r)["≤ EvoPress at ≤ 50 % FPE"] for r in rows] == ["no", "–", "no", "yes", "yes", "yes"]
    assert [S.checks(r)["beats sleb"] for r in rows] == ["yes", "–", "no", "yes", "–", "yes"]
    # BlockPruner is measured at the sublayer point only; its pydocs interval holds 1, so no win there
    assert [S.checks(r)["beats blockpruner"] for r in rows] == ["–", "–", "–", "–", "no", "–"]
    assert S.checks(rows[1])["beats one-at-a-time"] == "–" and S.ratio(rows[1], "austen", "validated") == [
        0.9,
        0.8,
        1.0,
    ]
    text = S.main([*map(str, files), "--out", str(tmp_path / "summary.md")])
    assert text == (tmp_path / "summary.md").read_text() == capsys.readouterr().out
    assert "| M = 15, s0 | 96 | 1400 | 0.49 | 1.010 [0.970, 1.040] |" in text
    assert "| M = 8 sublayer, s0 | 96 | 1400 | 0.47 |" in text and "÷ blockpruner, pydocs" in text
    assert "| gemma3-270m, M = 4, s0 | 96 | 1400 | 0.49 |" in text
