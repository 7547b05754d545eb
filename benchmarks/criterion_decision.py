"""The race's criterion decided across the grid's points: the sets the race picks by KL to the original and by
cross-entropy (the default), scored on splits no report uses, per point and pooled over the points.

Reads what ``benchmarks.suite_grid`` cached (per-item scores of each set) and the ``benchmarks.final_choice``
results of both races; computes nothing on a model. Per point: KL race − CE race in average accuracy over the
tasks, a paired bootstrap interval over the items; pooled: the mean of the points' differences, every draw
resampling the items once for all points (``cbo.downstream.scores.paired_contrast``). The rule, fixed before the
scores were seen: KL becomes the default only if the pooled interval lies above zero; a tie keeps CE.

    .venv/bin/python -m benchmarks.criterion_decision \\
        --kl m8-s0=benchmarks/results/final_choice/m8-s0-select96-kl.json,m12-s0=...,m15-s0=...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import harness as C

RESULTS = Path(__file__).parent / "results"
TASKS = "arc_easy_validation,arc_challenge_validation,mmlu_selection"


def parse(argv: list[str] | None) -> Any:
    p = C.parser(__doc__.splitlines()[0], out="criterion_decision", threads=False)
    p.add_argument("--kl", required=True, help="POINT=FILE,...: the final_choice result of the race by KL per point")
    p.add_argument("--tasks", default=TASKS, help="the selection tasks (splits no report uses)")
    p.add_argument("--cache", type=Path, default=RESULTS / "suite" / "scores", help="suite_grid's score cache")
    C.add_report_arg(p, "criterion_decision")
    return p.parse_args(argv)


def scores_of(cache: Path, blocks: list[int], tasks: list[str]) -> dict:
    """One layer set's cached results and per-item scores of ``tasks`` (all of them, or a clear error naming the
    command)."""
    from benchmarks.suite_grid import _key, read_scores
    from cbo.downstream.standard_tasks import expand
    from cbo.model.loading import DEFAULT_MODEL

    path = Path(cache) / f"{_key(DEFAULT_MODEL, 'layer', blocks, None, 0)}.json"
    done = read_scores(path)
    missing = [t for t in tasks if t not in done["results"] or any(s not in done["items"] for s in expand(t))]
    if missing:
        raise SystemExit(
            f"no scores of {missing} for the set {blocks} in {path}; score it first: python -m benchmarks.suite_grid "
            f"--extra race-kl=FILE --tasks {','.join(tasks)} --cache {cache}"
        )
    return done


def decide(pooled: list[float]) -> str:
    """The rule: KL only if the pooled interval lies above zero; otherwise CE (a tie, or CE ahead)."""
    return "kl" if pooled[1] > 0 else "ce"


def run(job: C.Run) -> dict:
    from benchmarks.suite_grid import POINTS, _items, point_row
    from cbo.downstream.scores import average, paired_contrast

    args = job.args
    tasks = C.split_list(args.tasks)
    pairs = dict(item.partition("=")[::2] for item in C.split_list(args.kl))
    rows, terms = {}, []
    for name, path in pairs.items():
        ce = list(point_row(RESULTS / "final_choice" / POINTS[name])["sets"]["refined"])
        kl = list(point_row(Path(path))["sets"]["refined"])
        kl_scores, ce_scores = scores_of(args.cache, kl, tasks), scores_of(args.cache, ce, tasks)
        a, b = _items(kl_scores), _items(ce_scores)
        diff = list(paired_contrast([(1.0, a), (-1.0, b)], tasks))
        accuracy = {"kl": average(kl_scores["results"], tasks), "ce": average(ce_scores["results"], tasks)}
        rows[name] = {"kl_set": kl, "ce_set": ce, **accuracy, "kl_minus_ce": diff}
        terms += [(1.0 / len(pairs), a), (-1.0 / len(pairs), b)]
    pooled = list(paired_contrast(terms, tasks))
    return job.header(torch_info=False, tasks=tasks, points=rows, pooled=pooled, decision=decide(pooled))


def markdown(result: dict) -> str:
    def ci(d: list[float]) -> str:
        return f"{100 * d[0]:+.1f} [{100 * d[1]:+.1f}, {100 * d[2]:+.1f}]"

    lines = [f"# The race's criterion on {', '.join(result['tasks'])} (every item)", "", f"`{result['command']}`", ""]
    header = ["point", "race by CE (the default)", "race by KL", "same set", "KL − CE (points, 95 % CI)"]
    rows = [
        [name, f"{100 * r['ce']:.1f}", f"{100 * r['kl']:.1f}", "yes" if r["kl_set"] == r["ce_set"] else "no",
         ci(r["kl_minus_ce"])]
        for name, r in result["points"].items()
    ]  # fmt: skip
    rows.append(["pooled (mean of the points)", "", "", "", ci(result["pooled"])])
    verdict = (
        "KL becomes the default" if result["decision"] == "kl" else "CE stays the default (KL not ahead beyond noise)"
    )
    lines += [C.md_table(header, rows), "", f"Decision: {verdict}.", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    C.main("criterion_decision", parse, run, markdown, argv=argv, torch=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
