"""The solver benchmark's quick run: it completes, writes its tables and records, the exact solvers agree, and a
rerun resumes from the records."""

from __future__ import annotations

import json

from bench_scripts import run_script


def test_quick_benchmark_runs_and_writes_json_and_markdown(tmp_path):
    run_script("solvers", "--quick", "--out", str(tmp_path))
    data = json.loads((tmp_path / "solvers.json").read_text())
    md = (tmp_path / "solvers.md").read_text()
    assert "| instance | M | reference (s) | solver |" in md and "## By group" in md
    assert "Time-limited `enumerate` at least as good as `auto`, state by state: 3 of 3 instances." in md
    assert data["meta"]["quick"] and len(data["instances"]) == 3
    for inst in data["instances"]:
        assert inst["reference"]["kind"] == "proven"
        rows = {r["label"]: r for r in inst["rows"]}
        for name in ("enumerate", "swap-sa", "swap-tabu"):
            assert rows[name]["status"] == "ok"
            assert rows[name]["gap"] == 0 and rows[name]["recall"] == 1.0
        assert rows["auto"]["result_solver"].startswith("auto→")
        assert inst["enumerate_never_worse"] is True
        for row in inst["rows"]:
            if row["status"] == "ok":
                assert row["gap"] >= -1e-9  # nobody beats the proven reference
    lines = (tmp_path / "solvers.jsonl").read_text().splitlines()
    run_script("solvers", "--quick", "--out", str(tmp_path))  # every run is recorded: none again
    assert (tmp_path / "solvers.jsonl").read_text().splitlines() == lines


def test_files_only_run_uses_just_the_given_instances(tmp_path):
    from cbo.qubo.instances import random_block_qubo

    path = tmp_path / "real.cboq"
    random_block_qubo(12, 3).save(path)
    run_script(
        "solvers",
        *("--instances", "none", f"{path}:3,5", "--solvers", "enumerate,swap-tabu", "--out", str(tmp_path)),
    )
    data = json.loads((tmp_path / "solvers.json").read_text())
    assert [(i["name"], i["M"]) for i in data["instances"]] == [("real.cboq", 3), ("real.cboq", 5)]
    for inst in data["instances"]:
        assert inst["reference"]["kind"] == "proven"
        assert {r["label"]: r["recall"] for r in inst["rows"]} == {"enumerate": 1.0, "swap-tabu": 1.0}
    assert data["meta"]["wall_time_s"] > 0
