"""losslens.study.analysis: correlations vs scipy, bootstrap intervals, partial correlation, phases, series."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from losslens.study.analysis import (
    AnalysisError,
    convergence_onset,
    correlate,
    detect_phases,
    divergence_onset,
    partial_correlation,
    series,
    summary,
)


@pytest.fixture
def xy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=40)
    y = 0.6 * x + rng.normal(scale=0.8, size=40)
    return x, y


@pytest.mark.parametrize(
    "method,ref", [("pearson", stats.pearsonr), ("spearman", stats.spearmanr), ("kendall", stats.kendalltau)]
)
def test_correlate_matches_scipy(xy, method, ref):
    x, y = xy
    c = correlate(x, y, method=method, n_boot=500, seed=3)
    want = ref(x, y)
    assert c.r == pytest.approx(want.statistic, abs=1e-12)
    assert c.p_iid == pytest.approx(want.pvalue, rel=1e-9)
    # one run: the within-run correlation is the correlation (issue 37 replaced the circular-shift
    # test, whose p = 1/40 this test used to assert, by the inference of losslens.study.analysis.inference)
    assert c.r_within == pytest.approx(c.r, abs=1e-12) and c.n_runs == 1
    assert c.n == 40 and c.n_excluded == 0 and c.method == method
    if method == "kendall":  # one run, Kendall: no effective-n interval
        assert c.inference == "descriptive" and math.isnan(c.p) and math.isnan(c.ci_low) and "Kendall" in c.note
        return
    assert c.inference == "effective-n t (AR(1))"
    assert c.ci_low < c.r < c.ci_high
    assert -1 <= c.ci_low and c.ci_high <= 1


def test_effective_n_interval_by_hand(xy):
    """One run of 40: the bias-corrected AR(1) fits, Bartlett's n_eff and the Fisher-z t interval,
    recomputed here with scipy's linregress (the slope is the least-squares lag-1 coefficient)."""
    x, y = xy
    c = correlate(x, y, n_boot=500)
    phis = []
    for v in (x, y):
        b = stats.linregress(v[:-1], v[1:]).slope
        phis.append(min(0.99, max(-0.99, b + (1 + 3 * b) / 40)))
    n_eff = min(40.0, max(1.0, 40 * (1 - phis[0] * phis[1]) / (1 + phis[0] * phis[1])))
    nu = n_eff - 3
    half = stats.t.ppf(0.975, nu) / math.sqrt(nu)
    z = math.atanh(stats.pearsonr(x, y).statistic)
    assert (c.phi_x, c.phi_y) == pytest.approx(tuple(phis), abs=1e-12)
    assert c.n_eff == pytest.approx(n_eff, rel=1e-12) and c.df == pytest.approx(nu, rel=1e-12)
    assert (c.ci_low, c.ci_high) == pytest.approx((math.tanh(z - half), math.tanh(z + half)), abs=1e-12)
    assert c.p == pytest.approx(2 * stats.t.sf(abs(z) * math.sqrt(nu), nu), rel=1e-9)


def test_run_level_interval_by_hand_and_seed_free():
    """4 runs: r_within, the interval and p are the one-sample t on the runs' Fisher z (scipy's
    ttest_1samp); seed, n_boot and n_perm do not change the row (the inference is closed-form);
    n_boot = 0 leaves the interval out."""
    rng = np.random.default_rng(4)
    g = np.repeat(np.arange(4), 12)
    x = rng.normal(size=48)
    y = 0.4 * x + rng.normal(size=48) + np.repeat(rng.normal(scale=3, size=4), 12)  # y's runs at other levels
    c = correlate(x, y, groups=g, seed=1)
    z = np.arctanh([stats.pearsonr(x[g == i], y[g == i]).statistic for i in range(4)])
    t = stats.ttest_1samp(z, 0.0)
    half = stats.t.ppf(0.975, 3) * z.std(ddof=1) / 2
    assert c.inference == "run-level t" and c.df == 3
    assert c.r_within == pytest.approx(math.tanh(z.mean()), abs=1e-12)
    assert (c.ci_low, c.ci_high) == pytest.approx((math.tanh(z.mean() - half), math.tanh(z.mean() + half)), abs=1e-12)
    assert c.p == pytest.approx(t.pvalue, rel=1e-9)
    assert c.r == pytest.approx(stats.pearsonr(x, y).statistic) and "between run means" in c.note
    assert correlate(x, y, groups=g, seed=9, n_boot=50, n_perm=7) == c
    bare = correlate(x, y, groups=g, n_boot=0)
    assert math.isnan(bare.ci_low) and bare.p == c.p


def test_nan_pairs_excluded_with_count(xy):
    x, y = xy
    x2, y2 = x.copy(), y.copy()
    x2[[3, 10]] = np.nan
    y2[20] = np.nan
    c = correlate(x2, y2, n_boot=100)
    keep = np.ones(40, bool)
    keep[[3, 10, 20]] = False
    assert c.n == 37 and c.n_excluded == 3
    assert c.r == pytest.approx(stats.pearsonr(x[keep], y[keep]).statistic)


def test_too_few_points_clear_message():
    with pytest.raises(AnalysisError, match="trajectory of 1 checkpoint cannot be correlated"):
        correlate([1.0], [2.0])
    with pytest.raises(AnalysisError, match="at least 3"):
        correlate([1.0, 2.0, np.nan, 4.0], [1.0, 3.0, 2.0, np.nan])
    with pytest.raises(AnalysisError, match="constant"):
        correlate([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(AnalysisError, match="unknown correlation method"):
        correlate([1, 2, 3], [1, 2, 3], method="distance")


def test_pandas_series_are_aligned_on_index():
    a = pd.Series([1.0, 2.0, 3.0, 4.0], index=list("abcd"))
    b = pd.Series([8.0, 6.0, 4.0, 2.0], index=list("dcba"))  # b = 2a per label
    c = correlate(a, b, n_boot=0)
    assert c.r == pytest.approx(1.0)


def test_partial_correlation_removes_planted_confounder():
    rng = np.random.default_rng(0)
    n = 200
    z = rng.normal(size=n)
    x = 2.0 * z + 0.3 * rng.normal(size=n)
    y = -1.5 * z + 0.3 * rng.normal(size=n)
    plain = correlate(x, y, n_boot=300)
    part = partial_correlation(x, y, z, n_boot=300)
    assert plain.r < -0.9
    assert abs(part.r) < 0.15
    assert part.ci_low < 0 < part.ci_high
    assert part.p > 0.01
    sp = partial_correlation(x, y, {"z": z}, method="spearman", n_boot=200)
    assert abs(sp.r) < 0.2 and sp.covariates == ("z",)


def test_partial_correlation_matches_residual_formula_and_t_test():
    rng = np.random.default_rng(5)
    n = 30
    Z = rng.normal(size=(n, 2))
    x = Z @ [1.0, -0.5] + rng.normal(size=n)
    y = Z @ [0.3, 0.8] + 0.5 * x + rng.normal(size=n)
    A = np.column_stack([np.ones(n), Z])
    rx = x - A @ np.linalg.lstsq(A, x, rcond=None)[0]
    ry = y - A @ np.linalg.lstsq(A, y, rcond=None)[0]
    r = stats.pearsonr(rx, ry).statistic
    dof = n - 2 - 2
    t = r * math.sqrt(dof / (1 - r * r))
    c = partial_correlation(x, y, Z, n_boot=200)
    assert c.r == pytest.approx(r, abs=1e-10)
    assert c.p_iid == pytest.approx(2 * stats.t.sf(abs(t), dof), rel=1e-8)
    # the residual on a single covariate equals the textbook formula
    z = Z[:, 0]
    rxy, rxz, ryz = (stats.pearsonr(a, b).statistic for a, b in ((x, y), (x, z), (y, z)))
    want = (rxy - rxz * ryz) / math.sqrt((1 - rxz**2) * (1 - ryz**2))
    assert partial_correlation(x, y, z, n_boot=0).r == pytest.approx(want, abs=1e-10)
    with pytest.raises(AnalysisError, match="at least 5"):
        partial_correlation(x[:4], y[:4], Z[:4])
    with pytest.raises(AnalysisError, match="pearson"):
        partial_correlation(x, y, Z, method="kendall")


def test_convergence_onset_planted():
    steps = np.arange(0, 1000, 50)
    loss = np.where(steps < 600, 5.0 - steps / 200.0, 2.0)  # improves until 600 then flat
    loss = loss + np.where(steps >= 600, 0.001 * np.sin(steps), 0)
    lrs = np.where(steps < 600, 1e-3, 1e-4)
    o = convergence_onset(steps, loss, lrs, tol=0.01)
    assert o.found and o.step == 600 and o.lr == pytest.approx(1e-4)
    still = convergence_onset(steps, 5.0 - steps / 200.0, tol=0.001)
    assert not still.found and still.step == steps[-1]


def test_divergence_onset_planted():
    steps = np.arange(0, 2000, 100, dtype=float)
    log_gap = np.where(steps <= 1200, -5 + 0.0002 * steps, -5 + 0.0002 * 1200 + 0.004 * (steps - 1200))
    rng = np.random.default_rng(0)
    gap = np.exp(log_gap + rng.normal(scale=0.02, size=steps.size))
    lrs = np.linspace(1e-3, 1e-5, steps.size)
    o = divergence_onset(steps, gap, lrs)
    assert o.found and o.step == 1200
    assert o.lr == pytest.approx(lrs[12])
    assert o.details["slope_after"] > 5 * o.details["slope_before"]
    # non-positive gaps have no log: excluded and counted
    gap2 = gap.copy()
    gap2[[2, 5]] = [-0.01, np.nan]
    o2 = divergence_onset(steps, gap2, lrs)
    assert o2.n_excluded == 2 and o2.step == 1200


def _tidy(n=12):
    rows = []
    rng = np.random.default_rng(0)
    for i in range(n):
        base = dict(
            run="t",
            checkpoint=f"step{i * 100}",
            step=i * 100,
            tokens=i * 1000,
            lr=1e-3 * (1 - i / n),
            derived=False,
            n_hvp=0,
            seconds=0.1,
            status="ok",
            error=None,
            seed=0,
            data_hash="h",
            stderr=np.nan,
            ci_low=np.nan,
            ci_high=np.nan,
        )
        loss = 4.0 - min(i, 7) * 0.3
        rows.append({**base, "probe": "loss", "spec": "", "metric": "loss", "value": loss})
        rows.append({**base, "probe": "loss", "spec": "", "metric": "ppl", "value": math.exp(loss)})
        tr = 100 + 10 * i + rng.normal(scale=8.0)
        rows.append({**base, "probe": "trace", "spec": "hutch++", "metric": "trace", "value": tr, "stderr": 1.0})
        gap = 0.001 * math.exp(0.05 * i + (0.5 * (i - 8) if i > 8 else 0))
        for spec, scale in (("rtn:4:g128", 1.0), ("gptq:3:g128", 3.0)):
            for m, v in (
                ("q_loss", loss * (1 + gap * scale)),
                ("rel_loss_error", gap * scale),
                ("ppl_gap", gap * scale),
            ):
                rows.append({**base, "probe": "quant", "spec": spec, "metric": m, "value": v})
    rows.append({**rows[0], "checkpoint": "lawa4", "derived": True, "step": None, "value": 9.0})
    df = pd.DataFrame(rows)
    # a failed trace on one checkpoint -> NaN in the series
    df.loc[(df.checkpoint == "step300") & (df.probe == "trace"), ["status", "value"]] = ["failed", np.nan]
    return df


def test_series_and_summary_from_tidy_frame():
    df = _tidy()
    tr = series(df, "trace")
    assert list(tr.index)[:2] == ["step0", "step100"] and "lawa4" not in tr.index
    assert np.isnan(tr["step300"])
    g = series(df, "gptq:3:g128")
    assert g["step0"] == pytest.approx(0.003)
    assert series(df, "quant/gptq:3:g128/ppl_gap").equals(g.rename("quant/gptq:3:g128/ppl_gap"))
    assert series(df, "lr").iloc[0] == pytest.approx(1e-3)
    assert "lawa4" in series(df, "loss", include_derived=True).index
    with pytest.raises(AnalysisError, match="ambiguous"):
        series(df, "q_loss")
    with pytest.raises(AnalysisError, match="unknown series"):
        series(df, "nonsense")
    tab = summary(df, x="trace", y=["gptq:3:g128"], controls=["lr"], n_boot=100)
    assert list(tab["method"]) == ["pearson", "pearson", "spearman", "spearman"]
    assert (tab["n"][:3] == 11).all() and (tab["n_excluded"][:3] == 1).all()
    assert tab.loc[0, "r"] > 0.6 and tab.loc[1, "controls"] == "lr"
    # the gap is monotone in lr: on ranks it is fully explained -> NaN row with the reason, no crash
    assert np.isnan(tab.loc[3, "r"]) and "fully explained" in tab.loc[3, "note"]
    default = summary(df, n_boot=50)
    assert set(default["y"]) == {"rtn:4:g128", "gptq:3:g128"} and set(default["x"]) == {"trace"}


def test_series_pools_runs_that_share_checkpoint_labels():
    """A store of several trajectories (e.g. the demo's WSD and cosine runs) repeats labels such as
    step100: every run's value is kept, keyed run/label, never one run's value silently dropped."""
    a, b = _tidy(), _tidy()
    b["run"] = "u"
    b.loc[b.probe == "trace", "value"] += 1000.0
    both = pd.concat([a, b], ignore_index=True)
    tr = series(both, "trace")
    assert len(tr) == 2 * len(series(a, "trace")) and tr.index.is_unique
    assert tr["u/step0"] == pytest.approx(series(a, "trace")["step0"] + 1000.0)
    assert list(series(a, "trace").index)[:1] == ["step0"]  # one run: labels unchanged
    assert summary(both, x="trace", y=["gptq:3:g128"], methods=("pearson",), n_boot=50).loc[0, "n"] == 22


def test_detect_phases_from_tidy_frame():
    ph = detect_phases(_tidy(20), loss="loss", gap="gptq:3:g128", tol=0.01)
    assert ph.convergence.step == 700 and ph.convergence.found
    assert ph.divergence.step == 800 and ph.divergence.found
    assert ph.divergence.lr == pytest.approx(1e-3 * (1 - 8 / 20))
