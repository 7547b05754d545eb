"""Save the Fisher-shaped synthetic instances under ``benchmarks/instances/`` and compare them with the real ones.

``cbo.qubo.instances.fisher_block_qubo`` draws ``H = AᵀA / samples`` from simulated per-sequence gate gradients fitted
to the committed SmolLM2-135M Fisher QUBOs (32 calibration sequences). This script writes, with seed 0:

* ``synthetic-fisher_sublayer_n60_s32.cboq``: the real sublayer instance's shape (60 halves, 32 samples, rank 32),
  and ``..._s128`` / ``..._s2048``: the same with 128 and 2048 gradient samples (full rank);
* ``synthetic-fisher_layer_n80_s32.cboq``: 80 layers (a 70B model's block count) with the project's default
  32 calibration sequences (rank 32: the hard case, 48 null directions);
* ``synthetic-fisher_layer_n80_s128.cboq`` and ``..._s2048.cboq``: the same model shape with 128 and with the
  paper's 2048 gradient samples (full rank).

and prints the statistics of each (``cbo.qubo.instances.fisher_statistics``) beside the real instances'::

    .venv/bin/python -m benchmarks.fisher_instances
    .venv/bin/python -m benchmarks.fisher_instances --out benchmarks/out/instances --seed 1
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import harness as C
from cbo.qubo.block_qubo import BlockQUBO
from cbo.qubo.instances import fisher_block_qubo, fisher_statistics

REAL = ("smollm2-135m_sublayer_fisher-kl", "smollm2-135m_layer_fisher-kl")
# (granularity, n, samples) of the saved instances
SPECS = (
    ("sublayer", 60, 32),
    ("sublayer", 60, 128),
    ("sublayer", 60, 2048),
    ("layer", 80, 32),
    ("layer", 80, 128),
    ("layer", 80, 2048),
)


def instance_name(granularity: str, n: int, samples: int, seed: int = 0) -> str:
    """File stem of a saved synthetic instance."""
    tail = "" if seed == 0 else f"_seed{seed}"
    return f"synthetic-fisher_{granularity}_n{n}_s{samples}{tail}"


def main(argv: list[str] | None = None) -> list[Path]:
    p = C.parser(__doc__, threads=False, seed=0)
    p.add_argument("--out", default=str(C.INSTANCES), help="folder for the .cboq files (default benchmarks/instances)")
    return C.main("fisher_instances", p, run, argv=argv, torch=False)


def run(job: C.Run) -> list[Path]:
    args, out = job.args, job.out
    rows = []
    for name in REAL:
        rows.append((name, fisher_statistics(BlockQUBO.load(C.INSTANCES / f"{name}.cboq").H)))
    written = []
    for granularity, n, samples in SPECS:
        q = fisher_block_qubo(n, args.seed, samples=samples, granularity=granularity)
        q.metadata["instance"] = {"source": "benchmarks/fisher_instances.py", "seed": args.seed}
        path = out / f"{instance_name(granularity, n, samples, args.seed)}.cboq"
        q.save(path)
        written.append(path)
        rows.append((path.stem, fisher_statistics(q.H)))
    keys = list(rows[0][1])
    print("| instance | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, stats in rows:
        print(f"| {name} | " + " | ".join(f"{stats[k]:.3g}" for k in keys) + " |")
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
