"""Statistics along a trajectory (SCIENCE.md §6): correlations, partial correlations, phases.

Inputs are per-checkpoint series. :func:`series` pulls one out of the tidy results DataFrame of
:meth:`probes.sweep.Store.results` (index: checkpoint label, in trajectory order; derived LAWA
checkpoints are left out by default because they are not points *along* the trajectory).

* :func:`correlate` — Pearson, Spearman or Kendall r with its scipy p-value and a percentile
  bootstrap 95% interval (pairs resampled with replacement, ``n_boot`` resamples, seeded).
* :func:`partial_correlation` — r between the residuals of x and y after least-squares regression
  on the covariates (with intercept); the Spearman version does the same on ranks. p from a t-test
  with n − 2 − k degrees of freedom; bootstrap interval as above.
* :func:`convergence_onset`, :func:`divergence_onset`, :func:`detect_phases` — seed 004's phases.
* :func:`summary` — a table of correlations (plain and partial) for several x/y pairs.

Missing values: a pair with a NaN on either side (or in a covariate) is excluded from every
statistic and counted in ``n_excluded``; values are never imputed or averaged in.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

METHODS = ("pearson", "spearman", "kendall")
CHECKPOINT_COLUMNS = ("step", "tokens", "lr")
_DEFAULT_METRIC = {"loss": "loss", "quant": "rel_loss_error", "trace": "trace", "eigen": "lambda_1",
                   "block_trace": "trace", "directional": "dHd", "kurtosis": "pooled"}
_ALIASES = {"lambda_max": ("eigen", None, "lambda_1"), "ppl": ("loss", None, "ppl"), "fp_loss": ("loss", None, "loss"),
            "kurtosis": ("kurtosis", None, "pooled"), "loss": ("loss", None, "loss"), "trace": ("trace", None, "trace"),
            "eigen": ("eigen", None, "lambda_1")}


class AnalysisError(ValueError):
    """Too few points, unknown series name, or otherwise unusable input for a statistic."""


# --------------------------------------------------------------------------- results
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


@dataclass(frozen=True)
class Onset:
    """A phase onset: the checkpoint index and step where it happens, and the LR there.

    ``found`` is False when no onset exists inside the trajectory (e.g. the loss still improves at
    the last checkpoint); ``details`` holds the fit (slopes, SSE, tolerance).
    """

    kind: str
    index: int | None
    step: float | None
    lr: float | None
    found: bool
    n: int
    n_excluded: int = 0
    details: Mapping[str, Any] | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["details"] = dict(self.details or {})
        return d


@dataclass(frozen=True)
class Phases:
    """FP-convergence onset and quantization-gap divergence onset of one trajectory."""

    convergence: Onset
    divergence: Onset

    def to_dict(self) -> dict:
        return {"convergence": self.convergence.to_dict(), "divergence": self.divergence.to_dict()}


# --------------------------------------------------------------------------- input handling
def _as_1d(x, name: str) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise AnalysisError(f"{name} must be numeric, got {type(x).__name__}: {exc}") from exc
    if a.ndim != 1:
        raise AnalysisError(f"{name} must be one-dimensional, got shape {a.shape}")
    return a


def _align(x, y):
    """Align two pandas Series on their index (inner join); anything else must have equal length."""
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    if pd is not None and isinstance(x, pd.Series) and isinstance(y, pd.Series) and not x.index.equals(y.index):
        j = pd.concat([x.rename("x"), y.rename("y")], axis=1, join="inner")
        return j["x"].to_numpy(float), j["y"].to_numpy(float)
    return x, y


def _covariate_matrix(covariates, n: int) -> tuple[np.ndarray, tuple[str, ...]]:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    if pd is not None and isinstance(covariates, pd.DataFrame):
        return covariates.to_numpy(float), tuple(map(str, covariates.columns))
    if pd is not None and isinstance(covariates, pd.Series):
        return covariates.to_numpy(float)[:, None], (str(covariates.name or "z"),)
    if isinstance(covariates, Mapping):
        names = tuple(covariates)
        cols = [_as_1d(covariates[k], f"covariate {k!r}") for k in names]
        return np.column_stack(cols) if cols else np.empty((n, 0)), tuple(map(str, names))
    Z = np.asarray(covariates, dtype=float)
    if Z.ndim == 1:
        Z = Z[:, None]
    if Z.ndim != 2:
        raise AnalysisError(f"covariates must be [n] or [n, k], got shape {Z.shape}")
    if Z.shape[0] != n and Z.shape[1] == n:
        Z = Z.T
    return Z, tuple(f"z{i}" for i in range(Z.shape[1]))


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise AnalysisError(f"unknown correlation method {method!r}; valid: {', '.join(METHODS)}")
    return method


def _too_few(n: int, need: int, what: str, usable: str = "finite values on both series") -> None:
    if n < need:
        if n <= 1 and "correlation" in what:
            raise AnalysisError(f"a trajectory of {n} checkpoint{'s' if n != 1 else ''} cannot be correlated; "
                                f"{what} needs at least {need} checkpoints with {usable}")
        raise AnalysisError(f"only {n} checkpoint{'s' if n != 1 else ''} with {usable}; {what} needs at least {need}")


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

    _check_method(method)
    x, y = _align(x, y)
    xa, ya = _as_1d(x, "x"), _as_1d(y, "y")
    if xa.shape != ya.shape:
        raise AnalysisError(f"x and y have different lengths ({xa.size} vs {ya.size})")
    keep = np.isfinite(xa) & np.isfinite(ya)
    n_excl = int((~keep).sum())
    xa, ya = xa[keep], ya[keep]
    n = int(xa.size)
    _too_few(n, 3, "a correlation")
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
            Z, names = _covariate_matrix(covariates, len(frame))
        xa, ya = frame["__x"].to_numpy(float), frame["__y"].to_numpy(float)
    else:
        xa, ya = _as_1d(x, "x"), _as_1d(y, "y")
        Z, names = _covariate_matrix(covariates, xa.size)
    if xa.shape != ya.shape or Z.shape[0] != xa.size:
        raise AnalysisError(f"x, y and covariates need the same number of checkpoints ({xa.size}, {ya.size}, {Z.shape[0]})")
    k = Z.shape[1]
    keep = np.isfinite(xa) & np.isfinite(ya) & np.isfinite(Z).all(axis=1)
    n_excl = int((~keep).sum())
    xa, ya, Z = xa[keep], ya[keep], Z[keep]
    n = int(xa.size)
    _too_few(n, k + 3, f"a partial correlation on {k} covariate{'s' if k != 1 else ''}")
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


# --------------------------------------------------------------------------- phases
def _xy(steps, values, lrs):
    s = _as_1d(steps, "steps")
    v = _as_1d(values, "values")
    if s.shape != v.shape:
        raise AnalysisError(f"steps and values have different lengths ({s.size} vs {v.size})")
    lr = None if lrs is None else _as_1d(lrs, "lrs")
    if lr is not None and lr.shape != s.shape:
        raise AnalysisError(f"lrs has length {lr.size}, steps {s.size}")
    if np.any(np.diff(s[np.isfinite(s)]) <= 0):
        raise AnalysisError("steps must be strictly increasing (one entry per checkpoint in trajectory order)")
    return s, v, lr


def convergence_onset(steps, loss, lrs=None, tol: float = 0.01, relative: bool = True) -> Onset:
    """FP-convergence onset: the first checkpoint after which the validation loss never improves by
    more than ``tol`` (relative to the loss there when ``relative``, else in nats).

    Index i qualifies when ``min(loss[i+1:]) >= loss[i] - tol_i``. The last checkpoint qualifies
    vacuously; ``found`` is False when it is the first to qualify (still improving at the end).
    NaN losses are excluded (counted) before the search.
    """
    s, v, lr = _xy(steps, loss, lrs)
    keep = np.isfinite(v) & np.isfinite(s)
    n_excl = int((~keep).sum())
    pos = np.flatnonzero(keep)
    s_k, v_k = s[keep], v[keep]
    n = int(v_k.size)
    _too_few(n, 2, "convergence-onset detection", "a finite loss")
    future_min = np.minimum.accumulate(v_k[::-1])[::-1]  # min of v[i:]
    for i in range(n):
        thr = tol * abs(v_k[i]) if relative else tol
        rest = future_min[i + 1] if i + 1 < n else math.inf
        if rest >= v_k[i] - thr:
            j = int(pos[i])
            return Onset("fp_convergence", j, float(s_k[i]), None if lr is None else float(lr[j]), i < n - 1, n, n_excl,
                         {"tol": tol, "relative": relative, "loss_at_onset": float(v_k[i]), "final_loss": float(v_k[-1])})
    raise AssertionError("unreachable")  # pragma: no cover


def _linfit_sse(x, y):
    A = np.column_stack([np.ones_like(x), x])
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(((A @ coef - y) ** 2).sum()), coef


def divergence_onset(steps, gap, lrs=None, min_points: int = 2, x_scale: str = "linear") -> Onset:
    """Divergence onset of the quantization gap: the changepoint of log(gap) against step.

    The best continuous two-segment piecewise-linear fit ``log gap ≈ a + b·x + c·max(0, x − x_k)``
    over every interior checkpoint x_k (at least ``min_points`` points on each side, counting x_k
    itself) is chosen by least squares; the onset is x_k. ``details`` gives the slope before (b) and
    after (b + c), the SSE of the fit and of a single line. ``x_scale='log'`` fits against log step.
    Non-positive or NaN gaps have no logarithm: they are excluded and counted in ``n_excluded``.
    """
    s, g, lr = _xy(steps, gap, lrs)
    keep = np.isfinite(g) & (g > 0) & np.isfinite(s)
    n_excl = int((~keep).sum())
    pos = np.flatnonzero(keep)
    x = s[keep]
    if x_scale == "log":
        if np.any(x <= 0):
            raise AnalysisError("x_scale='log' needs positive steps")
        x = np.log(x)
    elif x_scale != "linear":
        raise AnalysisError(f"x_scale must be 'linear' or 'log', got {x_scale!r}")
    y = np.log(g[keep])
    n = int(y.size)
    need = 2 * min_points + 1 if min_points >= 2 else 3
    _too_few(n, max(need, 4), "divergence-onset detection (two fitted segments)", "a finite positive gap")
    sse1, coef1 = _linfit_sse(x, y)
    best = None
    for k in range(min_points - 1, n - min_points + 1):
        if k <= 0 or k >= n - 1:
            continue
        A = np.column_stack([np.ones(n), x, np.maximum(0.0, x - x[k])])
        coef, *_ = np.linalg.lstsq(A, y, rcond=None)
        sse = float(((A @ coef - y) ** 2).sum())
        if best is None or sse < best[0] - 1e-15:
            best = (sse, k, coef)
    if best is None:
        raise AnalysisError(f"{n} points leave no interior changepoint with min_points={min_points}")
    sse, k, coef = best
    j = int(pos[k])
    details = {"slope_before": float(coef[1]), "slope_after": float(coef[1] + coef[2]), "sse": sse, "sse_one_line": sse1,
               "x_scale": x_scale, "gap_at_onset": float(g[j])}
    found = bool(coef[2] > 0)
    return Onset("gap_divergence", j, float(s[j]), None if lr is None else float(lr[j]), found, n, n_excl, details)


def detect_phases(df, loss: str = "loss", gap: str = "rtn:4", x: str = "step", tol: float = 0.01,
                  include_derived: bool = False) -> Phases:
    """Both onsets from a tidy results DataFrame: FP convergence of ``loss`` and divergence of
    ``gap`` (a quant spec → its rel_loss_error; any :func:`series` key works), with the LR at each."""
    cols = series_frame(df, [loss, gap, x, "lr"], include_derived=include_derived)
    steps = cols[x].to_numpy(float)
    if np.isnan(steps).any():
        keep = np.isfinite(steps)
        cols = cols[keep]
        steps = steps[keep]
    return Phases(convergence_onset(steps, cols[loss].to_numpy(float), cols["lr"].to_numpy(float), tol=tol),
                  divergence_onset(steps, cols[gap].to_numpy(float), cols["lr"].to_numpy(float)))


# --------------------------------------------------------------------------- tidy frame -> series
def _canonical_quant(key: str) -> str | None:
    try:
        from probes.quant import QuantSpec  # type: ignore

        return str(QuantSpec.parse(key))
    except Exception:
        return None


def _resolve(df, key: str) -> tuple[str | None, str | None, str]:
    """(probe, spec, metric) for a series key; probe None means a checkpoint column."""
    if key in CHECKPOINT_COLUMNS:
        return None, None, key
    if "/" in key:
        parts = key.split("/")
        if len(parts) == 3:
            return parts[0], parts[1] or None, parts[2]
        if len(parts) == 2:
            return parts[0], parts[1] or None, _DEFAULT_METRIC.get(parts[0], "")
        raise AnalysisError(f"series key {key!r}: use 'probe/spec/metric', e.g. 'quant/gptq:3:g128/ppl_gap'")
    if key in _ALIASES:
        return _ALIASES[key]
    probes = set(df["probe"].dropna().unique())
    metrics = df.loc[df["metric"].notna(), ["probe", "metric"]].drop_duplicates()
    hit = metrics[metrics["metric"] == key]
    if len(hit) == 1:
        return hit["probe"].iloc[0], None, key
    if len(hit) > 1:
        raise AnalysisError(f"metric {key!r} is measured by several probes ({sorted(hit['probe'])}); use 'probe/spec/metric'")
    if key in probes:
        return key, None, _DEFAULT_METRIC.get(key, "")
    qspecs = set(df.loc[df["probe"] == "quant", "spec"].unique())
    canon = _canonical_quant(key)
    for cand in (key, canon):
        if cand is not None and cand in qspecs:
            return "quant", cand, "rel_loss_error"
    valid = sorted(CHECKPOINT_COLUMNS) + sorted(set(_ALIASES) | probes | set(metrics["metric"])) + sorted(qspecs)
    raise AnalysisError(f"unknown series {key!r}; valid keys include: {', '.join(valid)} (or 'probe/spec/metric')")


def _run_qualified(df):
    """``df`` with checkpoint labels made unique across runs (``run/label``) when it holds several
    runs (a store of several trajectories shares labels such as ``step-000100``); unchanged otherwise."""
    if "run" not in df.columns or df["run"].nunique(dropna=False) <= 1:
        return df
    out = df.copy()
    out["checkpoint"] = out["run"].astype(str) + "/" + out["checkpoint"].astype(str)
    return out


def series(df, key: str, include_derived: bool = False):
    """One per-checkpoint series (pandas Series indexed by checkpoint label, trajectory order;
    ``run/label`` when the table holds several runs, which are then pooled).

    ``key``: a checkpoint column ('step', 'tokens', 'lr'); a probe ('loss', 'trace', 'eigen',
    'kurtosis' → its main metric; 'lambda_max' = lambda_1); a metric name measured by one probe
    ('ppl', 'lambda_2', 'q_loss' is ambiguous once several specs exist); a quantizer spec
    ('gptq:3:g128' → its rel_loss_error); or explicit 'probe/spec/metric'
    ('quant/rtn:4/ppl_gap', 'directional/rtn:4/dHd', 'block_trace/layer0/trace').
    Failed probes give NaN. Raises :class:`AnalysisError` for an unknown or ambiguous key.
    """
    import pandas as pd

    if df is None or len(df) == 0:
        raise AnalysisError("the results table is empty")
    df = _run_qualified(df)
    base = df if include_derived else df[~df["derived"].astype(bool)]
    order = list(dict.fromkeys(base["checkpoint"]))
    probe, spec, metric = _resolve(df, key)
    if probe is None:
        s = base.drop_duplicates("checkpoint").set_index("checkpoint")[metric].astype(float)
        return s.reindex(order).rename(key)
    sel = base[(base["probe"] == probe) & (base["metric"] == metric) & (base["status"] == "ok")]
    specs = list(dict.fromkeys(base.loc[base["probe"] == probe, "spec"]))
    if spec is not None:
        if spec not in specs:
            canon = _canonical_quant(spec)
            if canon in specs:
                spec = canon
            else:
                raise AnalysisError(f"probe {probe!r} has no spec {spec!r}; available: {specs}")
        sel = sel[sel["spec"] == spec]
    else:
        used = list(dict.fromkeys(sel["spec"]))
        if len(used) > 1:
            raise AnalysisError(f"{key!r} is ambiguous: probe {probe!r} has specs {used}; use '{probe}/<spec>/{metric}'")
    if sel.empty and not (base["probe"] == probe).any():
        raise AnalysisError(f"the results hold no {probe!r} probe")
    s = sel.drop_duplicates("checkpoint", keep="last").set_index("checkpoint")["value"].astype(float)
    return pd.Series(s.reindex(order).to_numpy(float), index=pd.Index(order, name="checkpoint"), name=key)


def series_frame(df, keys: Sequence[str], include_derived: bool = False):
    """Several :func:`series` side by side as a DataFrame (index: checkpoint)."""
    import pandas as pd

    return pd.concat([series(df, k, include_derived=include_derived) for k in dict.fromkeys(keys)], axis=1)


# --------------------------------------------------------------------------- summary table
def summary(df, x: str | Sequence[str] | None = None, y: str | Sequence[str] | None = None,
            controls: Sequence[str] | str | None = None, methods: Sequence[str] = ("pearson", "spearman"),
            n_boot: int = 2000, seed: int = 0, include_derived: bool = False):
    """Correlation table: one row per (x, y, method, controls) with r, CI, p, n, n_excluded.

    Defaults: x = every curvature/weight series present (trace, lambda_max, kurtosis); y = every
    quantizer spec present (its rel_loss_error). With ``controls`` each pair also gets a partial
    correlation row (Pearson/Spearman only). Pairs that cannot be computed (too few points,
    constant series) get a row with NaNs and the reason in ``note``.
    """
    import pandas as pd

    xs = _keys(x) if x is not None else [k for k, p in (("trace", "trace"), ("lambda_max", "eigen"), ("kurtosis", "kurtosis"))
                                         if (df["probe"] == p).any()]
    ys = _keys(y) if y is not None else list(dict.fromkeys(df.loc[df["probe"] == "quant", "spec"]))
    ctrl = _keys(controls) if controls else []
    rows = []
    for xk in xs:
        for yk in ys:
            for m in methods:
                variants = [()] + ([tuple(ctrl)] if ctrl and m != "kendall" else [])
                for cv in variants:
                    row = {"x": xk, "y": yk, "method": m, "controls": ",".join(cv)}
                    try:
                        frame = series_frame(df, [xk, yk, *cv], include_derived=include_derived)
                        if cv:
                            c = partial_correlation(frame[xk], frame[yk], frame[list(cv)], method=m, n_boot=n_boot, seed=seed)
                        else:
                            c = correlate(frame[xk], frame[yk], method=m, n_boot=n_boot, seed=seed)
                        row.update(r=c.r, ci_low=c.ci_low, ci_high=c.ci_high, p=c.p, n=c.n, n_excluded=c.n_excluded, note="")
                    except AnalysisError as exc:
                        row.update(r=math.nan, ci_low=math.nan, ci_high=math.nan, p=math.nan, n=0, n_excluded=0, note=str(exc))
                    rows.append(row)
    cols = ["x", "y", "method", "controls", "r", "ci_low", "ci_high", "p", "n", "n_excluded", "note"]
    return pd.DataFrame(rows, columns=cols)


def _keys(v) -> list[str]:
    if isinstance(v, str):
        return [v]
    return list(v)


__all__ = ["Correlation", "Onset", "Phases", "AnalysisError", "correlate", "partial_correlation", "convergence_onset",
           "divergence_onset", "detect_phases", "series", "series_frame", "summary", "METHODS"]
