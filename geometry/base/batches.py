"""Batch weights: how a loss over several batches is averaged (by
:class:`~losslens.geometry.operators.hessian.HessianOperator`,
the data-parallel and sharded operators, :func:`~losslens.geometry.surfaces.surface.evaluate_surface` and the loss
oracle alike).

The mean loss over batches b_1..b_n is Σ_i w_i L(b_i) with weights normalised to sum 1. When each
L(b_i) is itself a mean over terms (tokens, examples), the pooled mean over all terms needs
w_i ∝ the number of terms of b_i. geometry knows no loss, so the loss says it: a ``loss_fn`` may carry
a method or attribute ``batch_weight(batch) -> float`` (the number of loss terms of the batch, e.g. the
predicted tokens that are not ignored: ``losslens.lm.core.next_token_loss.lm_loss`` does), and the default weight is
that. A ``loss_fn`` without it gets the batch size (rows: ``batch.shape[0]``, or the first element's
for an ``(inputs, targets)`` tuple), an example-weighted mean, equal to the token-weighted one only
for equal-shaped batches.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch


def rows_weight(batch: Any) -> float:
    """``batch.shape[0]`` for a tensor, the first element's ``shape[0]`` for a tuple/list starting
    with a tensor (``(inputs, targets)``), else 1."""
    if isinstance(batch, torch.Tensor):
        return float(batch.shape[0]) if batch.ndim else 1.0
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor) and batch[0].ndim:
        return float(batch[0].shape[0])
    return 1.0


def default_batch_weight(batch: Any, loss_fn: Callable[..., Any] | None = None) -> float:
    """Default weight of a batch: ``loss_fn.batch_weight(batch)`` when the loss carries it (its
    number of loss terms), else :func:`rows_weight` (the batch size)."""
    weigh = getattr(loss_fn, "batch_weight", None)
    return float(weigh(batch)) if callable(weigh) else rows_weight(batch)


def raw_batch_weights(
    batches: Sequence[Any],
    weights: Sequence[float] | None = None,
    error: type[Exception] = ValueError,
    loss_fn: Callable[..., Any] | None = None,
) -> list[float]:
    """One unnormalised weight per batch (default: :func:`default_batch_weight` of each, with
    ``loss_fn``), checked: raises ``error`` when the count does not match the batches or a weight is
    negative or not finite."""
    raw = [default_batch_weight(b, loss_fn) for b in batches] if weights is None else [float(w) for w in weights]
    if len(raw) != len(batches):
        raise error(f"got {len(raw)} weights for {len(batches)} batches")
    if any(not math.isfinite(w) or w < 0 for w in raw):
        raise error(f"batch weights must be finite and non-negative, got {raw}")
    return raw


def normalise_batch_weights(
    batches: Sequence[Any],
    weights: Sequence[float] | None = None,
    error: type[Exception] = ValueError,
    loss_fn: Callable[..., Any] | None = None,
) -> tuple[float, ...]:
    """One weight per batch, normalised to sum 1 (default: :func:`default_batch_weight` of each, with
    ``loss_fn``).

    Raises ``error`` (the caller's exception class) when the count does not match the batches,
    a weight is negative or not finite, or the weights sum to zero.
    """
    raw = raw_batch_weights(batches, weights, error, loss_fn)
    total = sum(raw)
    if total <= 0:
        raise error("batch weights sum to zero")
    return tuple(w / total for w in raw)
