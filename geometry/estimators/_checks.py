"""Argument checks shared by the estimators (one message style for every bad input)."""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from ..operators.interface import CurvatureOperator, is_finite
from ..base.results import EstimatorError


def check_op(op) -> None:
    """Raise unless ``op`` is a :class:`~geometry.operators.interface.CurvatureOperator`."""
    if not isinstance(op, CurvatureOperator):
        raise EstimatorError(f"op must be a CurvatureOperator (e.g. HessianOperator, DenseOperator), got {type(op).__name__}")


def check_int(name: str, value, minimum: int) -> int:
    """``value`` as an int ≥ ``minimum``; bools, floats and smaller values raise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise EstimatorError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise EstimatorError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def flat_direction(op: CurvatureOperator, direction: Mapping[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """``direction`` (a dict with exactly the keys of ``op.space``, or a flat ``[dim]`` tensor) as a
    flat ``[dim]`` tensor in the operator's dtype and device, checked finite."""
    if isinstance(direction, Mapping):
        if op.space is None:
            raise EstimatorError("a dict direction needs op.space to order its entries; pass a flat [dim] tensor")
        d = op.space.flatten({k: torch.as_tensor(v) for k, v in direction.items()})
    elif isinstance(direction, torch.Tensor):
        d = direction
    else:
        raise EstimatorError(f"direction must be a dict of tensors or a flat tensor, got {type(direction).__name__}")
    if d.ndim != 1 or d.shape[0] != op.dim:
        raise EstimatorError(f"direction has shape {tuple(d.shape)}; expected a flat [{op.dim}] vector")
    d = d.detach().to(device=op.device, dtype=op.dtype)
    if not is_finite(d):
        raise EstimatorError("direction contains NaN/Inf")
    return d
