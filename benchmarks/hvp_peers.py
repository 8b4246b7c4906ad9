"""The peers of the HVP benchmarks, behind one call shape: ``call(V [k, dim]) -> [k, dim]`` Hessian-
vector products of the mean next-token cross-entropy of an HF causal LM over its batches (the loss
of :func:`losslens.lm.core.next_token_loss.lm_loss`), w.r.t. every parameter. PyHessian 0.1 (:func:`_pyhessian`;
``call.charged``: the seconds to charge instead of the call's wall time, when the graph build is not
charged) and curvlinops 3.x (:func:`_curvlinops`), with the adapters they need (the model as
``ids -> logits``, the shifted cross-entropy as a criterion). Used by :mod:`benchmarks.hvp_throughput`
and :mod:`benchmarks.gpu.throughput`.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


class _Logits(nn.Module):
    """``ids [b, s] -> logits [b, s, V]`` (PyHessian's ``model(inputs)``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.m = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids).logits


class _FlatLogits(_Logits):
    """``ids -> logits[:, :-1]`` flattened to [b (s-1), V] (curvlinops' ``model_func``)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.m(input_ids=ids).logits
        return logits[:, :-1].reshape(-1, logits.shape[-1])


def _shifted_ce(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """PyHessian's ``criterion(outputs, targets)``: the same loss as ``lm_loss``."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))


def _pyhessian(
    model: nn.Module, batches: list[torch.Tensor], charge_graph: bool = True
) -> Callable[[torch.Tensor], torch.Tensor]:
    from pyhessian import hessian
    from pyhessian.utils import hessian_vector_product

    wrapped = _Logits(model)
    params = [p for p in model.parameters() if p.requires_grad]
    shapes = [p.shape for p in params]

    def split(v: torch.Tensor) -> list[torch.Tensor]:
        return [t.view(s) for t, s in zip(torch.split(v, [s.numel() for s in shapes]), shapes)]

    def call(V: torch.Tensor) -> torch.Tensor:
        try:
            if len(batches) == 1:
                H = hessian(wrapped, _shifted_ce, data=(batches[0], batches[0]), cuda=False)
                t0 = time.perf_counter()  # graph build not charged: only the k HVPs count
                out = [
                    torch.cat([h.reshape(-1) for h in hessian_vector_product(H.gradsH, H.params, split(v))]) for v in V
                ]
                call.charged = None if charge_graph else time.perf_counter() - t0
            else:
                H = hessian(wrapped, _shifted_ce, dataloader=[(b, b) for b in batches], cuda=False)
                out = [torch.cat([h.reshape(-1) for h in H.dataloader_hv_product(split(v))[1]]) for v in V]
                call.charged = None
            return torch.stack(out).detach()
        finally:
            model.zero_grad(set_to_none=True)  # PyHessian leaves create_graph grads in .grad

    call.charged = None
    return call


def _curvlinops(model: nn.Module, batches: list[torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    def call(V: torch.Tensor) -> torch.Tensor:
        from curvlinops import HessianLinearOperator

        params = [p for p in model.parameters() if p.requires_grad]
        data = [(b, b[:, 1:].reshape(-1)) for b in batches]
        op = HessianLinearOperator(
            _FlatLogits(model),
            nn.CrossEntropyLoss(),
            params,
            data,
            check_deterministic=False,
            num_data=sum(b.shape[0] for b in batches),
        )
        out = op @ (V[0] if V.shape[0] == 1 else V.T)
        return (out.unsqueeze(0) if V.shape[0] == 1 else out.T).detach()

    call.charged = None
    return call
