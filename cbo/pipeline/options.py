"""The option groups of the pipelines: a few small frozen dataclasses instead of long keyword lists passed down.

``prune_depth`` and ``compress`` take them as ``data=Data(...)``, ``estimate=Estimate(...)``, ``search=Search(...)``
and ``run=Run(...)`` (beside the QUBO's own :class:`cbo.qubo.block_qubo.Constraints`, built from ``keep``, ``caps``
and ``budget_params``), or the groups' fields as flat keywords for convenience (``seed=1, n_calibration=16``);
:func:`option_groups` builds the groups once, at the entry point, and everything below takes the groups. Every
field name belongs to one group, so a flat keyword says where it goes. Model: llm-compressor's ``args/`` dataclasses
and ``parse_args``, transformers' ``TrainingArguments``.

Example:
    >>> data, estimate, search, run = option_groups({"seed": 1, "top_k": 5}, who="prune_depth")
    >>> run.seed, search.top_k, estimate.estimator
    (1, 5, 'singles')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbo.errors import InvalidOptionError
from cbo.search.budget import FLOOR

# the depth estimator used when none is given, everywhere (prune_depth, compress's depth proposer, `cbo prune`,
# `cbo hessian`, `cbo compress`); chosen from benchmarks/fidelity.py (BENCHMARKS.md): measured single-block removal
# losses, whose validated excited states beat every baseline at M = 8 and 15 of 30 there
DEFAULT_ESTIMATOR = "singles"
# what ``refine``/``select`` mean when not given ("auto"): refinement rounds of this many FPE after the estimate, then
# a race of the validated states on up to this many fresh windows by perplexity (method "cbo"; otherwise, and
# where no fresh window can be cut, off). Chosen from benchmarks/final_choice.py at the pipeline's sizes
# (BENCHMARKS.md, "The final choice among near-ties"): at M = 15 of 30 it beats the validation-KL choice by 7.5 %
# test perplexity on Austen and 24 % on the second domain and ties EvoPress's choice, at M = 12 it beats it by 6 % and
# 14 %, at M = 8 it ties. The races of 480 windows there had their final leader after 96 (32 + 64), so the default
# stops there: measured at M = 15, the same set for 49 % of EvoPress's total FPE.
# The refine budget at layer granularity; larger spaces get more (cbo.search.budget.scaled_budget: 4/3 FPE per swap
# neighbour of a set, so 939 FPE for 16 of 60 sublayer halves).
AUTO = "auto"
DEFAULT_REFINE = FLOOR
DEFAULT_SELECT = 96


@dataclass(frozen=True)
class Data:
    """Where the token windows come from.

    Attributes:
        text: the text source (file, folder, .jsonl, list of strings, datasets object); None = the Austen novels.
        splits: precomputed ``TokenSplits`` (then ``text`` and the window counts are not used).
        n_calibration / n_validation / n_test: windows per split; seq_len: tokens per window.
    """

    text: Any = None
    splits: Any = None
    n_calibration: int = 32
    n_validation: int = 32
    n_test: int = 0
    seq_len: int = 128


@dataclass(frozen=True)
class Estimate:
    """How the QUBO is estimated: a registered Hessian estimator (``cbo estimators``), its loss and options."""

    estimator: str = DEFAULT_ESTIMATOR
    loss: str = "kl"
    estimator_options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Search:
    """How the states are found and chosen.

    Attributes:
        solver / solver_options: a registered solver (``"auto"`` picks one) and its options.
        top_k: low-energy states ranked; validate: how many of them are measured on the validation windows.
        refine: a budget in forward-pass equivalents for the refinement rounds after the estimate
            (:mod:`cbo.search.refine`; ``"auto"``: ``DEFAULT_REFINE`` for method ``cbo``; None: no refinement).
        select / select_options: a budget of fresh windows for the final selection's race among the validated
            states (:mod:`cbo.pipeline.final_selection`; ``"auto"``: ``DEFAULT_SELECT`` for method ``cbo`` when
            fresh windows can be cut from the text; None: the lowest validation KL is chosen) and its options (a
            ``cbo.search.selection.SelectionOptions`` or a dict of its fields).
    """

    solver: str = "auto"
    solver_options: dict[str, Any] = field(default_factory=dict)
    top_k: int = 10
    validate: int = 10
    refine: float | str | None = AUTO
    select: int | str | None = AUTO
    select_options: Any = None


@dataclass(frozen=True)
class Run:
    """How the work runs: the seed (windows, labels, randomized solvers), the batch size, the progress bars, the
    cache folder (True: ``CBO_HOME/cache``; None/False: none) and, for a model given by name, its device and dtype."""

    seed: int = 0
    batch_size: int = 8
    progress: bool = True
    cache_dir: str | Path | bool | None = True
    device: Any = "cpu"
    dtype: Any = None


GROUPS: dict[str, type] = {"data": Data, "estimate": Estimate, "search": Search, "run": Run}
# every flat keyword and the group it belongs to
FIELDS: dict[str, str] = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


def option_groups(
    flat: dict[str, Any],
    *,
    who: str,
    unused: tuple[str, ...] = (),
    defaults: dict[str, Any] | None = None,
    **given: Any,
) -> tuple[Data, Estimate, Search, Run]:
    """``(Data, Estimate, Search, Run)`` built once at an entry point: the groups ``given`` (``data=...``; else
    ``defaults[name]``, else the class's defaults) with the flat keywords ``flat`` replacing their fields.

    Args:
        flat: flat keywords (``{"seed": 1}``); each names a field of one group.
        who: the entry point, named in errors.
        unused: flat keywords the entry point does not take (refused).
        defaults: the entry point's own default groups (``{"run": Run(batch_size=4)}``).
        **given: the groups passed (None: not passed).

    Raises:
        InvalidOptionError: a keyword of no group (the message lists the valid ones), one the entry point does not
            take, or a group of the wrong type.
    """
    bad = sorted(k for k in flat if k not in FIELDS or k in unused)
    if bad:
        valid = sorted(k for k in FIELDS if k not in unused)
        raise InvalidOptionError(
            f"{who} has no option(s) {bad}; valid options: {valid} (and the groups {list(GROUPS)})."
        )
    out = []
    for name, cls in GROUPS.items():
        group = given.get(name)
        if group is None:
            group = (defaults or {}).get(name) or cls()
        elif not isinstance(group, cls):
            raise InvalidOptionError(f"{who}: {name}= takes a {cls.__name__}(...), got {type(group).__name__}.")
        mine = {k: v for k, v in flat.items() if FIELDS[k] == name}
        if "estimator_options" in mine or "solver_options" in mine:  # None means none
            mine = {k: (dict(v or {}) if k.endswith("_options") else v) for k, v in mine.items()}
        out.append(dataclasses.replace(group, **mine) if mine else group)
    return tuple(out)  # type: ignore[return-value]


def options_json(**groups: Any) -> dict[str, Any]:
    """``{"data": {...}, "estimate": {...}, ...}``: the groups as plain dicts for a report (``splits`` and a text
    that is no path described, not copied; a torch dtype or device by name)."""
    out: dict[str, Any] = {}
    for name, group in groups.items():
        d = (
            {
                f.name: (
                    dataclasses.asdict(getattr(group, f.name))
                    if dataclasses.is_dataclass(getattr(group, f.name))
                    else getattr(group, f.name)
                )
                for f in dataclasses.fields(group)
            }
            if dataclasses.is_dataclass(group)
            else dict(group)
        )
        if "splits" in d:
            d["splits"] = None if d["splits"] is None else "given"
        if "text" in d and not (d["text"] is None or isinstance(d["text"], (str, Path))):
            d["text"] = type(d["text"]).__name__
        for key in ("dtype", "device"):
            if d.get(key) is not None:
                d[key] = str(d[key])
        out[name] = {
            k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, tuple) else v) for k, v in d.items()
        }
    return out


def upgrade_options(options: dict[str, Any]) -> dict[str, Any]:
    """The ``options`` of a report written before the option groups (flat: ``top_k``, ``seed``, ``keep``, ...)
    in the grouped form; a grouped one as it is."""
    if not options or any(k in options for k in (*GROUPS, "constraints")):
        return options
    out: dict[str, Any] = {name: {} for name in (*GROUPS, "constraints")}
    renamed = {"requested_solver": "solver", "budget_params": "max_removed_params"}
    for key, value in options.items():
        key = renamed.get(key, key)
        group = "constraints" if key in ("keep", "caps", "max_removed_params") else FIELDS.get(key, "run")
        out[group][key] = value
    return out
