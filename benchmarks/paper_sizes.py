"""The paper's estimator (``estimator="paper"``) at growing calibration sizes, from one nested run.

The calibration pool is the default text's calibration split cut into ``--pool`` windows of ``--seq-len`` tokens
(*Emma* first, then the other calibration novels when *Emma* alone has too few windows; never the validation or
test novels), shuffled with the seed. The estimate at n sequences uses the first n windows of the pool, so the
sizes are nested and one pass over the pool yields all of them: the estimator sums per-sequence outer products,
so its state after the batch that reaches n sequences, divided by n, *is* ``estimate_hessian`` on the first n
windows (``batch_size`` must divide every size). Each size's QUBO is written as it is reached
(``paper-n{n}.cboq``), the run checkpoints after every batch (Ctrl-C, then the same command, resumes), and the
cumulative sums every ``--chunk`` sequences are kept (``chunks.npz``) so that disjoint chunks of the pool give
independent estimates at small n (the estimator's sampling spread).

    .venv/bin/python -m benchmarks.paper_sizes --sizes 32,256,2048          # hours on one busy core
    .venv/bin/python -m benchmarks.paper_sizes --sizes 32 --out benchmarks/out/paper-32  # one small estimate
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness as C

# a run's QUBOs, checkpoints and chunks (not committed); the committed QUBOs: benchmarks/instances/paper
OUT = C.OUT / "paper"
HELD_OUT = ("mansfield_park", "persuasion")  # the validation and test novels of the default text


def calibration_pool(tok: Any, seq_len: int, size: int, seed: int) -> tuple[Any, dict[str, Any]]:
    """``size`` shuffled calibration windows of the default text and a description of where they come from."""
    import warnings

    from cbo.data.windows import make_splits

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # one validation and one test window keep their novels out of the calibration documents
        splits = make_splits(tok, seq_len=seq_len, n_calibration=size, n_validation=1, n_test=1, seed=seed)
    docs = splits.info["documents"]["calibration"]
    leaked = [d for d in docs if d in HELD_OUT]
    if leaked:
        raise RuntimeError(f"the calibration pool would read held-out novels {leaked}; use a smaller --pool.")
    windows = splits.calibration
    if windows.shape[0] < size:
        raise RuntimeError(f"the calibration novels hold {windows.shape[0]} windows of {seq_len} tokens, not {size}.")
    order = np.random.default_rng([seed, 17]).permutation(windows.shape[0])
    info = {
        "documents": docs,
        "windows": int(windows.shape[0]),
        "seq_len": seq_len,
        "tokens_available": splits.info["tokens_available"]["calibration"],
        "shuffle_seed": [seed, 17],
        "notes": [str(w.message) for w in caught],
    }
    return windows[order], info


def qubo_path(out: Path, n: int) -> Path:
    return out / f"paper-n{n}.cboq"


def wait_for(out: Path, sizes: list[int], poll_s: float = 30.0) -> None:
    """Wait until another process's nested run has written the QUBO of every size (it checkpoints as it goes)."""
    waiting = [n for n in sizes if not qubo_path(out, n).exists()]
    if waiting:
        print(f"waiting for the nested paper run to reach n = {waiting} in {out}", flush=True)
    while any(not qubo_path(out, n).exists() for n in sizes):
        time.sleep(poll_s)


def paper_qubos(
    model: Any,
    tok: Any,
    pool: Any,
    sizes: list[int],
    out: Path,
    *,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = True,
    chunk: int = 32,
    pool_info: dict[str, Any] | None = None,
) -> dict[int, Any]:
    """The paper-preset QUBO at every size in ``sizes`` (loaded when already written, else from the nested run)."""
    from cbo.hessian import estimate_hessian
    from cbo.model.blocks import find_blocks
    from cbo.qubo.block_qubo import BlockQUBO

    sizes = sorted(set(int(n) for n in sizes))
    bad = [n for n in sizes if n % batch_size or n > pool.shape[0]]
    if bad:
        raise ValueError(f"sizes {bad} must be multiples of batch_size={batch_size} and at most {pool.shape[0]}.")
    if chunk % batch_size:
        raise ValueError(f"chunk={chunk} must be a multiple of batch_size={batch_size}.")
    out.mkdir(parents=True, exist_ok=True)
    missing = [n for n in sizes if not qubo_path(out, n).exists()]
    if missing:
        largest = max(missing)
        blocks = find_blocks(model, "layer")
        clock_path = out / "elapsed.json"
        chunks_path = out / "chunks.npz"
        # wall time survives a resume: seconds spent in earlier, interrupted runs of this nested estimate
        clock = json.loads(clock_path.read_text()) if clock_path.exists() else {}
        key = f"n{largest}"
        spent = float(clock.get(key, 0.0))
        chunks: dict[str, np.ndarray] = dict(np.load(chunks_path)) if chunks_path.exists() else {}
        t0 = time.perf_counter()

        def snapshot(batch_index: int, state: dict[str, np.ndarray]) -> None:
            count = int(state["count"])
            elapsed = spent + time.perf_counter() - t0
            clock[key] = elapsed
            clock_path.write_text(json.dumps(clock))
            if count % chunk == 0:
                chunks[f"outer_{count}"] = np.array(state["outer"])
                np.savez(chunks_path, **chunks)
            if count in missing:
                work = state["_work"]
                metadata = {
                    "estimator": "paper",
                    "loss": "ce",
                    "granularity": "layer",
                    "n_sequences": count,
                    "seq_len": int(pool.shape[1]),
                    "n_tokens": count * int(pool.shape[1]),
                    "batch_size": batch_size,
                    "seed": seed,
                    "forward_passes": int(work[0]),
                    "backward_passes": int(work[1]),
                    "forward_equivalents_of_n": round(float(work[2]) * largest / count, 2),
                    "wall_time_s": round(elapsed, 1),
                    "calibration_ce": float(state["loss_sum"]) / count,
                    "pool": pool_info or {},
                    "nested": f"the first {count} windows of the shuffled pool (from the run up to {largest})",
                    "energy": "E(x) = 0.5 x^T H x, H = A^T A / n; the paper's x^T H x is twice this",
                }
                qubo = BlockQUBO(
                    state["outer"] / count,
                    np.zeros(len(blocks)),
                    names=[b.name for b in blocks],
                    kinds=[b.kind for b in blocks],
                    sizes=[int(b.n_params) for b in blocks],
                    metadata=metadata,
                    symmetrize=True,
                )
                qubo.save(qubo_path(out, count))
                print(f"paper n={count}: written after {elapsed:.0f} s", flush=True)

        estimate_hessian(
            model,
            tok,
            pool[:largest],
            estimator="paper",
            loss="ce",
            batch_size=batch_size,
            seed=seed,
            checkpoint=out / "checkpoint",
            progress=progress,
            callback=snapshot,
        )
    return {n: BlockQUBO.load(qubo_path(out, n)) for n in sizes}


def chunk_estimates(out: Path, n: int) -> list[np.ndarray]:
    """Independent paper-preset H from disjoint runs of n consecutive pool windows (as far as the run got)."""
    path = out / "chunks.npz"
    if not path.exists():
        return []
    chunks = dict(np.load(path))
    counts = sorted(int(k.split("_")[1]) for k in chunks)
    have = set(counts)
    found = []
    start = 0
    while start + n in have:
        before = chunks[f"outer_{start}"] if start else 0.0
        found.append((chunks[f"outer_{start + n}"] - before) / n)
        start += n
    return found


def stability(out: Path, sizes: list[int], Ms: list[int]) -> dict[str, Any]:
    """How much the paper estimator's ground state moves with its calibration sample, from the kept chunk sums.

    For each n: the ground state at each M of every independent estimate from disjoint runs of n pool windows,
    the mean overlap |A ∩ B| / M over pairs of them, and their mean overlap with the ground state of the
    largest nested estimate written (``reference``).
    """
    from itertools import combinations

    from cbo.qubo.block_qubo import BlockQUBO
    from cbo.solvers import solve

    written = sorted(int(p.stem.split("-n")[1]) for p in out.glob("paper-n*.cboq"))
    if not written or not (out / "chunks.npz").exists():
        raise SystemExit(f"--stability: {out} holds no paper-n*.cboq or no chunks.npz; run the nested estimate first")
    largest = BlockQUBO.load(qubo_path(out, written[-1]))
    reference = {M: set(solve(largest, M, "enumerate", k=1)[0].removed) for M in Ms}
    rows = []
    for n in sizes:
        estimates = chunk_estimates(out, n)
        if not estimates:
            continue
        for M in Ms:
            grounds = [set(solve(BlockQUBO(H, np.zeros(len(H))), M, "enumerate", k=1)[0].removed) for H in estimates]
            pairs = [len(a & b) / M for a, b in combinations(grounds, 2)]
            rows.append(
                {
                    "n": n,
                    "remove": M,
                    "estimates": len(grounds),
                    "pairwise_overlap": float(np.mean(pairs)) if pairs else None,
                    "overlap_with_reference": float(np.mean([len(g & reference[M]) / M for g in grounds])),
                    "grounds": [sorted(g) for g in grounds],
                }
            )
            print(
                f"n={n:>4} M={M:>2}: {len(grounds)} disjoint estimates, ground-state overlap between them "
                f"{rows[-1]['pairwise_overlap']}, with the n={written[-1]} ground {rows[-1]['overlap_with_reference']:.2f}",
                flush=True,
            )
    return {
        "reference_n": written[-1],
        "reference_grounds": {str(M): sorted(g) for M, g in reference.items()},
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--sizes", default="32,256,2048", help="comma-separated calibration sizes")
    p.add_argument("--pool", type=int, default=None, help="windows in the shuffled pool (default: largest size)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--chunk", type=int, default=32, help="sequences between kept cumulative sums")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--stability", help="chunk sizes for the ground-state stability report (no model passes)")
    p.add_argument("--remove", default="4,8,15", help="M values of the stability report")
    C.main("paper_sizes", p, run, argv=argv)


def run(job: C.Run) -> None:
    args = job.args
    if args.stability:
        sizes = [int(s) for s in args.stability.split(",") if s]
        report = stability(Path(args.out), sizes, [int(m) for m in args.remove.split(",") if m])
        (Path(args.out) / "stability.json").write_text(json.dumps(report, indent=1))
        return
    from cbo.model.loading import load_model

    sizes = [int(s) for s in args.sizes.split(",") if s]
    model, tok = load_model(args.model)
    pool, info = calibration_pool(tok, args.seq_len, args.pool or max(sizes), args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pool.json").write_text(json.dumps(info, indent=1))
    print(f"pool: {info['windows']} windows from {info['documents']}", flush=True)
    qubos = paper_qubos(
        model,
        tok,
        pool,
        sizes,
        out,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=not args.no_progress,
        chunk=args.chunk,
        pool_info=info,
    )
    for n, q in qubos.items():
        md = q.metadata
        print(f"n={n}: {md['forward_passes']} forward + {md['backward_passes']} backward passes, {md['wall_time_s']} s")


if __name__ == "__main__":
    main(sys.argv[1:])
