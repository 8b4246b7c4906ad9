"""Correlations across checkpoints that hold up when the checkpoints of a run are autocorrelated, and
partial correlations (docs/science.md §6, issue 37).

* :func:`correlate` — Pearson, Spearman or Kendall.
* :func:`partial_correlation` — r between the residuals of x and y after least squares on the
  covariates (Pearson, or Spearman on ranks).

Each gives two numbers and says which one its inference is about:

- ``r``: over the checkpoints of every run pooled (as scipy computes it; partial: residuals on one
  intercept). With several runs whose levels differ it is mostly *between-run* variation: the note
  gives the share of x's and y's variance that lies between run means.
- ``r_within``: the *within-run* correlation, and the 95% interval ``[ci_low, ci_high]`` and the
  two-sided ``p`` are about it (:mod:`.inference`):

  - with ≥ :data:`~.inference.MIN_RUNS` usable runs (each with ≥ k + 4 checkpoints): each run's own
    correlation (partial: controls residualised within the run), in Fisher z; ``r_within`` =
    tanh(mean z), interval and p from the t-statistic over the runs (Ibragimov–Müller), ``df`` =
    runs − 1 — 'run-level t'. Runs are the independent units; no model of the autocorrelation;
  - with one or two runs: the correlation of the run-demeaned series, Fisher z ± t_ν/√ν with ν from
    Bartlett's AR(1) effective n — 'effective-n t (AR(1))', or 'descriptive' (no interval, no p)
    when ν < :data:`~.inference.MIN_NU`, the persistence φ > :data:`~.inference.MAX_PHI`, or for
    Kendall.

``n_eff``: Bartlett's effective n of the within-run correlation from bias-corrected AR(1) fits
(``phi_x``, ``phi_y``), for reading the strength of the evidence; ``p_iid`` keeps the textbook
p-value (scipy; pairs assumed independent) for comparison only.

The runs are given by ``groups`` (one label per point; None = one run); within a run the given
order is time order. Missing values: a pair with a NaN on either side (or in a covariate) is
excluded from every statistic and counted in ``n_excluded``; values are never imputed.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np

from losslens.study.analysis import inference as inf
from losslens.study.analysis.dependence import run_index
from losslens.study.analysis.inputs import AnalysisError, align_pair, as_1d, check_method, covariate_matrix, too_few

__all__ = ["Correlation", "correlate", "partial_correlation", "RUN_LEVEL", "EFFECTIVE_N", "DESCRIPTIVE"]

RUN_LEVEL, EFFECTIVE_N, DESCRIPTIVE = inf.RUN_LEVEL, inf.EFFECTIVE_N, inf.DESCRIPTIVE


@dataclass(frozen=True)
class Correlation:
    """A pooled correlation and the within-run correlation with an honest 95% interval and p.

    ``r``: pooled over runs; ``r_within``: within runs (what ``ci_low``, ``ci_high`` and ``p`` are
    about); ``n``: pairs used; ``n_excluded``: pairs dropped because of a NaN; ``n_eff``: Bartlett's
    AR(1) effective n of the within-run correlation (≤ n); ``n_runs``: runs; ``df``: degrees of
    freedom of the t quantile (runs − 1, or ν); ``phi_x``, ``phi_y``: bias-corrected lag-1
    autocorrelations within runs; ``p_iid``: scipy's p assuming independent pairs (for comparison
    only); ``inference``: :data:`~.inference.RUN_LEVEL`, :data:`~.inference.EFFECTIVE_N` or
    :data:`~.inference.DESCRIPTIVE` (no interval, ``p`` NaN); ``note``: why descriptive, what the pooled r means, what
    was left out; ``covariates``: names of the controls for a partial correlation (empty otherwise).
    """

    r: float
    p: float
    ci_low: float
    ci_high: float
    n: int
    n_excluded: int
    method: str = "pearson"
    covariates: tuple[str, ...] = ()
    r_within: float = math.nan
    n_eff: float = math.nan
    n_runs: int = 1
    df: float = math.nan
    phi_x: float = math.nan
    phi_y: float = math.nan
    p_iid: float = math.nan
    inference: str = RUN_LEVEL
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        ctrl = f" | {', '.join(self.covariates)}" if self.covariates else ""
        if self.inference == DESCRIPTIVE or not math.isfinite(self.ci_low):
            rw = f"within runs {self.r_within:+.3f} " if math.isfinite(self.r_within) else ""
            inner = f"{rw}(descriptive: no interval, no p)"
        else:
            inner = (
                f"within runs {self.r_within:+.3f} [{self.ci_low:+.3f}, {self.ci_high:+.3f}] 95%, "
                f"p = {self.p:.3g} "
                f"({self.inference}, df {self.df:.0f})"
            )
        neff = f"n_eff {self.n_eff:.1f}, " if math.isfinite(self.n_eff) else ""
        return (
            f"{self.method}{ctrl}: r = {self.r:+.3f} pooled; {inner}; n = {self.n} ({neff}"
            f"{self.n_runs} run{'s' if self.n_runs != 1 else ''})"
            + (f" ({self.n_excluded} excluded: NaN)" if self.n_excluded else "")
            + (f"; {self.note}" if self.note else "")
        )


def _pearson_rows(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair of X, Y [b, n] (NaN where a row is constant)."""
    X, Y = np.broadcast_arrays(X, Y)
    Xc = X - X.mean(axis=-1, keepdims=True)
    Yc = Y - Y.mean(axis=-1, keepdims=True)
    num = (Xc * Yc).sum(-1)
    den = np.sqrt((Xc * Xc).sum(-1) * (Yc * Yc).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = num / den
    r[~(den > 1e-300 * max(1.0, float(np.abs(num).max(initial=0))))] = np.nan
    return np.clip(r, -1.0, 1.0)


def _groups(groups, keep: np.ndarray, n_all: int):
    if groups is None:
        return None
    g = np.asarray(groups, dtype=object)
    if g.shape != (n_all,):
        raise AnalysisError(f"groups needs one run label per checkpoint ({n_all}), got shape {g.shape}")
    return g[keep]


def _within(xa, ya, Z, g, method: str, interval: bool) -> dict:
    """The within-run half of a row: r_within, interval, p, n_eff, df, φ, inference and notes."""
    runs = run_index(g, xa.size)
    k = 0 if Z is None else Z.shape[1]
    xs, ys = [xa[r] for r in runs], [ya[r] for r in runs]
    zs = None if Z is None else [Z[r] for r in runs]
    notes = []
    if len(runs) > 1:
        bx, by = inf.between_share(xs), inf.between_share(ys)
        notes.append(
            f"r pools {len(runs)} runs (between run means: {100 * bx:.0f}% of x's, {100 * by:.0f}% of y's "
            "variance); r_within, the interval and p are within runs"
        )
    need = inf.min_run_length(k)
    use = [i for i, r in enumerate(runs) if len(r) >= need and np.ptp(xa[r]) > 0 and np.ptp(ya[r]) > 0]
    if len(use) < len(runs):
        notes.append(
            f"{len(runs) - len(use)} run(s) with fewer than {need} checkpoints or a constant series give no "
            "correlation of their own"
        )
    pick = lambda v: [v[i] for i in use]
    zs_u = None if zs is None else pick(zs)
    if not use:
        return dict(
            r_within=math.nan,
            ci_low=math.nan,
            ci_high=math.nan,
            p=math.nan,
            n_eff=math.nan,
            df=math.nan,
            phi_x=math.nan,
            phi_y=math.nan,
            inference=DESCRIPTIVE,
            note="; ".join(notes + ["descriptive: no run has a correlation of its own"]),
        )
    lengths = [len(runs[i]) for i in use]
    if method == "kendall":
        rx, ry = inf.within_residuals(pick(xs), pick(ys), None, "spearman")
        phx, phy = float(inf.ar1_persistence(rx)), float(inf.ar1_persistence(ry))
        rr = inf.run_correlations(pick(xs), pick(ys), None, method)
        q = int(np.isfinite(rr).sum())
        res = {"n_eff": float(inf.effective_n_ar1(lengths, phx, phy)), "phi_x": phx, "phi_y": phy, "q": q}
        bound = np.array([inf.rank_bound("kendall", n) for n in lengths])
        if q >= inf.MIN_RUNS and math.isfinite(float(inf.run_level_t(np.clip(rr, -bound, bound))["p"])):
            res.update(inf.run_level_t(np.clip(rr, -bound, bound)), status=0, df=q - 1.0)
        else:
            res.update(
                estimate=float(np.nanmean(rr)), ci_low=math.nan, ci_high=math.nan, p=math.nan, status=2, df=math.nan
            )
    else:
        res = inf.infer_within(pick(xs), pick(ys), zs_u, method)
    q, n_eff, status = int(res["q"]), float(res["n_eff"]), int(res["status"])
    phx, phy = float(res["phi_x"]), float(res["phi_y"])
    out = dict(
        r_within=float(res["estimate"]),
        ci_low=float(res["ci_low"]),
        ci_high=float(res["ci_high"]),
        p=float(res["p"]),
        n_eff=n_eff,
        df=float(res["df"]),
        phi_x=phx,
        phi_y=phy,
        inference=inf.STATUS[status],
    )
    if status == 0 and n_eff / q < 2:
        notes.append(
            f"n_eff {n_eff:.1f}: about {n_eff / q:.1f} independent pair(s) per run; the interval rests on the {q} runs"
        )
    if q < len(use):
        notes.append(
            f"{len(use) - q} run(s) whose x or y is fully explained by the controls within the run give no "
            "correlation of their own"
        )
    if q == 0:
        out.update(r_within=math.nan)
    if status == 2 and q >= inf.MIN_RUNS:
        notes.append(
            f"descriptive: the {q} runs' correlations are all {out['r_within']:+.3f} (e.g. two series "
            "monotone in every run); with no spread across runs there is no interval and no p-value"
        )
    elif status == 2 and q == 0:
        notes.append("descriptive: no run has a correlation of its own; no interval, no p-value")
    elif status == 2:
        why = (
            "Kendall's tau has no effective-n interval"
            if method == "kendall"
            else f"the persistence φ = {max(phx, phy):.2f} is above {inf.MAX_PHI}"
            if max(phx, phy) > inf.MAX_PHI
            else f"ν = n_eff − (runs − 1) − k − 3 = {out['df']:.1f} is below {inf.MIN_NU}"
        )
        notes.append(
            f"descriptive: {q} run(s) with a correlation of their own (run-level inference needs "
            f"{inf.MIN_RUNS}) and {why}; no interval, no p-value"
        )
    if not interval:
        out.update(ci_low=math.nan, ci_high=math.nan)
    out["note"] = "; ".join(notes)
    return out


def correlate(
    x,
    y,
    method: str = "pearson",
    n_boot: int = 2000,
    seed: int = 0,
    groups=None,
    n_perm: int = 2000,
    block_len: int | None = None,
) -> Correlation:
    """Correlation between two per-checkpoint series (module docstring for the inference).

    ``x``, ``y``: equal-length sequences [n], or pandas Series (aligned on their index when
    ``groups`` is None). ``groups``: run label per point [n] (None: one run, i.e. one time series).
    Pairs with a NaN on either side are excluded and counted. ``n_boot`` = 0 leaves the interval
    out; otherwise ``n_boot``, ``seed``, ``n_perm`` and ``block_len`` are accepted for callers of
    the earlier resampling inference and do not change the result (the inference is closed-form).
    Cost: O(n) (Kendall: O(n log n) per run). Raises :class:`AnalysisError` with fewer than 3 usable
    pairs or a constant series.
    """
    from scipy import stats

    check_method(method)
    if groups is None:
        x, y = align_pair(x, y)
    xa, ya = as_1d(x, "x"), as_1d(y, "y")
    if xa.shape != ya.shape:
        raise AnalysisError(f"x and y have different lengths ({xa.size} vs {ya.size})")
    keep = np.isfinite(xa) & np.isfinite(ya)
    g = _groups(groups, keep, xa.size)
    n_excl = int((~keep).sum())
    xa, ya = xa[keep], ya[keep]
    n = int(xa.size)
    too_few(n, 3, "a correlation")
    if np.ptp(xa) == 0 or np.ptp(ya) == 0:
        raise AnalysisError(
            f"{'x' if np.ptp(xa) == 0 else 'y'} is constant over the {n} checkpoints; its correlation is undefined"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = {"pearson": stats.pearsonr, "spearman": stats.spearmanr, "kendall": stats.kendalltau}[method](xa, ya)
    w = _within(xa, ya, None, g, method, interval=bool(n_boot))
    return Correlation(
        r=float(ref.statistic),
        n=n,
        n_excluded=n_excl,
        method=method,
        n_runs=len(run_index(g, n)),
        p_iid=float(ref.pvalue),
        **w,
    )


def _residualise(v: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """Residual of v [n] after least squares on [1, Z] (Z [n, k])."""
    A = np.column_stack([np.ones(v.shape[0]), Z])
    coef, *_ = np.linalg.lstsq(A, v, rcond=None)
    return v - A @ coef


def _partial_inputs(x, y, covariates, groups):
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    if pd is not None and isinstance(x, pd.Series) and isinstance(y, pd.Series) and groups is None:
        frame = pd.concat([x.rename("__x"), y.rename("__y")], axis=1, join="inner")
        if isinstance(covariates, (pd.Series, pd.DataFrame)):
            cov = covariates.to_frame() if isinstance(covariates, pd.Series) else covariates
            frame = frame.join(cov, how="left")
            names = tuple(map(str, cov.columns))
            Z = frame[list(cov.columns)].to_numpy(float)
        else:
            Z, names = covariate_matrix(covariates, len(frame))
        return frame["__x"].to_numpy(float), frame["__y"].to_numpy(float), Z, names
    xa, ya = as_1d(x, "x"), as_1d(y, "y")
    Z, names = covariate_matrix(covariates, xa.size)
    return xa, ya, Z, names


def partial_correlation(
    x,
    y,
    covariates,
    method: str = "pearson",
    n_boot: int = 2000,
    seed: int = 0,
    groups=None,
    n_perm: int = 2000,
    block_len: int | None = None,
) -> Correlation:
    """Correlation of x and y controlling for ``covariates`` (linear least squares, with intercept).

    ``covariates``: [n] or [n, k] array, a pandas Series/DataFrame, or ``{name: [n] values}``.
    ``method``: 'pearson' (on the values) or 'spearman' (ranks first: pooled ranks for ``r``,
    within-run ranks for ``r_within``). ``r`` = Pearson r of the two residual vectors on [1, Z]
    pooled; ``r_within`` and its inference residualise x and y on the covariates *within each run*
    (own intercept and slopes), so a control shared by the runs (an LR schedule) is removed where
    it acts. ``p_iid``: the t-test with dof = n − 2 − k (independent rows assumed). Other arguments
    as in :func:`correlate`. Rows with a NaN anywhere are excluded and counted. Needs n ≥ k + 3.
    Cost: O(n · k²).
    """
    from scipy import stats

    if method not in ("pearson", "spearman"):
        raise AnalysisError(f"partial correlation supports 'pearson' and 'spearman', got {method!r}")
    xa, ya, Z, names = _partial_inputs(x, y, covariates, groups)
    if xa.shape != ya.shape or Z.shape[0] != xa.size:
        raise AnalysisError(
            f"x, y and covariates need the same number of checkpoints ({xa.size}, {ya.size}, {Z.shape[0]})"
        )
    k = Z.shape[1]
    keep = np.isfinite(xa) & np.isfinite(ya) & np.isfinite(Z).all(axis=1)
    g = _groups(groups, keep, xa.size)
    n_excl = int((~keep).sum())
    xa, ya, Z = xa[keep], ya[keep], Z[keep]
    n = int(xa.size)
    too_few(n, k + 3, f"a partial correlation on {k} covariate{'s' if k != 1 else ''}")
    xr, yr, Zr = xa, ya, Z
    if method == "spearman":
        from scipy.stats import rankdata

        xr, yr = rankdata(xa), rankdata(ya)
        Zr = np.column_stack([rankdata(Z[:, j]) for j in range(k)]) if k else Z
    rx, ry = _residualise(xr, Zr), _residualise(yr, Zr)
    scale = max(np.abs(xr).max(), np.abs(yr).max(), 1.0)
    if np.abs(rx).max() <= 1e-12 * scale or np.abs(ry).max() <= 1e-12 * scale:
        raise AnalysisError("x or y is fully explained by the covariates; the partial correlation is undefined")
    r = float(_pearson_rows(rx[None], ry[None])[0])
    dof = n - 2 - k
    t = r * math.sqrt(dof / max(1e-300, 1 - r * r))
    p_iid = float(2 * stats.t.sf(abs(t), dof))
    w = _within(xa, ya, Z, g, method, interval=bool(n_boot))
    return Correlation(
        r=r,
        n=n,
        n_excluded=n_excl,
        method=method,
        covariates=tuple(names),
        n_runs=len(run_index(g, n)),
        p_iid=p_iid,
        **w,
    )
