"""Input handling shared by the statistics: numeric 1-D series, alignment, covariates, and
:class:`AnalysisError` (too few points, unknown series, unusable input)."""

from __future__ import annotations

import numbers
from typing import Mapping

import numpy as np

from losslens.geometry.base.errors import LosslensError

__all__ = [
    "AnalysisError",
    "as_1d",
    "align_pair",
    "covariate_matrix",
    "check_method",
    "check_n_boot",
    "too_few",
    "METHODS",
    "MIN_BOOT",
]

METHODS = ("pearson", "spearman", "kendall")
MIN_BOOT = 40
"""Fewest bootstrap resamples for a 95% percentile interval: below 40 its 2.5% / 97.5% quantiles
are the smallest / largest resample, not an interval estimate."""


class AnalysisError(LosslensError, ValueError):
    """Too few points, unknown series name, or otherwise unusable input for a statistic."""


def as_1d(x, name: str) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise AnalysisError(f"{name} must be numeric, got {type(x).__name__}: {exc}") from exc
    if a.ndim != 1:
        raise AnalysisError(f"{name} must be one-dimensional, got shape {a.shape}")
    return a


def align_pair(x, y):
    """Align two pandas Series on their index (inner join); anything else must have equal length."""
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    if pd is not None and isinstance(x, pd.Series) and isinstance(y, pd.Series) and not x.index.equals(y.index):
        j = pd.concat([x.rename("x"), y.rename("y")], axis=1, join="inner")
        return j["x"].to_numpy(float), j["y"].to_numpy(float)
    return x, y


def covariate_matrix(covariates, n: int) -> tuple[np.ndarray, tuple[str, ...]]:
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
        cols = [as_1d(covariates[k], f"covariate {k!r}") for k in names]
        return np.column_stack(cols) if cols else np.empty((n, 0)), tuple(map(str, names))
    Z = np.asarray(covariates, dtype=float)
    if Z.ndim == 1:
        Z = Z[:, None]
    if Z.ndim != 2:
        raise AnalysisError(f"covariates must be [n] or [n, k], got shape {Z.shape}")
    if Z.shape[0] != n and Z.shape[1] == n:
        Z = Z.T
    return Z, tuple(f"z{i}" for i in range(Z.shape[1]))


def check_method(method: str) -> str:
    if method not in METHODS:
        raise AnalysisError(f"unknown correlation method {method!r}; valid: {', '.join(METHODS)}")
    return method


def check_n_boot(n_boot, minimum: int = MIN_BOOT) -> int:
    """``n_boot`` as an int, or :class:`AnalysisError` when it is not an integer >= ``minimum``
    (the API accepts 0 = no interval; the CLI asks for at least :data:`MIN_BOOT`)."""
    if isinstance(n_boot, bool) or not isinstance(n_boot, numbers.Integral):
        raise AnalysisError(f"n_boot must be an integer, got {n_boot!r}")
    n = int(n_boot)
    if n < minimum:
        why = (
            f"; a 95% percentile interval needs at least {MIN_BOOT} resamples (2000 is the default)"
            if minimum == MIN_BOOT
            else ""
        )
        raise AnalysisError(f"n_boot must be >= {minimum}, got {n}{why}")
    return n


def too_few(n: int, need: int, what: str, usable: str = "finite values on both series") -> None:
    if n < need:
        if n <= 1 and "correlation" in what:
            raise AnalysisError(
                f"a trajectory of {n} checkpoint{'s' if n != 1 else ''} cannot be correlated; "
                f"{what} needs at least {need} checkpoints with {usable}"
            )
        raise AnalysisError(f"only {n} checkpoint{'s' if n != 1 else ''} with {usable}; {what} needs at least {need}")
