"""Learning-rate schedules as small pure functions (no torch, no state).

Units: every ``step`` / ``t`` is a count of optimizer updates; every ``*_lr`` is a learning rate
(the value handed to AdamW). Convention shared by all functions: the value returned for step ``s``
is the LR of the update that *produces* step ``s`` (1-based: update 1 turns the initial weights into
step 1), so a checkpoint at step ``s`` was reached with ``lr(s)`` as its last LR.

Base schedules (training from scratch; defined in :mod:`losslens.lm.core.base_schedules`, where published
trajectories' schedules use them too, and re-exported here): :func:`constant_lr`, :func:`wsd_lr`,
:func:`cosine_lr`, :func:`linear_lr`.

Fork schedules (continuing from a checkpoint; ``t`` = updates since the fork, ``t = 1`` is the
first update after the checkpoint):

- :func:`cosine_continuation_lr` -- half cosine from ``start_lr`` to ``min_lr`` over ``steps``.
- :func:`sgdr_lr` -- SGDR warm restarts (Loshchilov & Hutter): cycles of half cosine from
  ``restart_lr`` to ``min_lr``; cycle ``i`` lasts ``round(period * period_mult**i)`` updates.
- :func:`oscillate_lr` / :func:`oscillate_phase` -- oscillating "lock-in" (seed 004): a cosine
  continuation baseline plus square bumps of height ``amplitude``; each cycle is ``bump_steps``
  bump updates followed by ``cool_steps`` cool updates (LR back on the baseline).

Past their end, every schedule holds its final value.
"""

from __future__ import annotations

import math

from losslens.lm.core.base_schedules import constant_lr, cosine_lr, linear_lr, wsd_lr

__all__ = [
    "constant_lr",
    "wsd_lr",
    "cosine_lr",
    "linear_lr",
    "cosine_continuation_lr",
    "sgdr_lr",
    "sgdr_cycle",
    "oscillate_lr",
    "oscillate_phase",
]


# --------------------------------------------------------------------------------------------
# fork schedules (t = updates since the fork checkpoint, 1-based)
# --------------------------------------------------------------------------------------------


def cosine_continuation_lr(t: int, steps: int, start_lr: float, min_lr: float = 0.0) -> float:
    """Half cosine from ``start_lr`` (t = 0, the fork checkpoint) to ``min_lr`` (t = ``steps``)."""
    p = min(1.0, max(0, t) / max(1, steps))
    return min_lr + (start_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


def sgdr_cycle(t: int, period: int, period_mult: float = 1.0) -> tuple[int, int, int]:
    """(cycle index, position 1..length inside it, cycle length) of update ``t`` >= 1.
    Cycle ``i`` lasts ``max(1, round(period * period_mult**i))`` updates."""
    if period < 1 or period_mult <= 0:
        raise ValueError(f"SGDR needs period >= 1 and period_mult > 0 (got {period}, {period_mult})")
    i, pos = 0, max(1, t)
    while True:
        length = max(1, round(period * period_mult**i))
        if pos <= length:
            return i, pos, length
        pos -= length
        i += 1


def sgdr_lr(t: int, period: int, restart_lr: float, min_lr: float = 0.0, period_mult: float = 1.0) -> float:
    """SGDR warm restarts: inside each cycle a half cosine from ``restart_lr`` down to ``min_lr``
    at the cycle's last update; the next update restarts near ``restart_lr``. The first cycle
    starts at the fork. With one cycle of length ``steps`` and ``restart_lr = start_lr`` this is
    :func:`cosine_continuation_lr`."""
    _, pos, length = sgdr_cycle(t, period, period_mult)
    return cosine_continuation_lr(pos, length, restart_lr, min_lr)


def oscillate_phase(t: int, bump_steps: int, cool_steps: int) -> str:
    """ "bump" or "cool": the phase of update ``t`` >= 1 in cycles of ``bump_steps`` bump updates
    followed by ``cool_steps`` cool updates (the cycle's last update ends a cool phase)."""
    if bump_steps < 0 or cool_steps < 1:
        raise ValueError(f"oscillate needs bump_steps >= 0 and cool_steps >= 1 (got {bump_steps}, {cool_steps})")
    return "bump" if (max(1, t) - 1) % (bump_steps + cool_steps) < bump_steps else "cool"


def oscillate_lr(
    t: int, steps: int, start_lr: float, min_lr: float, amplitude: float, bump_steps: int, cool_steps: int
) -> float:
    """Oscillating lock-in: :func:`cosine_continuation_lr` (``start_lr`` -> ``min_lr`` over
    ``steps``) plus ``amplitude`` (an LR, added) during bump phases (:func:`oscillate_phase`)."""
    base = cosine_continuation_lr(t, steps, start_lr, min_lr)
    return base + amplitude if oscillate_phase(t, bump_steps, cool_steps) == "bump" else base
