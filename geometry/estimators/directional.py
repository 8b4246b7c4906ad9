"""Curvature of the loss along one direction: gᵀd, dᵀHd and the second-order prediction.

For a quantization step d = θ̂ − θ this links sharpness to quantization error directly
(docs/science.md §4): ΔL ≈ gᵀd + ½ dᵀHd, to compare with the measured L(θ̂) − L(θ).
"""

from __future__ import annotations

import math
import time
from typing import Mapping

import torch

from losslens.geometry.estimators._checks import check_op, flat_direction, refuse_sharded
from losslens.geometry.base._linalg import rowdot
from losslens.geometry.memory.model import (
    TEMPORARIES_PART,
    MemoryEstimate,
    first_fitting,
    temporaries_bytes,
    vector_bytes,
)
from losslens.geometry.memory.budget import resolve_budget
from losslens.geometry.operators.interface import CurvatureOperator
from losslens.geometry.base.results import DirectionalCurvature, EstimatorError

__all__ = ["directional_curvature", "estimate_memory"]


def estimate_memory(op: CurvatureOperator, max_memory=None) -> MemoryEstimate:
    """Memory of :func:`directional_curvature`: the direction, the gradient and H d (three full-dim
    vectors of ``op.dtype``) plus one operator pass (no graph kept: one product)."""
    budget = resolve_budget(op.max_memory if max_memory is None else max_memory, op.device)
    vec = vector_bytes(op.dim, op.dtype)
    parts = {
        "direction, gradient, H d [3, dim]": 3 * vec,
        "operator pass": op.pass_bytes(1, cached=False),
        TEMPORARIES_PART: temporaries_bytes(op.dim, op.dtype),
    }
    settings = {"cache_graphs": False}
    backend = getattr(op, "product_backend", None)
    if backend is not None and not backend.exact:  # its measured error goes with every result
        settings.update(backend=backend.name, hvp_check=op.checked())
    return first_fitting(
        [MemoryEstimate(parts, budget, settings)],
        "directional_curvature",
        "use fewer or shorter curvature batches, fewer parameters (params=...), or raise max_memory",
    )


def directional_curvature(
    op: CurvatureOperator,
    direction: Mapping[str, torch.Tensor] | torch.Tensor,
    max_memory: int | str | None = None,
) -> DirectionalCurvature:
    """Loss, slope and curvature of the loss along ``direction``.

    Args:
        op: a curvature operator with a ``gradient() -> (loss, flat grad [dim])`` method, e.g.
            :class:`~losslens.geometry.operators.hessian.HessianOperator`.
        direction: d as a dict ``{name: tensor of the parameter's shape}`` with exactly the keys of
            ``op.space`` (e.g. ``{n: q[n] - p[n]}`` for a quantized copy), or a flat ``[dim]``
            tensor in the space's order. Cast to the operator's dtype and device; not scaled.
        max_memory: bytes (or ``"8GB"``) the call may allocate (:func:`estimate_memory`).

    Returns:
        :class:`DirectionalCurvature`: ``loss``, ``gTd``, ``dHd``, ``predicted_delta = gTd + dHd/2``
        (second-order change of the loss, loss units), ``direction_norm``, ``memory``. Cost: one
        gradient (one forward + backward per batch) and one HVP. Memory: :func:`estimate_memory`.
    """
    check_op(op)
    refuse_sharded(op, "directional_curvature")
    gradient = getattr(op, "gradient", None)
    if not callable(gradient):
        raise EstimatorError(
            f"directional_curvature needs an operator with a gradient() method (e.g. HessianOperator); "
            f"{type(op).__name__} has none"
        )
    d = flat_direction(op, direction)
    plan = estimate_memory(op, max_memory)
    t0, n0 = time.perf_counter(), op.num_matvecs
    loss, g = gradient()
    loss = float(loss)
    g = g.detach().reshape(-1).to(device=op.device)
    if g.shape[0] != op.dim:
        raise EstimatorError(f"op.gradient() returned a gradient of length {g.shape[0]}, expected {op.dim}")
    Hd = op.matvec_flat(d)
    gTd = float(rowdot(g[None], d[None])[0])
    dHd = float(rowdot(d[None], Hd[None])[0])
    norm = float(rowdot(d[None], d[None])[0]) ** 0.5
    for name, x in (("loss", loss), ("gTd", gTd), ("dHd", dHd)):
        if not math.isfinite(x):
            raise EstimatorError(f"{name} is not finite ({x}); check the loss and the direction")
    return DirectionalCurvature(
        loss=loss,
        gTd=gTd,
        dHd=dHd,
        predicted_delta=gTd + 0.5 * dHd,
        direction_norm=norm,
        num_matvecs=op.num_matvecs - n0,
        seconds=time.perf_counter() - t0,
        num_gradients=1,
        memory=plan.to_dict(),
    )
