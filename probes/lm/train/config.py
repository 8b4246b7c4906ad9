"""The configuration of a tiny training run and its learning-rate schedule.

:class:`TrainConfig` determines a run completely (same config -> same weights); :func:`lr_at` is
the LR of each update, picked from the pure schedule functions of :mod:`losslens.lm.train.schedules`
(``wsd`` / ``cosine`` / ``constant`` / ``linear``). :func:`format_value` writes config values into
run names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from losslens.geometry.base.errors import LosslensError

from losslens.lm.train import schedules

__all__ = ["TrainConfig", "TrainError", "lr_at", "format_value", "SCHEDULES", "FORMAT"]

SCHEDULES = ("wsd", "cosine", "constant", "linear")
FORMAT = "losslens-trajectory/1"


class TrainError(LosslensError, ValueError):
    """Bad training config, or an output folder that holds a different run."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a tiny training run (same config -> same weights).

    Schedule: ``warmup`` and ``decay`` are fractions of ``steps``; the LR rises linearly to
    ``peak_lr`` over the warmup, then ``wsd`` holds it and decays linearly to
    ``min_lr_ratio * peak_lr`` over the last ``decay`` fraction; ``cosine`` / ``linear`` decay from
    the end of warmup to the end; ``constant`` holds it. See :func:`lr_at`.

    The defaults (0.17M-parameter GPT-NeoX, 800 steps of 32×64 tokens, weight decay 1.0) are the
    embedded trajectory of ``losslens demo``: chosen so that the weight norm reaches equilibrium
    within the budget (1/(lr·wd) ≤ 330 steps) and the quantization effect of the LR decay is
    measurable above checkpoint noise (docs/science.md §8; measured effect sizes with 3-seed intervals
    in benchmarks/README.md). About 1–1.5 min per run on 2 CPU cores with 1 thread.
    """

    schedule: str = "wsd"
    peak_lr: float = 3e-3
    steps: int = 800
    checkpoints: int = 8
    seed: int = 0
    warmup: float = 0.05
    decay: float = 0.2
    min_lr_ratio: float = 0.0
    weight_decay: float = 1.0
    batch_size: int = 32
    seq_len: int = 64
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int | None = None  # default 4 * hidden_size
    vocab_size: int = 512
    grad_clip: float = 1.0
    val_batches: int = 8
    beta1: float = 0.9
    beta2: float = 0.95
    data_seed: int | None = None  # default: seed
    docstrings: bool = True  # corpus: pydoc topics + stdlib docstrings (False: topics only)
    save_optimizer: bool = False
    name: str | None = None

    @classmethod
    def tiny(cls, **overrides: Any) -> "TrainConfig":
        """The ``--tiny`` preset for tests and smoke runs: ~60k parameters, 60 steps of 8x32, 3
        checkpoints; a few seconds on 2 cores (plus ~5 s of one-off data preparation)."""
        base = dict(
            steps=60,
            checkpoints=3,
            batch_size=8,
            seq_len=32,
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            vocab_size=512,
            val_batches=2,
            warmup=0.1,
            weight_decay=0.1,
        )
        base.update(overrides)
        return cls(**base)

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise TrainError(f"unknown schedule {self.schedule!r}; choose one of {SCHEDULES}")
        if self.steps < 1 or self.checkpoints < 1 or self.checkpoints > self.steps:
            raise TrainError(
                f"need steps >= 1 and 1 <= checkpoints <= steps (got steps={self.steps}, "
                f"checkpoints={self.checkpoints})"
            )
        for name in ("warmup", "decay", "min_lr_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise TrainError(f"{name} must be a fraction in [0, 1], got {getattr(self, name)}")
        if self.schedule == "wsd" and self.warmup + self.decay > 1.0:
            raise TrainError(f"wsd: warmup + decay fractions exceed 1 ({self.warmup} + {self.decay})")
        if self.peak_lr <= 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise TrainError("peak_lr must be > 0, weight_decay and grad_clip >= 0")
        if self.hidden_size % self.num_heads:
            raise TrainError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.seq_len < 2 or self.batch_size < 1 or self.val_batches < 1:
            raise TrainError("need seq_len >= 2, batch_size >= 1 and val_batches >= 1")

    @property
    def run_name(self) -> str:
        """``name``, or ``tiny-{schedule}-lr{peak_lr}-wd{weight_decay}-s{seed}`` (e.g. ``tiny-wsd-lr3e-3-wd0.1-s0``)."""
        return self.name or (
            f"tiny-{self.schedule}-lr{format_value(self.peak_lr)}-wd{format_value(self.weight_decay)}-s{self.seed}"
        )

    @property
    def checkpoint_steps(self) -> list[int]:
        """Steps at which checkpoints are written: ``round(steps * i / checkpoints)``, i = 1..checkpoints."""
        return sorted({max(1, round(self.steps * i / self.checkpoints)) for i in range(1, self.checkpoints + 1)})

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def lr_at(step: int, config: TrainConfig) -> float:
    """Learning rate of the optimizer update that produces step ``step`` (1-based: update 1 turns
    the initial weights into step 1). Pure function of (step, config); see :class:`TrainConfig`
    and the schedule functions in :mod:`losslens.lm.train.schedules`."""
    peak, low, total = config.peak_lr, config.peak_lr * config.min_lr_ratio, config.steps
    warm = round(config.warmup * total)
    if config.schedule == "constant":
        return schedules.constant_lr(step, peak, warm)
    if config.schedule == "wsd":
        return schedules.wsd_lr(step, total, peak, low, warm, round(config.decay * total))
    if config.schedule == "cosine":
        return schedules.cosine_lr(step, total, peak, low, warm)
    return schedules.linear_lr(step, total, peak, low, warm)


def format_value(v: Any) -> str:
    """Compact, file-name-safe number format for run names: 3e-3, 0.5, 1e-2, 600, true."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        if v != 0 and abs(v) < 0.1:
            mant, exp = f"{v:e}".split("e")
            mant = mant.rstrip("0").rstrip(".")
            return f"{mant}e{int(exp)}"
        return f"{v:g}"
    return str(v)
