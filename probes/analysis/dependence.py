"""Checkpoints of one run are a time series: the resampling plans that respect it (docs/science.md §6).

Pooling the checkpoints of several runs and treating them as independent pairs overstates the
evidence: neighbouring checkpoints of one run share most of their weights, so a slow drift in x and
an unrelated slow drift in y give a large r whose i.i.d. p-value and pair-bootstrap interval claim
far more certainty than the data hold. This module gives the pieces that keep each run's series
intact; :mod:`.correlation` uses them.

- :func:`run_index` — the positions of each run (runs in order of first appearance; within a run
  the given order is time order).
- :func:`autocorrelation` — lag-k autocorrelation pooled over runs; lag pairs never cross runs.
- :func:`block_length` — the block length, from the lag-1 autocorrelation (a plug-in rule for
  block-bootstrap variance estimation: the n^(1/3) rate with an AR(1) constant):
  ``b = ceil((3m/2)^(1/3) · (2ρ/(1 − ρ²))^(2/3))``, m the median run length, ρ the larger
  ``|lag-1 autocorrelation|`` of the two series (each centred on its run mean, ρ ≤ 0.95).
- :func:`effective_n` — Bartlett's effective sample size of a correlation between two
  autocorrelated series, ``n / (1 + 2 Σ_k w_k ρ_x(k) ρ_y(k))`` (w_k = share of the n points that
  have a partner k steps later in their run; series centred on the pooled mean, so a between-run
  offset counts as dependence).
- :func:`block_bootstrap_indices` — circular blocks resampled *within* each run.
- :func:`circular_shifts` — index arrays that rotate each run's series by its own random
  (or, when there are few, every) offset: the permutation null of "no relation between x and y"
  that keeps each run's autocorrelation.

Cost: O(n · max_lag) for the autocorrelations, O(n_boot · n) and O(n_perm · n) integers for the
index arrays (memory: 8 bytes each).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

__all__ = ["run_index", "autocorrelation", "block_length", "effective_n", "block_bootstrap_indices",
           "circular_shifts", "shift_combinations", "MIN_PERMUTATIONS", "max_lag"]

MIN_PERMUTATIONS = 40
"""Fewest distinct circular-shift combinations for a p-value: with fewer the smallest attainable
two-sided p is above 0.025, so the test cannot tell anything at the usual levels ("descriptive")."""


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


def autocorrelation(v: np.ndarray, runs: list[np.ndarray], lags: int, center: str = "run") -> tuple[np.ndarray, np.ndarray]:
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


def _lag1(v: np.ndarray, runs: list[np.ndarray]) -> float:
    if max(len(r) for r in runs) < 2:
        return 0.0
    rho, _ = autocorrelation(v, runs, 1, center="run")
    return 0.0 if not math.isfinite(rho[1]) else float(rho[1])


def block_length(x: np.ndarray, y: np.ndarray, runs: list[np.ndarray]) -> tuple[int, float]:
    """(block length of the rule in the module docstring, the lag-1 autocorrelation it used).
    At least 1; not capped at the run length (the caller decides what a too-long block means)."""
    rho = min(0.95, max(abs(_lag1(x, runs)), abs(_lag1(y, runs))))
    if rho <= 0:
        return 1, rho
    m = float(np.median([len(r) for r in runs]))
    b = math.ceil((1.5 * m) ** (1 / 3) * (2 * rho / (1 - rho * rho)) ** (2 / 3))
    return max(1, b), rho


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


def block_bootstrap_indices(runs: list[np.ndarray], b: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """[n_boot, n] positions: each run rebuilt to its own length from blocks of ``b`` consecutive
    checkpoints of that run, drawn with replacement, wrapping around the run's end (circular block
    bootstrap, Politis & Romano 1992: every checkpoint is equally likely, where moving blocks would
    under-draw the first and last ones). Blocks never cross runs; a run shorter than ``b`` is one
    block. With one run and b = 1 this is the i.i.d. pair bootstrap (same random draws as
    ``rng.integers(0, n, (n_boot, n))``)."""
    cols = []
    for r in runs:
        m = len(r)
        bb = min(b, m)
        n_blocks = math.ceil(m / bb)
        starts = rng.integers(0, m, size=(n_boot, n_blocks))
        pos = ((starts[:, :, None] + np.arange(bb)[None, None, :]) % m).reshape(n_boot, -1)[:, :m]
        cols.append(r[pos])
    return np.concatenate(cols, axis=1)


def circular_shifts(runs: list[np.ndarray], n_perm: int, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """([P, n] positions, exact): every run's series rotated by an offset of its own. When the
    number of distinct offset combinations ∏ n_r is at most ``n_perm``, all of them (exact test,
    the identity included); else ``n_perm`` random ones (identity excluded)."""
    sizes = [len(r) for r in runs]
    total = math.prod(sizes)
    exact = total <= n_perm
    if exact:
        offsets = np.array(list(itertools.product(*[range(m) for m in sizes])), dtype=int).reshape(total, len(runs))
    else:
        offsets = np.column_stack([rng.integers(0, m, size=n_perm) for m in sizes])
        identity = (offsets == 0).all(axis=1)
        while identity.any():  # the observed arrangement is counted once, separately
            offsets[identity] = np.column_stack([rng.integers(0, m, size=int(identity.sum())) for m in sizes])
            identity = (offsets == 0).all(axis=1)
    cols = []
    for j, r in enumerate(runs):
        m = len(r)
        cols.append(r[(np.arange(m)[None, :] + offsets[:, j:j + 1]) % m])
    return np.concatenate(cols, axis=1), exact


def shift_combinations(runs: list[np.ndarray]) -> int:
    """∏ n_r: the number of distinct circular-shift arrangements."""
    return math.prod(len(r) for r in runs)
