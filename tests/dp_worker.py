"""Worker of tests/test_data_parallel.py: one rank of a 2-process gloo group (spawned, one thread).

Each scenario writes what the rank computed (or the error it raised) to ``out/<scenario>-<rank>.pt``;
the test compares the ranks with a single process over all the batches.
"""

from __future__ import annotations

import torch

from losslens.geometry import HessianOperator, hutchinson_trace, top_eigenvalues
from losslens.geometry.operators.data_parallel import split_batches
from tests.gloo_ranks import gloo_group, record
from tests.tiny_models import lm_loss, micro_gptneox, random_batches

SIZES = [3, 5, 2]  # uneven rows: the token weights matter, and 3 batches split 2 + 1


def lm_batches() -> list[torch.Tensor]:
    return [random_batches(n_batches=1, batch=b, seq=8, seed=10 + i)[0] for i, b in enumerate(SIZES)]


def estimates(op: HessianOperator) -> dict:
    """The numbers compared: fixed products, the gradient, a trace and λ_max."""
    g = torch.Generator().manual_seed(5)
    V = torch.randn(3, op.dim, generator=g, dtype=op.dtype)
    loss, grad = op.gradient()
    tr = hutchinson_trace(op, num_matvecs=12, seed=3)
    ev = top_eigenvalues(op, k=1, method="lanczos", tol=1e-10, max_iter=60, seed=4)
    return {
        "hv": op.matmat_flat(V),
        "loss": loss,
        "grad": grad,
        "trace": tr.value,
        "lambda": ev.values[0],
        "weights": op.weights,
        "num_batches": len(op.batches),
    }


def run(rank: int, world: int, port: int, out: str) -> None:
    with gloo_group(rank, world, port, timeout_s=60):
        model = micro_gptneox(seed=1)
        mine = split_batches(lm_batches(), rank, world)
        record(out, "same", rank, lambda: estimates(HessianOperator(model, lm_loss, mine, data_parallel=True)))

        def failing_loss(m, batch):
            if rank == 1:
                raise RuntimeError("this rank's loss broke")
            return lm_loss(m, batch)

        record(
            out,
            "rank_fails",
            rank,
            lambda: HessianOperator(model, failing_loss, mine, data_parallel=True).matvec_flat(
                torch.ones(sum(p.numel() for p in model.parameters()), dtype=torch.float64)
            ),
        )
        record(
            out,
            "empty_rank",
            rank,
            lambda: HessianOperator(model, lm_loss, mine if rank == 0 else [], data_parallel=True),
        )
        record(
            out,
            "mismatch",
            rank,
            lambda: HessianOperator(
                model, lm_loss, mine, params="*layers.0.*" if rank == 0 else None, data_parallel=True
            ),
        )
