"""The LR schedule of a schedule fork (:class:`ForkSchedule`: cosine continuation, SGDR, oscillating
lock-in, or the parent's own schedule) and :func:`lr_function`, the LR at any global step of a
``train-tiny`` trajectory or of a fork (forking itself: :mod:`losslens.lm.train.forks`).

Units: ``t`` and steps are optimizer updates; LRs are AdamW learning rates.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable

from losslens.lm.checkpoints import Trajectory

from losslens.lm.train import schedules
from losslens.lm.train.config import TrainConfig, TrainError, format_value, lr_at

__all__ = ["FORK_KINDS", "ForkSchedule", "lr_function"]

FORK_KINDS = ("cosine", "sgdr", "oscillate", "parent", "constant", "linear", "wsd")


@dataclass(frozen=True)
class ForkSchedule:
    """The LR schedule of a fork, as a function of ``t`` = updates since the fork checkpoint.

    ``kind``:
      - ``cosine`` -- cosine continuation from ``start_lr`` to ``min_lr`` over ``steps``.
      - ``sgdr`` -- warm restarts: cycles of ``period`` updates (times ``period_mult`` per cycle),
        each a half cosine from ``restart_lr`` to ``min_lr``.
      - ``oscillate`` -- oscillating lock-in: the cosine continuation plus ``amplitude`` (an LR,
        added) for ``bump_steps`` updates, then ``cool_steps`` updates on the baseline, repeated.
      - ``parent`` -- the parent's own schedule continued unchanged (``lr_at(S + t, parent)``).
      - ``constant`` -- ``start_lr`` throughout; ``linear`` -- linear from ``start_lr`` to ``min_lr``
        over ``steps``; ``wsd`` -- ``start_lr`` until update ``cooldown_at`` (default ``steps − steps // 5``),
        then a linear cooldown to ``min_lr`` at ``steps`` (the seeds' WSD cooldown at a chosen step).

    ``None`` fields are filled by :meth:`resolve` from the parent: ``start_lr`` = the LR of the
    parent's last update before the checkpoint; ``min_lr`` = the parent's final LR
    (``peak_lr * min_lr_ratio``); ``period`` = ``steps // 3``; ``restart_lr`` = the parent's peak LR
    (full-amplitude restarts as in seed 004); ``amplitude`` = ``start_lr`` (bumps double the LR).
    """

    kind: str = "cosine"
    steps: int = 300
    start_lr: float | None = None
    min_lr: float | None = None
    period: int | None = None
    restart_lr: float | None = None
    period_mult: float = 1.0
    amplitude: float | None = None
    bump_steps: int = 25
    cool_steps: int = 100
    cooldown_at: int | None = None

    def __post_init__(self):
        if self.kind not in FORK_KINDS:
            raise TrainError(f"unknown fork schedule {self.kind!r}; choose one of {FORK_KINDS}")
        if self.steps < 1:
            raise TrainError(f"a fork needs steps >= 1 (got {self.steps})")
        for name in ("start_lr", "min_lr", "restart_lr", "amplitude"):
            v = getattr(self, name)
            if v is not None and (v < 0 or not math.isfinite(v)):
                raise TrainError(f"{name} must be a finite LR >= 0, got {v}")
        if self.period is not None and self.period < 1:
            raise TrainError(f"period must be >= 1 update, got {self.period}")
        if self.period_mult <= 0:
            raise TrainError(f"period_mult must be > 0, got {self.period_mult}")
        if self.cooldown_at is not None and not 0 <= self.cooldown_at <= self.steps:
            raise TrainError(f"cooldown_at must be an update in [0, steps={self.steps}], got {self.cooldown_at}")
        if self.bump_steps < 0 or self.cool_steps < 1:
            raise TrainError(f"need bump_steps >= 0 and cool_steps >= 1 (got {self.bump_steps}, {self.cool_steps})")

    def resolve(self, parent_config: TrainConfig, parent_lr: float) -> "ForkSchedule":
        """A copy with every ``None`` filled from the parent (see the class docstring)."""
        start = parent_lr if self.start_lr is None else self.start_lr
        changes: dict[str, Any] = {"start_lr": start}
        if self.min_lr is None:
            changes["min_lr"] = parent_config.peak_lr * parent_config.min_lr_ratio
        if self.kind == "sgdr":
            if self.period is None:
                changes["period"] = max(1, self.steps // 3)
            if self.restart_lr is None:
                changes["restart_lr"] = parent_config.peak_lr
        if self.kind == "oscillate" and self.amplitude is None:
            changes["amplitude"] = start
        if self.kind == "wsd" and self.cooldown_at is None:
            changes["cooldown_at"] = self.steps - self.steps // 5
        return replace(self, **changes)

    @property
    def resolved(self) -> bool:
        return (
            self.start_lr is not None
            and self.min_lr is not None
            and (self.kind != "sgdr" or (self.period is not None and self.restart_lr is not None))
            and (self.kind != "oscillate" or self.amplitude is not None)
        )

    def lr(self, t: int, parent_lr_fn: Callable[[int], float] | None = None, fork_step: int = 0) -> float:
        """LR of fork update ``t`` (1-based). ``parent`` needs ``parent_lr_fn`` (global step -> LR)
        and ``fork_step``. Needs a resolved schedule."""
        if self.kind == "parent":
            if parent_lr_fn is None:
                raise TrainError("the 'parent' fork schedule needs the parent's LR function")
            return parent_lr_fn(fork_step + t)
        if not self.resolved:
            raise TrainError("resolve() the fork schedule against its parent before asking for LRs")
        if self.kind == "cosine":
            return schedules.cosine_continuation_lr(t, self.steps, self.start_lr, self.min_lr)
        if self.kind == "constant":
            return float(self.start_lr)
        if self.kind in ("linear", "wsd"):
            at = (
                0
                if self.kind == "linear"
                else (self.steps - self.steps // 5 if self.cooldown_at is None else self.cooldown_at)
            )
            p = min(1.0, max(0, t - at) / max(1, self.steps - at))
            return self.start_lr + (self.min_lr - self.start_lr) * p
        if self.kind == "sgdr":
            return schedules.sgdr_lr(t, self.period, self.restart_lr, self.min_lr, self.period_mult)
        return schedules.oscillate_lr(
            t, self.steps, self.start_lr, self.min_lr, self.amplitude, self.bump_steps, self.cool_steps
        )

    def phase(self, t: int) -> str | None:
        """``"start"`` at t = 0; ``"bump"`` / ``"cool"`` for oscillate; ``None`` otherwise."""
        if t <= 0:
            return "start"
        if self.kind == "oscillate":
            return schedules.oscillate_phase(t, self.bump_steps, self.cool_steps)
        return None

    @property
    def label(self) -> str:
        """Readable schedule id used in fork names: ``cosine``, ``sgdr-p100-r3e-3``,
        ``oscillate-a1e-3-b25-c100``, ``parent`` (plus ``-min<lr>`` when ``min_lr`` was given)."""
        parts = [self.kind]
        if self.kind == "sgdr":
            parts += [
                f"p{self.period}" if self.period is not None else "pauto",
                *([f"x{format_value(float(self.period_mult))}"] if self.period_mult != 1 else []),
                f"r{format_value(self.restart_lr)}" if self.restart_lr is not None else "rpeak",
            ]
        if self.kind == "oscillate":
            parts += [
                f"a{format_value(self.amplitude)}" if self.amplitude is not None else "aauto",
                f"b{self.bump_steps}",
                f"c{self.cool_steps}",
            ]
        if self.kind == "wsd":
            parts.append(f"cd{self.cooldown_at}" if self.cooldown_at is not None else "cdauto")
        return "-".join(parts)

    def to_dict(self) -> dict:
        """The fields (``cooldown_at`` only when set, so older forks' lineages compare equal)."""
        d = asdict(self)
        if d["cooldown_at"] is None:
            del d["cooldown_at"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ForkSchedule":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def lr_function(meta: dict) -> Callable[[int], float]:
    """Global step -> LR for a train-tiny trajectory or a fork, from its ``trajectory.json``
    content (``Trajectory.meta``). Forks of forks under ``parent`` read their parent's folder."""
    cfg = TrainConfig.from_dict(meta["config"])
    fork = meta.get("fork")
    if not fork:
        return lambda step: lr_at(step, cfg)
    sched = ForkSchedule.from_dict(fork["schedule"])
    s0 = int(fork["parent_step"])
    parent_fn = None
    if sched.kind == "parent":
        parent_fn = lr_function(Trajectory.from_folder(fork["parent"]).meta)
    return lambda step: sched.lr(step - s0, parent_fn, s0) if step > s0 else float(fork["parent_lr"])
