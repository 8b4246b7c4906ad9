"""Phases of a trajectory (seed 004): FP-convergence onset and quantization-gap divergence onset."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from losslens.study.analysis.inputs import AnalysisError, as_1d, too_few
from losslens.study.analysis.series import series_frame

__all__ = ["Onset", "Phases", "convergence_onset", "divergence_onset", "detect_phases"]


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


def _xy(steps, values, lrs):
    s = as_1d(steps, "steps")
    v = as_1d(values, "values")
    if s.shape != v.shape:
        raise AnalysisError(f"steps and values have different lengths ({s.size} vs {v.size})")
    lr = None if lrs is None else as_1d(lrs, "lrs")
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
    too_few(n, 2, "convergence-onset detection", "a finite loss")
    future_min = np.minimum.accumulate(v_k[::-1])[::-1]  # min of v[i:]
    for i in range(n):
        thr = tol * abs(v_k[i]) if relative else tol
        rest = future_min[i + 1] if i + 1 < n else math.inf
        if rest >= v_k[i] - thr:
            j = int(pos[i])
            return Onset(
                "fp_convergence",
                j,
                float(s_k[i]),
                None if lr is None else float(lr[j]),
                i < n - 1,
                n,
                n_excl,
                {"tol": tol, "relative": relative, "loss_at_onset": float(v_k[i]), "final_loss": float(v_k[-1])},
            )
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
    too_few(n, max(need, 4), "divergence-onset detection (two fitted segments)", "a finite positive gap")
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
    details = {
        "slope_before": float(coef[1]),
        "slope_after": float(coef[1] + coef[2]),
        "sse": sse,
        "sse_one_line": sse1,
        "x_scale": x_scale,
        "gap_at_onset": float(g[j]),
    }
    found = bool(coef[2] > 0)
    return Onset("gap_divergence", j, float(s[j]), None if lr is None else float(lr[j]), found, n, n_excl, details)


def detect_phases(
    df, loss: str = "loss", gap: str = "rtn:4", x: str = "step", tol: float = 0.01, include_derived: bool = False
) -> Phases:
    """Both onsets from a tidy results DataFrame: FP convergence of ``loss`` and divergence of
    ``gap`` (a quant spec → its rel_loss_error; any :func:`series` key works), with the LR at each."""
    cols = series_frame(df, [loss, gap, x, "lr"], include_derived=include_derived)
    steps = cols[x].to_numpy(float)
    if np.isnan(steps).any():
        keep = np.isfinite(steps)
        cols = cols[keep]
        steps = steps[keep]
    return Phases(
        convergence_onset(steps, cols[loss].to_numpy(float), cols["lr"].to_numpy(float), tol=tol),
        divergence_onset(steps, cols[gap].to_numpy(float), cols["lr"].to_numpy(float)),
    )
