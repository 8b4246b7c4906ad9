"""The language-model loss (docs/science.md §1) and its evaluation over a token set.

``lm_loss(model, batch)`` is the mean next-token cross-entropy in nats over every target token of
a ``[batch, seq]`` LongTensor: positions 0..seq-2 predict tokens 1..seq-1, so one batch holds
``batch * (seq - 1)`` targets. It is a valid ``loss_fn`` for :class:`losslens.geometry.HessianOperator`, and carries
``lm_loss.batch_weight`` (= :func:`target_count`), so operators and surfaces over several batches
weight each batch by its targets: their loss is the pooled token mean that :func:`evaluate` reports
(docs/science.md §1).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from losslens.geometry.base.errors import LosslensError
from losslens.geometry.base.modes import module_modes


class LossError(LosslensError, ValueError):
    """The loss could not be computed as defined (bad batch shape, sequence too long, NaN, ...)."""


def _logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    if attention_mask is not None:
        out = model(input_ids=input_ids, attention_mask=attention_mask)
    else:
        out = model(input_ids=input_ids) if _accepts_input_ids(model) else model(input_ids)
    logits = getattr(out, "logits", out)
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits


def _accepts_input_ids(model: nn.Module) -> bool:
    return hasattr(model, "config") and hasattr(model.config, "vocab_size")


def check_batch(model: nn.Module, batch: torch.Tensor) -> None:
    """Raise :class:`LossError` when ``batch`` is not a [b, s >= 2] integer tensor the model can take."""
    if (
        not isinstance(batch, torch.Tensor)
        or batch.ndim != 2
        or batch.dtype not in (torch.long, torch.int32, torch.int64)
    ):
        raise LossError(
            f"a batch must be an integer tensor [batch, seq]; got {getattr(batch, 'dtype', type(batch))} "
            f"{tuple(getattr(batch, 'shape', ()))}"
        )
    if batch.shape[1] < 2:
        raise LossError("sequences need at least 2 tokens to have a next-token target")
    config = getattr(model, "config", None)
    ctx = getattr(config, "max_position_embeddings", None)
    if ctx is not None and batch.shape[1] > ctx:
        raise LossError(
            f"sequence length {batch.shape[1]} exceeds the model's context of {ctx} tokens; build the token set "
            f"with seq <= {ctx}"
        )
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None and batch.numel() and int(batch.max()) >= vocab:
        raise LossError(
            f"token id {int(batch.max())} is outside the model's vocabulary of {vocab}; was the token set built "
            f"with another tokenizer?"
        )


def lm_loss(model: nn.Module, batch: torch.Tensor, exclude: Sequence[int] = ()) -> torch.Tensor:
    """Mean next-token cross-entropy (nats, scalar) of ``model`` on ``batch`` [b, s].

    ``exclude``: token ids left out of the loss as inputs and as targets (:func:`kept_targets`): an
    HF model gets an attention mask that hides them from every other position, and a target counts
    only when it and its input are kept; the mean is over the kept targets (0 when none is kept).
    """
    device = next(model.parameters()).device
    ids = batch.to(device=device, dtype=torch.long)
    if not exclude:
        logits = _logits(model, ids)
        if logits.dtype in (torch.float16, torch.bfloat16):  # half precision: take the softmax in float32
            logits = logits.float()
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    if not _accepts_input_ids(model):
        raise LossError("excluding tokens needs a transformers model (it takes an attention_mask)")
    keep = kept_tokens(ids, exclude)
    logits = _logits(model, ids, attention_mask=keep.long())
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    valid = (keep[:, :-1] & keep[:, 1:]).reshape(-1)
    total = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1])[valid], ids[:, 1:].reshape(-1)[valid], reduction="sum"
    )
    return total / max(int(valid.sum()), 1)


def kept_tokens(ids: torch.Tensor, exclude: Sequence[int]) -> torch.Tensor:
    """Bool mask [b, s]: True where the token id is not in ``exclude``."""
    return ~torch.isin(ids, torch.as_tensor(list(exclude), dtype=ids.dtype, device=ids.device))


def kept_targets(batch: torch.Tensor, exclude: Sequence[int]) -> int:
    """Targets of a [b, s] batch that the loss counts when ``exclude`` is left out: position t
    predicts token t+1 when neither is excluded. ``b * (s - 1)`` when nothing is excluded."""
    if not exclude:
        return target_count(batch)
    keep = kept_tokens(batch, exclude)
    return int((keep[:, :-1] & keep[:, 1:]).sum())


def target_count(batch: torch.Tensor) -> int:
    """Number of next-token targets in a [b, s] batch: ``b * (s - 1)``."""
    return int(batch.shape[0] * (batch.shape[1] - 1))


class ExcludingLoss:
    """``loss_fn(model, batch, exclude=ids)`` as a plain ``loss_fn(model, batch)`` (for the
    curvature operators), carrying ``batch_weight`` = :func:`kept_targets`, so batches are weighted
    by the targets the loss counts. ``loss_fn``: :func:`lm_loss` or
    :func:`losslens.lm.core.lm_head.lm_loss_lean`."""

    def __init__(self, loss_fn, exclude: Sequence[int]):
        self.loss_fn, self.exclude = loss_fn, tuple(int(i) for i in exclude)
        self.__name__ = getattr(loss_fn, "__name__", "loss_fn")

    def __call__(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(model, batch, exclude=self.exclude)

    def batch_weight(self, batch: torch.Tensor) -> int:
        return kept_targets(batch, self.exclude)

    def __repr__(self) -> str:
        return f"ExcludingLoss({self.__name__}, exclude={list(self.exclude)})"


# the curvature operators and surfaces weight each batch by its targets (losslens.geometry.base.batches), as evaluate()
# does
lm_loss.batch_weight = target_count


@dataclass(frozen=True)
class LossResult:
    """Loss (nats per target token) and perplexity of a model over a token set."""

    loss: float
    ppl: float
    n_tokens: int
    seconds: float


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: Iterable[torch.Tensor], progress: bool = False, desc: str = "eval", loss_fn=lm_loss
) -> LossResult:
    """L and PPL = exp(L) over every target token of ``batches`` (token-weighted mean).

    ``loss_fn``: :func:`lm_loss` or an :class:`ExcludingLoss` (then the mean is over its kept
    targets, each batch weighted by ``loss_fn.batch_weight``: the loss of a curvature operator built
    with it, ``n_tokens`` its kept targets); a loss without ``batch_weight`` is weighted by
    :func:`target_count`.

    ``batches`` is a :class:`losslens.lm.data.TokenSet` or any iterable of [b, s] LongTensors. The model
    is put in eval mode for the call and every module's previous mode restored
    (:func:`losslens.geometry.base.modes.module_modes`). Cost: one forward per batch.
    Raises :class:`LossError` on an empty set or a non-finite loss.
    """
    from losslens.geometry.base.progress import progress_bar

    batches = list(batches)
    if not batches:
        raise LossError("no evaluation batches: the token set is empty")
    t0 = time.perf_counter()
    total, count = 0.0, 0
    with module_modes(model, training=False):
        with progress_bar(progress, len(batches), what=desc, unit="batch", plan=False) as bar:
            for batch in batches:
                check_batch(model, batch)
                n = getattr(loss_fn, "batch_weight", target_count)(batch)  # the operators' default weight: one rule
                total += float(loss_fn(model, batch)) * n
                count += n
                bar.update()
    if count == 0:
        raise LossError("no target token is counted: every token of the set is excluded")
    loss = total / count
    if not math.isfinite(loss):
        raise LossError(f"the evaluation loss is {loss}; the model's weights or the token set are broken")
    return LossResult(loss=loss, ppl=math.exp(loss), n_tokens=count, seconds=time.perf_counter() - t0)
