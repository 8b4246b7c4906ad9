"""The conventions, side effects and guarantees of every product call of a
:class:`~losslens.geometry.operators.hessian.HessianOperator`.

:func:`product_call` is the context every product, gradient and memory measurement runs in:

- attention runs under the backend's context: for the exact backends
  :func:`losslens.geometry.operators.attention.second_order_attention` (SDPA MATH backend); embeddings'
  ``padding_idx`` is cleared (:func:`losslens.geometry.operators.derivatives.true_derivatives`), so the
  products are those of the loss the forward computes;
- the model is put in **eval mode** for the call, and every submodule's previous mode is restored;
- ``.grad`` of every parameter is left as it was (exact backends use ``torch.autograd.grad``; the
  difference backend's ``.grad`` writes are undone); parameters outside the selection are frozen
  for the call only (so no graph is kept for layers that lead to no selected parameter: curvature
  of the last blocks needs the graph of those blocks only); ``requires_grad`` flags and parameter
  values are restored;
- grad mode is switched on internally, so calls work inside ``torch.no_grad()``;
- every floating parameter and buffer runs in the operator's compute dtype (float32 for a
  half-precision model by default: :mod:`losslens.geometry.operators.precision`), the stored tensors
  untouched and put back after;
- the selected parameters are looked up in the model at each call (weights may have been
  replaced); one that vanished or changed shape, dtype or device raises
  :class:`~losslens.geometry.operators.interface.OperatorError`.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterator

import torch
from torch import nn

from losslens.geometry.base.modes import module_modes
from losslens.geometry.base.params import ParamSpace
from losslens.geometry.operators.derivatives import true_derivatives
from losslens.geometry.operators.interface import OperatorError
from losslens.geometry.operators.precision import computed_in

__all__ = ["product_call", "current_parameters", "batch_items"]


def current_parameters(model: nn.Module, space: ParamSpace) -> dict[str, torch.Tensor]:
    """The selected parameters as they are in ``model`` now, in ``space`` order."""
    named = dict(model.named_parameters())
    out = {}
    for name, shape in zip(space.names, space.shapes):
        p = named.get(name)
        if p is None or p.shape != shape or p.dtype != space.dtype or p.device != space.device:
            raise OperatorError(
                f"parameter {name!r} vanished or changed shape/dtype/device since the operator was built"
            )
        out[name] = p
    return out


@contextlib.contextmanager
def product_call(
    model: nn.Module, space: ParamSpace, attention: ContextManager, compute_dtype: torch.dtype | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    """Yields the selected parameters. Eval mode, ``attention``, true embedding derivatives, grad
    enabled, parameters outside the selection frozen (``requires_grad=False``: autograd then keeps
    no graph for the layers that lead to no selected parameter, and the Hessian is w.r.t. the
    selection with the rest constant, as defined), every floating tensor in ``compute_dtype``
    (:func:`~losslens.geometry.operators.precision.computed_in`); restores modes,
    ``requires_grad``, ``.grad`` and the stored tensors."""
    grads = [(p, p.grad) for p in model.parameters()]
    params = current_parameters(model, space)
    chosen = {id(t) for t in params.values()}
    frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in chosen]
    try:
        for p in frozen:
            p.requires_grad_(False)
        compute = computed_in(model, compute_dtype or space.dtype)
        with module_modes(model, training=False), torch.enable_grad(), compute, attention, true_derivatives(model):
            yield params
    finally:
        for p in frozen:
            p.requires_grad_(True)
        for p, g in grads:
            if p.grad is not g:
                p.grad = g


def batch_items(op: Any, desc: str) -> Iterator[tuple[int, tuple[float, Any]]]:
    """``(index, (weight, batch))`` of every batch of ``op`` with a positive weight (a tqdm bar on rank 0
    with ``op.progress``)."""
    pairs = list(zip(op.weights, op.batches))
    items: Any = enumerate(pairs)
    if op.progress and (op.parallel is None or op.parallel.rank == 0):
        from tqdm.auto import tqdm

        items = tqdm(items, total=len(pairs), desc=desc, leave=False)
    for i, (w, batch) in items:
        if w > 0:
            yield i, (w, batch)
