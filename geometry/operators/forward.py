"""The forward-over-reverse Hessian-vector product: ``torch.func.jvp`` of ``torch.func.grad``.

:class:`ForwardBackend` (``backend="forward"`` of :class:`losslens.geometry.operators.hessian.HessianOperator`):
the loss is written
as a function of the selected parameters with :func:`torch.func.functional_call` (the other
parameters and buffers enter as constants), and the jvp of its gradient is vmapped over the k
tangents, a chunk at a time.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from losslens.geometry.memory.graphs import forward_pass_bytes
from losslens.geometry.operators.backend import ProductBackend
from losslens.geometry.operators.interface import OperatorError
from losslens.geometry.operators.precision import cast_inputs
from losslens.geometry.operators.reverse import _chunks, _option, check_loss, converted_bytes


class _LossModule(nn.Module):
    """``batch -> loss_fn(model, batch)`` as a module, so ``functional_call`` can swap parameters."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module, Any], torch.Tensor]):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: Any) -> torch.Tensor:
        return self.loss_fn(self.model, batch)


def forward_over_reverse(
    model: nn.Module,
    loss_fn,
    params: dict[str, torch.Tensor],
    batch: Any,
    vs: list[torch.Tensor],
    outs: list[torch.Tensor],
    weight: float,
    chunk: int,
    param_dtype: torch.dtype,
    check_loss: Callable[[torch.Tensor], None],
    index: int,
) -> None:
    """``outs[j] += weight · (H_batch V)_j`` for V given per parameter as ``vs[j]`` ``[k, *shape_j]``."""
    from torch.func import functional_call, grad, jvp, vmap

    wrapper = _LossModule(model, loss_fn)
    names = list(params)
    primals = {n: p.detach() for n, p in params.items()}
    selected = {id(p) for p in params.values()}
    consts = {"model." + n: p.detach() for n, p in model.named_parameters() if id(p) not in selected}
    k = vs[0].shape[0]

    def loss_of(p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        full = {"model." + n: t for n, t in p.items()}
        full.update(consts)
        loss = functional_call(wrapper, full, (batch,))
        check_loss(loss)  # values are checked outside the transforms
        return loss, loss.detach()

    grad_fn = grad(loss_of, has_aux=True)

    def hvp(t: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        _, tangent_out, aux = jvp(grad_fn, (primals,), (t,), has_aux=True)
        return tangent_out, aux

    batched = vmap(hvp, in_dims=(0,), randomness="same")
    for start in range(0, k, chunk):
        stop = min(start + chunk, k)
        hv, losses = batched({n: v[start:stop].to(param_dtype) for n, v in zip(names, vs)})
        if not torch.isfinite(losses).all():
            raise OperatorError(
                f"the loss is {float(losses.reshape(-1)[0])} on batch {index}; "
                "the Hessian of a non-finite loss is undefined"
            )
        for n, o in zip(names, outs):
            o[start:stop].add_(hv[n], alpha=weight)


class ForwardBackend(ProductBackend):
    """Forward-over-reverse products, vmapped over chunks of tangents. It rebuilds the forward and
    the gradient for every chunk (≈ 4 gradients per vector on CPU); memory per chunk:
    :func:`~losslens.geometry.memory.graphs.forward_pass_bytes`."""

    name = "forward"
    summary = "exact"

    def products(
        self, op: Any, params: dict[str, torch.Tensor], vs: list[torch.Tensor], outs: list[torch.Tensor]
    ) -> None:
        k = vs[0].shape[0]
        for i, (w, batch) in op.batch_items("hvp"):
            forward_over_reverse(
                op.model,
                op.loss_fn,
                params,
                cast_inputs(batch, op.compute_dtype),
                vs,
                outs,
                w,
                op.chunk_for(k, True),
                op.param_dtype,
                lambda loss: check_loss(loss, i, finite=False),
                i,
            )

    def pass_bytes(self, op: Any, k: int, cached: bool | None = None, chunk: int | None = None) -> int:
        graphs = [op.graph_bytes(i) for i in range(len(op.batches))]
        chunk = chunk or op.chunk_for(k, True)
        return forward_pass_bytes(
            graphs,
            op.dim * op.param_dtype.itemsize,
            k,
            chunk,
            op.loss_transient_bytes + converted_bytes(op, k, chunk, True),
        )

    def pass_options(self, op: Any, k: int, calls: int, hvps: int) -> list[tuple[dict[str, Any], int, float]]:
        """Vmapped chunk sizes (no graph to keep); cost: 4 gradient-equivalents per vector."""
        chunks = _chunks(k) if op.chunk_size is None else [None]
        return [_option(op, k, chunk, False, 4.0 * hvps, hvps) for chunk in chunks]
