"""Worker of tests/test_batch_weights.py: one rank of a 2-process gloo group (spawned, one thread)
that builds the data-parallel and the FSDP2-sharded operator over batches of unequal length and
saves their products of fixed global vectors (``out/<scenario>-<rank>.pt``)."""

from __future__ import annotations

import torch

from losslens.geometry import HessianOperator
from losslens.geometry.operators.data_parallel import split_batches
from tests.gloo_ranks import gloo_group, record
from tests.tiny_models import lm_loss, micro_llama, random_batches

SHAPES = [(2, 9), (3, 5), (1, 12)]  # [rows, seq]: 16, 12 and 11 targets; split [0, 1] + [2] over 2 ranks
K = 3


def unequal_batches() -> list[torch.Tensor]:
    return [random_batches(n_batches=1, batch=b, seq=s, seed=40 + i)[0] for i, (b, s) in enumerate(SHAPES)]


PAD = 1


def zero_row_model() -> torch.nn.Module:
    """micro_llama (seed 1) with token PAD's input-embedding row zeroed."""
    model = micro_llama(seed=1)
    with torch.no_grad():
        model.get_input_embeddings().weight[PAD] = 0.0
    return model


def padded_batches() -> list[torch.Tensor]:
    """:func:`unequal_batches` with token PAD at the end of the first row and inside the last batch
    (5 positions; 6 targets left out)."""
    out = [b.masked_fill(b == PAD, PAD + 1) for b in unequal_batches()]
    out[0][0, -3:] = PAD
    out[2][0, 4:6] = PAD
    return out


def probes(dim: int) -> torch.Tensor:
    """Fixed global vectors [K, dim] (float64)."""
    return torch.randn(K, dim, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


def _local(V: torch.Tensor, op) -> torch.Tensor:
    """This rank's columns of global rows ``V``, padded to ``op.dim``."""
    out = torch.zeros(V.shape[0], op.dim, dtype=V.dtype)
    at = 0
    for start, length in op.layout.ranges:
        out[:, at : at + length] = V[:, start : start + length]
        at += length
    return out


def _global(HV: torch.Tensor, op) -> torch.Tensor:
    """Rows of local columns back at their global positions (zeros elsewhere; summed over ranks by the test)."""
    out = torch.zeros(HV.shape[0], op.global_dim, dtype=HV.dtype)
    at = 0
    for start, length in op.layout.ranges:
        out[:, start : start + length] = HV[:, at : at + length]
        at += length
    return out


def run(rank: int, world: int, port: int, out: str) -> None:
    from losslens.geometry.operators.sharded import ShardedHessianOperator
    from losslens.lm.models.sharding import shard_model

    with gloo_group(rank, world, port, timeout_s=120):
        mine = split_batches(unequal_batches(), rank, world)
        model = micro_llama(seed=1)
        dim = sum(p.numel() for p in model.parameters())

        def data_parallel():
            op = HessianOperator(model, lm_loss, mine, data_parallel=True)
            return {"hv": op.matmat_flat(probes(dim)), "weights": op.weights}

        record(out, "data", rank, data_parallel)
        sharded = shard_model(micro_llama(seed=1))

        def fsdp():
            op = ShardedHessianOperator(sharded, lm_loss, mine, richardson=True)
            return {"hv": _global(op.matmat_flat(_local(probes(dim), op)), op), "weights": op.weights}

        record(out, "fsdp", rank, fsdp)
        padded = shard_model(zero_row_model())

        def fsdp_zero_row():  # the zero row found shard by shard (the plan); sharded_lm_hessian leaves token PAD out
            from losslens.geometry.operators.data_parallel import DataParallel
            from losslens.lm.models.lm_setup import plan_lm_setup
            from losslens.lm.models.sharding import sharded_lm_hessian

            mine_padded = split_batches(padded_batches(), rank, world)
            setup = plan_lm_setup(
                padded, mine_padded, backend="difference", lean_head=False, data_parallel=DataParallel()
            )
            found = setup.exclude
            op = sharded_lm_hessian(padded, setup, richardson=True)
            return {
                "hv": _global(op.matmat_flat(_local(probes(dim), op)), op),
                "excluded": op.excluded,
                "found": found,
            }

        record(out, "fsdp-zero-row", rank, fsdp_zero_row)

        def data_zero_row():  # lm_hessian, data-parallel: the counts summed over the ranks
            from losslens.geometry.operators.data_parallel import DataParallel
            from losslens.lm.models.curvature import lm_hessian

            op = lm_hessian(
                zero_row_model(),
                split_batches(padded_batches(), rank, world),
                check=False,
                data_parallel=DataParallel(),
            )
            return {"hv": op.matmat_flat(probes(dim)), "excluded": op.excluded}

        record(out, "data-zero-row", rank, data_zero_row)
