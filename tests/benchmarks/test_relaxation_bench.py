"""benchmarks/fisher_instances.py and benchmarks/relaxation.py, run on small grids."""

from __future__ import annotations

import json

import numpy as np
from bench_scripts import bench_module

from cbo.qubo.block_qubo import BlockQUBO
from cbo.qubo.instances import fisher_block_qubo


def test_fisher_instances_script_writes_the_instances(tmp_path, capsys):
    script = bench_module("fisher_instances")
    written = script.main(["--out", str(tmp_path), "--seed", "2"])
    assert len(written) == len(script.SPECS)
    for (granularity, n, samples), path in zip(script.SPECS, written):
        q = BlockQUBO.load(path)
        assert np.allclose(q.H, fisher_block_qubo(n, 2, samples=samples, granularity=granularity).H)
    assert "| smollm2-135m_sublayer_fisher-kl |" in capsys.readouterr().out


def test_relaxation_script_proves_the_real_instance_and_resumes(tmp_path):
    script = bench_module("relaxation")
    records = script.main(["--grid", "real", "--out", str(tmp_path)])
    assert [r["M"] for r in records] == [8, 16, 24, 30]
    assert all(r["exact"] and len(r["energies"]) == 10 for r in records)
    # energies are those of the recorded states, on the full QUBO
    q = BlockQUBO.load(script.INSTANCES / f"{script.REAL}.cboq")
    for r in records:
        X = np.zeros((len(r["states"]), q.n))
        for i, s in enumerate(r["states"]):
            X[i, s] = 1
        assert np.allclose(q.energy(X), r["energies"])
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    again = script.main(["--grid", "real", "--out", str(tmp_path)])  # nothing left to run
    assert (tmp_path / "results.jsonl").read_text().splitlines() == lines
    assert [json.dumps(r, sort_keys=True) for r in again] == [json.dumps(r, sort_keys=True) for r in records]
    assert "| recall@10 |" in (tmp_path / "table.md").read_text()
