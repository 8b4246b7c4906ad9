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
records it on the operator (``op.hvp_check``), with the zero-embedding tokens found once on the whole model
(:func:`losslens.lm.models.lm_setup.plan_lm_setup`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from losslens.geometry.base.errors import LosslensError
from losslens.geometry.operators.difference import DifferenceBackend
from losslens.geometry.operators.sharded import ShardedHessianOperator
from losslens.lm.core.modules import find_blocks


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
    setup: Any,
    max_memory: Any = None,
    hvp_check: dict | None = None,
    **kwargs,
) -> ShardedHessianOperator:
    """The sharded Hessian of the mean LM loss of an FSDP2 model (:func:`shard_model`) over this rank's
    batches, as planned by ``setup`` (:func:`losslens.lm.models.lm_setup.plan_lm_setup` with
    ``data_parallel``: its batches, its loss without the zero-embedding tokens, as
    :func:`losslens.lm.models.curvature.lm_hessian` leaves them out, and their record ``op.excluded``).
    ``hvp_check``: the difference backend's measured error on the unsharded architecture, recorded
    as ``op.hvp_check``. Extra keywords go to the operator (``compute_dtype``, ``difference_step``)."""
    op = ShardedHessianOperator(
        model, setup.difference_loss, setup.batches, max_memory=max_memory, **kwargs
    )  # float64 fidelity: as lm_hessian's difference backend
    op.hvp_check = hvp_check
    op.excluded = setup.excluded
    return op


def fsdp_lm_hessian(
    setup: Any, device: Any, backend: str = DifferenceBackend.name, max_memory: Any = None, master_device: Any = None
) -> ShardedHessianOperator:
    """``sharpness --parallel fsdp``: the sharded Hessian of the planned model (``setup``:
    :func:`losslens.lm.models.lm_setup.plan_lm_setup` of the whole model, loaded on this rank, with
    ``data_parallel`` and ``bound=True``), cast to the set-up's compute dtype and sharded by
    :func:`shard_model`, its loss without the zero-embedding tokens found once on the whole model, and
    its error the one the set-up bounded on a miniature of the architecture against float64 exact
    products (the same on every rank: double backward does not run under FSDP2). An exact ``backend``
    (reverse, forward, auto) is replaced by the difference backend out loud (``op.backend_choice``
    says why; the CLI prints it). ``max_memory``: the sharded operator's budget per rank;
    ``master_device``: ``"cpu"`` keeps its copy of θ in host RAM (``--master-device cpu``)."""
    from losslens.geometry.operators.names import backend_named
    from losslens.lm.models.curvature import ERROR_TOLERANCE

    model = setup.model.to(setup.compute_dtype)  # the products run in it, on the shards
    sharded = shard_model(model, device, setup.compute_dtype)
    op = sharded_lm_hessian(
        sharded, setup, max_memory=max_memory, compute_dtype=setup.compute_dtype, master_device=master_device
    )
    op.hvp_check = {**op.checked(), **setup.bound}
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
