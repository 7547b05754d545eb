"""Is a chosen set a local optimum of its objective? Every one-swap neighbour of a grid point's sets, measured on
the whole calibration pool (KL to the original, the objective refine and EvoPress minimise).

For each method's set of a ``benchmarks.final_choice`` point (the default route ``refined``, EvoPress, ...), the
``k (n − k)`` sets one swap away (``cbo.search.moves.SwapMoves.neighbours``) are measured on the point's 32
calibration windows, the same windows the search grid's anytime curves use. The report gives each set's KL, how
many neighbours are lower, and the lowest ones: zero lower means no single swap improves the set, which is what
refine's later rounds search for around their incumbent. Measurements are cached under ``OUT/cache`` after every
chunk of sets; a stopped run resumes there.

    .venv/bin/python -m benchmarks.swap_neighbours --points m15-s0 --methods refined,evopress --threads 2
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import harness as C

RESULTS = Path(__file__).parent / "results"


def parse(argv: list[str] | None) -> Any:
    from benchmarks.suite_grid import POINTS

    p = C.parser(__doc__.splitlines()[0], out="swap_neighbours", progress=True)
    p.add_argument("--points", default="m15-s0", help=f"points ({', '.join(POINTS)})")
    p.add_argument("--methods", default="refined,evopress", help="whose sets (those the point's file has)")
    p.add_argument("--chunk", type=int, default=16, help="sets measured between two saves of the cache")
    p.add_argument("--top", type=int, default=5, help="lowest neighbours listed per set")
    C.add_report_arg(p, "swap_neighbours")
    return p.parse_args(argv)


def local_rank(centre: tuple[int, ...], kl: dict[tuple[int, ...], float], top: int) -> dict[str, Any]:
    """``centre``'s KL against its neighbours' (``kl`` holds both): how many are lower, and the ``top`` lowest,
    each with the swap that leads to it (``out``: the block put back, ``in``: the block removed)."""
    own = kl[centre]
    around = sorted((v, s) for s, v in kl.items() if s != centre)
    lowest = []
    for v, s in around[:top]:
        out, into = sorted(set(centre) - set(s)), sorted(set(s) - set(centre))
        lowest.append({"removed": list(s), "kl": v, "out": out, "in": into})
    return {
        "kl": own,
        "neighbours": len(around),
        "lower": sum(1 for v, _ in around if v < own),
        "best_neighbour_kl": around[0][0] if around else None,
        "lowest": lowest,
    }


def run(job: C.Run) -> dict:
    import json
    from argparse import Namespace

    from benchmarks.final_choice import FULL, splits_for
    from benchmarks.suite_grid import POINTS, point_row
    from cbo.data.windows import data_hash
    from cbo.measure.executors import InProcessExecutor, Measurements
    from cbo.model.blocks import find_blocks
    from cbo.model.fingerprint import model_fingerprint
    from cbo.model.loading import load_model
    from cbo.search.moves import SwapMoves

    args = job.args
    model, tokenizer = load_model("smollm2-135m", quiet=True)
    points: dict[str, Any] = {}
    for name in C.split_list(args.points):
        row = point_row(RESULTS / "final_choice" / POINTS[name])
        windows = splits_for(Namespace(**FULL), tokenizer, model, int(row["seed"])).calibration
        blocks = find_blocks(model, row["granularity"])
        measure = Measurements(InProcessExecutor(model, blocks, windows, keep_windows=len(windows)))
        ident = f"{model_fingerprint(model)[:12]}-{row['granularity']}-{data_hash(windows)[:12]}"
        cache = job.out / "cache" / f"{name}-calibration-kl-{ident}.json"  # other model or windows: another file
        if cache.is_file():
            measure.restore(json.loads(cache.read_text()))
        every = list(range(measure.n_windows))
        moves = SwapMoves([b.kind for b in blocks])
        result = {}
        for method in C.split_list(args.methods):
            if method not in row["sets"]:
                continue
            centre = tuple(sorted(int(i) for i in row["sets"][method]))
            sets = [centre, *moves.neighbours(centre)]
            values = []
            for start in range(0, len(sets), int(args.chunk)):
                chunk = sets[start : start + int(args.chunk)]
                values += measure(chunk, every, loss="kl").mean(axis=1).tolist()
                C.write_json(cache, measure.state())
                if not args.no_progress:
                    print(f"{name} {method}: {start + len(chunk)} of {len(sets)} sets measured", flush=True)
            result[method] = local_rank(centre, dict(zip(sets, values)), int(args.top))
        points[name] = {"granularity": row["granularity"], "windows": len(every), "methods": result}
        measure.executor.close()
        job.save(job.header(points=points))
    return job.header(points=points)


def markdown(result: dict) -> str:
    lines = [*C.report_head("Every one-swap neighbour of the grid's sets (calibration KL, 32 windows)", result)]
    for name, point in result["points"].items():
        lines += [f"## {name} ({point['granularity']}, {point['windows']} calibration windows)", ""]
        rows = []
        for method, r in point["methods"].items():
            low = r["lowest"][0] if r["lowest"] else None
            swap = "—" if low is None else f"put back {low['out']}, remove {low['in']}"
            best = "—" if r["best_neighbour_kl"] is None else f"{r['best_neighbour_kl']:.4f}"
            rows.append([method, f"{r['kl']:.4f}", r["neighbours"], r["lower"], best, swap])
        header = ["set", "calibration KL", "neighbours", "lower", "lowest neighbour", "its swap"]
        lines += [C.md_table(header, rows), ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    C.main("swap_neighbours", parse, run, markdown, argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
