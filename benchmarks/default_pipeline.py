"""The default pipeline (``prune_depth`` with every default) at M = 8 and 15, its choice measured on the test windows
of ``fidelity.py`` (64 x 256 tokens of *Persuasion* for M = 8, the first 32 for M = 15), so that its test PPL sits
beside the baselines' in BENCHMARKS.md. The test split is only measured, never used to choose.

    .venv/bin/python benchmarks/default_pipeline.py      # about 13 minutes on one CPU thread
"""

import json
import math
import time

import torch

from cbo import prune_depth
from cbo.blocks import find_blocks
from cbo.data import make_splits
from cbo.hessian.measure import MeasureCache, Measurer
from cbo.models import load_model

torch.set_num_threads(1)

model, tok = load_model("smollm2-135m")
blocks = find_blocks(model, "layer")
test_all = make_splits(tok, seq_len=256, n_calibration=0, n_validation=0, n_test=64, seed=0).test
cache = MeasureCache("benchmarks/out/default_pipeline_measured", model, blocks)
measurer = Measurer(model, blocks, test_all, batch_size=8, cache=cache, retain=False)
out = {}
for m, n_test in ((8, 64), (15, 32)):
    t = time.perf_counter()
    r = prune_depth(model, tok, remove=m, progress=False)
    res = measurer.losses([r.chosen_blocks], windows=n_test)
    nll = float(res.ce[0].mean())
    kl = float(res.kl[0].mean())
    out[m] = {
        "estimator": r.estimator,
        "chosen": r.chosen_blocks,
        "rank": r.chosen_rank,
        "test_ppl": math.exp(nll),
        "test_kl": kl,
        "val_kl": r.pruned_metrics.get("kl"),
        "seconds": time.perf_counter() - t,
        "options": {k: r.options.get(k) for k in ("top_k", "validate")},
        "data": r.data_info.get("windows"),
    }
    print(m, out[m], flush=True)
json.dump(out, open("benchmarks/out/default_pipeline.json", "w"), indent=1)
