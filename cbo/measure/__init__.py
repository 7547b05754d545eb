"""The one place that measures the loss of a model with blocks removed.

The prefix tree and replay (``replay``), the measurer with its cache (``measurer``, ``cache``) and the executors
that run measurements in process or on Ray workers (``executors``). One cost unit: FPE, one full forward pass over
one window. Used by the estimators, baselines, validation and search.
"""
