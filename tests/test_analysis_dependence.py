"""Correlations across checkpoints of several runs treat each run as a time series (issues #24, #37):
run-level t over the runs, an AR(1) effective-n t with one or two runs, effective n, and
'descriptive' where neither holds. The Monte-Carlo checks are seeded; their tolerances are 3
binomial standard errors of the rate over the replicates."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from losslens.study.analysis import correlate, partial_correlation, summary
from losslens.study.analysis.correlation import DESCRIPTIVE, EFFECTIVE_N
from losslens.study.analysis.dependence import autocorrelation, effective_n, run_index


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
    """Every run's x follows the same trend (a rise over the run, as a sharpness series does) plus a
    slow drift; every run's y drifts slowly (AR(1), φ = 0.5, the same law in every run); x and y are
    independent: the true correlation is 0. scipy's p rejects far more often than 5%; with two runs
    the effective-n interval covers 0 and its p rejects at their nominal 95% / 5%, within 3 binomial
    standard errors over the replicates. (Until issue 37 this checked the block bootstrap and the
    circular-shift test, and compared the i.i.d. pair bootstrap's coverage.)"""
    rng = np.random.default_rng(2024)
    runs, m, reps = 2, 400, 200
    g = np.repeat(np.arange(runs), m)
    trend = np.tile(np.linspace(-1.5, 1.5, m), runs)
    cover = reject = iid_reject = 0
    for i in range(reps):
        x, y = _ar1(rng, runs, m, 0.5) + trend, _ar1(rng, runs, m, 0.5)
        c = correlate(x, y, groups=g)
        assert c.inference == EFFECTIVE_N
        cover += c.ci_low <= 0 <= c.ci_high
        reject += c.p < 0.05
        iid_reject += c.p_iid < 0.05
    tol = 3 * _se(0.05, reps)
    print(
        f"effective-n coverage {cover / reps:.3f}, rejection {reject / reps:.3f}; scipy rejection "
        f"{iid_reject / reps:.3f}; tolerance {tol:.3f}"
    )
    assert cover / reps >= 0.95 - tol, cover / reps
    assert reject / reps <= 0.05 + tol, reject / reps
    assert iid_reject / reps > 0.05 + tol, iid_reject


def test_partial_correlation_gets_the_same_treatment():
    """x and y both follow a covariate z (a shared slow trend) plus independent AR(1) drifts: the
    partial correlation on z is 0. The t-test (independent rows) rejects far more than 5%; the
    effective-n interval and p of the residuals (within runs) hold their nominal rates."""
    rng = np.random.default_rng(7)
    runs, m, reps = 2, 400, 150
    g = np.repeat(np.arange(runs), m)
    cover = reject = t_reject = 0
    for i in range(reps):
        z = _ar1(rng, runs, m, 0.9)
        x, y = z + _ar1(rng, runs, m, 0.6), -z + _ar1(rng, runs, m, 0.6)
        c = partial_correlation(x, y, z, groups=g)
        cover += c.ci_low <= 0 <= c.ci_high
        reject += c.p < 0.05
        t_reject += c.p_iid < 0.05
    tol = 3 * _se(0.05, reps)
    print(
        f"partial: coverage {cover / reps:.3f}, shift-test rejection {reject / reps:.3f}, t-test rejection "
        f"{t_reject / reps:.3f}; tolerance {tol:.3f}"
    )
    assert cover / reps >= 0.95 - tol and reject / reps <= 0.05 + tol, (cover, reject)
    assert t_reject / reps > 0.05 + tol, t_reject


def test_effective_n_against_closed_forms():
    rng = np.random.default_rng(0)
    # the demo's shape (4 runs of 8, every lag used): a series constant within each run carries one
    # value per run, n_eff = the number of runs
    runs = run_index(np.repeat(np.arange(4), 8), 32)
    x, y = np.repeat(rng.normal(size=4), 8), np.repeat(rng.normal(size=4), 8)
    assert effective_n(x, y, runs) == pytest.approx(4.0, rel=1e-12)
    # white noise: about n
    runs = run_index(np.repeat(np.arange(4), 50), 200)
    assert effective_n(rng.normal(size=200), rng.normal(size=200), runs) == pytest.approx(200, rel=0.25)
    # AR(1) with φ: n (1 − φ²) / (1 + φ²) (Bartlett), within Monte-Carlo error
    phi, vals = 0.7, []
    long = run_index(np.repeat(np.arange(4), 500), 2000)
    for _ in range(20):
        vals.append(effective_n(_ar1(rng, 4, 500, phi), _ar1(rng, 4, 500, phi), long))
    assert np.mean(vals) == pytest.approx(2000 * (1 - phi**2) / (1 + phi**2), rel=0.15)


def test_autocorrelation_never_pairs_across_runs():
    v = np.array([0.0, 1.0, 0.0, 1.0, 5.0, 5.0])  # run 0 alternates; run 1 is constant
    rho, pairs = autocorrelation(v, run_index([0, 0, 0, 0, 1, 1], 6), 1, center="run")
    assert pairs.tolist() == [6, 4]
    c = np.array([-0.5, 0.5, -0.5, 0.5, 0.0, 0.0])  # centred on each run's mean
    assert rho[1] == pytest.approx((np.dot(c[:3], c[1:4]) + 0.0) / 4 / np.mean(c * c))


def test_few_or_short_runs_are_descriptive():
    """2 runs of 4 checkpoints: fewer than 3 runs for run-level inference and ν = n_eff − 4 < 10 for
    the effective-n one: the row says 'descriptive' and why, with no interval and no p. 4 runs of 2
    checkpoints: no run has a correlation of its own."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=8)
    c = correlate(x, x + 0.1 * rng.normal(size=8), groups=[0] * 4 + [1] * 4)
    assert math.isnan(c.p) and math.isnan(c.ci_low) and c.inference == DESCRIPTIVE
    assert "run-level inference needs 3" in c.note and "below 10" in c.note and c.p_iid < 1e-3
    short = correlate(x, x + 0.1 * rng.normal(size=8), groups=[0, 0, 1, 1, 2, 2, 3, 3])
    assert math.isnan(short.ci_low) and short.inference == DESCRIPTIVE and "no run has a correlation" in short.note


def test_summary_orders_each_run_by_step_and_reports_dependence():
    """The summary table gives r_within, n_eff, runs, df and the inference for every row, and each
    run enters as one time series ordered by step even when the table is not."""
    from tests.test_analysis import _tidy

    a, b = _tidy(), _tidy()
    b["run"] = "u"
    b.loc[b.probe == "trace", "value"] += 5.0
    df = pd.concat([a, b], ignore_index=True)
    tab = summary(df, x="trace", y=["gptq:3:g128"], methods=("pearson", "spearman", "kendall"), n_boot=200)
    shuffled = summary(
        df.sample(frac=1.0, random_state=1),
        x="trace",
        y=["gptq:3:g128"],
        methods=("pearson", "spearman", "kendall"),
        n_boot=200,
    )
    pd.testing.assert_frame_equal(tab, shuffled)
    assert (tab["n"] == 22).all() and (tab["n_runs"] == 2).all()
    assert (tab["n_eff"] < tab["n"]).all()
    assert set(tab["inference"]) <= {"effective-n t (AR(1))", "descriptive"}  # two runs
    assert "between run means" in tab.loc[0, "note"]
