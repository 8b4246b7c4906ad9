"""Correlations across checkpoints that respect their dependence, and partial correlations
(docs/science.md §6).

* :func:`correlate` — Pearson, Spearman or Kendall r over the pooled checkpoints, with

  - a 95% interval from a **circular-block bootstrap within runs** (blocks of ``block_len``
    consecutive checkpoints of one run, chosen from the lag-1 autocorrelation and recorded;
    :func:`~.dependence.block_length`);
  - a two-sided **permutation p-value from circular shifts within runs**: y's series of each run
    is rotated against x's by an offset of its own, which keeps every run's autocorrelation and
    breaks only the alignment of x and y (all ∏ n_r arrangements when there are at most
    ``n_perm``, else ``n_perm`` random ones);
  - **n_eff**, Bartlett's effective sample size, next to n.

* :func:`partial_correlation` — r between the residuals of x and y after least squares on the
  covariates (with intercept; on ranks for Spearman); the same interval (rows resampled together),
  a Freedman–Lane permutation test (y's residuals rotated within runs, then residualised again)
  and n_eff of the residuals.

The runs are given by ``groups`` (one label per point; None = one run); within a run the given
order is time order. Without an honest p-value — fewer than
:data:`~.dependence.MIN_PERMUTATIONS` shift arrangements — ``p`` is NaN and ``inference`` is
'descriptive'; with a median run shorter than 4 checkpoints the interval is NaN too. The interval
and the p-value are conditional on the runs observed: they describe how the checkpoints within
those runs could have fallen, not how another run would (with a handful of runs, run-to-run
variation cannot be estimated). ``p_iid`` keeps the textbook p-value (scipy; pairs assumed
independent) for comparison only.

Missing values: a pair with a NaN on either side (or in a covariate) is excluded from every
statistic and counted in ``n_excluded``; values are never imputed or averaged in.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np

from .dependence import (MIN_PERMUTATIONS, block_bootstrap_indices, block_length, circular_shifts, effective_n,
                         run_index, shift_combinations)
from .inputs import AnalysisError, align_pair, as_1d, check_method, covariate_matrix, too_few

__all__ = ["Correlation", "correlate", "partial_correlation", "DEPENDENT", "DESCRIPTIVE"]

#: ``inference`` of a correlation with a block-bootstrap interval and a circular-shift p-value.
DEPENDENT = "block bootstrap + circular shifts"
#: ``inference`` of a correlation without an honest p-value (too few arrangements).
DESCRIPTIVE = "descriptive"
MIN_RUN_FOR_INTERVAL = 4
"""Median run length below which no block-bootstrap interval is given (fewer than 2 blocks of 2)."""


@dataclass(frozen=True)
class Correlation:
    """A correlation coefficient with a dependence-aware p-value and 95% interval.

    ``n``: pairs used; ``n_excluded``: pairs dropped because of a NaN; ``n_eff``: effective sample
    size (≤ n); ``n_runs``: runs; ``block_len``: circular-block length used (``block_rule``: what
    the autocorrelation asked for, ``lag1``: the lag-1 autocorrelation it came from);
    ``n_boot_failed``: bootstrap resamples with an undefined r, excluded from the interval;
    ``n_perm``: shift arrangements compared (``p_exact``: all of them); ``p_iid``: scipy's p
    assuming independent pairs (for comparison only); ``inference``: :data:`DEPENDENT` or
    :data:`DESCRIPTIVE` (no honest p-value: ``p`` is NaN); ``note``: why something is descriptive, missing or capped;
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
    n_eff: float = math.nan
    n_runs: int = 1
    block_len: int = 1
    block_rule: int = 1
    lag1: float = math.nan
    n_perm: int = 0
    p_exact: bool = False
    p_iid: float = math.nan
    inference: str = DEPENDENT
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        ctrl = f" | {', '.join(self.covariates)}" if self.covariates else ""
        p = f"p = {self.p:.3g}" if math.isfinite(self.p) else "p: descriptive"
        return (f"{self.method}{ctrl}: r = {self.r:+.3f} [{self.ci_low:+.3f}, {self.ci_high:+.3f}], {p}, "
                f"n = {self.n} (n_eff {self.n_eff:.1f}, {self.n_runs} run{'s' if self.n_runs != 1 else ''}, "
                f"block {self.block_len})" + (f" ({self.n_excluded} excluded: NaN)" if self.n_excluded else "")
                + (f"; {self.note}" if self.note else ""))


# --------------------------------------------------------------------------- row statistics
def _rank_rows(A: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(A, axis=-1)


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


def _stat_rows(X: np.ndarray, Y: np.ndarray, method: str) -> np.ndarray:
    if method == "pearson":
        return _pearson_rows(X, Y)
    if method == "spearman":
        return _pearson_rows(_rank_rows(X), _rank_rows(Y))
    from scipy.stats import kendalltau

    X, Y = np.broadcast_arrays(X, Y)
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


def _perm_p(r: float, null: np.ndarray, exact: bool) -> float:
    """Two-sided p of ``r`` against the shift distribution ``null`` (exact: it holds the identity)."""
    null = null[np.isfinite(null)]
    hits = int(np.sum(np.abs(null) >= abs(r) - 1e-12))
    if exact:
        return hits / max(1, null.size)
    return (1 + hits) / (1 + null.size)


# --------------------------------------------------------------------------- the plan of one statistic
@dataclass
class _Plan:
    """Runs, block length and the notes of one correlation (shared by plain and partial)."""

    runs: list
    order: np.ndarray
    block_len: int
    block_rule: int
    lag1: float
    n_eff: float
    interval: bool
    test: bool
    notes: list


def _plan(u: np.ndarray, v: np.ndarray, groups, block_len: int | None, n_boot: int) -> _Plan:
    """``u``, ``v``: the two series whose dependence matters (values or residuals), [n]."""
    runs = run_index(groups, len(u))
    order = np.concatenate(runs)
    rule, lag1 = block_length(u, v, runs)
    lengths = sorted(len(r) for r in runs)
    m_med = int(np.median(lengths))
    notes = []
    interval = bool(n_boot) and m_med >= MIN_RUN_FOR_INTERVAL
    if n_boot and not interval:
        notes.append(f"no interval: the median run has {m_med} checkpoint(s), fewer than {MIN_RUN_FOR_INTERVAL} "
                     "(no blocks to resample)")
    if block_len is None:
        cap = max(1, m_med // 2)
        used = min(rule, cap)
        if interval and rule > cap:
            notes.append(f"block length {rule} from the lag-1 autocorrelation {lag1:.2f} exceeds half the median run "
                         f"({m_med}); capped at {cap}, so the interval is likely too narrow")
    else:
        used = int(block_len)
        if used < 1:
            raise AnalysisError(f"block_len must be >= 1, got {block_len}")
    combos = shift_combinations(runs)
    test = combos >= MIN_PERMUTATIONS
    if not test:
        notes.append(f"descriptive: only {combos} circular-shift arrangement(s) of {len(runs)} run(s) of "
                     f"{'/'.join(map(str, lengths))} checkpoints, fewer than {MIN_PERMUTATIONS}; no honest p-value")
    return _Plan(runs, order, used, rule, lag1, effective_n(u, v, runs), interval, test, notes)


def _groups(groups, keep: np.ndarray, n_all: int):
    if groups is None:
        return None
    g = np.asarray(groups, dtype=object)
    if g.shape != (n_all,):
        raise AnalysisError(f"groups needs one run label per checkpoint ({n_all}), got shape {g.shape}")
    return g[keep]


def _finish(r, p_iid, plan: _Plan, lo, hi, failed, null, exact, n, n_excl, method, n_boot, names=()) -> Correlation:
    p = _perm_p(r, null, exact) if plan.test else math.nan
    return Correlation(r, p, lo, hi, n, n_excl, method, int(n_boot), failed, tuple(names), plan.n_eff, len(plan.runs),
                       plan.block_len, plan.block_rule, plan.lag1, int(null.size) if plan.test else 0, bool(exact and plan.test),
                       p_iid, DEPENDENT if plan.test else DESCRIPTIVE, "; ".join(plan.notes))


# --------------------------------------------------------------------------- correlation
def correlate(x, y, method: str = "pearson", n_boot: int = 2000, seed: int = 0, groups=None, n_perm: int = 2000,
              block_len: int | None = None) -> Correlation:
    """Correlation between two per-checkpoint series (module docstring for the inference).

    ``x``, ``y``: equal-length sequences [n], or pandas Series (aligned on their index when
    ``groups`` is None). ``groups``: run label per point [n] (None: one run, i.e. one time series).
    Pairs with a NaN on either side are excluded and counted. ``n_boot``: block-bootstrap resamples
    (0 skips the interval); ``n_perm``: circular-shift arrangements (all of them when there are
    fewer); ``block_len``: force a block length (default: from the autocorrelation).
    ``numpy.random.default_rng(seed)`` draws the resamples first, then the shifts.
    Cost: O((n_boot + n_perm) · n) (Kendall: that many scipy calls). Memory: [n_boot or n_perm, n] floats.
    Raises :class:`AnalysisError` with fewer than 3 usable pairs or a constant series.
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
        raise AnalysisError(f"{'x' if np.ptp(xa) == 0 else 'y'} is constant over the {n} checkpoints; its correlation is undefined")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = {"pearson": stats.pearsonr, "spearman": stats.spearmanr, "kendall": stats.kendalltau}[method](xa, ya)
    r, p_iid = float(ref.statistic), float(ref.pvalue)
    ux, uy = (_rank_rows(xa), _rank_rows(ya)) if method != "pearson" else (xa, ya)
    plan = _plan(ux, uy, g, block_len, n_boot)
    rng = np.random.default_rng(seed)
    lo = hi = math.nan
    failed = 0
    if plan.interval:
        idx = block_bootstrap_indices(plan.runs, plan.block_len, int(n_boot), rng)
        lo, hi, failed = _percentile_ci(_stat_rows(xa[idx], ya[idx], method))
    null, exact = np.empty(0), False
    if plan.test:
        idx, exact = circular_shifts(plan.runs, int(n_perm), rng)
        xo = xa[plan.order]
        if method == "kendall":
            null = _stat_rows(xo[None, :], ya[idx], method)
        else:  # ranks of a rearranged y are the rearranged ranks
            null = _pearson_rows(ux[plan.order][None, :], uy[idx])
    return _finish(r, p_iid, plan, lo, hi, failed, null, exact, n, n_excl, method, n_boot)


def _residualise(v: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """Residual of v [n] (or rows of v [b, n]) after least squares on [1, Z] (Z [n, k] or [b, n, k])."""
    if v.ndim == 1:
        A = np.column_stack([np.ones(v.shape[0]), Z])
        coef, *_ = np.linalg.lstsq(A, v, rcond=None)
        return v - A @ coef
    # rows: centre and scale each covariate (the residual on [1, Z] does not change), then the
    # normal equations of a well-conditioned [b, n, k+1] design (lstsq per row is ~20x slower)
    Zc = Z - Z.mean(axis=-2, keepdims=True)
    sd = np.sqrt((Zc * Zc).mean(axis=-2, keepdims=True))
    Zc = Zc / np.where(sd > 0, sd, 1.0)
    A = np.concatenate([np.ones(Z.shape[:-1] + (1,)), Zc], axis=-1)  # [b, n, k+1]
    At = np.swapaxes(A, -1, -2)
    G = At @ A
    rhs = At @ v[..., None]
    try:
        coef = np.linalg.solve(G, rhs)
    except np.linalg.LinAlgError:  # a resample with a constant covariate: fall back to the pseudo-inverse
        coef = np.linalg.pinv(A) @ v[..., None]
    return v - (A @ coef)[..., 0]


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


def partial_correlation(x, y, covariates, method: str = "pearson", n_boot: int = 2000, seed: int = 0, groups=None,
                        n_perm: int = 2000, block_len: int | None = None) -> Correlation:
    """Correlation of x and y controlling for ``covariates`` (linear least squares, with intercept).

    ``covariates``: [n] or [n, k] array, a pandas Series/DataFrame, or ``{name: [n] values}``.
    ``method``: 'pearson' (on the values) or 'spearman' (everything replaced by ranks first).
    r = Pearson r of the two residual vectors. Interval: circular-block bootstrap within runs of the
    rows (x, y, covariates together; residualised again in every resample). p: Freedman–Lane —
    y's residuals rotated within runs, residualised on the covariates again, correlated with x's
    residuals. Block length and n_eff from the residuals. ``p_iid``: the t-test with
    dof = n − 2 − k (independent rows assumed). ``groups``, ``n_perm``, ``block_len``, ``seed``: as
    in :func:`correlate`. Rows with a NaN anywhere are excluded and counted. Needs n ≥ k + 3.
    Cost: O((n_boot + n_perm) · n · k²) for the least squares of the resamples and shifts.
    """
    from scipy import stats

    if method not in ("pearson", "spearman"):
        raise AnalysisError(f"partial correlation supports 'pearson' and 'spearman', got {method!r}")
    xa, ya, Z, names = _partial_inputs(x, y, covariates, groups)
    if xa.shape != ya.shape or Z.shape[0] != xa.size:
        raise AnalysisError(f"x, y and covariates need the same number of checkpoints ({xa.size}, {ya.size}, {Z.shape[0]})")
    k = Z.shape[1]
    keep = np.isfinite(xa) & np.isfinite(ya) & np.isfinite(Z).all(axis=1)
    g = _groups(groups, keep, xa.size)
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
    p_iid = float(2 * stats.t.sf(abs(t), dof))
    plan = _plan(rx, ry, g, block_len, n_boot)
    rng = np.random.default_rng(seed)
    lo = hi = math.nan
    failed = 0
    if plan.interval:
        idx = block_bootstrap_indices(plan.runs, plan.block_len, int(n_boot), rng)
        X, Y, ZZ = xa[idx], ya[idx], Z[idx]
        if method == "spearman":
            X, Y = _rank_rows(X), _rank_rows(Y)
            ZZ = np.stack([_rank_rows(ZZ[..., j]) for j in range(k)], axis=-1) if k else ZZ
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            boot = _pearson_rows(_residualise(X, ZZ), _residualise(Y, ZZ))
        lo, hi, failed = _percentile_ci(boot)
    null, exact = np.empty(0), False
    if plan.test:
        idx, exact = circular_shifts(plan.runs, int(n_perm), rng)
        Q, _ = np.linalg.qr(np.column_stack([np.ones(n), Z])[plan.order])  # [n, k+1], spans [1, Z] (full rank:
        Ys = ry[idx]                                                          # the residuals are not all zero)
        null = _pearson_rows(rx[plan.order][None, :], Ys - (Ys @ Q) @ Q.T)
    return _finish(r, p_iid, plan, lo, hi, failed, null, exact, n, n_excl, method, n_boot, names)
