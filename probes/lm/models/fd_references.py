"""AD-rule-free references for the second-order check: finite differences, probe vectors and batch.

Two references, each needing no second-order rule:

- :func:`fd_hvp`: the central difference of autograd's gradient, (g(θ+εv) − g(θ−εv)) / 2ε. It
  checks the second-order rules but trusts the first-order ones;
- :func:`fd_quadratic`: the second difference of the *loss*, (L(θ+εv) − 2L(θ) + L(θ−εv)) / ε²,
  which estimates vᵀHv from forward passes alone. It also catches a backward that is not the
  derivative of its forward (``padding_idx``-style gradient masking), which the first cannot.

Both use one step size (the check compares two steps for its own accuracy). The independent
oracle with Richardson extrapolation, polarisation (uᵀHv) and Hessian blocks, evaluated on a
float64 copy with HF's float32 upcasts made exact, is :class:`losslens.lm.models.oracles.LossOracle`.

Such masking hides behind particular tokens, so the check's batch carries every special token of
the model (:func:`with_special_tokens`) and one probe vector lives on the embedding rows of the
batch's tokens (:func:`probe_vectors`), where a masked row's curvature is not diluted by the rest
of the model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _selected(op) -> dict[str, torch.Tensor]:
    named = dict(op.model.named_parameters())
    return {n: named[n] for n in op.space.names}


def _moved(
    op, params: dict[str, torch.Tensor], originals: dict[str, torch.Tensor], step: dict[str, torch.Tensor], sign: float
) -> None:
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(originals[n] + sign * step[n].view_as(p))


def fd_hvp(op, V: torch.Tensor, eps: float) -> torch.Tensor:
    """Central finite difference of the gradient: (g(θ+εv) − g(θ−εv)) / 2ε per row v of V
    ([k, dim] in ``op``'s space). Cost: 2k gradients; weights restored exactly."""
    params = _selected(op)
    out = torch.empty_like(V)
    originals = {n: p.detach().clone() for n, p in params.items()}
    try:
        for i in range(V.shape[0]):
            step = op.space.unflatten(V[i] * eps)
            grads = []
            for sign in (1.0, -1.0):
                _moved(op, params, originals, step, sign)
                grads.append(op.gradient()[1])
            out[i] = (grads[0] - grads[1]) / (2 * eps)
    finally:
        _moved(op, params, originals, {n: torch.zeros_like(p) for n, p in originals.items()}, 0.0)
    return out


def _loss(op) -> float:
    """The operator's weighted mean loss, forward passes only (eval mode, no graph)."""
    modes = [(m, m.training) for m in op.model.modules()]
    op.model.eval()
    try:
        with torch.no_grad():
            return float(sum(w * float(op.loss_fn(op.model, b)) for w, b in zip(op.weights, op.batches)))
    finally:
        for m, training in modes:
            m.training = training


def fd_quadratic(op, V: torch.Tensor, eps: float) -> torch.Tensor:
    """``[k]`` float64 second differences of the loss, (L(θ+εv) − 2L(θ) + L(θ−εv)) / ε², per row v
    of V (≈ vᵀHv for unit v). Cost: 2k + 1 forward passes over the operator's batches."""
    params = _selected(op)
    originals = {n: p.detach().clone() for n, p in params.items()}
    out = torch.empty(V.shape[0], dtype=torch.float64)
    try:
        center = _loss(op)
        for i in range(V.shape[0]):
            step = op.space.unflatten(V[i] * eps)
            vals = []
            for sign in (1.0, -1.0):
                _moved(op, params, originals, step, sign)
                vals.append(_loss(op))
            out[i] = (vals[0] - 2 * center + vals[1]) / eps**2
    finally:
        _moved(op, params, originals, {n: torch.zeros_like(p) for n, p in originals.items()}, 0.0)
    return out


def special_token_ids(model: nn.Module) -> list[int]:
    """Ids the model treats specially: the config's pad/bos/eos/unk/sep/cls/mask tokens and every
    embedding's ``padding_idx`` (within the vocabulary)."""
    cfg = getattr(model, "config", None)
    vocab = getattr(cfg, "vocab_size", None)
    ids: list[int] = []
    for key in (
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "unk_token_id",
        "sep_token_id",
        "cls_token_id",
        "mask_token_id",
    ):
        v = getattr(cfg, key, None)
        for x in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(x, int) and x >= 0:
                ids.append(x)
    for m in model.modules():
        idx = getattr(m, "padding_idx", None)
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and isinstance(idx, int):
            ids.append(idx % m.num_embeddings)
    return sorted({i for i in ids if vocab is None or i < vocab})


def with_special_tokens(model: nn.Module, batch: Any) -> Any:
    """A copy of an LM batch ([b, s] integer tensor) whose first row carries every special token of
    the model (:func:`special_token_ids`) after its first position; other batches are returned as is."""
    if not (isinstance(batch, torch.Tensor) and batch.ndim == 2 and not batch.is_floating_point()):
        return batch
    ids = special_token_ids(model)[: max(0, batch.shape[1] - 1)]
    out = batch.clone()
    if ids:
        out[0, 1 : 1 + len(ids)] = torch.tensor(ids, dtype=out.dtype, device=out.device)
    return out


def probe_vectors(op, num_vectors: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """``[num_vectors, dim]`` unit probe vectors: Gaussian over every parameter, except the second,
    which is Gaussian on the input-embedding rows of the tokens in the operator's batches (when the
    model has ``get_input_embeddings`` and those rows are selected)."""
    g = torch.Generator().manual_seed(seed)
    V = torch.randn(num_vectors, op.dim, generator=g, dtype=torch.float64)
    emb = getattr(op.model, "get_input_embeddings", None)
    weight = getattr(emb(), "weight", None) if callable(emb) else None
    name = next((n for n, p in op.model.named_parameters() if p is weight), None) if weight is not None else None
    if num_vectors >= 2 and name in op.space.slices:
        tokens = torch.cat([b.reshape(-1) for b in op.batches if isinstance(b, torch.Tensor)]).unique().cpu()
        rows = torch.zeros(weight.shape[0], dtype=torch.bool)
        rows[tokens[tokens < weight.shape[0]]] = True
        mask = torch.zeros(op.dim, dtype=torch.bool)
        mask[op.space.slices[name]] = rows[:, None].expand(weight.shape).reshape(-1)
        V[1] = torch.where(mask, V[1], torch.zeros((), dtype=torch.float64))
    V = V / torch.linalg.vector_norm(V, dim=1, keepdim=True)
    return V.to(dtype=dtype, device=op.device)
