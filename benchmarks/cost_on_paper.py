"""What the default route and EvoPress cost where users run them, on paper: forward-pass equivalents, H100 hours and
memory for Llama-3.1-8B and Llama-3.3-70B, 25 % and 50 % of the blocks removed, layer and sublayer granularity.

Pure arithmetic: no model is loaded. One FPE is one forward pass of the whole model over one window (``--window``
tokens). Each part is counted by the rules of the code it models, with the code's own defaults and functions:

* the estimate (``singles``): per window (the calibration split; refine's one low-fidelity window in a large space,
  ``cbo.search.budget.large_space``), the original pass and the replay's check, and every single
  removal through the prefix tree (block i reruns the layers after it, then the head), each call weighted by its
  parameters as ``cbo.measure.replay`` weighs it;
* validation, the race and EvoPress measure removal sets: one set on one window costs its head run and a share
  ``rho`` of its kept layers (the replay starts at the first removed block and sets in one call share prefixes),
  ``h + rho (1 - h) (n - k) / n`` with ``h`` the head's share of the parameters; ``rho`` is fitted on the committed
  measurements (``benchmarks/results``: the final-choice rows, the search grid's EvoPress runs), per granularity one
  for the default's sets (validation and the race) and one for EvoPress's, and the calibration table prints every
  measured point beside its prediction;
* refine spends its budget, ``cbo.search.budget.scaled_budget(n, k)``; the race is costed at its upper bound (every
  finalist on all 96 windows); validation measures ``validate`` sets, and in a large space the chosen set alone
  (the race comes first there); EvoPress runs ``cbo.baselines.evopress.default_generations`` generations of the
  code's stages on the calibration windows (the fast setting: 16 offspring; the published one: 32; with
  2,048-token windows the stages of 1 and 16 windows are the published 2,048 and 32,768 tokens).

Published figures (cited): the models' configurations (their ``config.json`` on the Hugging Face hub); one H100
SXM's dense BF16 peak, 989.4 TFLOP/s, and its 80 GB (NVIDIA H100 datasheet; an H200 holds 141 GB, NVIDIA H200
datasheet); the model-FLOPs utilisation ``--mfu`` 0.40: Llama 3's BF16 training ran at 38-43 % MFU on H100s
(Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 4), and NVIDIA NIM's published prefill
of 5,000 tokens of Llama-3.3-70B on two H100s in FP8 (time to first token 406.77 ms; docs.nvidia.com/nim/
benchmarking/llm, Performance) implies the MFU printed as a cross-check. Derived: everything else. FLOPs per token
of one FPE: 2 x (decoder layers + output head) parameters plus 4·T·d per layer for the attention scores (the
upper figure of ``docs/guides/big-models.md``). Memory: bf16 weights, the original passes the measurers keep
(per window the teacher's float32 probabilities, T·V·4 bytes, and the bf16 stream entering every layer) and one
batch's largest layer intermediates (the MLP's three T·d_ff tensors); no method here runs a backward pass.

    .venv/bin/python -m benchmarks.cost_on_paper --out benchmarks/results/cost_on_paper
    .venv/bin/python -m benchmarks.cost_on_paper --window 4096 --mfu 0.5
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import harness as C

RESULTS = C.REPO / "benchmarks" / "results"
PEAK_BF16 = 989.4e12  # H100 SXM dense BF16 tensor FLOP/s (datasheet: 1,979 with sparsity)
PEAK_FP8 = 1978.9e12  # H100 SXM dense FP8 tensor FLOP/s (datasheet: 3,958 with sparsity)
H100_GB, H200_GB = 80.0, 141.0
GB = 1e9
# NVIDIA NIM LLM benchmarking, Performance: Llama-3.3-70B-Instruct, 2 x H100 80G, fp8 TP2, 5000 input tokens,
# concurrency 1, time to first token 406.77 ms
NIM = {"model": "llama-3.3-70b", "gpus": 2, "tokens": 5000, "seconds": 0.40677, "peak": PEAK_FP8}


@dataclass(frozen=True)
class Arch:
    """A decoder-only model's shape (its published config.json) and the parameter counts the measurer weighs."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @property
    def attention(self) -> int:  # q and o: d x heads·head_dim; k and v: d x kv_heads·head_dim (no biases)
        return self.hidden * self.head_dim * 2 * (self.heads + self.kv_heads)

    @property
    def mlp(self) -> int:  # gate, up, down
        return 3 * self.hidden * self.intermediate

    @property
    def layer(self) -> int:  # plus its two norms
        return self.attention + self.mlp + 2 * self.hidden

    @property
    def head(self) -> int:  # the output embedding
        return self.vocab * self.hidden

    @property
    def full(self) -> int:  # one full forward as the measurer weighs it: the decoder layers and the head
        return self.layers * self.layer + self.head

    @property
    def params(self) -> int:  # all parameters: plus the final norm and, untied, the input embedding
        return self.full + self.hidden + (0 if self.tied else self.vocab * self.hidden)

    def blocks(self, sublayer: bool) -> int:
        return 2 * self.layers if sublayer else self.layers


# config.json of HuggingFaceTB/SmolLM2-135M-Instruct, meta-llama/Llama-3.1-8B, meta-llama/Llama-3.3-70B-Instruct
MODELS = {
    "smollm2-135m": Arch("SmolLM2-135M", 30, 576, 1536, 9, 3, 64, 49152, True),
    "llama-3.1-8b": Arch("Llama-3.1-8B", 32, 4096, 14336, 32, 8, 128, 128256, False),
    "llama-3.3-70b": Arch("Llama-3.3-70B", 80, 8192, 28672, 64, 8, 128, 128256, False),
}
TARGETS = ("llama-3.1-8b", "llama-3.3-70b")
FRACTIONS = (0.25, 0.5)


def defaults() -> dict[str, Any]:
    """The code's defaults that set each part's size (windows, candidates, the race, EvoPress's stages)."""
    from cbo.baselines.evopress import FAST, EvoPressOptions
    from cbo.measure.executors import InProcessExecutor
    from cbo.pipeline.options import DEFAULT_SELECT, Data, Run, Search
    from cbo.search.options import RefineOptions
    from cbo.search.selection import SelectionOptions

    data, evo, race = Data(), EvoPressOptions(), SelectionOptions()
    return {
        "calibration": data.n_calibration,
        "validation": data.n_validation,
        "validate": Search().validate,
        "batch": Run().batch_size,
        "refine_windows": RefineOptions().windows(data.n_calibration)[1],
        "low_windows": RefineOptions().windows(data.n_calibration)[0],
        "race": [[w, race.finalists] for w in race.schedule(DEFAULT_SELECT, DEFAULT_SELECT)],
        "kept_windows": inspect.signature(InProcessExecutor).parameters["keep_windows"].default,
        "evopress": {
            "initial": evo.initial,
            "initial_windows": evo.initial_windows,
            "stages": [list(s) for s in evo.stages()],
        },
        "offspring": {"fast": FAST["offspring"], "published": evo.offspring},
    }


# ---------------------------------------------------------------------------------------------------- FPE
def setup_fpe(a: Arch, sublayer: bool) -> float:
    """One window's original pass and the replay's check (the last layer and the head; at sublayer granularity
    each kind of half replayed and gated once), as ``cbo.measure.replay`` charges them."""
    ell, h = a.layer / a.full, a.head / a.full
    check = ell + h
    if sublayer:
        check += ell * (4 - (a.attention + a.mlp) / a.layer)
    return 1.0 + check


def singles_fpe(a: Arch, sublayer: bool) -> float:
    """The single removals of one window through the prefix tree: removing block i reruns the layers after it
    (a half also its own layer without it) and the head."""
    L, ell, h = a.layers, a.layer / a.full, a.head / a.full
    if not sublayer:
        return ell * L * (L - 1) / 2 + L * h
    return ell * L * (2 - (a.attention + a.mlp) / a.layer) + ell * L * (L - 1) + 2 * L * h


def set_fpe(a: Arch, n: int, k: int, rho: float) -> float:
    """One removal set on one window: its head run and the share ``rho`` of its kept layers that is rerun."""
    h = a.head / a.full
    return h + rho * (1 - h) * (n - k) / n


def implied_rho(a: Arch, n: int, k: int, per_set: float) -> float:
    h = a.head / a.full
    return (per_set - h) / ((1 - h) * (n - k) / n)


def default_fpe(
    a: Arch,
    sublayer: bool,
    k: int,
    rho: float,
    d: dict,
    refine: float,
    race=None,
    estimate_windows=None,
    validated=None,
) -> dict[str, float]:
    """The default route's FPE by part; ``race``: ``[[windows, sets measured], ...]`` (default: every finalist on
    every window of the schedule, the upper bound); ``estimate_windows``: the windows the estimate runs on (default:
    the calibration split; in a large space the default runs it on refine's low-fidelity windows); ``validated``:
    the sets measured on the validation windows (default ``validate``; in a large space the race comes first and
    only its choice is validated)."""
    setup, c = setup_fpe(a, sublayer), set_fpe(a, a.blocks(sublayer), k, rho)
    return {
        "estimate": (estimate_windows or d["calibration"]) * (setup + singles_fpe(a, sublayer)),
        "validation": d["validation"] * (setup + (validated or d["validate"]) * c),
        "refine": float(refine),
        "race": sum(w * (setup + m * c) for w, m in (d["race"] if race is None else race)),
    }


def evopress_fpe(a: Arch, sublayer: bool, k: int, rho: float, d: dict, offspring: int, settings=None) -> dict:
    """EvoPress's FPE by stage: the pool's original passes, the initial sets, the offspring (stage 1) and the
    survivors with the parent (stage 2), over ``default_generations`` of the kind with the most removed."""
    from cbo.baselines.evopress import default_generations, kind_counts

    s = settings or d["evopress"]
    kinds = ["attention", "mlp"] * a.layers if sublayer else ["layer"] * a.layers
    counts = kind_counts(kinds, k)
    kind = max((c, name) for name, c in counts.items())[1]
    generations = default_generations(kinds.count(kind), counts[kind])
    (survivors, w1), (_, w2) = s["stages"]
    c = set_fpe(a, a.blocks(sublayer), k, rho)
    pairs = {
        "initial": s["initial"] * s["initial_windows"],
        "stage 1": generations * offspring * w1,
        "stage 2": generations * (survivors + 1) * w2,
    }
    parts = {"windows": float(d["calibration"]), **{stage: c * count for stage, count in pairs.items()}}
    return {"generations": generations, "pairs": sum(pairs.values()), "parts": parts, "total": sum(parts.values())}


# ---------------------------------------------------------------------------------------------------- calibration
def measured_points(results: Path) -> tuple[list[dict], list[dict]]:
    """The committed final-choice rows (the default's routes) and the search grid's EvoPress runs (with settings), of
    the default model only (another model's forward costs differently per window)."""

    def ours(data: dict) -> bool:  # the model the cost model is calibrated on: the default model
        return not C.model_tag(C.model_of(data))

    files = [json.loads(p.read_text()) for p in sorted((results / "final_choice").glob("*-select96.json"))]
    routes = [data["rows"][0] for data in files if ours(data)]
    search = results / "search"
    runs = []
    for path in [search / "search.json", *sorted((search / "full").glob("*.point.json"))]:
        data = json.loads(path.read_text())
        if not ours(data):
            continue
        for name, point in (data["points"] if "points" in data else {data["spec"]["name"]: data}).items():
            if "evopress" not in point["runs"]:  # a point of other methods only (e.g. refine with another budget)
                continue
            run, (granularity, remove) = point["runs"]["evopress"], name.split("-")[:2]
            runs.append({"granularity": granularity, "remove": int(remove), "fpe": run["fpe"], "settings": run["info"]})
    return routes, runs


def calibrate(results: Path, d: dict) -> dict[str, Any]:
    """``rho`` per kind of measurement and granularity (the mean over the committed points), and every measured
    point beside the model's prediction with it."""
    a = MODELS["smollm2-135m"]
    routes, runs = measured_points(results)

    def where(row: dict) -> tuple[bool, int, int]:
        sub = row["granularity"] == "sublayer"  # M layers' worth: M attention and M MLP halves
        return sub, a.blocks(sub), row["remove"] * (2 if sub else 1)

    def evopress(run: dict, rho: float) -> dict:  # with the run's own settings
        s = run["settings"]
        stages = {"initial": s["initial"], "initial_windows": s["initial_windows"], "stages": s["stages"]}
        return evopress_fpe(a, *where(run)[::2], rho, d, s["offspring"], stages)

    fits: dict[str, dict[str, list[float]]] = {"set": {}, "evopress": {}}
    for row in routes:  # validation: the validated route's FPE beyond the estimate's
        sub, n, k = where(row)
        per_window = (row["fpe"]["validated"] - row["fpe"]["one-at-a-time"]) / d["validation"]
        per_set = (per_window - setup_fpe(a, sub)) / d["validate"]
        fits["set"].setdefault(row["granularity"], []).append(implied_rho(a, n, k, per_set))
    for run in runs:  # EvoPress: its FPE beyond the pool's original passes, per (set, window) pair
        sub, n, k = where(run)
        per_pair = (run["fpe"] - d["calibration"]) / evopress(run, 1.0)["pairs"]
        fits["evopress"].setdefault(run["granularity"], []).append(implied_rho(a, n, k, per_pair))
    rho = {kind: {g: sum(v) / len(v) for g, v in by.items()} for kind, by in fits.items()}

    rows = []
    for row in routes:
        sub, n, k = where(row)
        r = rho["set"][row["granularity"]]
        point = f"{row['granularity']} M = {row['remove']}, s{row['seed']}"
        base = default_fpe(a, sub, k, r, d, 0.0, race=[])
        predicted = {"one-at-a-time": base["estimate"], "validated": base["estimate"] + base["validation"]}
        for route in ("raced", "refined"):
            rounds = [[x["windows"], x["measured"]] for x in row["selection"][route]["rounds"]]
            refine = row["refine"]["budget"] if route == "refined" else 0.0
            predicted[route] = sum(default_fpe(a, sub, k, r, d, refine, race=rounds).values())
        rows += [[point, route, row["fpe"][route], value] for route, value in predicted.items()]
    for run in runs:
        s = run["settings"]
        value = evopress(run, rho["evopress"][run["granularity"]])["total"]
        label = f"evopress ({s['offspring']} offspring, stages {s['stages']})"
        rows.append([f"{run['granularity']} M = {run['remove']}, s{s['seed']}", label, run["fpe"], value])
    return {"rho": rho, "rows": [[p, w, m, v, v / m] for p, w, m, v in rows]}


# ---------------------------------------------------------------------------------------------------- time and memory
def flops_per_fpe(a: Arch, window: int) -> float:
    """One forward over one window: 2 FLOPs per weight of the layers and the head per token, plus 4·T·d per
    layer per token for the attention scores."""
    return window * (2.0 * a.full + 4.0 * window * a.heads * a.head_dim * a.layers)


def hours(a: Arch, fpe: float, window: int, mfu: float) -> float:
    """Wall hours at one H100's throughput (layer-wise model parallelism runs one GPU at a time)."""
    return fpe * flops_per_fpe(a, window) / (PEAK_BF16 * mfu) / 3600


def window_state(a: Arch, window: int) -> float:
    """Bytes one window's kept original pass holds: the teacher's float32 probabilities, its negative entropy and
    top tokens, and the bf16 stream entering every layer and leaving the last."""
    return window * (a.vocab * 4 + 4 + 8) + (a.layers + 1) * window * a.hidden * 2


def peak_gb(a: Arch, window: int, phases: list[tuple[int, int]]) -> float:
    """bf16 weights plus the largest phase: ``(windows kept, windows per forward)``; a forward's largest
    intermediates are the MLP's three T x d_ff tensors per window."""
    extra = max(kept * window_state(a, window) + 3 * batch * window * a.intermediate * 2 for kept, batch in phases)
    return (2 * a.params + extra) / GB


def memory(a: Arch, window: int, d: dict) -> dict[str, float]:
    """Peak GB of each method: the default's estimate, validation and race keep one batch, refine its high-fidelity
    windows (one forward each); EvoPress keeps the pool's windows up to the executor's limit."""
    default = [(d["batch"], d["batch"]), (d["refine_windows"], 1)]
    evopress = [(min(d["kept_windows"], d["calibration"]), 1)]
    return {"default": peak_gb(a, window, default), "evopress": peak_gb(a, window, evopress)}


def implied_mfu() -> float:
    """NIM's published prefill (time to first token at concurrency 1) as a share of the GPUs' dense peak."""
    a = MODELS[NIM["model"]]
    return flops_per_fpe(a, NIM["tokens"]) / NIM["seconds"] / (NIM["gpus"] * NIM["peak"])


# ---------------------------------------------------------------------------------------------------- the table
def table(rho: dict, d: dict, window: int, mfu: float) -> list[dict[str, Any]]:
    from cbo.search.budget import large_space, scaled_budget

    rows = []
    for key in TARGETS:
        a = MODELS[key]
        for granularity in ("layer", "sublayer"):
            sub = granularity == "sublayer"
            n = a.blocks(sub)
            mem = memory(a, window, d)
            for fraction in FRACTIONS:
                k = round(fraction * n)
                large = large_space(n, k)  # cbo.pipeline.depth: a cheap prior, the race before one validation
                parts = default_fpe(
                    a, sub, k, rho["set"][granularity], d, scaled_budget(n, k),
                    estimate_windows=d["low_windows"] if large else None, validated=1 if large else None,
                )  # fmt: skip
                total = sum(parts.values())
                evo = {
                    name: evopress_fpe(a, sub, k, rho["evopress"][granularity], d, count)
                    for name, count in d["offspring"].items()
                }
                rows.append({
                    "model": a.name, "granularity": granularity, "fraction": fraction, "n": n, "k": k,
                    "neighbours": k * (n - k), "budget": scaled_budget(n, k), "default": parts, "default_total": total,
                    "dominant": max(parts, key=parts.get), "evopress": evo,
                    "generations": evo["fast"]["generations"],
                    "ratio": {name: total / e["total"] for name, e in evo.items()},
                    "hours": {"default": hours(a, total, window, mfu),
                              **{name: hours(a, e["total"], window, mfu) for name, e in evo.items()}},
                    "memory_gb": mem,
                    "h100s": {m: math.ceil(v / H100_GB) for m, v in mem.items()},
                    "h200s": {m: math.ceil(v / H200_GB) for m, v in mem.items()},
                })  # fmt: skip
    return rows


def parse(argv: list[str] | None) -> Any:
    p = C.parser(__doc__.splitlines()[0], out="cost_on_paper", threads=False)
    p.add_argument("--window", type=int, default=2048, help="tokens per window: one FPE (default 2048)")
    p.add_argument("--mfu", type=float, default=0.40, help="model-FLOPs utilisation of the H100s (default 0.40)")
    p.add_argument("--results", default=str(RESULTS), help="the committed measurements (default benchmarks/results)")
    return p.parse_args(argv)


def run(job: C.Run) -> dict:
    args = job.args
    d = defaults()
    cal = calibrate(Path(args.results), d)
    throughput = {
        key: PEAK_BF16 * args.mfu * args.window / flops_per_fpe(MODELS[key], args.window) for key in TARGETS
    }  # fmt: skip
    return job.header(
        torch_info=False, window=args.window, mfu=args.mfu, implied_mfu_nim=implied_mfu(), defaults=d,
        models={k: {**asdict(MODELS[k]), "params": MODELS[k].params, "full": MODELS[k].full} for k in MODELS},
        tokens_per_second=throughput, calibration=cal, rows=table(cal["rho"], d, args.window, args.mfu),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------- the report
def markdown(result: dict) -> str:
    w, mfu = result["window"], result["mfu"]
    rho = result["calibration"]["rho"]
    lines = [
        f"# What the default and EvoPress cost on paper ({w}-token windows, {mfu:.0%} MFU)",
        "",
        f"`{result['command']}`",
        "",
    ]
    lines += [
        "FPE: one forward pass of the whole model over one window. Published: the models' configurations, the H100's "
        f"dense BF16 peak (989.4 TFLOP/s) and memory (80 GB; H200 141 GB), the MFU ({mfu:.0%}; Llama 3's BF16 "
        f"training: 38-43 %; NIM's published FP8 prefill of Llama-3.3-70B implies {result['implied_mfu_nim']:.0%}). "
        "Derived: everything else (see the script's docstring).",
        "",
        "One H100 at that MFU: " + ", ".join(
            f"{MODELS[k].name} {v:,.0f} tokens/s" for k, v in result["tokens_per_second"].items()) + ".",
        "",
        "## Calibration: the model against the committed measurements (SmolLM2-135M, 128-token windows)",
        "",
        "rho (share of a measured set's kept layers rerun), the mean over the points of its kind: "
        + "; ".join(f"{kind} {g} {v:.3f}" for kind, by in rho.items() for g, v in by.items()) + ".",
        "",
    ]  # fmt: skip
    cal = [[p, what, f"{m:,.0f}", f"{v:,.0f}", f"{r:.2f}"] for p, what, m, v, r in result["calibration"]["rows"]]
    lines += [C.md_table(["point", "what", "measured FPE", "predicted FPE", "predicted ÷ measured"], cal), ""]
    lines += ["## FPE by part", ""]
    head = ["model", "granularity", "removed", "n", "k", "k(n−k)", "refine budget", "estimate", "validation",
            "refine", "race ≤", "default", "EvoPress 16", "EvoPress 32", "default ÷ EvoPress 16 / 32", "dominant"]  # fmt: skip
    body = []
    for r in result["rows"]:
        p, e = r["default"], r["evopress"]
        share = p[r["dominant"]] / r["default_total"]
        body.append([
            r["model"], r["granularity"], f"{r['fraction']:.0%}", r["n"], r["k"], f"{r['neighbours']:,}",
            f"{r['budget']:,.0f}", *(f"{p[x]:,.0f}" for x in ("estimate", "validation", "refine", "race")),
            f"**{r['default_total']:,.0f}**", f"{e['fast']['total']:,.0f}", f"{e['published']['total']:,.0f}",
            f"{r['ratio']['fast']:.2f} / {r['ratio']['published']:.2f}", f"{r['dominant']} ({share:.0%})",
        ])  # fmt: skip
    lines += [C.md_table(head, body), ""]
    lines += [
        "Race: its upper bound, all 8 finalists on all 96 windows. Dominant: the default's largest part and its share.",
        "",
        f"## H100 hours and peak memory ({w}-token windows)",
        "",
        "Hours: the FPE at one H100's throughput (layer-wise model parallelism runs one GPU at a time; the GPU-hours "
        "held are the hours times the GPUs). GB: bf16 weights, the original passes the measurers keep and one "
        "forward's largest intermediates; the GPUs it takes at 80 GB (H100) and 141 GB (H200) each.",
        "",
    ]
    head = ["model", "granularity", "removed", "EvoPress generations", "EvoPress stage 2 share", "default h",
            "EvoPress 16 h", "EvoPress 32 h", "default GB (H100s / H200s)", "EvoPress GB (H100s / H200s)"]  # fmt: skip
    body = []
    for r in result["rows"]:
        e, hrs, mem = r["evopress"]["fast"], r["hours"], r["memory_gb"]
        body.append([
            r["model"], r["granularity"], f"{r['fraction']:.0%}", f"{r['generations']:,}",
            f"{e['parts']['stage 2'] / e['total']:.0%}", *(f"{hrs[x]:.3f}" for x in ("default", "fast", "published")),
            *(f"{mem[x]:.0f} ({r['h100s'][x]} / {r['h200s'][x]})" for x in ("default", "evopress")),
        ])  # fmt: skip
    lines += [C.md_table(head, body), ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    C.main("cost_on_paper", parse, run, markdown, argv=argv, torch=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
