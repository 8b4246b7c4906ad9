"""Batch weights: how a loss over several batches is averaged (by :class:`~geometry.operators.hessian.HessianOperator`
and :func:`~geometry.surfaces.surface.evaluate_surface` alike).

The mean loss over batches b_1..b_n is Σ_i w_i L(b_i) with weights normalised to sum 1; by default
w_i is the batch size (an example-weighted mean, equal to the token-weighted mean for equal-shaped
LM batches).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch


def default_batch_weight(batch: Any) -> float:
    """Default weight of a batch: ``batch.shape[0]`` for a tensor, the first element's
    ``shape[0]`` for a tuple/list starting with a tensor (``(inputs, targets)``), else 1."""
    if isinstance(batch, torch.Tensor):
        return float(batch.shape[0]) if batch.ndim else 1.0
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor) and batch[0].ndim:
        return float(batch[0].shape[0])
    return 1.0


def raw_batch_weights(batches: Sequence[Any], weights: Sequence[float] | None = None,
                      error: type[Exception] = ValueError) -> list[float]:
    """One unnormalised weight per batch (default: :func:`default_batch_weight` of each), checked:
    raises ``error`` when the count does not match the batches or a weight is negative or not finite."""
    raw = [default_batch_weight(b) for b in batches] if weights is None else [float(w) for w in weights]
    if len(raw) != len(batches):
        raise error(f"got {len(raw)} weights for {len(batches)} batches")
    if any(not math.isfinite(w) or w < 0 for w in raw):
        raise error(f"batch weights must be finite and non-negative, got {raw}")
    return raw


def normalise_batch_weights(batches: Sequence[Any], weights: Sequence[float] | None = None,
                            error: type[Exception] = ValueError) -> tuple[float, ...]:
    """One weight per batch, normalised to sum 1 (default: :func:`default_batch_weight` of each).

    Raises ``error`` (the caller's exception class) when the count does not match the batches,
    a weight is negative or not finite, or the weights sum to zero.
    """
    raw = raw_batch_weights(batches, weights, error)
    total = sum(raw)
    if total <= 0:
        raise error("batch weights sum to zero")
    return tuple(w / total for w in raw)
