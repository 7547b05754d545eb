"""The search benchmark's output: the per-point Markdown tables, the seed-pooled tables, the runs in progress and
one PNG per grid point (written by ``benchmarks.search``; ``--report`` rebuilds them from what is on disk)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks import harness as C

METHODS = ("refine", "evopress", "sleb", "blockpruner", "singles", "random")
EQUAL = "evopress@refine-fpe"  # EvoPress's incumbent once it has spent what refine spent in all


def in_progress(out: Path) -> list[dict[str, Any]]:
    """Methods with a checkpoint and no result yet: how far each got (read from the checkpoint, nothing measured)."""
    rows = []
    for ckpt in sorted(out.glob("*/*.ckpt.json")):
        method = ckpt.name.split("-")[0]
        if (ckpt.parent / f"{method}.json").exists():
            continue
        try:
            state = json.loads(ckpt.read_text())["state"]
        except (OSError, ValueError, KeyError):
            continue
        if method == "evopress":
            last = state["history"][-1]
            step = {"step": f"generation {last['generation']}", "fpe": last["fpe"], "loss": last["fitness"]}
            step["removed"] = last["removed"]
        elif method == "refine":
            last = state["rounds"][-1]
            step = {"step": f"round {last['round']}", "fpe": last["fpe"], "loss": last["best"]}
            step["removed"] = last["best_removed"]
        elif method == "blockpruner":
            last = state["history"][-1]
            step = {"step": f"step {last['step']}", "fpe": last["fpe"], "loss": math.log(last["ppl"])}
            step["removed"] = last["removed"]
        else:
            continue
        rows.append({"point": ckpt.parent.name, "method": method, **step, "history": _search_curve(method, state)})
    return rows


def _search_curve(method: str, state: dict[str, Any]) -> list[list[float]]:
    if method == "evopress":
        return [[h["fpe"], h["fitness"]] for h in state["history"]]
    if method == "refine":
        return [[r["fpe"], r["best"]] for r in state["rounds"]]
    return [[h["fpe"], math.log(h["ppl"])] for h in state["history"]]


def pooled(points: dict[str, Any], resamples: int = 2000) -> dict[str, dict[str, Any]]:
    """Points that differ only in the calibration seed, pooled: per method the seed-mean test PPL and FPE share,
    and refine's ratio over the windows of the seed-mean NLL difference (the seeds share the test windows)."""
    import numpy as np

    from cbo.stats import paired_ppl_ratio

    groups: dict[str, list[dict[str, Any]]] = {}
    for name, entry in points.items():
        groups.setdefault(name.rsplit("-s", 1)[0], []).append(entry)
    out: dict[str, dict[str, Any]] = {}
    for group, entries in groups.items():
        if len(entries) < 2:
            continue
        methods = [m for m in METHODS if all(m in e.get("evaluations", {}) for e in entries)]
        if "refine" not in methods:
            continue
        nll = {m: np.mean([e["evaluations"][m]["test_nll"] for e in entries], axis=0) for m in methods}
        rows = {}
        for m in methods:
            share = (
                [e["evaluations"][m]["fpe"] / e["evaluations"]["evopress"]["fpe"] for e in entries]
                if ("evopress" in methods)
                else [None]
            )
            rows[m] = {
                "seeds": len(entries),
                "test_ppl": float(np.mean([e["evaluations"][m]["test_ppl"] for e in entries])),
                "fpe_share": float(np.mean(share)) if share[0] is not None else None,
                "ratio": None if m == "refine" else paired_ppl_ratio(nll["refine"], nll[m], resamples),
            }
        out[group] = rows
    return out


def pooled_markdown(points: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for group, rows in pooled(points).items():
        n = next(iter(rows.values()))["seeds"]
        lines += ["", f"## {group}, {n} calibration seeds pooled", ""]
        table = [
            [
                m,
                r["fpe_share"],
                r["test_ppl"],
                f"{r['ratio'][0]:.3f} [{r['ratio'][1]:.3f}, {r['ratio'][2]:.3f}]" if r["ratio"] else "–",
            ]
            for m, r in rows.items()
        ]
        lines.append(C.md_table(["method", "FPE / EvoPress (mean)", "test PPL (mean)", "refine / method"], table))
    return lines


def markdown(result: dict) -> str:
    lines = [
        "# Search that pays: anytime curves and final choices",
        "",
        f"Command: `{result.get('command', '')}`",
        "",
        "FPE: forward-pass equivalents, one full forward pass of the model over one calibration window. Calibration"
        " KL: on the whole calibration pool (not charged). Test PPL: Persuasion windows. Ratio: refine's test PPL"
        " over the method's, paired bootstrap 95 % interval over test windows.",
    ]
    for name, entry in result.get("points", {}).items():
        evals, ratios = entry.get("evaluations", {}), entry.get("ratios", {})
        evo = evals.get("evopress", {}).get("fpe")
        lines += ["", f"## {name} (unpruned test PPL {C.fmt(entry.get('original_test_ppl'))})", ""]
        rows = []
        for method in (*METHODS, EQUAL):
            if method not in evals:
                continue
            e = evals[method]
            ratio = ratios.get(method)
            rows.append(
                [
                    method,
                    e["fpe"],
                    e["fpe"] / evo if evo else None,
                    e["calibration_kl"],
                    e["test_ppl"],
                    f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]" if ratio else "–",
                    str(e["removed"]),
                ]
            )
        header = ["method", "FPE", "FPE / EvoPress", "calibration KL", "test PPL", "refine / method", "removed"]
        lines.append(C.md_table(header, rows))
        if ratios.get("best_baseline"):
            lines += ["", f"Best baseline by test PPL: {ratios['best_baseline']}."]
    lines += pooled_markdown(result.get("points", {}))
    if result.get("in_progress"):
        lines += [
            "",
            "## Runs in progress (from their checkpoints; loss = the method's own search loss on its windows)",
            "",
        ]
        rows = [
            [r["point"], r["method"], r["step"], r["fpe"], r["loss"], str(r["removed"])] for r in result["in_progress"]
        ]
        lines.append(C.md_table(["point", "method", "reached", "FPE", "search loss", "incumbent"], rows))
    return "\n".join(lines) + "\n"


def plot_point(entry: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for method, e in entry["evaluations"].items():
        curve = e["curve"]
        xs = [c["fpe"] for c in curve]
        axes[0].step(xs, [c["calibration_kl"] for c in curve], where="post", label=method, marker=".")
        pts = [(c["fpe"], c["test_ppl"]) for c in curve if "test_ppl" in c]
        if pts:
            axes[1].plot(*zip(*pts), marker="o", label=method)
    for ax, label in zip(axes, ("calibration KL of the incumbent", "test PPL of the incumbent")):
        ax.set_xscale("log")
        ax.set_xlabel("forward-pass equivalents spent")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(entry["spec"]["name"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
