"""The report family of the pipelines: one base (:class:`Report`) for JSON, files, tables and the pruned model.

Every report is a dataclass that says what a pipeline did and measured and holds the pruned model. The base gives
each the same surface:

* ``to_json()`` / ``from_json(data)``: a JSON-serializable summary (no weights) and back;
* ``save(path)`` / ``Report.load(path)``: that summary as a file (``load`` of a folder written by
  ``save_model`` also loads the model and its tokenizer);
* ``table()`` / ``print(console)``: a rich table of the evidence;
* ``save_model(directory)``: the pruned model and tokenizer as the one save route writes them
  (:func:`cbo.surgery.io.save_pruned`), ``report.json`` and the report's own files (``save_artifacts``), through
  one staging folder.

A subclass sets ``format`` (the ``"format"`` key of its JSON) and implements ``to_json``, ``from_json`` and
``table``; it keeps the pruned model in ``pruned_model`` and its tokenizer in ``tokenizer``. :class:`DepthReport`
is ``prune_depth``'s; :class:`cbo.pipeline.compression.CompressionReport` is ``compress``'s.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from cbo.errors import CBOError, CorruptFileError
from cbo.jsonable import checksum_mismatch, json_number, jsonable, with_checksum
from cbo.pipeline.options import upgrade_options
from cbo.qubo.block_qubo import BlockQUBO
from cbo.qubo.states import RankedStates


def fmt_value(v: Any, spec: str = ".4g") -> str:
    """``v`` formatted with ``spec``, or "None"."""
    return "None" if v is None else format(v, spec)


def refine_line(work: dict[str, Any] | None) -> str:
    """The caption's line on refinement: its rounds, how many rounds after the first improved the incumbent, and
    how much of the best set's one-swap neighbourhood was measured (empty without refinement, or for a report
    written before the count was kept)."""
    if not work or "improving_rounds" not in work:
        return ""
    rounds, better = int(work.get("rounds") or 0), list(work["improving_rounds"])
    found = f"the best set from round {better[-1]}" if better else "the best set from round 1"
    line = (
        f"\nrefine: {rounds} rounds, {work.get('fpe', 0):.0f} of {work.get('budget', 0):.0f} FPE; {found}; "
        f"{len(better)} of {max(rounds - 1, 0)} later rounds improved it"
    )
    mix = work.get("proposals") or {}
    if mix.get("parents") == 1:  # a large space's local search (cbo.search.budget.space_options)
        line += f"; a local search: {mix['local']:.0%} of each round's proposals are swaps of the incumbent"
    race = work.get("promotion") or {}
    if race.get("stages"):  # staged promotion (cbo.search.staged)
        tried = race["finished"] + race["dropped"]
        line += f"; {race['dropped']} of {tried} promoted sets stopped early, behind the incumbent on a stage's windows"
    around = work.get("neighbourhood") or {}
    if around:
        line += (
            f"; {around['measured']} of its {around['size']} one-swap neighbours measured, {around['high']} of them "
            "on the high-fidelity windows, none lower"
        )
    return line


def removed_fractions(before: int | None, after: int | None, prunable: int | None) -> str:
    """`` (-12.3% of all, -20.0% of the decoder layers')``: what was removed, over both denominators."""
    if not before or after is None:
        return ""
    line = f" (-{(before - after) / before:.1%} of all"
    if prunable:
        line += f", -{(before - after) / prunable:.1%} of the decoder layers'"
    return line + ")"


class Report(ABC):
    """Base of the pipeline reports (see the module docstring for the surface every report shares)."""

    format: ClassVar[str] = ""
    report_file: ClassVar[str] = "report.json"
    pruned_model: Any
    tokenizer: Any

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable summary (no model weights) whose ``"format"`` is the class's ``format``."""

    @classmethod
    @abstractmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        """The report of a summary written by ``to_json`` (without the model)."""

    @abstractmethod
    def table(self) -> Any:
        """A rich table of what the report shows."""

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the JSON summary to ``path`` (atomically: a reader sees the old file or the new one), with a checksum
        of its content (:mod:`cbo.jsonable`) that :meth:`load` compares."""
        from cbo.files import atomic_write_text

        return atomic_write_text(Path(path), json.dumps(with_checksum(jsonable(self.to_json())), indent=1))

    @classmethod
    def load(cls, path: str | Path, *, with_model: bool = True, **model_kwargs: Any) -> Report:
        """A report from its JSON file, or from a folder written by ``save_model`` (then with the model).

        Args:
            path: a ``report.json`` file, or the folder that holds it.
            with_model: for a folder, also load the pruned model (:func:`cbo.surgery.io.load_pruned`) and its
                tokenizer.
            **model_kwargs: passed to ``load_pruned`` (``dtype``, ``device_map``, ...).

        Raises:
            CorruptFileError: the file is not readable JSON, not a report of this kind, or edited (its fields
                disagree, or its checksum does not match).
        """
        path = Path(path)
        folder = path if path.is_dir() else None
        file = folder / cls.report_file if folder is not None else path
        try:
            data = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CorruptFileError(f"cannot read a report from {str(file)!r}: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != cls.format:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise CorruptFileError(
                f"{str(file)!r} is not a {cls.__name__} (format {found!r}, expected {cls.format!r})."
            )
        try:
            report = cls.from_json(data)
            why = report.inconsistency()
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CorruptFileError(f"the report in {str(file)!r} is incomplete or edited: {exc!r}") from exc
        if why is not None:
            raise CorruptFileError(f"the report in {str(file)!r} is edited or damaged: {why}.")
        if folder is not None and with_model and (folder / "config.json").is_file():
            from cbo.surgery.io import load_pruned, load_tokenizer

            model = load_pruned(folder, **model_kwargs)
            why = report.model_inconsistency(model)
            if why is not None:
                raise CorruptFileError(
                    f"the report and the model in {str(folder)!r} disagree (one of them was edited): {why}."
                )
            report.pruned_model, report.tokenizer = model, load_tokenizer(folder)
        if checksum_mismatch(data):  # last: the checks above name the field when the edit shows in it
            raise CorruptFileError(
                f"the report in {str(file)!r} was edited or damaged after it was saved: its checksum does not match its "
                "content; use the report the run wrote (or run it again)."
            )
        return report

    def inconsistency(self) -> str | None:
        """Why the report's fields disagree with each other (None when they agree); a loaded report is checked."""
        return None

    def model_inconsistency(self, model: Any) -> str | None:
        """Why the report disagrees with the pruned model saved beside it (None when they agree)."""
        return None

    def save_artifacts(self, directory: Path) -> list[Path]:
        """Write the report's own files beside the model (none by default); returns them."""
        return []

    def save_model(
        self, directory: str | Path, extra_files: Mapping[str, str] | None = None, *, progress: bool = True
    ) -> Path:
        """Save the pruned model and tokenizer (as :func:`cbo.surgery.io.save_pruned` does), ``report.json``, the
        report's own files and ``extra_files`` (name -> text), all through one staging folder
        (:func:`cbo.files.output_folder`): an interrupted save leaves ``directory`` as it was, every file is listed
        as CBO's, and a file an earlier save wrote there that this one does not (an earlier QUBO) is removed.
        ``progress=False``: without transformers' "Writing model shards" bar."""
        from cbo.files import atomic_write_text, output_folder
        from cbo.model.hf_output import quiet_loading
        from cbo.surgery.io import write_pruned_folder

        if self.pruned_model is None:
            raise CBOError("this report holds no model (it was loaded from its JSON alone); nothing to save.")
        with output_folder(directory) as staging, quiet_loading(not progress):
            write_pruned_folder(self.pruned_model, staging, self.tokenizer)
            self.save(staging / self.report_file)
            self.save_artifacts(staging)
            for name, text in (extra_files or {}).items():
                atomic_write_text(staging / name, text)
        return Path(directory).expanduser()

    # ------------------------------------------------------------------ display
    def print(self, console: Any = None) -> None:
        from rich.console import Console

        (console or Console()).print(self.table())


@dataclass
class ValidatedState:
    """One candidate removal set measured on the validation split."""

    rank: int | None  # energy rank (None for a baseline's selection)
    removed: list[int]
    removed_names: list[str]
    energy: float | None
    kl: float
    ppl: float
    agreement: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "removed": list(self.removed),
            "removed_names": list(self.removed_names),
            "energy": self.energy,
            "kl": json_number(self.kl),
            "ppl": json_number(self.ppl),
            "agreement": self.agreement,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ValidatedState:
        number = lambda v: None if v is None else float(v)  # noqa: E731 - "inf" strings come back as floats
        return cls(
            data["rank"],
            [int(i) for i in data["removed"]],
            list(data["removed_names"]),
            number(data["energy"]),
            float(data["kl"]),
            float(data["ppl"]),
            number(data["agreement"]),
        )


@dataclass
class DepthReport(Report):
    """Everything ``prune_depth`` did: the QUBO, the ranked states, their validation, the choice and the model.

    Attributes:
        qubo / states: the energy and its ranked low-energy states (None for a baseline method).
        validation: the validated candidates, in energy order.
        chosen_rank: energy rank of the chosen state (None for a baseline).
        chosen_blocks / chosen_names: the removed blocks.
        pruned_model / tokenizer: the pruned model (a new object; the original is untouched) and its tokenizer.
        original_metrics / pruned_metrics: perplexity, KL to the original, agreement and parameters on the
            validation split.
        timings: seconds per step.
        work: forward-pass equivalents spent: the estimate (relative to one forward over the calibration
            windows) and the validation (:class:`cbo.measure.measurer.Work`, relative to the validation windows);
            ``work["refine"]`` / ``work["selection"]``: the refinement's rounds and the final selection's race (one
            FPE per window), when they ran; ``work["total_fpe"]``: all of it in that one unit (one full forward pass
            over one window), the figure to compare methods by.
        selection: the race's record (``cbo.search.selection.Selection.to_json``): every finalist's interval.
        options: the options as used, one dict per group of :mod:`cbo.pipeline.options`: ``{"data", "estimate",
            "search", "constraints", "run"}`` (a report written before the groups is read into this form).
    """

    format: ClassVar[str] = "cbo.depthreport"

    model_name: str
    method: str
    remove: int
    n_blocks: int
    granularity: str
    estimator: str | None
    loss: str | None
    solver: str | None
    qubo: BlockQUBO | None
    states: RankedStates | None
    validation: list[ValidatedState]
    chosen_rank: int | None
    chosen_blocks: list[int]
    chosen_names: list[str]
    pruned_model: Any
    tokenizer: Any
    original_metrics: dict[str, Any]
    pruned_metrics: dict[str, Any]
    timings: dict[str, float]
    work: dict[str, Any] = field(default_factory=dict)
    data_info: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    selection: dict[str, Any] | None = None  # the final selection's race (cbo.search.selection), when it ran

    @property
    def chosen(self) -> ValidatedState | None:
        for v in self.validation:
            if v.removed == self.chosen_blocks:
                return v
        return None

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable summary (no model weights)."""
        q = self.qubo
        return jsonable(
            {
                "format": self.format,
                "model": self.model_name,
                "method": self.method,
                "remove": self.remove,
                "n_blocks": self.n_blocks,
                "granularity": self.granularity,
                "estimator": self.estimator,
                "loss": self.loss,
                "solver": self.solver,
                "chosen": {"rank": self.chosen_rank, "removed": self.chosen_blocks, "removed_names": self.chosen_names},
                "validation": [v.to_json() for v in self.validation],
                "original": self.original_metrics,
                "pruned": self.pruned_metrics,
                "states": self.states.to_json() if self.states is not None else None,
                "qubo": None
                if q is None
                else {
                    "names": list(q.names),
                    "kinds": list(q.kinds),
                    "sizes": [int(s) for s in q.sizes],
                    "H": q.H.tolist(),
                    "g": q.g.tolist(),
                    "keep": list(q.constraints.keep),
                    "metadata": q.metadata,
                },
                "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
                "work": self.work,
                "data": self.data_info,
                "options": self.options,
                "selection": self.selection,
            }
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DepthReport:
        q = data.get("qubo")
        qubo = None
        if q is not None:
            qubo = BlockQUBO(
                q["H"], q["g"], names=q["names"], kinds=q["kinds"], sizes=q["sizes"], keep=q.get("keep", ()),
                metadata=q["metadata"],
            )  # fmt: skip
        chosen = data["chosen"]
        return cls(
            model_name=data["model"],
            method=data["method"],
            remove=int(data["remove"]),
            n_blocks=int(data["n_blocks"]),
            granularity=data["granularity"],
            estimator=data["estimator"],
            loss=data["loss"],
            solver=data["solver"],
            qubo=qubo,
            states=RankedStates.from_json(data["states"]) if data.get("states") is not None else None,
            validation=[ValidatedState.from_json(v) for v in data["validation"]],
            chosen_rank=chosen["rank"],
            chosen_blocks=[int(i) for i in chosen["removed"]],
            chosen_names=list(chosen["removed_names"]),
            pruned_model=None,
            tokenizer=None,
            original_metrics=dict(data["original"]),
            pruned_metrics=dict(data["pruned"]),
            timings={k: float(v) for k, v in data["timings_s"].items()},
            work=dict(data.get("work") or {}),
            data_info=dict(data.get("data") or {}),
            options=upgrade_options(dict(data.get("options") or {})),
            selection=data.get("selection"),
        )

    def inconsistency(self) -> str | None:
        chosen = self.chosen_blocks
        if len(set(chosen)) != len(chosen) or any(not 0 <= i < self.n_blocks for i in chosen):
            return f"chosen.removed {chosen} repeats a block or leaves 0..{self.n_blocks - 1} (n_blocks)"
        if len(self.chosen_names) != len(chosen):
            return f"chosen.removed lists {len(chosen)} blocks but chosen.removed_names {len(self.chosen_names)}"
        if self.qubo is not None:
            if self.qubo.n != self.n_blocks:
                return f"the QUBO has {self.qubo.n} blocks but n_blocks is {self.n_blocks}"
            names = [self.qubo.names[i] for i in chosen]
            if names != list(self.chosen_names):
                return f"chosen.removed {chosen} are the blocks {names}, not chosen.removed_names {self.chosen_names}"
        return None

    def model_inconsistency(self, model: Any) -> str | None:
        from cbo.surgery.depth import ORIGINAL_KEY, REMOVED_KEY, text_config, zeroed_sublayers

        layers, halves = set(), set()  # layers and (layer, half) of the input model the chosen blocks remove
        for name in self.chosen_names:
            parts = str(name).split(".")
            if len(parts) < 2 or not parts[1].isdigit():
                return None  # block names of another kind of model: nothing to compare
            if len(parts) == 2:
                layers.add(int(parts[1]))
            else:
                halves.add((int(parts[1]), "attn" if parts[2] in ("attn", "attention") else "mlp"))
        layers |= {i for i, _ in halves if (i, "attn") in halves and (i, "mlp") in halves}
        halves = {(i, p) for i, p in halves if i not in layers}
        config = text_config(model)
        n_input = self.n_blocks if self.granularity == "layer" else self.n_blocks // 2
        n = int(config.num_hidden_layers)
        if n != n_input - len(layers):
            return f"the report removes {len(layers)} of {n_input} layers, but the model has {n} layers"
        removed = list(getattr(config, REMOVED_KEY, None) or [])
        original = list(getattr(config, ORIGINAL_KEY, None) or range(n))
        if n + len(removed) == n_input:  # the input model was not pruned before: its layer numbers are the original
            zeroed = {(original[i], p) for i, p in zeroed_sublayers(model)}
            if set(removed) != layers or zeroed != halves:
                return (
                    f"the report removes the layers {sorted(layers)} and halves {sorted(halves)}, the model's config "
                    f"records the layers {sorted(removed)} and halves {sorted(zeroed)}"
                )
        return None

    def save_artifacts(self, directory: Path) -> list[Path]:
        """The QUBO beside the model (``qubo.cboq``)."""
        return [self.qubo.save(directory / "qubo.cboq")] if self.qubo is not None else []

    # ------------------------------------------------------------------ display
    def print(self, console: Any = None) -> None:
        """The ranked states' table and, when the final selection raced them, the race's table."""
        from rich.console import Console

        console = console or Console()
        console.print(self.table())
        if self.selection is not None:
            from cbo.pipeline.final_selection import selection_table

            console.print(selection_table(self.selection))

    def table(self) -> Any:
        """A rich table: rank, removed blocks, energy, validated KL / PPL / agreement; the choice marked."""
        from rich.table import Table

        validated = {v.rank: v for v in self.validation}
        title = f"{self.model_name}: remove {self.remove} of {self.n_blocks} {self.granularity} blocks — " + (
            f"{self.estimator}/{self.loss} Hessian, solver {self.solver}" if self.method == "cbo" else self.method
        )
        table = Table(title=title)
        for col, just in (
            ("rank", "right"),
            ("removed blocks", "left"),
            ("energy", "right"),
            ("val KL", "right"),
            ("val PPL", "right"),
            ("agree", "right"),
            ("", "left"),
        ):
            # the removed set is the result: wrapped on narrow screens and in files, never cut
            table.add_column(col, justify=just, overflow="fold" if col == "removed blocks" else "ellipsis")
        if self.states is not None:
            rows = [(s.rank, list(s.removed), s.energy) for s in self.states]
        else:
            rows = [(None, self.chosen_blocks, None)]
        for rank, removed, energy in rows:
            v = validated.get(rank)
            chosen = removed == self.chosen_blocks
            table.add_row(
                "–" if rank is None else str(rank),
                ", ".join(map(str, removed)),
                "–" if energy is None else f"{energy:.5g}",
                "–" if v is None else f"{v.kl:.4f}",
                "–" if v is None else f"{v.ppl:.2f}",
                "–" if v is None or v.agreement is None else f"{v.agreement:.3f}",
                "[bold green]◀ chosen[/]" if chosen else "",
                style="bold" if chosen else None,
            )
        o, p = self.original_metrics, self.pruned_metrics
        table.caption = (
            f"validation: original PPL {o.get('ppl', float('nan')):.2f} → pruned PPL {p.get('ppl', float('nan')):.2f}, "
            f"KL {p.get('kl') if p.get('kl') is None else round(p['kl'], 4)}; "
            f"params {o.get('n_params', 0) / 1e6:.1f}M → {p.get('n_params', 0) / 1e6:.1f}M"
            + removed_fractions(o.get("n_params"), p.get("n_params"), o.get("prunable_params"))
            + refine_line(self.work.get("refine"))
        )
        return table

    def __repr__(self) -> str:
        return (
            f"DepthReport(model={self.model_name!r}, method={self.method!r}, remove={self.remove}/{self.n_blocks}, "
            f"chosen_rank={self.chosen_rank}, chosen={self.chosen_blocks}, "
            f"val_kl={fmt_value(self.pruned_metrics.get('kl'))}, val_ppl={fmt_value(self.pruned_metrics.get('ppl'))})"
        )
