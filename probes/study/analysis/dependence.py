"""Checkpoints of one run are a time series: runs and autocorrelations (docs/science.md §6).

Pooling the checkpoints of several runs and treating them as independent pairs overstates the
evidence: neighbouring checkpoints of one run share most of their weights, so a slow drift in x and
an unrelated slow drift in y give a large r whose i.i.d. p-value claims far more certainty than the
data hold. The inference that accounts for it is in :mod:`.inference`; this module gives the pieces
that describe the dependence.

- :func:`run_index` — the positions of each run (runs in order of first appearance; within a run
  the given order is time order).
- :func:`autocorrelation` — lag-k autocorrelation pooled over runs; lag pairs never cross runs.
- :func:`effective_n` — Bartlett's nonparametric effective sample size of a correlation between
  two autocorrelated series, ``n / (1 + 2 Σ_k w_k ρ_x(k) ρ_y(k))`` (w_k = share of the n points
  that have a partner k steps later in their run; series centred on the pooled mean, so a
  between-run offset counts as dependence). At short, persistent runs its autocorrelations are
  biased low (it overstates n_eff); the table's n_eff is the AR(1) one of :mod:`.inference`.

Cost: O(n · max_lag).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["run_index", "autocorrelation", "effective_n", "max_lag"]


def run_index(groups, n: int) -> list[np.ndarray]:
    """Positions [n_r] of each run in a sequence of ``n`` points; ``groups`` None = one run."""
    if groups is None:
        return [np.arange(n)]
    g = np.asarray(groups, dtype=object)
    runs: dict = {}
    for i, v in enumerate(g):
        runs.setdefault(v, []).append(i)
    return [np.asarray(ix, dtype=int) for ix in runs.values()]


def max_lag(runs: list[np.ndarray]) -> int:
    """Largest lag used: min(longest run − 1, ⌊10·log10(longest run)⌋) (R's ``acf`` default)."""
    m = max(len(r) for r in runs)
    return max(0, min(m - 1, int(10 * math.log10(m)) if m > 1 else 0))


def autocorrelation(
    v: np.ndarray, runs: list[np.ndarray], lags: int, center: str = "run"
) -> tuple[np.ndarray, np.ndarray]:
    """(ρ[0..lags], pairs[0..lags]): lag-k autocorrelation of ``v`` pooled over runs, and the number
    of lag-k pairs. ``center``: 'run' (each run on its own mean: dependence within runs) or
    'pooled' (one mean: a run's offset counts as dependence). ρ(k) = mean of the lag-k products ÷
    the mean square (NaN when v is constant)."""
    v = np.asarray(v, dtype=float)
    c = v.copy()
    if center == "run":
        for r in runs:
            c[r] = v[r] - v[r].mean()
    else:
        c = v - v.mean()
    var = float(np.mean(c * c))
    rho = np.full(lags + 1, np.nan)
    pairs = np.zeros(lags + 1, dtype=int)
    for k in range(lags + 1):
        s, cnt = 0.0, 0
        for r in runs:
            if len(r) > k:
                a = c[r]
                s += float(np.dot(a[: len(a) - k], a[k:]))
                cnt += len(a) - k
        pairs[k] = cnt
        if var > 0 and cnt:
            rho[k] = (s / cnt) / var
    return rho, pairs


def effective_n(x: np.ndarray, y: np.ndarray, runs: list[np.ndarray]) -> float:
    """Bartlett's effective sample size of corr(x, y) (module docstring); between 1 and n."""
    n = len(x)
    K = max_lag(runs)
    if K == 0:
        return float(n)
    rx, pairs = autocorrelation(x, runs, K, center="pooled")
    ry, _ = autocorrelation(y, runs, K, center="pooled")
    prod = rx[1:] * ry[1:]
    ok = np.isfinite(prod)
    factor = 1.0 + 2.0 * float(np.sum((pairs[1:] / n)[ok] * prod[ok]))
    return float(min(n, max(1.0, n / max(factor, 1.0))))
