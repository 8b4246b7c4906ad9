"""Argument checks shared by the estimators (one message style for every bad input)."""
from __future__ import annotations

import numpy as np

from .operator import CurvatureOperator
from .results import EstimatorError


def check_op(op) -> None:
    """Raise unless ``op`` is a :class:`~geometry.operator.CurvatureOperator`."""
    if not isinstance(op, CurvatureOperator):
        raise EstimatorError(f"op must be a CurvatureOperator (e.g. HessianOperator, DenseOperator), got {type(op).__name__}")


def check_int(name: str, value, minimum: int) -> int:
    """``value`` as an int ≥ ``minimum``; bools, floats and smaller values raise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise EstimatorError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise EstimatorError(f"{name} must be >= {minimum}, got {value}")
    return int(value)
