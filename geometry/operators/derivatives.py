"""Make autograd return the derivatives of the function the forward computes.

``nn.Embedding(padding_idx=p)`` (and ``nn.EmbeddingBag``) compute ``weight[p]`` in the forward like
any other row, but their backward zeroes the gradient of row p by convention (the padding row is
not trained). Whenever token p occurs in a batch, autograd's "gradient" G = P·∇L (P zeroes row p)
is then not the derivative of the loss, and its Jacobian P·H is not symmetric: reverse-over-reverse
returns H·P·v, forward-over-reverse P·H·v, and neither is the Hessian H·v of the loss (measured on
the tiny OLMo, OLMo-2, SmolLM3 and Apertus models, whose ``pad_token_id`` is a real vocabulary
row: 3–1,300× relative disagreement between the two backends, issue #12). The padding convention
is a training rule, not part of the function, so curvature code runs under
:func:`true_derivatives`, which clears ``padding_idx`` for the call (the forward is unchanged) and
restores it afterwards. ``F.embedding(..., padding_idx=...)`` called directly inside a custom module
cannot be reached this way; :func:`losslens.lm.models.second_order.check_second_order` catches such ops by
comparing both backends on a probe batch that contains every special token.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
from torch import nn

from losslens.geometry.operators.interface import OperatorError

__all__ = ["true_derivatives", "padding_modules", "check_dead_rows"]


def padding_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every ``nn.Embedding`` / ``nn.EmbeddingBag`` with a ``padding_idx``."""
    return [
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.padding_idx is not None
    ]


@contextlib.contextmanager
def true_derivatives(model: nn.Module) -> Iterator[None]:
    """Within the block, embeddings have no ``padding_idx``, so autograd differentiates the
    forward exactly; the previous values are restored on exit (also on error)."""
    saved = [(m, m.padding_idx) for _, m in padding_modules(model)]
    for m, _ in saved:
        m.padding_idx = None
    try:
        yield
    finally:
        for m, idx in saved:
            m.padding_idx = idx


def check_dead_rows(loss: Callable[[], torch.Tensor], params: dict[str, torch.Tensor], dead: list[int]) -> None:
    """Raise :class:`~losslens.geometry.operators.interface.OperatorError` when the gradient changes as the tensors
    ``dead`` (indices into ``params``) move, although their gradients have no autograd graph.

    A gradient without a graph means a zero Hessian row: right for a loss linear in that tensor,
    silently wrong when an op's backward on its path is not differentiable. A central difference of
    the full gradient along a random move of those tensors (1% of each tensor's norm; 3% in half
    precision) tells the two apart. Cost: two gradients (once per operator). Values are restored
    exactly.
    """
    names, tensors = list(params), list(params.values())
    dtype = tensors[dead[0]].dtype
    eps = 3e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-2
    saved = [tensors[j].detach().clone() for j in dead]

    def grad_at(sign: float) -> torch.Tensor:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for j, orig in zip(dead, saved):
                u = torch.randn(orig.shape, generator=gen, dtype=torch.float64)
                scale = eps * max(float(orig.double().norm()), 1.0) / max(float(u.norm()), 1e-30)
                tensors[j].copy_(orig + sign * (scale * u).to(device=orig.device, dtype=orig.dtype))
        gs = torch.autograd.grad(loss(), tensors, allow_unused=True, materialize_grads=True)
        return torch.cat([g.detach().reshape(-1).to(torch.float64) for g in gs])

    try:
        g_plus, g_minus = grad_at(+1.0), grad_at(-1.0)
    finally:
        with torch.no_grad():
            for j, orig in zip(dead, saved):
                tensors[j].copy_(orig)
    change = float((g_plus - g_minus).norm())
    scale = max(float(g_plus.norm()), float(g_minus.norm()), 1e-30)
    tol = max(1e3 * torch.finfo(dtype).eps, 1e-6)
    if change > tol * scale:
        which = ", ".join(names[j] for j in dead[:6]) + (" ..." if len(dead) > 6 else "")
        raise OperatorError(
            f"the gradient of {which} has no autograd graph (a zero Hessian row), yet moving those tensors by "
            f"{eps:g} of their norm changes the gradient by {change / scale:.2g} of its norm: an op on their path "
            "has a backward that is not differentiable (a custom autograd.Function whose backward runs without "
            "grad, or a detach). Its curvature would silently be zero; exclude these parameters (params=...) or "
            "give the op a differentiable backward"
        )
