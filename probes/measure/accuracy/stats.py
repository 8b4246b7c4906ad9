"""Accuracy statistics: a mean with its standard error, and **paired** differences.

The same items are scored under the FP and the quantized model, so Δacc = acc_q − acc_fp and the
relative drop (acc_fp − acc_q)/acc_fp get paired intervals: a bootstrap that resamples *items*
(the same resampled items for both models), percentile 95% interval, and McNemar's exact test on
the discordant items (b = right under FP and wrong quantized, c = the reverse; two-sided binomial
p-value of min(b, c) under Binomial(b + c, ½)). For a mean over several tasks (each task weighs
the same, as in the seeds' 12-task mean) the bootstrap resamples items within each task.

Cost: ``n_boot`` × n draws, in chunks of 256 resamples (memory 256·n·8 bytes at most).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

__all__ = ["mean_stderr", "PairedDelta", "paired_delta", "mcnemar_p", "macro_mean"]

_CHUNK = 256


def mean_stderr(x) -> tuple[float, float]:
    """(mean, standard error = sample std (ddof 1)/√n) of per-item scores [n] (0/1 for accuracy).
    n = 1 gives a NaN stderr."""
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return math.nan, math.nan
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else math.nan
    return float(x.mean()), se


def macro_mean(means: Sequence[float], stderrs: Sequence[float]) -> tuple[float, float]:
    """Unweighted mean over tasks and its standard error √(Σ se²)/T (tasks scored on disjoint items)."""
    m = np.asarray(means, dtype=float)
    s = np.asarray(stderrs, dtype=float)
    return float(m.mean()), float(math.sqrt(float(np.sum(s**2))) / m.size)


def mcnemar_p(fp, q) -> float:
    """Two-sided exact McNemar p-value of paired 0/1 outcomes (1.0 when no item is discordant)."""
    from scipy.stats import binom

    fp = np.asarray(fp, dtype=bool)
    q = np.asarray(q, dtype=bool)
    b = int(np.sum(fp & ~q))
    c = int(np.sum(~fp & q))
    if b + c == 0:
        return 1.0
    return float(min(1.0, 2.0 * binom.cdf(min(b, c), b + c, 0.5)))


@dataclass(frozen=True)
class PairedDelta:
    """Δ = acc_q − acc_fp and the relative drop (acc_fp − acc_q)/acc_fp, with paired bootstrap
    95% intervals (``stderr``: the bootstrap standard deviation of Δ), ``n`` items, McNemar
    ``p`` (None for a mean over tasks) and the discordant counts ``b`` (FP right, quantized wrong)
    and ``c`` (the reverse)."""

    delta: float
    stderr: float
    ci_low: float
    ci_high: float
    rel_drop: float
    rel_ci_low: float
    rel_ci_high: float
    n: int
    p: float | None
    b: int
    c: int
    n_boot: int
    seed: int

    def to_dict(self) -> dict:
        return asdict(self)


def _boot(pairs: list[tuple[np.ndarray, np.ndarray]], n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean-over-tasks FP accuracy, quantized accuracy) for each of ``n_boot`` stratified resamples."""
    rng = np.random.default_rng(seed)
    fp_b = np.zeros(n_boot)
    q_b = np.zeros(n_boot)
    for fp, q in pairs:
        n = fp.size
        for start in range(0, n_boot, _CHUNK):
            k = min(_CHUNK, n_boot - start)
            idx = rng.integers(0, n, size=(k, n))
            fp_b[start : start + k] += fp[idx].mean(axis=1)
            q_b[start : start + k] += q[idx].mean(axis=1)
    return fp_b / len(pairs), q_b / len(pairs)


def paired_delta(fp, q, n_boot: int = 2000, seed: int = 0) -> PairedDelta:
    """Paired Δacc of one task (``fp``, ``q``: per-item 0/1 outcomes [n], the same items in the
    same order) or of the mean over tasks (``fp``, ``q``: lists of such arrays, one per task)."""
    many = isinstance(fp, (list, tuple))
    fps = [np.asarray(a, dtype=float) for a in (fp if many else [fp])]
    qs = [np.asarray(a, dtype=float) for a in (q if many else [q])]
    if not fps or any(a.shape != b.shape or a.ndim != 1 or a.size == 0 for a, b in zip(fps, qs)) or len(fps) != len(qs):
        raise ValueError(
            "paired_delta needs, per task, two non-empty 1-D outcome arrays of equal length (the same items)"
        )
    acc_fp = float(np.mean([a.mean() for a in fps]))
    acc_q = float(np.mean([a.mean() for a in qs]))
    fp_b, q_b = _boot(list(zip(fps, qs)), n_boot, seed) if n_boot > 0 else (np.array([]), np.array([]))
    d_b = q_b - fp_b
    with np.errstate(divide="ignore", invalid="ignore"):
        r_b = (fp_b - q_b) / fp_b
    r_b = r_b[np.isfinite(r_b)]

    def ci(a):
        return (float(np.quantile(a, 0.025)), float(np.quantile(a, 0.975))) if a.size else (math.nan, math.nan)

    lo, hi = ci(d_b)
    rlo, rhi = ci(r_b)
    fb = np.concatenate(fps).astype(bool)
    qb = np.concatenate(qs).astype(bool)
    return PairedDelta(
        delta=acc_q - acc_fp,
        stderr=float(d_b.std(ddof=1)) if d_b.size > 1 else math.nan,
        ci_low=lo,
        ci_high=hi,
        rel_drop=(acc_fp - acc_q) / acc_fp if acc_fp > 0 else math.nan,
        rel_ci_low=rlo,
        rel_ci_high=rhi,
        n=int(fb.size),
        p=None if many and len(fps) > 1 else mcnemar_p(fb, qb),
        b=int(np.sum(fb & ~qb)),
        c=int(np.sum(~fb & qb)),
        n_boot=int(n_boot),
        seed=int(seed),
    )
