"""Tokens whose input-embedding row is zero are left out of curvature losses (docs/science.md §4).

HF zero-initialises the padding row of the input embedding (``padding_idx``; Gemma's
``pad_token_id = 0``), and training never moves it: padding is attention-masked and its labels
ignored. At a zero input the first normalisation (RMSNorm / LayerNorm, ``x / sqrt(mean x² + eps)``)
is singular: its derivatives grow like ``eps^(-1/2)``, ``eps^(-1)``, ``eps^(-3/2)`` and it turns
within ``sqrt(eps)`` of the origin, so the gradient-difference backend's step crosses the bend and
its products are wrong (float64: up to 5×10³ relative, benchmarks/README.md "Zero embedding rows"),
while the exact Hessian there is dominated by an artefact of a row that is never trained.

So every LM curvature operator (:func:`~losslens.lm.models.curvature.lm_hessian`,
:func:`~losslens.lm.models.sharding.sharded_lm_hessian`) takes its loss without these tokens, as training
does: :func:`zero_embedding_tokens` finds the rows (on the unperturbed weights, once per operator, by
the function that builds it, which hands the ids to :func:`curvature_loss` and :func:`exclusion_record`), and
:class:`losslens.lm.core.next_token_loss.ExcludingLoss` hides them from every position with an attention mask and
counts a target only when it and its input are kept; batches are weighted by the kept targets.
:func:`exclusion_record` is what results record (``excluded`` in ``losslens sharpness`` and in
trace / eigen rows). Cost: one pass over the embedding matrix (no copy beyond a chunk of rows).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from losslens.lm.core.next_token_loss import ExcludingLoss, kept_targets, target_count

__all__ = ["zero_embedding_tokens", "curvature_loss", "exclusion_record", "row_extra"]

_ROWS = 4096  # rows of the embedding read at a time


def _zero_rows(weight: torch.Tensor, offset: int = 0) -> list[int]:
    found: list[int] = []
    for s in range(0, weight.shape[0], _ROWS):
        chunk = weight[s : s + _ROWS].detach()
        found += [offset + s + int(i) for i in (chunk == 0).all(dim=1).nonzero().reshape(-1).tolist()]
    return found


def zero_embedding_tokens(model: nn.Module) -> tuple[int, ...]:
    """Sorted token ids whose input-embedding row (``model.get_input_embeddings().weight``) is all
    zero; ``()`` for a model without a 2-D input embedding. An FSDP2-sharded embedding (``DTensor``,
    ``Shard(0)``) is read shard by shard and the ids gathered over its mesh (a collective: every rank
    calls it)."""
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    weight = getattr(emb, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
        return ()
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed
        DTensor = ()  # type: ignore[assignment]
    if not isinstance(weight, DTensor):
        return tuple(_zero_rows(weight))
    import torch.distributed as dist

    group = weight.device_mesh.get_group()
    local = weight.to_local()
    counts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(counts, int(local.shape[0]), group=group)
    offset = sum(counts[: dist.get_rank(group)])
    found: list[Any] = [None] * len(counts)
    dist.all_gather_object(found, _zero_rows(local, offset), group=group)
    return tuple(sorted(i for ids in found for i in ids))


def curvature_loss(loss_fn, exclude: Sequence[int]):
    """``loss_fn`` (:func:`losslens.lm.core.next_token_loss.lm_loss` or the lean head's loss) without the tokens of
    ``exclude`` (:func:`zero_embedding_tokens` of the model, found once by the caller): an
    :class:`~losslens.lm.core.next_token_loss.ExcludingLoss`, or ``loss_fn`` itself when there is nothing to exclude."""
    return ExcludingLoss(loss_fn, exclude) if exclude else loss_fn


def exclusion_record(exclude: Sequence[int], batches: Sequence[torch.Tensor], parallel: Any = None) -> dict:
    """What a result records about the tokens ``exclude`` left out over ``batches``: the token ids, the
    positions holding them and the targets the loss does not count (0s when none); with ``parallel`` (a
    :class:`~losslens.geometry.operators.data_parallel.DataParallel`, a collective) summed over every rank's batches."""
    ids = tuple(int(i) for i in exclude)
    positions = (
        sum(int(torch.isin(b, torch.as_tensor(ids, dtype=b.dtype, device=b.device)).sum()) for b in batches)
        if ids
        else 0
    )
    dropped = sum(target_count(b) - kept_targets(b, ids) for b in batches) if ids else 0
    if parallel is not None:
        positions, dropped = (int(x) for x in parallel.sum_floats([positions, dropped]))
    return {
        "zero_embedding_tokens": list(ids),
        "positions": positions,
        "targets": dropped,
        "reason": (
            "input-embedding rows that are zero (padding) are left out of the loss as inputs and targets: "
            "the first normalisation is singular there"
            if ids
            else None
        ),
    }


def row_extra(op: Any) -> dict:
    """``{"excluded": op.excluded}`` for a sweep row's ``extra`` when the operator left tokens out, else ``{}``."""
    rec = getattr(op, "excluded", None)
    return {"excluded": rec} if rec and rec.get("positions") else {}
