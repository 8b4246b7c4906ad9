"""Correlations across checkpoints of several runs treat each run as a time series (issue #24):
block-bootstrap intervals within runs, circular-shift permutation p-values, effective n, and
'descriptive' where no honest p-value exists. The Monte-Carlo checks are seeded; their tolerances
are 3 binomial standard errors of the rate over the replicates."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from probes.analysis import correlate, partial_correlation, summary
from probes.analysis.correlation import DESCRIPTIVE
from probes.analysis.dependence import (autocorrelation, block_bootstrap_indices, circular_shifts, effective_n,
                                        run_index)


def _ar1(rng, runs: int, m: int, phi: float) -> np.ndarray:
    """[runs * m] stationary AR(1) series, run after run (unit innovations, started in equilibrium)."""
    out = np.empty((runs, m))
    out[:, 0] = rng.normal(size=runs) / math.sqrt(1 - phi * phi)
    e = rng.normal(size=(runs, m))
    for t in range(1, m):
        out[:, t] = phi * out[:, t - 1] + e[:, t]
    return out.ravel()


def _se(rate: float, reps: int) -> float:
    return math.sqrt(rate * (1 - rate) / reps)


def test_unrelated_trending_runs_interval_and_p_at_nominal_rate():
    """x and y drift slowly within every run (AR(1), φ = 0.5, the same law in every run) but are
    independent: the true correlation is 0. The i.i.d. pair bootstrap and scipy's p exclude 0 far
    more often than 5%; the block bootstrap within runs covers 0 and the circular-shift test rejects
    at their nominal 95% / 5%, within 3 binomial standard errors over the replicates."""
    rng = np.random.default_rng(2024)
    runs, m, reps = 2, 400, 200
    g = np.repeat(np.arange(runs), m)
    cover = reject = iid_cover = iid_reject = 0
    for i in range(reps):
        x, y = _ar1(rng, runs, m, 0.5), _ar1(rng, runs, m, 0.5)
        c = correlate(x, y, groups=g, n_boot=200, n_perm=99, seed=i)
        cover += c.ci_low <= 0 <= c.ci_high
        reject += c.p < 0.05
        old = correlate(x, y, n_boot=200, n_perm=0, seed=i, block_len=1)  # = the i.i.d. pair bootstrap
        iid_cover += old.ci_low <= 0 <= old.ci_high
        iid_reject += old.p_iid < 0.05
    tol = 3 * _se(0.05, reps)
    print(f"block bootstrap coverage {cover / reps:.3f}, shift-test rejection {reject / reps:.3f}; "
          f"i.i.d. coverage {iid_cover / reps:.3f}, scipy rejection {iid_reject / reps:.3f}; tolerance {tol:.3f}")
    assert cover / reps >= 0.95 - tol, cover / reps
    assert reject / reps <= 0.05 + tol, reject / reps
    assert 1 - iid_cover / reps > 0.05 + tol and iid_reject / reps > 0.05 + tol, (iid_cover, iid_reject)
