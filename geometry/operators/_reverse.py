"""Reverse-over-reverse Hessian-vector products on one batch's retained gradient graph.

Used by :class:`geometry.operators.hessian.HessianOperator` with ``backend="reverse"``: the
gradient ``g = ∇L_b`` is built once with ``create_graph=True`` (:class:`GradientGraph`), then
``H_b v = ∇(g · v)`` is one more backward per vector (``vectorize=False``) or one vmapped
backward per chunk of vectors (``vectorize=True``, ``is_grads_batched``). Memory: the graph
plus one chunk's second-backward intermediates (:func:`geometry.memory.graphs.pass_bytes`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .interface import OperatorError


@dataclass
class GradientGraph:
    """One batch's gradient with its graph: the live gradients (those that have a graph) and
    which selected tensors they belong to."""

    loss: torch.Tensor
    outputs: list[torch.Tensor]
    live: list[int]


def gradient_graph(loss: torch.Tensor, tensors: list[torch.Tensor]) -> GradientGraph:
    """The gradient of ``loss`` w.r.t. ``tensors`` with ``create_graph=True``; a gradient without
    a graph (it does not depend on θ: a zero Hessian row) is left out of ``outputs``."""
    grads = torch.autograd.grad(loss, tensors, create_graph=True, allow_unused=True, materialize_grads=True)
    live = [j for j, g in enumerate(grads) if g.requires_grad]
    return GradientGraph(loss, [grads[j] for j in live], live)


def reverse_products(graph: GradientGraph, tensors: list[torch.Tensor], vs: list[torch.Tensor],
                     outs: list[torch.Tensor], weight: float, chunk: int, vectorize: bool,
                     param_dtype: torch.dtype) -> None:
    """``outs[j] += weight · (H_b V)_j`` for V given per parameter as ``vs[j]`` [k, *shape_j]
    (in the estimator dtype; converted to ``param_dtype`` a chunk at a time)."""
    if not graph.live:
        return
    k = vs[0].shape[0]
    for start in range(0, k, chunk):
        stop = min(start + chunk, k)
        if vectorize:
            hv = torch.autograd.grad(
                graph.outputs, tensors, grad_outputs=[vs[j][start:stop].to(param_dtype) for j in graph.live],
                retain_graph=True, is_grads_batched=True, allow_unused=True, materialize_grads=True,
            )
            for o, h in zip(outs, hv):
                o[start:stop].add_(h, alpha=weight)
            continue
        for r in range(start, stop):
            hv = torch.autograd.grad(
                graph.outputs, tensors, grad_outputs=[vs[j][r].to(param_dtype) for j in graph.live],
                retain_graph=True, allow_unused=True, materialize_grads=True,
            )
            for o, h in zip(outs, hv):
                o[r].add_(h, alpha=weight)
            del hv


def check_loss(loss: Any, index: int, finite: bool = True) -> None:
    """Raise :class:`OperatorError` unless ``loss`` (of batch ``index``) is a floating-point scalar
    tensor, and, with ``finite``, a finite one."""
    if not isinstance(loss, torch.Tensor):
        raise OperatorError(f"loss_fn must return a scalar tensor, got {type(loss).__name__} on batch {index}")
    if loss.ndim != 0:
        raise OperatorError(
            f"loss_fn must return a scalar (0-dim) mean loss; got shape {tuple(loss.shape)} on batch {index}"
        )
    if not loss.is_floating_point():
        raise OperatorError(f"loss_fn returned a {loss.dtype} tensor; the loss must be floating point")
    if finite and not torch.isfinite(loss.detach()).all():
        raise OperatorError(f"the loss is {float(loss.detach())} on batch {index}; the Hessian of a non-finite loss is undefined")
