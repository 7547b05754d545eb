"""A batch's engine (its teacher distributions, its recorded streams) is freed as soon as it is dropped."""

from __future__ import annotations

import gc
import weakref

from cbo.measure.replay import RemovalLosses
from cbo.model.blocks import find_blocks


def test_a_measured_batch_is_freed_without_the_cycle_collector(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=4)
    meter = RemovalLosses(model, find_blocks(model, "layer"), tiny_windows(model, n=2, seq_len=8))
    meter.losses([(1,), (1, 2), (0, 3)])  # through the prefix tree, whose visitor is a recursive closure
    ref = weakref.ref(meter)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del meter
        assert ref() is None, "a reference cycle keeps the batch's teacher alive until the cycle collector runs"
    finally:
        if enabled:
            gc.enable()
