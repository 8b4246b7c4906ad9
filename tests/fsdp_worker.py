"""Worker of tests/test_sharded.py: one rank of a 2-process gloo group (spawned, one thread) that
shards a tiny model with FSDP2 ``fully_shard`` and runs the estimators on a
:class:`~geometry.operators.sharded.ShardedHessianOperator`; each scenario saves what the rank
computed, or the error it raised, to ``out/<scenario>-<rank>.pt``."""
from __future__ import annotations

import datetime
import os
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from geometry import hutchinson_trace, hutchpp_trace, spectral_density, top_eigenvalues
from geometry.operators.parallel import split_batches
from tests.tiny_models import lm_loss, micro_gptneox, micro_llama, random_batches

SIZES = [3, 5, 2]  # 3 batches of uneven rows: split 2 + 1 over 2 ranks
FAMILIES = {"neox": micro_gptneox, "llama": micro_llama}


def lm_batches() -> list[torch.Tensor]:
    return [random_batches(n_batches=1, batch=b, seq=8, seed=20 + i)[0] for i, b in enumerate(SIZES)]


def estimates(op) -> dict:
    tr = hutchinson_trace(op, num_matvecs=6, seed=3)
    pp = hutchpp_trace(op, num_matvecs=9, seed=4)
    lz = top_eigenvalues(op, k=1, method="lanczos", tol=1e-6, max_iter=40, seed=5)
    pw = top_eigenvalues(op, k=1, method="power", tol=1e-4, max_iter=60, seed=6)
    return {"trace": tr.value, "hutchpp": pp.value, "lanczos": lz.values[0], "power": pw.values[0]}


def shard(model, world: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    blocks = model.gpt_neox.layers if hasattr(model, "gpt_neox") else model.model.layers
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _record(out: Path, name: str, rank: int, fn) -> None:
    try:
        result = {"ok": fn()}
    except Exception as exc:  # the test inspects the error each rank raised
        result = {"error": type(exc).__name__, "message": str(exc), "trace": traceback.format_exc()}
    torch.save(result, out / f"{name}-{rank}.pt")


def run(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    out = Path(out)
    from geometry.operators.sharded import ShardedHessianOperator

    try:
        mine = split_batches(lm_batches(), rank, world)
        for family, make in FAMILIES.items():
            model = shard(make(seed=1), world)
            before = {n: p.to_local().clone() for n, p in model.named_parameters()}

            def run_family():
                op = ShardedHessianOperator(model, lm_loss, mine)
                res = estimates(op)
                res.update(local_dim=op.local_dim, dim=op.dim, global_dim=op.global_dim,
                           unchanged=all(torch.equal(before[n], p.to_local()) for n, p in model.named_parameters()))
                return res

            _record(out, f"same-{family}", rank, run_family)
        model = shard(micro_gptneox(seed=1), world)
        _record(out, "refuses-slq", rank, lambda: spectral_density(ShardedHessianOperator(model, lm_loss, mine),
                                                                   num_runs=1, num_steps=4))
    finally:
        dist.destroy_process_group()
