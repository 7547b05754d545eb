"""A sublayer-pruned folder of the default model loaded with plain transformers, against ``cbo.load_pruned``.

Attention and MLP halves are removed (``cbo.surgery.depth.remove_sublayers``), the model is saved three times: with
``cbo.save_pruned`` (every weight of the zeroed halves saved as zeros: the plain load is silent), with
``save_pruned(..., plain_weights="outputs")`` (their output projections only: plain transformers warns of the
missing input weights), and with bare ``save_pretrained`` (the zero modules' missing weights: what plain
transformers re-initialises at random). Each folder is loaded with ``AutoModelForCausalLM.from_pretrained``
(recording whether transformers printed its LOAD REPORT of missing weights) and its logits on test windows compared
with ``cbo.load_pruned``'s; the folder sizes say what the zeros cost on disk.

    .venv/bin/python -m benchmarks.sublayer_folder --threads 1
    .venv/bin/python -m benchmarks.sublayer_folder --halves 3.attn,9.mlp --windows 2
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks import depth_harness as D
from benchmarks import harness as C

DEFAULT_HALVES = "4.attn,8.attn,12.attn,16.attn,6.mlp,10.mlp,14.mlp,18.mlp"


@contextmanager
def load_report_printed() -> Iterator[list[str]]:
    """Collect (and silence) transformers' LOAD REPORT warnings, missing or unexpected weights, inside it."""
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage()) if "LOAD REPORT" in record.getMessage() else None
    logger = logging.getLogger("transformers")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        yield seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> dict:
    p = C.parser(__doc__, model=True)
    p.add_argument("--halves", default=DEFAULT_HALVES, help="removed halves, LAYER.attn or LAYER.mlp, comma-separated")
    p.add_argument("--windows", type=int, default=4, help="test windows the logits are compared on")
    p.add_argument(
        "--out",
        default=str(C.REPO / "benchmarks" / "results"),
        help="folder of sublayer_folder.json (default: results)",
    )
    p.set_defaults(seq_len=128)
    return C.main("sublayer_folder", p, run, argv=argv)


def run(job: C.Run) -> dict:
    args = job.args
    import torch
    import transformers

    from cbo.surgery.depth import remove_sublayers
    from cbo.surgery.io import load_pruned, save_pruned, zeroed_half_weights

    model, tok, splits = D.load(args, n_calibration=0, n_validation=0, n_test=args.windows)
    windows = splits.test
    halves = [(int(h.split(".")[0]), h.split(".")[1]) for h in args.halves.split(",")]
    pruned = remove_sublayers(model, halves)
    del model
    with torch.no_grad():
        reference = pruned(input_ids=windows).logits
    zeros = {kind: zeroed_half_weights(pruned, kind) for kind in ("all", "outputs")}
    rows = {}
    with tempfile.TemporaryDirectory(prefix="cbo-sublayer-") as tmp:
        for route in ("save_pruned", "save_pruned_outputs", "save_pretrained"):
            folder = Path(tmp) / route
            if route == "save_pruned":
                save_pruned(pruned, folder, tok)
            elif route == "save_pruned_outputs":
                save_pruned(pruned, folder, tok, plain_weights="outputs")
            else:
                pruned.save_pretrained(folder)
            with torch.no_grad():
                cbo_logits = load_pruned(folder)(input_ids=windows).logits
                with load_report_printed() as printed:
                    plain = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
                plain_logits = plain(input_ids=windows).logits
            rows[route] = {
                "folder_mb": round(folder_bytes(folder) / 1e6, 2),
                "plain_load_report": bool(printed),
                "load_pruned_max_abs_diff": float((cbo_logits - reference).abs().max()),
                "plain_from_pretrained_max_abs_diff": float((plain_logits - reference).abs().max()),
                "plain_top1_agreement": float((plain_logits.argmax(-1) == reference.argmax(-1)).float().mean()),
            }
            del plain
            print(
                f"{route:16} folder {rows[route]['folder_mb']:8.2f} MB   max |logit - pruned|: load_pruned "
                f"{rows[route]['load_pruned_max_abs_diff']:.3g}, plain from_pretrained "
                f"{rows[route]['plain_from_pretrained_max_abs_diff']:.3g} (top-1 agreement "
                f"{rows[route]['plain_top1_agreement']:.3f})"
            )
    result = {
        **job.header(),
        "halves": args.halves,
        "windows": list(windows.shape),
        "zero_parameters_saved": {k: int(sum(t.numel() for t in z.values())) for k, z in zeros.items()},
        "routes": rows,
        "wall_time_s": round(job.clock(), 1),
        "cpu_time_s": round(job.clock.cpu(), 1),
    }
    print(f"zeros saved (all weights / output projections): {result['zero_parameters_saved']} parameters")
    job.save(result)
    return result


if __name__ == "__main__":
    main()
