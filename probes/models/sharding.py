"""FSDP2 sharding of a language model for sharded curvature (``losslens sharpness --parallel fsdp``).

:func:`shard_model` applies ``torch.distributed.fsdp.fully_shard`` the way large models are trained:
each decoder block is one FSDP unit (found by :func:`probes.core.modules.find_blocks`), the root
module (embeddings, final norm, LM head) another, on a 1-D device mesh over the default process
group. Tied input/output embeddings stay one parameter. :func:`sharded_lm_hessian` builds the
:class:`~geometry.operators.sharded.ShardedHessianOperator` of the mean LM loss
(:func:`probes.core.lm.lm_loss`) over this rank's curvature batches.

The difference backend's accuracy cannot be measured against an exact product on the sharded model
(double backward does not run under FSDP2), so :func:`sharded_lm_hessian` accepts the error measured
beforehand on the unsharded architecture (a float64 miniature: see ``probes.models.curvature``) and
records it on the operator (``op.hvp_check``).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from geometry.base.errors import LosslensError
from geometry.operators.sharded import ShardedHessianOperator
from probes.core.lm import lm_loss
from probes.core.modules import find_blocks
from .fidelity import with_float64_fidelity
from .zero_embeddings import curvature_loss, exclusion_record


class ShardingError(LosslensError, ValueError):
    """The model or the process group cannot be sharded as asked."""


def shard_model(model: nn.Module, device: str | torch.device | None = None) -> nn.Module:
    """``fully_shard`` every decoder block of ``model`` and then the model itself, in place, on a 1-D
    mesh over the default process group (``device``'s type: ``cpu`` with gloo, ``cuda`` with NCCL).
    Returns the model (now an ``FSDPModule``; parameters are ``DTensor`` shards)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ShardingError("FSDP2 sharding needs an initialised torch.distributed process group: run under torchrun")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = torch.device(device) if device is not None else next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    try:
        _, blocks = find_blocks(model)
    except ValueError as exc:
        raise ShardingError(f"cannot find the decoder blocks to shard: {exc}") from exc
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def sharded_lm_hessian(model: nn.Module, batches: Sequence[torch.Tensor], max_memory: Any = None,
                       hvp_check: dict | None = None, **kwargs) -> ShardedHessianOperator:
    """The sharded Hessian of the mean LM loss over this rank's ``batches`` ([b, s] token tensors) of
    an FSDP2 model (:func:`shard_model`). ``hvp_check``: the difference backend's measured error on
    the unsharded architecture, recorded as ``op.hvp_check``. Extra keywords go to the operator
    (``difference_step``, ``richardson``). Tokens whose input-embedding row is zero are left out of
    the loss as in :func:`probes.models.curvature.lm_hessian` (``op.excluded`` records them)."""
    loss_fn = curvature_loss(lm_loss, model)  # zero-embedding tokens left out, as lm_hessian (a collective)
    op = ShardedHessianOperator(model, with_float64_fidelity(loss_fn, model), list(batches), max_memory=max_memory,
                                **kwargs)  # float64 fidelity: as lm_hessian's difference backend
    op.hvp_check = hvp_check
    op.excluded = exclusion_record(loss_fn, list(batches), op.parallel)
    return op


__all__ = ["shard_model", "sharded_lm_hessian", "ShardingError"]
