"""Correlations with bootstrap intervals, and partial correlations (docs/science.md §6).

* :func:`correlate` — Pearson, Spearman or Kendall r with its scipy p-value and a percentile
  bootstrap 95% interval (pairs resampled with replacement, ``n_boot`` resamples, seeded).
* :func:`partial_correlation` — r between the residuals of x and y after least-squares regression
  on the covariates (with intercept); the Spearman version does the same on ranks. p from a t-test
  with n − 2 − k degrees of freedom; bootstrap interval as above.

Missing values: a pair with a NaN on either side (or in a covariate) is excluded from every
statistic and counted in ``n_excluded``; values are never imputed or averaged in.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np

from .inputs import AnalysisError, align_pair, as_1d, check_method, covariate_matrix, too_few

__all__ = ["Correlation", "correlate", "partial_correlation"]


@dataclass(frozen=True)
class Correlation:
    """A correlation coefficient with a two-sided p-value and a bootstrap 95% interval.

    ``n``: pairs used; ``n_excluded``: pairs dropped because of a NaN; ``n_boot_failed``: bootstrap
    resamples with an undefined r (e.g. a constant resample), excluded from the interval;
    ``covariates``: names of the controls for a partial correlation (empty otherwise).
    """

    r: float
    p: float
    ci_low: float
    ci_high: float
    n: int
    n_excluded: int
    method: str = "pearson"
    n_boot: int = 2000
    n_boot_failed: int = 0
    covariates: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        ctrl = f" | {', '.join(self.covariates)}" if self.covariates else ""
        return (f"{self.method}{ctrl}: r = {self.r:+.3f} [{self.ci_low:+.3f}, {self.ci_high:+.3f}], p = {self.p:.3g}, "
                f"n = {self.n}" + (f" ({self.n_excluded} excluded: NaN)" if self.n_excluded else ""))


# --------------------------------------------------------------------------- correlation
def _rank_rows(A: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(A, axis=-1)


def _pearson_rows(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair of X, Y [b, n] (NaN where a row is constant)."""
    Xc = X - X.mean(axis=-1, keepdims=True)
    Yc = Y - Y.mean(axis=-1, keepdims=True)
    num = (Xc * Yc).sum(-1)
    den = np.sqrt((Xc * Xc).sum(-1) * (Yc * Yc).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = num / den
    r[~(den > 1e-300 * max(1.0, float(np.abs(num).max(initial=0))))] = np.nan
    return np.clip(r, -1.0, 1.0)


def _stat_rows(X: np.ndarray, Y: np.ndarray, method: str) -> np.ndarray:
    if method == "pearson":
        return _pearson_rows(X, Y)
    if method == "spearman":
        return _pearson_rows(_rank_rows(X), _rank_rows(Y))
    from scipy.stats import kendalltau

    out = np.empty(X.shape[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(X.shape[0]):
            out[i] = kendalltau(X[i], Y[i]).statistic
    return out


def _percentile_ci(boot: np.ndarray, level: float = 0.95) -> tuple[float, float, int]:
    ok = boot[np.isfinite(boot)]
    failed = int(boot.size - ok.size)
    if ok.size == 0:
        return math.nan, math.nan, failed
    a = (1 - level) / 2
    lo, hi = np.quantile(ok, [a, 1 - a])
    return float(lo), float(hi), failed


def correlate(x, y, method: str = "pearson", n_boot: int = 2000, seed: int = 0) -> Correlation:
    """Correlation between two per-checkpoint series.

    ``x``, ``y``: equal-length sequences, or pandas Series (aligned on their index). Pairs with a
    NaN on either side are excluded and counted. r and p come from scipy.stats
    (pearsonr / spearmanr / kendalltau); the 95% interval is the percentile bootstrap over
    ``n_boot`` resamples of the pairs (``numpy.random.default_rng(seed)``; ``n_boot=0`` skips it).
    Raises :class:`AnalysisError` with fewer than 3 usable pairs or a constant series.
    """
    from scipy import stats

    check_method(method)
    x, y = align_pair(x, y)
    xa, ya = as_1d(x, "x"), as_1d(y, "y")
    if xa.shape != ya.shape:
        raise AnalysisError(f"x and y have different lengths ({xa.size} vs {ya.size})")
    keep = np.isfinite(xa) & np.isfinite(ya)
    n_excl = int((~keep).sum())
    xa, ya = xa[keep], ya[keep]
    n = int(xa.size)
    too_few(n, 3, "a correlation")
    if np.ptp(xa) == 0 or np.ptp(ya) == 0:
        raise AnalysisError(f"{'x' if np.ptp(xa) == 0 else 'y'} is constant over the {n} checkpoints; its correlation is undefined")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "pearson":
            res = stats.pearsonr(xa, ya)
        elif method == "spearman":
            res = stats.spearmanr(xa, ya)
        else:
            res = stats.kendalltau(xa, ya)
    r, p = float(res.statistic), float(res.pvalue)
    lo = hi = math.nan
    failed = 0
    if n_boot:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, n, size=(int(n_boot), n))
        boot = _stat_rows(xa[idx], ya[idx], method)
        lo, hi, failed = _percentile_ci(boot)
    return Correlation(r, p, lo, hi, n, n_excl, method, int(n_boot), failed)


def _residualise(v: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """Residual of v [n] (or rows of v [b, n]) after least squares on [1, Z] (Z [n, k] or [b, n, k])."""
    if v.ndim == 1:
        A = np.column_stack([np.ones(v.shape[0]), Z])
        coef, *_ = np.linalg.lstsq(A, v, rcond=None)
        return v - A @ coef
    A = np.concatenate([np.ones(Z.shape[:-1] + (1,)), Z], axis=-1)  # [b, n, k+1]
    pinv = np.linalg.pinv(A)  # [b, k+1, n]
    coef = pinv @ v[..., None]
    return v - (A @ coef)[..., 0]


def partial_correlation(x, y, covariates, method: str = "pearson", n_boot: int = 2000, seed: int = 0) -> Correlation:
    """Correlation of x and y controlling for ``covariates`` (linear least squares, with intercept).

    ``covariates``: [n] or [n, k] array, a pandas Series/DataFrame, or ``{name: [n] values}``.
    ``method``: 'pearson' (on the values) or 'spearman' (everything replaced by ranks first).
    r = Pearson r of the two residual vectors; p from t = r·sqrt(dof / (1 − r²)) with
    dof = n − 2 − k. Interval: percentile bootstrap over ``n_boot`` resamples of the rows.
    Rows with a NaN anywhere are excluded and counted. Needs n ≥ k + 3.
    """
    from scipy import stats

    if method not in ("pearson", "spearman"):
        raise AnalysisError(f"partial correlation supports 'pearson' and 'spearman', got {method!r}")
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    if pd is not None and isinstance(x, pd.Series) and isinstance(y, pd.Series):
        frame = pd.concat([x.rename("__x"), y.rename("__y")], axis=1, join="inner")
        if isinstance(covariates, (pd.Series, pd.DataFrame)):
            cov = covariates.to_frame() if isinstance(covariates, pd.Series) else covariates
            frame = frame.join(cov, how="left")
            names = tuple(map(str, cov.columns))
            Z = frame[list(cov.columns)].to_numpy(float)
        else:
            Z, names = covariate_matrix(covariates, len(frame))
        xa, ya = frame["__x"].to_numpy(float), frame["__y"].to_numpy(float)
    else:
        xa, ya = as_1d(x, "x"), as_1d(y, "y")
        Z, names = covariate_matrix(covariates, xa.size)
    if xa.shape != ya.shape or Z.shape[0] != xa.size:
        raise AnalysisError(f"x, y and covariates need the same number of checkpoints ({xa.size}, {ya.size}, {Z.shape[0]})")
    k = Z.shape[1]
    keep = np.isfinite(xa) & np.isfinite(ya) & np.isfinite(Z).all(axis=1)
    n_excl = int((~keep).sum())
    xa, ya, Z = xa[keep], ya[keep], Z[keep]
    n = int(xa.size)
    too_few(n, k + 3, f"a partial correlation on {k} covariate{'s' if k != 1 else ''}")
    if method == "spearman":
        from scipy.stats import rankdata

        xa, ya = rankdata(xa), rankdata(ya)
        Z = np.column_stack([rankdata(Z[:, j]) for j in range(k)]) if k else Z
    rx, ry = _residualise(xa, Z), _residualise(ya, Z)
    scale = max(np.abs(xa).max(), np.abs(ya).max(), 1.0)
    if np.abs(rx).max() <= 1e-12 * scale or np.abs(ry).max() <= 1e-12 * scale:
        raise AnalysisError("x or y is fully explained by the covariates; the partial correlation is undefined")
    r = float(_pearson_rows(rx[None], ry[None])[0])
    dof = n - 2 - k
    t = r * math.sqrt(dof / max(1e-300, 1 - r * r))
    p = float(2 * stats.t.sf(abs(t), dof))
    lo = hi = math.nan
    failed = 0
    if n_boot:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, n, size=(int(n_boot), n))
        X, Y, ZZ = xa[idx], ya[idx], Z[idx]
        if method == "spearman":
            X, Y = _rank_rows(X), _rank_rows(Y)
            ZZ = np.stack([_rank_rows(ZZ[..., j]) for j in range(k)], axis=-1) if k else ZZ
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            boot = _pearson_rows(_residualise(X, ZZ), _residualise(Y, ZZ))
        lo, hi, failed = _percentile_ci(boot)
    return Correlation(r, p, lo, hi, n, n_excl, method, int(n_boot), failed, names)
