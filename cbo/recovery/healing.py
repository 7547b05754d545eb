"""Recovery after pruning ("healing"): a step budget of knowledge distillation from the unpruned model's logits.

:func:`heal` trains a pruned *student* to match the next-token distributions of an unpruned *teacher*
(``loss="kd"``: ``T² · KL(teacher_T ‖ student_T)`` per predicted position, the CBO paper's recovery), or on
the plain next-token loss when no teacher is given (``loss="lm"``, MoP's recovery). ``method="lora"`` trains
LoRA adapters on every projection that width pruning knows (all seven of a Llama layer; needs ``peft``) and
merges them into the weights at the end; ``"full"`` updates every parameter. Shapes never change, so a healed
model saves and loads like the pruned one (:meth:`HealResult.save` goes through
:func:`cbo.surgery.io.save_pruned`) and its config records the recovery (``cbo_recovery``).

Training is deterministic given ``seed``: step ``i`` uses a fixed batch of the windows (a seeded permutation
per epoch) and a fixed learning rate (``schedule``). With ``checkpoint_dir`` the trainable weights, the
optimizer state and the losses are written every ``checkpoint_every`` steps, at the end, and when the run is
interrupted (Ctrl-C); ``resume=True`` continues from there and ends with the same weights as an uninterrupted
run. A checkpoint written by a different heal (other options, windows, student or teacher) is refused.

The student is trained in place. An interrupted LoRA heal leaves it as it was (the adapters are removed); an
interrupted full heal leaves it part-trained (the checkpoint holds the same weights).

Example:
    >>> result = heal(pruned, teacher, splits.calibration, steps=50, method="lora",
    ...               checkpoint_dir="out/heal-ckpt", progress=True)          # doctest: +SKIP
    >>> result.losses[0], result.losses[-1]                                    # doctest: +SKIP
    (1.93, 0.61)
    >>> result.save("out/healed", tokenizer)                                   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbo.checks import check_float, check_int, check_seed
from cbo.data.windows import check_windows, data_hash, model_vocab_size
from cbo.errors import CorruptFileError, DataError, InvalidOptionError, ModelError
from cbo.extras import require
from cbo.files import CheckpointFile, atomic_write_text, output_folder
from cbo.model.forward import input_device
from cbo.model.structures import model_structures
from cbo.progress import progress_bar
from cbo.recovery.state_codec import StateFormatError, decode_state, encode_state

torch = require("torch", "recovery fine-tuning")
F = torch.nn.functional

METHODS = ("lora", "full")
LOSSES = ("kd", "lm")
SCHEDULES = ("constant", "linear", "cosine")
# learning rates used when none is given: LoRA as in common LoRA recipes, full as in the CBO paper's recovery
DEFAULT_LR = {"lora": 2e-4, "full": 2e-5}
CHECKPOINT_FILE = "heal_state.safetensors"  # tensors as safetensors, the rest as JSON: loading runs no code
LEGACY_CHECKPOINT_FILE = "heal_state.pt"  # a pickle, written before version 2; refused, never unpickled
CHECKPOINT_VERSION = 2


@dataclass
class HealOptions:
    """The settings of one heal (everything that decides its result, besides the models and the windows)."""

    steps: int
    method: str = "lora"
    loss: str = "kd"
    lr: float | None = None  # None: DEFAULT_LR[method]
    batch_size: int = 4
    temperature: float = 1.0
    schedule: str = "linear"
    warmup: int = 0
    lora_rank: int = 8
    lora_alpha: float | None = None  # None: 2 * lora_rank
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # max gradient norm (0: no clipping)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.lr is None and self.method in DEFAULT_LR:
            self.lr = DEFAULT_LR[self.method]
        if self.lora_alpha is None and isinstance(self.lora_rank, int):
            self.lora_alpha = float(2 * self.lora_rank)

    def validate(self) -> None:
        """Raise :class:`InvalidOptionError` (or :class:`MissingExtraError` for LoRA without peft) on a bad option."""

        for name, choices in (("method", METHODS), ("loss", LOSSES), ("schedule", SCHEDULES)):
            if getattr(self, name) not in choices:
                raise InvalidOptionError(f"unknown heal {name} {getattr(self, name)!r}; use one of {list(choices)}")
        for name, low in (("steps", 0), ("batch_size", 1), ("warmup", 0), ("lora_rank", 1)):
            check_int(f"heal {name}", getattr(self, name), low)
        check_seed("heal seed", self.seed)
        for name in ("lr", "temperature", "lora_alpha"):
            check_float(f"heal {name}", getattr(self, name), 0, lo_open=True)
        for name in ("weight_decay", "grad_clip"):
            check_float(f"heal {name}", getattr(self, name), 0)
        if self.warmup > self.steps:
            raise InvalidOptionError(f"heal warmup ({self.warmup}) must not exceed steps ({self.steps})")
        if self.method == "lora":
            require("peft", "LoRA recovery (or use method='full')")

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must agree on to be resumed (the step count only where the schedule depends on it)."""
        out = dataclasses.asdict(self)
        if self.schedule == "constant":
            out.pop("steps")
        return out


@dataclass
class HealResult:
    """A healed model and the record of its training."""

    model: Any
    options: HealOptions
    losses: list[float]  # training loss of every step, the resumed ones included
    resumed_from: int  # the step a checkpoint resumed at (0: a fresh run)
    seconds: float  # training time of this call (the resumed part excluded)
    teacher: str | None = None
    checkpoint: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.losses)

    def record(self) -> dict[str, Any]:
        """What the healed model's config records under ``cbo_recovery`` (and ``heal.json`` holds, with the losses)."""
        o = self.options
        return {
            "method": o.method,
            "loss": o.loss,
            "steps": self.steps,
            "lr": o.lr,
            "batch_size": o.batch_size,
            "schedule": o.schedule,
            "seed": o.seed,
            "teacher": self.teacher,
            **({"lora_rank": o.lora_rank, "lora_alpha": o.lora_alpha} if o.method == "lora" else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.record(),
            "options": dataclasses.asdict(self.options),
            "losses": self.losses,
            "resumed_from": self.resumed_from,
            "seconds": self.seconds,
            "checkpoint": self.checkpoint,
            "info": self.info,
        }

    def save(self, path: str | os.PathLike, tokenizer: Any = None) -> Path:
        """Save the healed model like any pruned model (:func:`cbo.surgery.io.save_pruned`) plus ``heal.json``."""
        from cbo.surgery.io import write_pruned_folder

        with output_folder(path) as staging:  # one staging folder: heal.json is listed with the model's files
            write_pruned_folder(self.model, staging, tokenizer)
            atomic_write_text(staging / "heal.json", json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        return Path(path).expanduser()


# ------------------------------------------------------------------------------------------ pieces


def kd_loss(student_logits: Any, teacher_logits: Any, temperature: float = 1.0) -> Any:
    """``T² · KL(softmax(teacher/T) ‖ softmax(student/T))`` averaged over every position, in float32."""
    t = float(temperature)
    vocab = student_logits.shape[-1]
    s = F.log_softmax(student_logits.float().reshape(-1, vocab) / t, dim=-1)
    p = F.log_softmax(teacher_logits.float().reshape(-1, vocab) / t, dim=-1)
    return F.kl_div(s, p, log_target=True, reduction="batchmean") * (t * t)


def next_token_loss(logits: Any, batch: Any) -> Any:
    """Mean next-token cross-entropy of ``(B, T, V)`` logits on the windows ``batch`` (float32)."""
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), batch[:, 1:].reshape(-1).to(logits.device))


def batch_indices(n_windows: int, batch_size: int, step: int, seed: int) -> Any:
    """The windows of training step ``step``: consecutive slices of a seeded permutation, a new one per epoch.

    A function of its arguments only, so a resumed run sees the batches the uninterrupted one would.
    """
    per_epoch = max(n_windows // batch_size, 1)
    epoch, k = divmod(step, per_epoch)
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + epoch)
    perm = torch.randperm(n_windows, generator=g)
    return perm[k * batch_size : (k + 1) * batch_size]


def lr_factor(step: int, steps: int, warmup: int = 0, schedule: str = "linear") -> float:
    """Multiplier of the learning rate at step ``step`` (0-based): linear warm-up, then constant / linear / cosine."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or steps <= warmup:
        return 1.0
    progress = (step - warmup) / (steps - warmup)
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def lora_targets(model: Any) -> list[str]:
    """Names (last component) of the modules that hold the prunable attention and MLP weights."""
    owners = {id(slot.module) for s in model_structures(model).all() for slot in s.slots}
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if id(module) in owners})


def weights_fingerprint(model: Any) -> str:
    """A short hash of every parameter and buffer of ``model`` (names, shapes, dtypes and values)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()[:16]


def model_label(model: Any) -> str | None:
    """Where a model came from, when it says (``name_or_path``)."""
    return getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)


def check_heal_options(steps: int, method: str = "lora", **options: Any) -> HealOptions:
    """The checked :class:`HealOptions` of a heal (for callers that check before long work, e.g. MoP).

    Raises:
        InvalidOptionError: an unknown option, or a bad value.
        MissingExtraError: ``method="lora"`` without ``peft`` installed.
    """
    valid = {f.name for f in dataclasses.fields(HealOptions)}
    bad = sorted(set(options) - valid)
    if bad:
        raise InvalidOptionError(f"heal has no option(s) {bad}; valid options: {sorted(valid)}")
    opts = HealOptions(steps=steps, method=method, **options)
    opts.validate()
    return opts


# ------------------------------------------------------------------------------------------ checkpoints


class Checkpoint(CheckpointFile):
    """The resumable state of one heal in a folder (one file, replaced atomically).

    The file is data only (:mod:`cbo.recovery.state_codec`: safetensors and JSON), so resuming from a folder
    someone else gave you cannot run code; a pickle checkpoint of an older CBO is refused, not loaded.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        super().__init__(self.folder / CHECKPOINT_FILE)

    @property
    def legacy(self) -> Path:
        return self.folder / LEGACY_CHECKPOINT_FILE

    def exists(self) -> bool:
        return super().exists() or self.legacy.is_file()

    def load(self) -> dict[str, Any]:
        if not self.path.is_file() and self.legacy.is_file():
            raise CorruptFileError(
                f"{str(self.legacy)!r} is a heal checkpoint of an older CBO, stored as a pickle, which CBO no longer "
                "loads (unpickling a file can run code); delete it (or the folder) and heal afresh"
            )
        try:
            state = decode_state(self.read() or b"")
        except StateFormatError as exc:  # a truncated or foreign file: say which, and what to do
            raise CorruptFileError(
                f"cannot read the heal checkpoint {str(self.path)!r} ({exc}); delete it to start afresh"
            ) from exc
        if state.get("version") != CHECKPOINT_VERSION:
            raise CorruptFileError(f"{str(self.path)!r} is not a heal checkpoint of version {CHECKPOINT_VERSION}")
        fields = {"fingerprint": dict, "step": int, "trainable": dict, "optimizer": dict, "losses": list}
        bad = [k for k, kind in fields.items() if not isinstance(state.get(k), kind)]
        if bad or not isinstance(state.get("rng"), torch.Tensor) or state["step"] < 0:
            raise CorruptFileError(
                f"the heal checkpoint {str(self.path)!r} lacks or mangles {bad or ['rng']}; delete it to start afresh"
            )
        return state

    def save(self, state: dict[str, Any]) -> None:
        self.write(encode_state({"version": CHECKPOINT_VERSION, **state}))

    def check(self, state: dict[str, Any], fingerprint: dict[str, Any], steps: int) -> None:
        """Refuse a checkpoint of another heal, or one already past ``steps``."""
        saved = state.get("fingerprint", {})
        differ = sorted(k for k in set(saved) | set(fingerprint) if saved.get(k) != fingerprint.get(k))
        if differ:
            detail = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {fingerprint.get(k)!r}" for k in differ)
            raise InvalidOptionError(
                f"the checkpoint in {str(self.folder)!r} belongs to a different heal ({detail}); resume with the "
                "same student, teacher, windows and options, or use another checkpoint folder"
            )
        if state["step"] > steps:
            raise InvalidOptionError(
                f"the checkpoint in {str(self.folder)!r} has {state['step']} steps done, more than steps={steps}"
            )


# ------------------------------------------------------------------------------------------ training


class _Trainable:
    """The parameters a heal trains, attached to the student and detached again (even on error)."""

    def __init__(self, student: Any, opts: HealOptions):
        self.student = student
        self.opts = opts
        self.flags = [(p, p.requires_grad) for p in student.parameters()]
        self.model = student
        if opts.method == "lora":
            peft = require("peft", "LoRA recovery")
            config = peft.LoraConfig(
                r=opts.lora_rank,
                lora_alpha=opts.lora_alpha,
                lora_dropout=0.0,
                bias="none",
                target_modules=lora_targets(student),
            )
            self.model = peft.get_peft_model(student, config)
        else:
            for p in student.parameters():
                p.requires_grad_(True)
        self.named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def state(self) -> dict[str, Any]:
        return {n: p.detach().cpu().clone() for n, p in self.named}

    def load(self, saved: dict[str, Any]) -> None:
        names = [n for n, _ in self.named]
        if sorted(saved) != sorted(names):
            raise CorruptFileError("the heal checkpoint's trainable parameters do not match this student")
        shapes = {n: tuple(p.shape) for n, p in self.named}
        if any(not isinstance(t, torch.Tensor) or tuple(t.shape) != shapes[n] for n, t in saved.items()):
            raise CorruptFileError("the heal checkpoint's trainable parameters do not have this student's shapes")
        with torch.no_grad():
            for n, p in self.named:
                p.copy_(saved[n].to(p.device))

    def finish(self, merge: bool) -> Any:
        """The student with the adapters merged (``merge``) or removed, gradient switches restored."""
        model = self.student
        if self.opts.method == "lora":
            model = self.model.merge_and_unload() if merge else self.model.unload()
        for p, flag in self.flags:
            p.requires_grad_(flag)
            p.grad = None
        return model


def heal(
    student: Any,
    teacher: Any,
    windows: Any,
    *,
    steps: int,
    method: str = "lora",
    loss: str | None = None,
    lr: float | None = None,
    batch_size: int = 4,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    seed: int = 0,
    progress: bool = False,
    on_step: Callable[[int, float], None] | None = None,
    **options: Any,
) -> HealResult:
    """Heal a pruned ``student`` with ``steps`` optimizer steps on ``windows``; returns a :class:`HealResult`.

    Args:
        student: the pruned causal LM (trained in place; see the module docstring).
        teacher: the unpruned model whose logits the student learns (``loss="kd"``), or None (``loss="lm"``).
        windows: ``(N, T)`` int64 training token windows (calibration text, never the test split).
        steps: optimizer steps (each on ``batch_size`` windows).
        method: ``"lora"`` (adapters merged at the end; needs peft) or ``"full"`` (every parameter).
        loss: ``"kd"`` (default with a teacher) or ``"lm"`` (default without).
        lr: peak learning rate (default :data:`DEFAULT_LR` of the method); ``schedule`` and ``warmup`` shape it.
        batch_size: windows per step.
        checkpoint_dir: folder of the resumable state (None: no checkpoints).
        checkpoint_every: steps between checkpoints (default a tenth of ``steps``).
        resume: continue from the checkpoint in ``checkpoint_dir`` (a fresh start, with a warning, when there is
            none).
        seed: decides the batch order.
        progress: a progress bar with the running loss.
        on_step: called as ``on_step(step, loss)`` after every step (1-based).
        **options: the other fields of :class:`HealOptions`: ``temperature`` (of the distillation loss),
            ``schedule`` (``"linear"``, ``"constant"``, ``"cosine"``) and ``warmup`` (steps), ``lora_rank`` /
            ``lora_alpha`` (LoRA's rank and scale, default alpha ``2 * rank``), ``weight_decay`` (AdamW's, decoupled)
            and ``grad_clip`` (maximum gradient norm; 0: none).

    Raises:
        InvalidOptionError: a bad option, or a checkpoint of a different heal; before any training.
        DataError / ModelError: windows that do not fit the student, a teacher with another vocabulary.

    Example:
        >>> r = heal(pruned, teacher, splits.calibration, steps=20, method="full", lr=2e-5)   # doctest: +SKIP
        >>> r.model.config.cbo_recovery["steps"]                                               # doctest: +SKIP
        20
    """
    loss = loss if loss is not None else ("kd" if teacher is not None else "lm")
    opts = check_heal_options(
        steps,
        method,
        loss=loss,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        **options,
    )
    if opts.loss == "kd" and teacher is None:
        raise InvalidOptionError("loss='kd' distils from a teacher; pass the unpruned model as teacher, or loss='lm'")
    check_int("checkpoint_every", checkpoint_every, 1, none_ok=True)
    if resume and checkpoint_dir is None:
        raise InvalidOptionError("resume=True needs the checkpoint_dir of the heal to continue")
    windows = check_windows(windows, student)
    if teacher is not None and opts.loss == "kd":
        ts, tt = student.config.vocab_size, teacher.config.vocab_size
        if model_vocab_size(teacher) != model_vocab_size(student) or ts != tt:
            raise ModelError(f"teacher and student must share a vocabulary (teacher {tt} tokens, student {ts})")
    if windows.shape[0] < opts.batch_size:
        raise DataError(f"batch_size={opts.batch_size} is larger than the {windows.shape[0]} training windows")

    fingerprint = {
        **opts.fingerprint(),
        "windows": data_hash(windows),
        "student": weights_fingerprint(student),
        "teacher": weights_fingerprint(teacher) if teacher is not None and opts.loss == "kd" else None,
    }
    ckpt = Checkpoint(checkpoint_dir) if checkpoint_dir is not None else None
    state = None
    if ckpt is not None and ckpt.exists():
        if not resume:
            raise InvalidOptionError(
                f"{str(ckpt.folder)!r} already holds a heal checkpoint; pass resume=True (--resume) to continue it, "
                "or choose another checkpoint folder"
            )
        state = ckpt.load()
        ckpt.check(state, fingerprint, steps)
    elif resume:
        warnings.warn(
            f"resume=True, but {str(ckpt.folder)!r} holds no heal checkpoint; training from step 0.", stacklevel=2
        )
    device = input_device(student)
    # the heal's own random stream (LoRA's initial adapters, dropout), seeded or restored; the caller's is untouched
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(opts.seed)
        model, losses, resumed_from, seconds = _train(
            student, teacher, windows, opts, fingerprint, ckpt, state, checkpoint_every, progress, on_step
        )
    model.eval()
    result = HealResult(
        model,
        opts,
        losses,
        resumed_from,
        seconds,
        teacher=model_label(teacher) if teacher is not None and opts.loss == "kd" else None,
        checkpoint=str(ckpt.folder) if ckpt is not None else None,
    )
    model.config.cbo_recovery = result.record()
    return result


def _train(student, teacher, windows, opts, fingerprint, ckpt, state, checkpoint_every, progress, on_step):
    """The training loop of :func:`heal`: returns ``(model, losses, resumed_from, seconds)``."""
    steps = opts.steps
    every = int(checkpoint_every) if checkpoint_every is not None else max(1, math.ceil(steps / 10))
    device = input_device(student)
    was_training = student.training
    trainable = _Trainable(student, opts)
    params = [p for _, p in trainable.named]
    optimizer = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    done, losses, previous = 0, [], 0.0
    if state is not None:
        try:
            trainable.load(state["trainable"])
            optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["rng"])
            done, losses, previous = int(state["step"]), list(state["losses"]), float(state.get("seconds", 0.0))
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError, CorruptFileError) as exc:
            trainable.finish(merge=False)  # the student as it was: no adapters left attached
            where = str(ckpt.path) if ckpt is not None else "the checkpoint"
            raise CorruptFileError(
                f"the heal checkpoint {where!r} does not fit this heal ({exc}); delete it to start afresh"
            ) from exc
    resumed_from, saved_at = done, done

    def write() -> None:
        nonlocal saved_at
        if ckpt is None or (done == saved_at and ckpt.exists()):
            return
        ckpt.save(
            {
                "fingerprint": fingerprint,
                "step": done,
                "trainable": trainable.state(),
                "optimizer": optimizer.state_dict(),
                "losses": losses,
                "rng": torch.get_rng_state(),
                "seconds": previous + time.perf_counter() - t0,
            }
        )
        saved_at = done

    bar = progress_bar(progress, total=steps, initial=done, desc=f"heal ({opts.method}, {opts.loss})", unit="step")
    if teacher is not None and opts.loss == "kd":
        teacher.eval()
    t0 = time.perf_counter()
    completed = False
    try:
        trainable.model.train()
        for step in range(done, steps):
            batch = windows[batch_indices(windows.shape[0], opts.batch_size, step, opts.seed)].to(device)
            for group in optimizer.param_groups:
                group["lr"] = opts.lr * lr_factor(step, steps, opts.warmup, opts.schedule)
            logits = trainable.model(input_ids=batch, use_cache=False).logits
            if opts.loss == "kd":
                with torch.no_grad():
                    target = teacher(input_ids=batch.to(input_device(teacher)), use_cache=False).logits
                value = kd_loss(logits, target.to(logits.device), opts.temperature)
            else:
                value = next_token_loss(logits, batch)
            if not torch.isfinite(value):
                raise DataError(f"the heal loss became {float(value)} at step {step + 1}; lower the learning rate")
            value.backward()
            if opts.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, opts.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(value.detach()))
            done = step + 1
            if done % every == 0 or done == steps:
                write()
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
            if on_step is not None:
                on_step(done, losses[-1])
        write()
        completed = True
    finally:
        if not completed:
            write()  # interrupted: keep every finished step
        bar.close()
        model = trainable.finish(merge=completed)
        model.train(was_training)
    return model, losses, resumed_from, time.perf_counter() - t0
