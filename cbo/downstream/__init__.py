"""Downstream evaluation: lm-eval tasks on in-memory models (:mod:`.harness`) and the local tasks made from the
default text (:mod:`.local_tasks`)."""

from cbo.downstream.harness import evaluate_tasks, window_loglikelihoods
from cbo.downstream.local_tasks import LOCAL_TAG, LOCAL_TASKS, ensure_local_tasks

__all__ = ["LOCAL_TAG", "LOCAL_TASKS", "ensure_local_tasks", "evaluate_tasks", "window_loglikelihoods"]
