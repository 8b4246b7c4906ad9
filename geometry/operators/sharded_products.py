"""The gradient-difference loop of the FSDP2-sharded operator with no copy it does not need (issue #48).

:class:`~losslens.geometry.operators.sharded.ShardedHessianOperator` computes, like the one-process
loop (:func:`losslens.geometry.operators.difference.difference_products`),

    outs[j][r] += Σ_(shift, coef) coef · ∇L(θ + shift · v_r)_j       (the stencil of the step rule)

with the local shards perturbed in place and restored bit-exactly. Two per-rank copies of θ are gone:

- **No ``.grad`` shards.** FSDP2 reduce-scatters each unit's gradient into a new flat buffer and calls
  the sharded parameters' post-accumulate-grad hooks (``torch.distributed.fsdp`` ``foreach_reduce``):
  the hook adds ``coef · grad`` to the output row and drops ``.grad``, so only one unit's
  reduce-scatter output is alive at a time, never a gradient of the whole shard (``4 B / param / N``
  in float32 compute: 17.5 GB per rank for a 32B model on 8 ranks). The arithmetic is the one of
  the loop that reads ``.grad`` after the backward (the same ``add_`` per parameter), so the products
  are bit-identical to it.
- **The master in the narrowest exact dtype** (:func:`master_dtypes`). θ is restored from a kept copy;
  a float32 shard cast from a bfloat16 checkpoint (the default float32 compute of a bfloat16 model,
  :mod:`losslens.geometry.operators.precision`) holds bfloat16 numbers exactly, so the copy is kept in
  bfloat16 (2 B instead of 4 B per parameter) and converted back exactly (``t.copy_(master)``,
  ``master.to(float32)``): θ and the products are bit-identical to a float32 master. Which dtype each
  tensor gets is checked on the values (one cast and compare per tensor), never assumed.

Per-rank bytes of one product beyond its ``[k, dim]`` input and output (:func:`master_bytes` and the
measured sharded gradient pass, :meth:`ShardedHessianOperator.pass_bytes`): the master (Σ numel × its
dtype's bytes) plus the larger of the pass (two all-gathered units, one unit's reduce-scatter output,
the activations) and one cast of the largest local tensor to the vectors' dtype when the master is
narrower (the perturbation ``master + shift · v`` is formed in the vectors' dtype before the pass).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch

from losslens.geometry.operators.backend import VectorSpace
from losslens.geometry.operators.difference import step_size, stencil

__all__ = ["master_dtypes", "master_bytes", "sharded_difference_products"]

#: Narrower dtypes tried for the kept θ, narrowest first (a float32 shard of a bfloat16 checkpoint).
NARROW = (torch.bfloat16, torch.float16, torch.float32)


def master_dtypes(tensors: Sequence[torch.Tensor]) -> list[torch.dtype]:
    """Per tensor, the narrowest of ``NARROW`` (below its own dtype) that holds every value exactly,
    else its own dtype. Cost: one cast and one compare per candidate (temporaries: one tensor)."""
    out = []
    for t in tensors:
        t, chosen = t.detach(), t.dtype
        for d in NARROW:
            if d.itemsize >= t.dtype.itemsize or not t.is_floating_point():
                break
            if torch.equal(t.to(d).to(t.dtype), t):
                chosen = d
                break
        out.append(chosen)
    return out


def master_bytes(
    tensors: Sequence[torch.Tensor], dtypes: Sequence[torch.dtype], vector_dtype: torch.dtype, on_host: bool = False
) -> tuple[int, int]:
    """``(kept, cast)``: device bytes of the kept θ in ``dtypes`` (0 when ``on_host``: it lives in host
    RAM), and of the perturbation's temporary, one copy of the largest tensor whose master is not in
    ``vector_dtype`` or on the device (freed before the gradient pass: the two never add up)."""
    kept = 0 if on_host else sum(t.numel() * d.itemsize for t, d in zip(tensors, dtypes))
    casts = [t.numel() for t, d in zip(tensors, dtypes) if d != vector_dtype or on_host]
    return int(kept), int(max(casts) * vector_dtype.itemsize if casts else 0)


def sharded_difference_products(
    params: Sequence[Any],
    tensors: Sequence[torch.Tensor],
    rounds: Sequence[tuple[int, Any]],
    loss_of: Callable[[Any, int], torch.Tensor],
    vs: list[torch.Tensor],
    outs: list[torch.Tensor],
    h: float,
    richardson: bool,
    space: VectorSpace,
    replay: Callable[[int], contextlib.AbstractContextManager] | None = None,
    master_device: Any = None,
) -> int:
    """``outs[j][r] += (H v_r)_j`` over every round's batch by gradient differences; returns the
    gradients computed.

    Args:
        params: the FSDP2 ``DTensor`` parameters (``requires_grad`` set for the call).
        tensors: their local shards, perturbed in place and restored bit-exactly (also on error).
        rounds: ``(index, batch)`` of every backward (each a collective: every rank runs as many).
        loss_of: ``loss_of(batch, index)`` -> scalar loss, the batch weight folded in.
        vs, outs: per parameter ``[k, *local shape]`` vectors and outputs (the vectors' dtype).
        h, richardson: the relative step and stencil (:func:`~losslens.geometry.operators.difference.step_size`).
        space: the norms of the step rule, summed over the ranks.
        replay: ``replay(index)`` -> the context of each gradient (frozen piecewise branches).
        master_device: ``"cpu"`` keeps the master in host RAM (pinned for shards on a GPU): each
            perturbation then moves it to the device a tensor at a time (its bytes per perturbation).

    Cost: k · (2 or 4) · len(rounds) sharded gradients. Memory: :func:`master_bytes` + one pass.
    """
    params, tensors = list(params), list(tensors)
    dtypes = master_dtypes(tensors)
    host = master_device is not None and torch.device(master_device) != tensors[0].device
    master = [_kept(t.detach(), d, host) for t, d in zip(tensors, dtypes)]
    theta = [t.detach() for t in tensors]
    theta_norm = space.norm(theta)
    k, n = vs[0].shape[0], space.numel(theta)
    del theta
    saved_flags = [p.requires_grad for p in params]
    now: dict[str, Any] = {"r": 0, "coef": 0.0}

    def into_output(o: torch.Tensor) -> Callable[[Any], None]:
        def hook(p: Any) -> None:  # after FSDP2 reduce-scattered this parameter's gradient
            if p.grad is not None:
                o[now["r"]].add_(p.grad.to_local().to(o.dtype), alpha=now["coef"])
                p.grad = None  # the unit's reduce-scatter buffer is freed with its last parameter's

        return hook

    handles = []
    count = 0
    try:
        for p, o in zip(params, outs):
            p.requires_grad_(True)
            p.grad = None
            handles.append(p.register_post_accumulate_grad_hook(into_output(o)))
        for r in range(k):
            v_norm, v4 = space.norms([v[r] for v in vs])
            if v_norm == 0.0:
                continue  # H 0 = 0
            now["r"] = r
            for shift, coef in stencil(step_size(h, theta_norm, v_norm, v4, n), richardson):
                with torch.no_grad():
                    for t, m, v in zip(tensors, master, vs):
                        torch.add(m.to(v.device, v.dtype), v[r], alpha=shift, out=t)  # in the vectors' dtype
                now["coef"] = coef
                for index, batch in rounds:
                    with replay(index) if replay is not None else contextlib.nullcontext():
                        loss_of(batch, index).backward()
                    count += 1
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for t, m in zip(tensors, master):
                t.copy_(m)  # exact: the master holds θ's values
        for p, flag in zip(params, saved_flags):
            p.grad = None
            p.requires_grad_(flag)
    return count


def _kept(t: torch.Tensor, dtype: torch.dtype, host: bool) -> torch.Tensor:
    """A copy of ``t`` in ``dtype``: on the device, or in host RAM (pinned when ``t`` is on a GPU)."""
    if not host:
        return t.to(dtype, copy=True)
    out = torch.empty(t.shape, dtype=dtype, pin_memory=t.device.type == "cuda")
    out.copy_(t)
    return out
