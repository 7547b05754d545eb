"""The one place that measures the loss of a model with blocks removed.

Every measured loss comes from the replay engine, ``replay.RemovalLosses`` (the prefix tree), through one of two
doors:

* :class:`~cbo.measure.measurer.Measurer` (with its on-disk ``cache``): fixed windows, many sets; used by the
  estimators, validation and the PPL / SLEB baselines;
* :class:`~cbo.measure.executors.Measurements` over an executor (in process, or Ray replicas): per-window answers
  kept for a search; used by EvoPress, BlockPruner and refine, whose ``WindowLosses`` holds one ``RemovalLosses``
  per window.

One cost unit, FPE (forward-pass equivalents): each decoder-layer call and head run weighted by its parameters
against the whole model's, a full gated pass 1. ``Work.fpe`` counts it relative to one forward over the measurer's
unit windows (for an estimator, all its calibration windows); ``Measurements.fpe`` per window (one FPE is one full
forward over one window).
"""
