"""FSDP2 sharding of a language model for sharded curvature (``losslens sharpness --parallel fsdp``).

:func:`shard_model` applies ``torch.distributed.fsdp.fully_shard`` the way large models are trained:
each decoder block is one FSDP unit (found by :func:`losslens.lm.core.modules.find_blocks`), the root
module (embeddings, final norm, LM head) another, on a 1-D device mesh over the default process
group. Tied input/output embeddings stay one parameter. :func:`sharded_lm_hessian` builds the
:class:`~losslens.geometry.operators.sharded.ShardedHessianOperator` of the mean LM loss
(:func:`losslens.lm.core.next_token_loss.lm_loss`) over this rank's curvature batches.

The difference backend's accuracy cannot be measured against an exact product on the sharded model
(double backward does not run under FSDP2), so :func:`sharded_lm_hessian` accepts the error measured
beforehand on the unsharded architecture (a float64 miniature: :func:`losslens.lm.models.miniature.miniature_bound`) and
records it on the operator (``op.hvp_check``), with the zero-embedding tokens found once on the whole model.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from losslens.geometry.base.errors import LosslensError
from losslens.geometry.operators.difference import DifferenceBackend
from losslens.geometry.operators.sharded import ShardedHessianOperator
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.core.modules import find_blocks
from losslens.lm.models.fidelity import with_float64_fidelity
from losslens.lm.models.zero_embeddings import curvature_loss, exclusion_record, zero_embedding_tokens


class ShardingError(LosslensError, ValueError):
    """The model or the process group cannot be sharded as asked."""


def shard_model(model: nn.Module, device: str | torch.device | None = None, compute_dtype: Any = None) -> nn.Module:
    """``fully_shard`` every decoder block of ``model`` and then the model itself, in place, on a 1-D
    mesh over the default process group (``device``'s type: ``cpu`` with gloo, ``cuda`` with NCCL).
    ``compute_dtype`` (:func:`losslens.geometry.operators.precision.compute_dtype_for`; None: float32 for
    half-precision weights): the model is cast to it first, so the shards hold the weights in the
    dtype the products run in (half weights convert to float32 exactly; the checkpoint stays the
    half source), and its rotary tables are recomputed in that dtype from their definition
    (:func:`losslens.geometry.operators.rotary.write_rotary_tables`), as the one-process path does.
    Returns the model (now an ``FSDPModule``; parameters are ``DTensor`` shards)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ShardingError("FSDP2 sharding needs an initialised torch.distributed process group: run under torchrun")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from losslens.geometry.operators.precision import compute_dtype_for
    from losslens.geometry.operators.rotary import write_rotary_tables

    device = torch.device(device) if device is not None else next(model.parameters()).device
    dtype = compute_dtype_for(next(model.parameters()).dtype, compute_dtype)
    model.to(dtype)
    write_rotary_tables(model, dtype)  # the tables the one-process policy computes in (precision.computed_in)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    try:
        _, blocks = find_blocks(model)
    except ValueError as exc:
        raise ShardingError(f"cannot find the decoder blocks to shard: {exc}") from exc
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def sharded_lm_hessian(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    exclude: Sequence[int],
    max_memory: Any = None,
    hvp_check: dict | None = None,
    **kwargs,
) -> ShardedHessianOperator:
    """The sharded Hessian of the mean LM loss over this rank's ``batches`` ([b, s] token tensors) of
    an FSDP2 model (:func:`shard_model`). ``exclude``: the tokens whose input-embedding row is zero,
    left out of the loss as in :func:`losslens.lm.models.curvature.lm_hessian` (``op.excluded`` records
    them): :func:`~losslens.lm.models.zero_embeddings.zero_embedding_tokens` of the model, found once by
    the caller (on the sharded model it is a collective). ``hvp_check``: the difference backend's
    measured error on the unsharded architecture, recorded as ``op.hvp_check``. Extra keywords go to
    the operator (``difference_step``, ``richardson``)."""
    loss_fn = curvature_loss(lm_loss, exclude)  # zero-embedding tokens left out, as lm_hessian
    op = ShardedHessianOperator(
        model, with_float64_fidelity(loss_fn, model), list(batches), max_memory=max_memory, **kwargs
    )  # float64 fidelity: as lm_hessian's difference backend
    op.hvp_check = hvp_check
    op.excluded = exclusion_record(exclude, list(batches), op.parallel)
    return op


def fsdp_lm_hessian(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    device: Any,
    backend: str = DifferenceBackend.name,
    compute_dtype: Any = None,
    max_memory: Any = None,
    master_device: Any = None,
) -> ShardedHessianOperator:
    """``sharpness --parallel fsdp``: the sharded Hessian of ``model`` (loaded whole on this rank, cast
    to the compute dtype, then sharded by :func:`shard_model`) with its error measured first on a
    miniature of the architecture in the compute dtype against its float64 exact products
    (:func:`losslens.lm.models.miniature.miniature_bound`, the same on every rank). The zero-embedding
    tokens are found once, on the whole model, for both. FSDP2 runs first-order gradients only: an
    exact ``backend`` (reverse, forward, auto) is replaced by the difference backend out loud
    (``op.backend_choice`` says why; the CLI prints it). ``master_device``: ``"cpu"`` keeps the
    operator's copy of θ in host RAM (``--master-device cpu``)."""
    from losslens.geometry.operators.names import backend_named
    from losslens.geometry.operators.precision import compute_dtype_for
    from losslens.lm.models.curvature import ERROR_TOLERANCE
    from losslens.lm.models.miniature import miniature_bound

    dtype = compute_dtype_for(next(model.parameters()).dtype, compute_dtype)
    model.to(dtype)  # the products run in it: on the miniature and on the shards
    exclude = zero_embedding_tokens(model)
    mini = {"rel_error": None, "reference": "unavailable: no batch to measure on"}
    if batches:
        mini = miniature_bound(model, [batches[0][:2, :32]], exclude=exclude)
    op = sharded_lm_hessian(
        shard_model(model, device, dtype),
        batches,
        exclude,
        max_memory=max_memory,
        compute_dtype=dtype,
        master_device=master_device,
    )
    op.hvp_check = {**op.checked(), **mini}
    op.error_tolerance = ERROR_TOLERANCE
    op.checked()  # a ProductErrorWarning, once, when the miniature's bound exceeds the tolerance
    requested = backend_named(backend)
    if not requested.shardable:
        op.backend_choice = {
            "chosen": op.backend,
            "requested": backend,
            "why": "FSDP2 runs first-order gradients only (no double backward on sharded "
            "parameters): the difference backend, its error measured on a miniature of the "
            "architecture",
        }
    return op


__all__ = ["shard_model", "sharded_lm_hessian", "fsdp_lm_hessian", "ShardingError"]
