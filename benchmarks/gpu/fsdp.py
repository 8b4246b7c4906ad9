"""Section 8 of the GPU check: FSDP2 at world size 1 equals the unsharded difference backend.

One process joins a one-rank group (NCCL on CUDA, gloo on the CPU: the same code path as
``torchrun --parallel fsdp``), shards a tiny float64 model of two families with ``fully_shard``
(:func:`losslens.lm.models.sharding.shard_model`) and runs Hutchinson (6 products) and Lanczos λ_max on
the sharded operator; the unsharded difference backend on a copy gives the reference (both with
HF's float32 islands kept in float64). Tolerance 1e-8 relative (float64; the two differ by
summation order only).
"""

from __future__ import annotations

import contextlib
import copy
import socket

import torch

from ._common import Context, check

FSDP_TOL = 1e-8


@contextlib.contextmanager
def one_rank_group(device: torch.device):
    """A world-size-1 process group on ``device``'s backend, destroyed on exit (unless one was already up)."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _estimates(op) -> dict[str, float]:
    from losslens.geometry import hutchinson_trace, top_eigenvalues

    return {
        "hutchinson": hutchinson_trace(op, num_matvecs=6, seed=3).value,
        "lanczos": top_eigenvalues(op, k=1, method="lanczos", tol=1e-8, max_iter=40, seed=5).values[0],
    }


def fsdp(ctx: Context) -> list[dict]:
    """Sharded (world size 1) vs unsharded difference-backend estimates on two tiny families."""
    from losslens.geometry import HessianOperator
    from losslens.geometry.operators.sharded import ShardedHessianOperator
    from losslens.lm.core.next_token_loss import lm_loss
    from losslens.lm.models.families import tiny_model
    from losslens.lm.models.fidelity import with_float64_fidelity
    from losslens.lm.models.sharding import shard_model

    g = torch.Generator().manual_seed(7)
    batches = [torch.randint(3, 96, (rows, 12), generator=g) for rows in (3, 2)]
    rows = []
    with one_rank_group(ctx.device):
        for fam in ("gpt_neox", "llama"):
            model = tiny_model(fam, seed=1, dtype=torch.float64).to(ctx.device)
            plain = copy.deepcopy(model)
            single = _estimates(
                HessianOperator(
                    plain,
                    with_float64_fidelity(lm_loss, plain),
                    [b.to(ctx.device) for b in batches],
                    backend="difference",
                )
            )
            sharded = shard_model(model, ctx.device)
            got = _estimates(
                ShardedHessianOperator(
                    sharded, with_float64_fidelity(lm_loss, sharded), [b.to(ctx.device) for b in batches]
                )
            )
            for key in got:
                rows.append(
                    check(
                        "fsdp",
                        f"{fam} {key}: sharded (1 rank) vs unsharded difference backend",
                        abs(got[key] - single[key]) / max(abs(single[key]), 1e-30),
                        FSDP_TOL,
                        sharded=got[key],
                        unsharded=single[key],
                    )
                )
    return rows
