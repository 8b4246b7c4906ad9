"""Base learning-rate schedules as small pure functions (no torch, no state).

Units: every ``step`` is a count of optimizer updates; every ``*_lr`` / ``peak`` / ``low`` is a
learning rate (the value handed to the optimizer). Convention: the value returned for step ``s``
is the LR of the update that *produces* step ``s`` (1-based: update 1 turns the initial weights into
step 1), so a checkpoint at step ``s`` was reached with ``lr(s)`` as its last LR.

Training from scratch, ``total`` updates, optional linear warmup over the first ``warmup_steps``
updates (update ``s <= warmup_steps`` uses ``peak * s / warmup_steps``):

- :func:`constant_lr` -- ``peak`` after the warmup.
- :func:`wsd_lr` -- warmup-stable-decay: ``peak`` until ``total - decay_steps``, then linear to ``low``.
- :func:`cosine_lr` -- half cosine from ``peak`` (end of warmup) to ``low`` (step ``total``).
- :func:`linear_lr` -- straight line from ``peak`` (end of warmup) to ``low`` (step ``total``).

Past ``total`` every schedule holds its final value. Used by tiny training
(:mod:`losslens.lm.train.config`) and by schedules attached to published trajectories
(:mod:`losslens.lm.checkpoints.schedule`); the fork schedules live in :mod:`losslens.lm.train.schedules`.
"""

from __future__ import annotations

import math

__all__ = ["constant_lr", "wsd_lr", "cosine_lr", "linear_lr"]


def _warmup(step: int, peak: float, warmup_steps: int) -> float | None:
    """LR during the linear warmup, or None once it is over."""
    if warmup_steps > 0 and step <= warmup_steps:
        return peak * step / warmup_steps
    return None


def constant_lr(step: int, peak: float, warmup_steps: int = 0) -> float:
    """``peak`` after a linear warmup of ``warmup_steps`` updates."""
    w = _warmup(step, peak, warmup_steps)
    return peak if w is None else w


def wsd_lr(step: int, total: int, peak: float, low: float = 0.0, warmup_steps: int = 0, decay_steps: int = 0) -> float:
    """Warmup-stable-decay: warmup, ``peak`` through step ``total - decay_steps``, then linear to
    ``low`` at step ``total`` (``decay_steps = 0``: no decay)."""
    w = _warmup(step, peak, warmup_steps)
    if w is not None:
        return w
    start = total - decay_steps
    if decay_steps == 0 or step <= start:
        return peak
    return peak + (low - peak) * min(1.0, (step - start) / decay_steps)


def _progress(step: int, total: int, warmup_steps: int) -> float:
    return min(1.0, (step - warmup_steps) / max(1, total - warmup_steps))


def cosine_lr(step: int, total: int, peak: float, low: float = 0.0, warmup_steps: int = 0) -> float:
    """Warmup, then a half cosine from ``peak`` to ``low`` at step ``total``."""
    w = _warmup(step, peak, warmup_steps)
    if w is not None:
        return w
    return low + (peak - low) * 0.5 * (1.0 + math.cos(math.pi * _progress(step, total, warmup_steps)))


def linear_lr(step: int, total: int, peak: float, low: float = 0.0, warmup_steps: int = 0) -> float:
    """Warmup, then a straight line from ``peak`` to ``low`` at step ``total``."""
    w = _warmup(step, peak, warmup_steps)
    if w is not None:
        return w
    return peak + (low - peak) * _progress(step, total, warmup_steps)
