"""Argument checks shared by the estimators (one message style for every bad input)."""

from __future__ import annotations

import functools
from typing import Callable, Mapping, TypeVar

import numpy as np
import torch

from losslens.geometry.base._linalg import sharded_vectors
from losslens.geometry.operators.interface import CurvatureOperator, is_finite
from losslens.geometry.base.results import EstimatorError

F = TypeVar("F", bound=Callable)


def on_operator_vectors(fn: F) -> F:
    """Decorate an estimator ``fn(op, ...)`` that supports sharded operators: it runs with the
    operator's ``ShardLayout`` (``losslens.geometry.base._linalg``) in force (``op.layout``; None for whole
    vectors), so its inner products, norms, Gram matrices and random probes are those of the global
    vectors on every rank (docs/science.md §4, "Sharded vectors")."""

    @functools.wraps(fn)
    def run(op, *args, **kwargs):
        with sharded_vectors(getattr(op, "layout", None)):
            return fn(op, *args, **kwargs)

    return run  # type: ignore[return-value]


def refuse_sharded(op, what: str) -> None:
    """Raise in one line when ``op`` holds sharded vectors and ``what`` does not support them."""
    if getattr(op, "layout", None) is not None:
        raise EstimatorError(
            f"{what} does not run on sharded operators yet (FSDP2): use hutchinson_trace, hutchpp_trace "
            "or top_eigenvalues (power, lanczos), or an unsharded operator"
        )


def check_op(op) -> None:
    """Raise unless ``op`` is a :class:`~losslens.geometry.operators.interface.CurvatureOperator`."""
    if not isinstance(op, CurvatureOperator):
        raise EstimatorError(
            f"op must be a CurvatureOperator (e.g. HessianOperator, DenseOperator), got {type(op).__name__}"
        )


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
