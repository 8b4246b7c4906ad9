"""Exact Hessians of tiny problems and a dense operator around an explicit matrix.

``exact_hessian`` is the ground truth of the test suite: the Hessian built row by row with double
backward (``torch.autograd.grad`` of each gradient entry). It is O(dim) backward passes, so only
for tiny models. It deliberately avoids ``torch.func.hessian`` and ``jvp(jacrev(...))``, which
were measured wrong for LayerNorm weights on torch 2.13 (docs/science.md §4).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from losslens.geometry.operators.interface import CurvatureOperator, OperatorError
from losslens.geometry.base.batches import normalise_batch_weights
from losslens.geometry.base.params import ParamGlobs, ParamSpace, select_parameters


class DenseOperator(CurvatureOperator):
    """A symmetric matrix ``H`` [dim, dim] as a :class:`CurvatureOperator` (exact, for tests)."""

    def __init__(self, matrix: torch.Tensor, space: ParamSpace | None = None):
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"DenseOperator needs a square matrix, got shape {tuple(matrix.shape)}")
        self.matrix = matrix
        self.space = space
        self.num_matvecs = 0

    @property
    def dim(self) -> int:
        return self.matrix.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.matrix.dtype

    @property
    def device(self) -> torch.device:
        return self.matrix.device

    def _matmat_flat(self, V: torch.Tensor) -> torch.Tensor:
        return V @ self.matrix  # symmetric: (H V^T)^T = V H


def exact_hessian(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, object], torch.Tensor],
    batches: Sequence[object],
    params: ParamGlobs = None,
    weights: Sequence[float] | None = None,
) -> tuple[torch.Tensor, ParamSpace]:
    """Dense Hessian [dim, dim] of the weighted mean loss over ``batches``, row by row.

    Weights default to :func:`~losslens.geometry.base.batches.default_batch_weight` of each batch, as
    :class:`~losslens.geometry.operators.hessian.HessianOperator`'s (``loss_fn.batch_weight`` when the loss
    carries it, else the batch size), normalised. Cost: one gradient plus ``dim``
    second backwards per batch. Returns the matrix and the :class:`ParamSpace` fixing its order.
    Attention runs under the MATH SDPA backend so every op has a double-backward rule, and
    embeddings' ``padding_idx`` is cleared (:func:`losslens.geometry.operators.derivatives.true_derivatives`) so the
    rows are those of the loss's Hessian (a padding row's zeroed gradient would make it P·H).
    """
    from losslens.geometry.operators.attention import second_order_attention
    from losslens.geometry.operators.derivatives import true_derivatives

    sel = select_parameters(model, params)
    space = ParamSpace.from_params(sel)
    w = torch.as_tensor(normalise_batch_weights(list(batches), weights, OperatorError, loss_fn), dtype=torch.float64)
    H = torch.zeros(space.dim, space.dim, dtype=space.dtype, device=space.device)
    tensors = list(sel.values())
    with second_order_attention(), true_derivatives(model):
        for wi, batch in zip(w.tolist(), batches):
            loss = loss_fn(model, batch)
            grads = torch.autograd.grad(loss, tensors, create_graph=True)
            g = torch.cat([x.reshape(-1) for x in grads])
            for i in range(space.dim):
                row = torch.autograd.grad(g[i], tensors, retain_graph=True, allow_unused=True)
                H[i] += (
                    wi
                    * torch.cat(
                        [(r if r is not None else torch.zeros_like(t)).reshape(-1) for r, t in zip(row, tensors)]
                    ).detach()
                )
    return H, space
