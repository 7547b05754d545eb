"""Save the default model's block-removal QUBOs under ``benchmarks/instances/`` (real instances for solver research).

Each instance is a :class:`cbo.BlockQUBO` file (``BlockQUBO.load``) estimated on the same calibration windows as
``depth_quality.py`` (32 x 128 tokens of *Emma*, seed 0), so the Hessian cache usually already holds them:

* ``smollm2-135m_layer_fisher-kl.cboq``: 30 decoder layers, Fisher of the KL to the original;
* ``smollm2-135m_layer_pairwise-kl.cboq``: 30 decoder layers, measured singles and pairs (8 windows, positive
  couplings; the raw single/pair table is in the metadata under ``measured``);
* ``smollm2-135m_sublayer_fisher-kl.cboq``: 60 attention / MLP halves, Fisher of the KL (kinds ``attention`` /
  ``mlp`` and parameter sizes included, for caps and budgets).

    .venv/bin/python -m benchmarks.make_instances
    .venv/bin/python -m benchmarks.make_instances --specs fisher,pairwise:windows=8 --sublayer-specs fisher
    .venv/bin/python -m benchmarks.make_instances --specs fisher --from-fidelity benchmarks/out/fidelity/results.json

``--from-fidelity`` also saves the QUBO of every estimator variant that ``benchmarks/fidelity.py`` built
(``..._layer_<variant>-kl-w<windows>.cboq``; variants fitted for one M, ``fit`` and ``trust``, get
``_M<m>``), with the
calibration windows that script used (8 x 128 tokens).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import depth_harness as D
from benchmarks import harness as C


def main(argv: list[str] | None = None) -> list[Path]:
    p = C.parser(__doc__, model=True)
    p.add_argument("--out", default=str(C.INSTANCES), help="folder for the .cboq files (default benchmarks/instances)")
    p.add_argument("--calibration", type=int, default=32, help="calibration windows (default 32)")
    p.add_argument("--specs", default="fisher,pairwise:windows=8", help="layer estimator specs")
    p.add_argument("--sublayer-specs", default="fisher", help="sublayer estimator specs")
    p.add_argument("--from-fidelity", default=None, help="also save the variants' QUBOs from a fidelity.py result")
    p.set_defaults(seq_len=128)
    return C.main("make_instances", p, run, argv=argv)


def run(job: C.Run) -> list[Path]:
    args, out = job.args, job.out
    model, tok, splits = D.load(args, n_calibration=args.calibration, n_validation=0, n_test=0)
    name = Path(str(args.model)).name
    specs = [D.EstimatorSpec.parse(t) for t in C.split_list(args.specs)]
    specs += [D.EstimatorSpec.parse(t, granularity="sublayer") for t in C.split_list(args.sublayer_specs)]
    written = []
    for spec in specs:
        qubo, wall = D.estimate(spec, model, tok, splits.calibration, args, not args.no_progress)
        variant = spec.name + "".join(f"-{k}={v}" for k, v in sorted(spec.options.items()))
        path = out / f"{name}_{spec.granularity}_{variant}-{spec.loss}.cboq"
        qubo.metadata["instance"] = {
            "source": "benchmarks/make_instances.py",
            "spec": spec.to_json(),
            "data": splits.info["documents"]["calibration"],
            "seq_len": args.seq_len,
        }
        qubo.save(path)
        written.append(path)
        print(f"{path} ({qubo.n} blocks, estimated in {qubo.metadata.get('wall_time_s')} s; this call {wall:.1f} s)")
    if args.from_fidelity:
        written += from_fidelity(Path(args.from_fidelity), out, name)
    return written


def from_fidelity(result_path: Path, out: Path, name: str) -> list[Path]:
    """The QUBO of every variant in a ``fidelity.py`` result (one file per variant, or per M when fitted per M)."""
    import json

    import numpy as np

    from cbo.qubo.block_qubo import BlockQUBO

    result = json.loads(result_path.read_text())
    setup = result.get("setup", {})
    written = []
    for variant, per_m in result.get("variants", {}).items():
        qubos = {m: (np.array(e["qubo"]["H"]), np.array(e["qubo"]["g"]), e["cost"]) for m, e in per_m.items()}
        first = next(iter(qubos.values()))
        same = all(np.array_equal(H, first[0]) and np.array_equal(g, first[1]) for H, g, _ in qubos.values())
        for m, (H, g, cost) in list(qubos.items())[:1] if same else qubos.items():
            meta = {
                "instance": {
                    "source": "benchmarks/fidelity.py",
                    "variant": variant,
                    "fitted_for_remove": None if same else int(m),
                    "calibration": setup.get("calibration"),
                    "data": setup.get("documents", {}).get("calibration"),
                },
                "cost": cost,
            }
            windows = (setup.get("calibration") or ["?"])[0]
            path = out / f"{name}_layer_{variant}-kl-w{windows}{'' if same else f'_M{m}'}.cboq"
            BlockQUBO(H, g, metadata=meta).save(path)
            written.append(path)
            print(f"{path} ({len(g)} blocks, from {result_path})")
    return written


if __name__ == "__main__":
    main()
