"""The quantization alarm: ΔQ growing fast *per unit of loss improvement while the LR anneals*.

ΔQ already grows while the loss falls in a WSD stable phase (the demo's runs: 0.22% → 2.05% before
the decay), so "ΔQ rises while the loss falls" fires far too early. The statistic is the
*exchange rate* between them, at a measurement at step t against the latest measurement at or
before t − ``window`` steps (step s)::

    rate(t) = (ΔQ(t) − ΔQ(s)) / (L(s) − L(t))        [ΔQ per nat of FP-loss improvement]

with ΔQ = L(θ̂)/L(θ) − 1 of the alarm's quantizer and L the FP loss, both on the monitor's fixed
held-out set. It is defined only when the loss improved by at least ``min_improvement`` nats over
the window (a flat or rising loss makes the ratio meaningless, and is not the time bomb: a falling
loss that hides a worsening quantized model is).

The alarm fires once, at the first measurement where ``rate > threshold`` **and the LR is
annealing**: the LR in effect at step t is below ``(1 − lr_drop)`` × the largest LR seen so far
(when the LR is not known, the rate alone decides). Why the gate: at peak LR, ΔQ growth is part of
ordinary progress (the weight norm still grows, docs/science.md §8), and its rate per nat there
can exceed the decay's -- seed 0 of the demo's WSD 1e-2 run measured 0.14 and 0.20 ΔQ per nat at
steps 500 and 600 (stable) against 0.05 and 0.09 in the decay -- so no threshold on the rate
alone separates the phases. The time bomb of the seeds is ΔQ exploding *when the LR decays* while
the loss keeps falling; the gate states that condition, and the rate says how expensive the
decay's loss gains are in quantization error.

The defaults (RTN INT2-g32, window 100 steps, threshold 0.06 ΔQ per nat, at least 0.01 nats of
improvement, ``lr_drop`` 0.05) come from seed 0 of the demo's configuration only: its WSD 3e-3
run measured 3.1 points of ΔQ per nat of FP improvement in the stable phase and 12 in the decay
(benchmarks/README.md, "Science check: the demo", checkpoints 100 steps apart), and 0.06 is their
geometric mean; replayed on seed 0's stored checkpoints (100 steps apart) it fires at step 700
(WSD 3e-3, rate 0.126) and 800 (WSD 1e-2, 0.085), in the decay. Validated on seeds 1 and 2
(benchmarks/monitor_alarm.py, measurements every 25 steps): it fired at steps 650, 650 (seed 1)
and 650, 700 (seed 2), all in the decay (from step 641) -- but every one of those runs had a rate
above the threshold in its stable phase, so the gate does most of the work (benchmarks/README.md,
"Robustness monitor").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Alarm", "AlarmEvent", "alarm_rate"]


@dataclass(frozen=True)
class AlarmEvent:
    """The alarm's firing: step, the statistic, the threshold and the window it was measured over."""

    step: int
    rate: float
    threshold: float
    since_step: int
    dq: float
    dq_since: float
    loss: float
    loss_since: float
    spec: str

    def message(self) -> str:
        return (
            f"quantization alarm at step {self.step}: ΔQ({self.spec}) grew {100 * (self.dq - self.dq_since):+.2f} "
            f"points (from {100 * self.dq_since:.2f}% to {100 * self.dq:.2f}%) while the FP loss fell "
            f"{self.loss_since - self.loss:.3f} nats since step {self.since_step}: {self.rate:.3f} ΔQ per nat > "
            f"threshold {self.threshold:g}. The quantized model is losing robustness faster than the FP model improves."
        )

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def alarm_rate(
    history: list[tuple[int, float, float]], window: int, min_improvement: float
) -> tuple[float, int] | None:
    """``(rate, since_step)`` of the last entry of ``history`` = ``[(step, loss, dq), ...]`` (sorted
    by step), or None when no measurement lies ``window`` steps back or the loss improved by less
    than ``min_improvement`` nats since."""
    if len(history) < 2:
        return None
    step, loss, dq = history[-1]
    back = [h for h in history[:-1] if h[0] <= step - window]
    if not back:
        return None
    s, loss_s, dq_s = back[-1]
    gain = loss_s - loss
    if not (math.isfinite(gain) and gain >= min_improvement):
        return None
    return (dq - dq_s) / gain, s


@dataclass
class Alarm:
    """The alarm's state along one run: the (step, loss, ΔQ) history and whether it fired."""

    spec: str
    threshold: float
    window: int
    min_improvement: float
    lr_drop: float = 0.05
    history: list[tuple[int, float, float]] = field(default_factory=list)
    fired: AlarmEvent | None = None
    max_lr: float | None = None

    def annealing(self, lr: float | None) -> bool:
        """Whether ``lr`` is below ``(1 − lr_drop)`` × the largest LR seen (True when unknown)."""
        if lr is None:
            return True
        self.max_lr = float(lr) if self.max_lr is None else max(self.max_lr, float(lr))
        return float(lr) < (1.0 - self.lr_drop) * self.max_lr

    def update(
        self, step: int, loss: float, dq: float, lr: float | None = None
    ) -> tuple[float | None, AlarmEvent | None]:
        """Add a measurement (with the LR in effect at ``step``, if known); return (the statistic
        or None, the event if the alarm fires *now*)."""
        self.history = sorted([h for h in self.history if h[0] != step] + [(int(step), float(loss), float(dq))])
        annealing = self.annealing(lr)
        got = alarm_rate([h for h in self.history if h[0] <= step], self.window, self.min_improvement)
        if got is None:
            return None, None
        rate, since = got
        if self.fired is None and rate > self.threshold and annealing:
            prev = next(h for h in self.history if h[0] == since)
            self.fired = AlarmEvent(
                int(step), float(rate), self.threshold, int(since), float(dq), prev[2], float(loss), prev[1], self.spec
            )
            return rate, self.fired
        return rate, None
