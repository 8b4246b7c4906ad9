"""Worker of tests/test_sharded.py: one rank of a 2-process gloo group (spawned, one thread) that
shards a tiny model with FSDP2 ``fully_shard`` and runs the estimators on a
:class:`~losslens.geometry.operators.sharded.ShardedHessianOperator`; each scenario saves what the rank
computed, or the error it raised, to ``out/<scenario>-<rank>.pt``."""

from __future__ import annotations

import torch
from losslens.geometry import hutchinson_trace, hutchpp_trace, spectral_density, top_eigenvalues
from losslens.geometry.operators.data_parallel import split_batches
from losslens.lm.models.sharding import shard_model
from tests.gloo_ranks import gloo_group, record
from tests.tiny_models import lm_loss, micro_gptneox, micro_llama, random_batches

SIZES = [3, 5, 2]  # 3 batches of uneven rows: split 2 + 1 over 2 ranks
FAMILIES = {"neox": micro_gptneox, "llama": micro_llama, "llama-relu": lambda seed: micro_llama(seed=seed, act="relu")}


def lm_batches() -> list[torch.Tensor]:
    return [random_batches(n_batches=1, batch=b, seq=8, seed=20 + i)[0] for i, b in enumerate(SIZES)]


def estimates(op) -> dict:
    tr = hutchinson_trace(op, num_matvecs=6, seed=3)
    pp = hutchpp_trace(op, num_matvecs=9, seed=4)
    lz = top_eigenvalues(op, k=1, method="lanczos", tol=1e-6, max_iter=40, seed=5)
    pw = top_eigenvalues(op, k=1, method="power", tol=1e-4, max_iter=60, seed=6)
    return {"trace": tr.value, "hutchpp": pp.value, "lanczos": lz.values[0], "power": pw.values[0]}


def run(rank: int, world: int, port: int, out: str) -> None:
    from losslens.geometry.operators.branches import FrozenBranches
    from losslens.geometry.operators.sharded import ShardedHessianOperator

    recorded = []  # the batch rounds whose piecewise activations were frozen (ReLU family only)
    original_record = FrozenBranches.record
    FrozenBranches.record = lambda self, index, forward: (recorded.append(index), original_record(self, index, forward))

    with gloo_group(rank, world, port, timeout_s=120):
        mine = split_batches(lm_batches(), rank, world)
        for family, make in FAMILIES.items():
            model = shard_model(make(seed=1))
            before = {n: p.to_local().clone() for n, p in model.named_parameters()}

            def run_family():
                recorded.clear()
                op = ShardedHessianOperator(model, lm_loss, mine)
                res = estimates(op)
                res.update(
                    recorded=len(recorded),
                    local_dim=op.local_dim,
                    dim=op.dim,
                    global_dim=op.global_dim,
                    unchanged=all(torch.equal(before[n], p.to_local()) for n, p in model.named_parameters()),
                )
                return res

            record(out, f"same-{family}", rank, run_family)
        half = shard_model(micro_llama(seed=1).bfloat16(), compute_dtype=torch.bfloat16)  # kept in bfloat16
        record(out, "refuses-half-shards", rank, lambda: ShardedHessianOperator(half, lm_loss, mine))
        record(
            out,
            "half-shards-on-request",
            rank,
            lambda: {"dtype": str(ShardedHessianOperator(half, lm_loss, mine, compute_dtype="bfloat16").param_dtype)},
        )
        model = shard_model(micro_gptneox(seed=1))
        record(
            out,
            "refuses-slq",
            rank,
            lambda: spectral_density(ShardedHessianOperator(model, lm_loss, mine), num_runs=1, num_steps=4),
        )
