"""Argument checks shared by the estimators (trace, eigen, density, directional)."""
from __future__ import annotations

import numpy as np

from .operator import CurvatureOperator
from .results import EstimatorError


def _check_op(op: CurvatureOperator) -> None:
    if not isinstance(op, CurvatureOperator):
        raise EstimatorError(f"op must be a CurvatureOperator (e.g. HessianOperator, DenseOperator), got {type(op).__name__}")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise EstimatorError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise EstimatorError(f"{name} must be >= {minimum}, got {value}")
    return int(value)
