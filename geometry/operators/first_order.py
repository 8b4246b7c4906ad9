"""The first-order pass of a Hessian operator: the weighted mean loss and its gradient.

:func:`loss_and_gradient` is :meth:`losslens.geometry.operators.hessian.HessianOperator.gradient`: one
gradient per batch in the operator's product call (:mod:`losslens.geometry.operators.call`: eval mode,
compute dtype, ``.grad`` untouched), weighted by the batch weights, summed over the ranks of a
data-parallel operator.
"""

from __future__ import annotations

from typing import Any

import torch

from losslens.geometry.operators.interface import OperatorError, is_finite

__all__ = ["loss_and_gradient"]


def loss_and_gradient(op: Any) -> tuple[float, torch.Tensor]:
    """``(L, ∇L)`` of ``op`` (a :class:`~losslens.geometry.operators.hessian.HessianOperator`): the weighted
    mean loss (float) and its gradient, flat ``Tensor[op.dim]`` in ``op.space`` order and ``op.dtype``.
    Cost: one gradient per batch (data-parallel: of this rank's batches, then one all-reduce).
    Memory: one ``[dim]`` vector plus one gradient pass."""
    grad = torch.zeros(op.dim, dtype=op.dtype, device=op.device)

    def local() -> float:
        total = 0.0
        with op.call_context() as params:
            for i, (w, batch) in op.batch_items("gradient"):
                loss = op.batch_loss(params, batch, i)
                gs = torch.autograd.grad(loss, list(params.values()), allow_unused=True, materialize_grads=True)
                for s, gi in zip(op.space.slices.values(), gs):
                    grad[s].add_(gi.reshape(-1), alpha=w)
                total += w * float(loss.detach())
        return total

    if op.parallel is None:
        total = local()
    else:
        total = op.parallel.agree(local, "a gradient", op.device)
        op.parallel.all_reduce_(grad)
        (total,) = op.parallel.sum_floats([total], op.device)
    if not is_finite(grad):
        raise OperatorError("the gradient is NaN/Inf; check the model's weights and the batches")
    return total, grad
