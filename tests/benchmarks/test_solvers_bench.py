"""The solver benchmark's quick run: it completes, writes its table, and the exact solvers agree."""

from __future__ import annotations

import json
import time

from bench_scripts import run_script


def test_quick_benchmark_runs_and_writes_json_and_markdown(tmp_path):
    t = time.perf_counter()
    run_script("solvers.py", "--quick", "--out", str(tmp_path), timeout=300)
    wall = time.perf_counter() - t
    data = json.loads((tmp_path / "solvers.json").read_text())
    md = (tmp_path / "solvers.md").read_text()
    assert "| instance | reference | solver |" in md
    assert data["meta"]["quick"] and len(data["instances"]) == 3
    for inst in data["instances"]:
        assert inst["reference"]["kind"] == "exact"
        rows = {r["solver"]: r for r in inst["rows"]}
        for name in ("enumerate", "swap-sa", "swap-tabu"):
            assert rows[name]["status"] == "ok"
            assert rows[name]["gap"] == 0 and rows[name]["recall"] == 1.0
        assert rows["auto"]["result_solver"].startswith("auto→")
        for row in inst["rows"]:
            if row["status"] == "ok":
                assert row["gap"] >= -1e-9  # nobody beats the exact reference
    assert wall < 120, f"the quick benchmark took {wall:.0f} s"


def test_files_only_run_uses_just_the_given_instances(tmp_path):
    from cbo.instances import random_block_qubo

    path = tmp_path / "real.cboq"
    random_block_qubo(12, 3).save(path)
    run_script(
        "solvers.py",
        *("--quick", "--no-synthetic", f"{path}:3,5", "--solvers", "enumerate,swap-tabu", "--out", str(tmp_path)),
        timeout=300,
    )
    data = json.loads((tmp_path / "solvers.json").read_text())
    assert [(i["name"], i["M"]) for i in data["instances"]] == [("real.cboq(M=3)", 3), ("real.cboq(M=5)", 5)]
    for inst in data["instances"]:
        assert inst["reference"]["kind"] == "exact"
        assert {r["solver"]: r["recall"] for r in inst["rows"]} == {"enumerate": 1.0, "swap-tabu": 1.0}
    assert data["meta"]["wall_time_s"] > 0
