"""The LM loss through a closed-form, token-chunked head: the same number as
:func:`~losslens.lm.core.next_token_loss.lm_loss`
with a far smaller double-backward graph at large vocabularies.

:func:`lm_loss_lean` runs the model's trunk (``model.base_model``: embeddings, blocks, final norm)
and applies the head with :func:`losslens.geometry.operators.linear_ce.linear_cross_entropy`, whose first and second
derivatives are closed-form and chunked over tokens, so no ``[tokens, vocab]`` logits tensor is
kept for the Hessian-vector products (docs: benchmarks/README.md, "Lean LM head").

It is used only when it computes exactly what the model computes: the first call on a model
checks, on one short sequence, that ``trunk(ids) @ Wᵀ + b`` (what the lean path computes) equals
``model(ids).logits`` (models with logit soft-capping, logit scaling, a hook or a non-linear head
fail this) and otherwise falls back to
:func:`~losslens.lm.core.next_token_loss.lm_loss` for that model, with the reason in :func:`lean_head_status`.
Reverse-mode only: its second derivative has no forward-mode rule, so the ``"forward"`` HVP
backend uses :func:`~losslens.lm.core.next_token_loss.lm_loss`.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch
from torch import nn

from losslens.geometry.operators.linear_ce import linear_cross_entropy, transient_bytes

from losslens.lm.core.next_token_loss import kept_tokens, lm_loss, target_count

__all__ = ["lm_loss_lean", "lean_head_status", "split_head"]

_STATUS: "weakref.WeakKeyDictionary[nn.Module, str]" = weakref.WeakKeyDictionary()


def split_head(model: nn.Module) -> tuple[nn.Module, nn.Linear] | None:
    """``(trunk, head)`` of an HF causal LM (``model.base_model`` and an ``nn.Linear`` output
    embedding), or None when the model does not have that form."""
    trunk = getattr(model, "base_model", None)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if trunk is None or trunk is model or not isinstance(head, nn.Linear):
        return None
    return trunk, head


def _verify(model: nn.Module, ids: torch.Tensor) -> str:
    parts = split_head(model)
    if parts is None:
        return "no (trunk, linear head) split: plain lm_loss"
    trunk, head = parts
    probe = ids[:1, : min(ids.shape[1], 8)]
    with torch.no_grad():
        want = model(input_ids=probe).logits
        got = torch.nn.functional.linear(trunk(input_ids=probe).last_hidden_state, head.weight, head.bias)
    if want.shape != got.shape or not torch.allclose(got.float(), want.float(), rtol=1e-4, atol=1e-5):
        return (
            "weight @ trunk(ids) differs from model(ids).logits (a logit transform or hook after the head): "
            "plain lm_loss"
        )
    return "lean"


def lean_head_status(model: nn.Module) -> str | None:
    """``"lean"``, the reason the plain loss is used, or None before the first call."""
    return _STATUS.get(model)


def lm_loss_lean(model: nn.Module, batch: Any, exclude: Sequence[int] = ()) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of ``model`` on ``batch`` [b, s], as :func:`lm_loss`
    defines it (half-precision logits taken in float32; ``exclude`` as there), through the
    closed-form chunked head. Memory of its double-backward graph: no ``[tokens, vocab]`` tensor
    beyond one chunk."""
    device = next(model.parameters()).device
    ids = batch.to(device=device, dtype=torch.long)
    status = _STATUS.get(model)
    if status is None:
        status = _STATUS[model] = _verify(model, ids)
    if status != "lean":
        return lm_loss(model, batch, exclude=exclude)
    trunk, head = split_head(model)
    if not exclude:
        hidden = trunk(input_ids=ids).last_hidden_state[:, :-1]
        targets = ids[:, 1:].reshape(-1)
        return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head.weight, targets, head.bias)
    keep = kept_tokens(ids, exclude)
    hidden = trunk(input_ids=ids, attention_mask=keep.long()).last_hidden_state[:, :-1]
    valid = (keep[:, :-1] & keep[:, 1:]).reshape(-1)
    if not bool(valid.any()):  # nothing counted: a zero that keeps the graph
        return hidden.sum() * 0.0
    return linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1])[valid], head.weight, ids[:, 1:].reshape(-1)[valid], head.bias
    )


lm_loss_lean.batch_weight = target_count  # as lm_loss: batches weighted by their targets (the pooled token mean)


def head_transient_bytes(model: nn.Module, batches: Any) -> int:
    """Bytes of the lean head's chunk temporaries for the largest of ``batches`` ([b, s] token
    tensors), or 0 when the model has no plain linear head (the plain loss is then used and its
    logits are part of the measured graph)."""
    parts = split_head(model)
    if parts is None:
        return 0
    head = parts[1]
    tokens = max((b.shape[0] * max(b.shape[-1] - 1, 1) for b in batches if isinstance(b, torch.Tensor)), default=0)
    return transient_bytes(tokens, head.weight.shape[0], head.weight.dtype) if tokens else 0
