"""Inference for a correlation along trajectories that holds at few runs and high autocorrelation
(docs/science.md §6, issue 37).

Runs are the independent units. Every function here is vectorised over leading batch axes, so a
benchmark of many replicates (``benchmarks/statistics.py``) calls the same code as one table row.
A run is an array ``[..., m_i]`` (the batch axes first, its checkpoints in time order last).

- :func:`run_correlations` — each run's own correlation (Pearson, Spearman on within-run ranks,
  or Kendall), or partial correlation on controls residualised *within* the run: [..., R].
- :func:`run_level_t` — the Ibragimov–Müller (2010) t-statistic: the q run estimates in Fisher z,
  their mean ± t_{q−1} · s/√q; valid (conservative) for q ≥ 2 independent, roughly normal
  estimates with any within-run dependence and even unequal variances (Bakirov–Székely 2006).
- :func:`ar1_persistence` — the lag-1 autocorrelation within runs (least squares on the previous
  checkpoint with a per-run intercept, pooled over runs), bias-corrected (Marriott & Pope 1954:
  E φ̂ ≈ φ − (1 + 3φ)/m).
- :func:`effective_n_ar1` — Bartlett's effective n of a correlation between two AR(1) series,
  Σ_i m_i (1 − φ_x φ_y)/(1 + φ_x φ_y) (between the number of runs and Σ m_i).
- :func:`within_effective_n_t` — the fallback for one or two runs: Fisher z of the run-demeaned
  correlation with standard error 1/√ν, ν = n_eff − (R − 1) − k − 3, Student-t quantiles on ν;
  descriptive when ν < :data:`MIN_NU` or the persistence is above :data:`MAX_PHI`.
- :func:`infer_within` — one row's choice among them (what ``summary`` and the benchmark call);
  :func:`mean_interval` — the same treatment for a mean over checkpoints (the explain check);
  :func:`rank_bound` — where a rank correlation of ±1 enters Fisher z.

Cost: O(batch · n) (partial: O(batch · n · k²)); memory a few copies of the [..., n] inputs.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

__all__ = [
    "RUN_LEVEL",
    "EFFECTIVE_N",
    "DESCRIPTIVE",
    "MIN_RUNS",
    "MIN_NU",
    "MAX_PHI",
    "LEVEL",
    "fisher_z",
    "within_residuals",
    "run_correlations",
    "demeaned_correlation",
    "run_level_t",
    "ar1_persistence",
    "effective_n_ar1",
    "within_effective_n_t",
    "infer_within",
    "mean_interval",
    "STATUS",
    "rank_bound",
    "min_run_length",
    "between_share",
]

#: ``inference`` of a row with the run-level t interval and p (3 or more usable runs).
RUN_LEVEL = "run-level t"
#: ``inference`` of a row with the effective-n t interval (one or two runs, moderate persistence).
EFFECTIVE_N = "effective-n t (AR(1))"
#: ``inference`` of a row without an honest interval or p-value.
DESCRIPTIVE = "descriptive"
MIN_RUNS = 3
"""Fewest runs for run-level inference: with 2 the t quantile on 1 degree of freedom is 12.7 and an
interval that happens to be narrow (two runs that agree by chance) is not one to quote."""
MIN_NU = 10
"""Fewest effective degrees of freedom ν for the effective-n fallback (one or two runs)."""
MAX_PHI = 0.9
"""Largest (bias-corrected) lag-1 autocorrelation for the effective-n fallback: above it the AR(1)
fit of a short run is too uncertain to size an interval on."""
LEVEL = 0.95
_CLIP = 1.0 - 1e-9


def min_run_length(k: int) -> int:
    """Fewest checkpoints a run needs to give its own (partial) correlation on ``k`` controls: k + 4
    (two degrees of freedom left after the means, the controls and the correlation)."""
    return int(k) + 4


def rank_bound(method: str, m: int) -> float:
    """Largest absolute r used in Fisher z for a run of ``m`` checkpoints: a rank correlation of ±1 is an
    atom (any two monotone series), so it is taken halfway to the next attainable value —
    Spearman 1 − 6/(m(m² − 1)), Kendall 1 − 2/(m(m − 1)); Pearson 1 − 1e-9."""
    if method == "spearman":
        return 1.0 - 6.0 / (m * (m * m - 1.0))
    if method == "kendall":
        return 1.0 - 2.0 / (m * (m - 1.0))
    return _CLIP


def fisher_z(r):
    """atanh(r), with r clipped to ±(1 − 1e-9) (a run with r = ±1 gives a large finite z)."""
    return np.arctanh(np.clip(r, -_CLIP, _CLIP))


def _ranks(v: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(v, axis=-1)


def _centre(v: np.ndarray) -> np.ndarray:
    return v - v.mean(axis=-1, keepdims=True)


def _residual(v: np.ndarray, z: np.ndarray | None) -> np.ndarray:
    """v [..., m] centred, minus its least-squares fit on the centred controls z [..., m, k] (or
    [m, k]); the pseudo-inverse handles a control constant within the run (it explains nothing)."""
    c = _centre(v)
    if z is None or z.shape[-1] == 0:
        return c
    zc = z - z.mean(axis=-2, keepdims=True)
    coef = np.linalg.pinv(zc) @ c[..., None]  # [..., k, 1]
    res = c - (zc @ coef)[..., 0]
    # fully explained by the controls (rounding noise left): zero, so its correlation is NaN
    gone = np.linalg.norm(res, axis=-1) <= 1e-9 * np.linalg.norm(c, axis=-1)
    return np.where(gone[..., None], 0.0, res)


def _pearson_last(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson r along the last axis of already-centred a, b (NaN where either is constant)."""
    num = (a * b).sum(-1)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    scale = np.maximum(np.abs(a).max(-1), np.abs(b).max(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = num / den
    bad = ~(den > (1e-12 * np.maximum(scale, 1e-300)) ** 2)
    return np.where(bad, np.nan, np.clip(r, -1.0, 1.0))


def _prepare(x: np.ndarray, y: np.ndarray, z: np.ndarray | None, method: str):
    """Within-run ranks for Spearman (controls too), then the residuals of x and y on the controls."""
    if method == "spearman":
        x, y = _ranks(x), _ranks(y)
        if z is not None and z.shape[-1]:
            z = np.moveaxis(_ranks(np.moveaxis(z, -1, -2)), -2, -1)
    return _residual(x, z), _residual(y, z)


def within_residuals(xs, ys, zs=None, method: str = "pearson") -> tuple[list, list]:
    """Per run: x's and y's centred series (Spearman: within-run ranks) less their fit on the controls."""
    pairs = [
        _prepare(np.asarray(x, float), np.asarray(y, float), None if zs is None else np.asarray(zs[i], float), method)
        for i, (x, y) in enumerate(zip(xs, ys))
    ]
    # a run whose x or y is constant (or fully explained by the controls) carries no pair: both zero
    dead = [~((a != 0).any(-1) & (b != 0).any(-1))[..., None] for a, b in pairs]
    return (
        [np.where(d, 0.0, a) for d, (a, _) in zip(dead, pairs)],
        [np.where(d, 0.0, b) for d, (_, b) in zip(dead, pairs)],
    )


def run_correlations(xs, ys, zs=None, method: str = "pearson") -> np.ndarray:
    """[..., R] each run's own correlation. ``xs``, ``ys``: R arrays [..., m_i]; ``zs``: None or R
    control arrays [..., m_i, k] (partial correlation, residualised within the run; Pearson or
    Spearman). Kendall (no controls): scipy's tau-b per run (a loop; batch axes not supported)."""
    out = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        x, y = np.asarray(x, float), np.asarray(y, float)
        z = None if zs is None else np.asarray(zs[i], float)
        if method == "kendall":
            from scipy.stats import kendalltau

            if z is not None and z.shape[-1]:
                raise ValueError("a Kendall partial correlation is not supported")
            out.append(np.asarray(kendalltau(x, y).statistic if np.ptp(x) and np.ptp(y) else np.nan, float))
            continue
        rx, ry = _prepare(x, y, z, method)
        out.append(_pearson_last(rx, ry))
    return np.stack(out, axis=-1)


def demeaned_correlation(xs, ys, zs=None, method: str = "pearson") -> np.ndarray:
    """[...] the correlation of the run-demeaned series pooled over runs (for Spearman: within-run
    ranks; with controls: the within-run residuals) — the within-run correlation as one number."""
    rx, ry = within_residuals(xs, ys, zs, method)
    return _pearson_last(np.concatenate(rx, axis=-1), np.concatenate(ry, axis=-1))


def run_level_t(r_runs: np.ndarray, level: float = LEVEL) -> dict:
    """Ibragimov–Müller t on the runs' estimates ``r_runs`` [..., R] (NaN runs left out).

    Returns arrays [...]: ``estimate`` tanh(mean z), ``ci_low``/``ci_high`` tanh(mean z ∓ t·s/√q),
    ``p`` two-sided (Student t, q − 1 dof), ``q`` runs used. NaN where q < 2 or s = 0."""
    from scipy import stats

    z = fisher_z(np.asarray(r_runs, float))
    ok = np.isfinite(z)
    q = ok.sum(-1)
    zs = np.where(ok, z, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = zs.sum(-1) / q
        var = (np.where(ok, z - mean[..., None], 0.0) ** 2).sum(-1) / (q - 1)
        se = np.sqrt(var / q)
        df = np.where(q >= 2, q - 1, np.nan)
        half = stats.t.ppf(0.5 + level / 2, df) * se
        t = mean / se
        p = 2 * stats.t.sf(np.abs(t), df)
    bad = (q < 2) | ~(se > 0)
    nan = np.full(np.shape(mean), np.nan)
    return {
        "estimate": np.tanh(mean),
        "ci_low": np.where(bad, nan, np.tanh(mean - half)),
        "ci_high": np.where(bad, nan, np.tanh(mean + half)),
        "p": np.where(bad, nan, p),
        "q": q,
    }


def ar1_persistence(vs) -> np.ndarray:
    """[...] bias-corrected lag-1 autocorrelation φ̃ of a series given as R runs [..., m_i]: least
    squares of each checkpoint on the previous one with an intercept per run, pooled over runs
    (φ̂ = Σ (a − ā)(b − b̄) / Σ (a − ā)², a = v[:-1], b = v[1:] per run), then φ̃ = φ̂ + (1 + 3φ̂)/m̄
    (Marriott & Pope 1954; m̄ the mean run length), clipped to [−0.99, 0.99]. Runs of fewer than 3
    checkpoints are skipped; NaN when none is left or the series is constant."""
    num = den = 0.0
    lengths = []
    for v in vs:
        v = np.asarray(v, float)
        if v.shape[-1] < 3:
            continue
        a, b = _centre(v[..., :-1]), _centre(v[..., 1:])
        num = num + (a * b).sum(-1)
        den = den + (a * a).sum(-1)
        lengths.append(v.shape[-1])
    if not lengths:
        return np.asarray(np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        phi = np.where(np.asarray(den) > 0, num / den, np.nan)
    m = float(np.mean(lengths))
    return np.clip(phi + (1 + 3 * phi) / m, -0.99, 0.99)


def effective_n_ar1(lengths, phi_x, phi_y) -> np.ndarray:
    """[...] Bartlett's n_eff of a correlation of two AR(1) series: n (1 − φ_x φ_y)/(1 + φ_x φ_y),
    n = Σ lengths, between the number of runs (one pair each) and n (anti-persistence does not add
    information here)."""
    n = float(np.sum(lengths))
    prod = np.asarray(phi_x, float) * np.asarray(phi_y, float)
    return np.clip(n * (1 - prod) / (1 + prod), float(len(lengths)), n)


def within_effective_n_t(r_within, n_eff, n_runs: int, k: int, phi_x, phi_y, level: float = LEVEL) -> dict:
    """The one-or-two-run fallback: Fisher z of ``r_within`` ± t_ν / √ν with ν = n_eff − (R − 1) − k − 3.

    Returns arrays [...]: ``ci_low``, ``ci_high``, ``p`` (NaN where descriptive), ``nu`` and
    ``ok`` (False: descriptive, ν < :data:`MIN_NU` or max(φ_x, φ_y) > :data:`MAX_PHI`)."""
    from scipy import stats

    nu = np.asarray(n_eff, float) - (n_runs - 1) - k - 3
    phi = np.fmax(np.asarray(phi_x, float), np.asarray(phi_y, float))
    ok = (nu >= MIN_NU) & (phi <= MAX_PHI) & np.isfinite(r_within)
    nus = np.where(ok, nu, MIN_NU)
    z = fisher_z(np.asarray(r_within, float))
    half = stats.t.ppf(0.5 + level / 2, nus) / np.sqrt(nus)
    p = 2 * stats.t.sf(np.abs(z) * np.sqrt(nus), nus)
    nan = np.full(np.shape(z), np.nan)
    return {
        "ci_low": np.where(ok, np.tanh(z - half), nan),
        "ci_high": np.where(ok, np.tanh(z + half), nan),
        "p": np.where(ok, p, nan),
        "nu": nu,
        "ok": ok,
    }


def infer_within(xs, ys, zs=None, method: str = "pearson", level: float = LEVEL) -> dict:
    """The within-run inference of one row, vectorised: R runs ``xs``, ``ys`` [..., m_i] (controls
    ``zs``: R arrays [..., m_i, k] or None; Pearson or Spearman). Every run must give a correlation
    of its own (≥ :func:`min_run_length` checkpoints; the caller leaves the others out).

    Returns arrays [...]: ``estimate`` (r_within), ``ci_low``, ``ci_high``, ``p`` (NaN where
    descriptive), ``n_eff``, ``df``, ``phi_x``, ``phi_y``, ``q`` (runs with a finite correlation)
    and ``status``: 0 = :data:`RUN_LEVEL` (q ≥ :data:`MIN_RUNS`), 1 = :data:`EFFECTIVE_N`,
    2 = :data:`DESCRIPTIVE`."""
    k = 0 if zs is None else int(np.shape(zs[0])[-1])
    rx, ry = within_residuals(xs, ys, zs, method)
    phx, phy = ar1_persistence(rx), ar1_persistence(ry)
    lengths = [np.shape(x)[-1] for x in xs]
    n_eff = np.where(np.isfinite(phx * phy), effective_n_ar1(lengths, np.nan_to_num(phx), np.nan_to_num(phy)), np.nan)
    rr = run_correlations(xs, ys, zs, method)
    bound = np.array([rank_bound(method, n) for n in lengths])
    t = run_level_t(np.clip(rr, -bound, bound), level)
    q = t["q"]
    run_level = q >= MIN_RUNS
    flat = run_level & ~np.isfinite(t["p"])  # every run at the same value (e.g. all at ±1): no spread, no interval
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a replicate without any finite run: NaN
        raw_mean = np.nanmean(rr, axis=-1)
    rw = np.where(run_level, np.where(flat, raw_mean, t["estimate"]), demeaned_correlation(xs, ys, zs, method))
    e = within_effective_n_t(rw, n_eff, len(xs), k, phx, phy, level)
    status = np.where(run_level, np.where(flat, 2, 0), np.where(e["ok"], 1, 2))
    pick = lambda key: np.where(run_level, t[key], e[key])
    return {
        "estimate": rw,
        "ci_low": pick("ci_low"),
        "ci_high": pick("ci_high"),
        "p": pick("p"),
        "n_eff": n_eff,
        "df": np.where(run_level, q - 1.0, e["nu"]),
        "phi_x": phx,
        "phi_y": phy,
        "q": q,
        "status": status,
    }


def mean_interval(vs, level: float = LEVEL) -> tuple[float, float, float, str]:
    """(mean, low, high, inference) of a quantity measured at the checkpoints of R runs (``vs``: R
    arrays [m_i], NaNs left out). ≥ :data:`MIN_RUNS` runs: the mean of the run means ± t_{R−1} ·
    s/√R (run-level t); else the pooled mean ± t_ν · sd/√n_eff with n_eff = n (1 − φ̃)/(1 + φ̃)
    (AR(1), :func:`ar1_persistence`) and ν = n_eff − R, when ν ≥ :data:`MIN_NU` and φ̃ ≤
    :data:`MAX_PHI`; otherwise the interval is NaN ('descriptive')."""
    from scipy import stats

    vs = [np.asarray(v, float)[np.isfinite(v)] for v in vs]
    vs = [v for v in vs if v.size]
    if not vs:
        return math.nan, math.nan, math.nan, DESCRIPTIVE
    if len(vs) >= MIN_RUNS:
        means = np.array([v.mean() for v in vs])
        mean, se = float(means.mean()), float(means.std(ddof=1) / math.sqrt(len(means)))
        if se > 0:
            h = float(stats.t.ppf(0.5 + level / 2, len(means) - 1)) * se
            return mean, mean - h, mean + h, RUN_LEVEL
        return mean, math.nan, math.nan, DESCRIPTIVE
    allv = np.concatenate(vs)
    mean = float(allv.mean())
    phi = float(ar1_persistence(vs))
    if not math.isfinite(phi) or allv.size < 3:
        return mean, math.nan, math.nan, DESCRIPTIVE
    n_eff = float(np.clip(allv.size * (1 - phi) / (1 + phi), 1.0, allv.size))
    nu = n_eff - len(vs)
    if nu < MIN_NU or phi > MAX_PHI:
        return mean, math.nan, math.nan, DESCRIPTIVE
    h = float(stats.t.ppf(0.5 + level / 2, nu)) * float(allv.std(ddof=1)) / math.sqrt(n_eff)
    return mean, mean - h, mean + h, EFFECTIVE_N


STATUS = (RUN_LEVEL, EFFECTIVE_N, DESCRIPTIVE)
"""``inference`` by the ``status`` code of :func:`infer_within`."""


def between_share(vs) -> float:
    """Share of the total sum of squares of a series (R runs [m_i]) that lies between the run means."""
    allv = np.concatenate([np.asarray(v, float) for v in vs])
    total = float(((allv - allv.mean()) ** 2).sum())
    within = float(sum(((np.asarray(v, float) - np.mean(v)) ** 2).sum() for v in vs))
    return math.nan if total <= 0 else max(0.0, 1.0 - within / total)
