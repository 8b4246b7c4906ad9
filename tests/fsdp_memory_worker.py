"""Worker of tests/test_sharded_memory.py (issue #48): one rank of a gloo group (spawned, one thread)
that shards a float64 Llama whose weights are bfloat16 numbers (a bfloat16 checkpoint in float64
compute: the master copy is kept in bfloat16) and, for every memory layout — Hutchinson, Lanczos with
the basis on the device and on local disk, Hutch++ with the sketch on disk — records the estimate,
the tracked peak of the call (:func:`~losslens.geometry.memory.graphs.peak_new_bytes`, the largest over
the ranks), the disk-held state's peak, the plan's device and host bytes, and whether θ came back
bit-identical. Also: one product against the loop that keeps ``.grad`` shards and a full-width master
(:func:`~losslens.geometry.operators.difference.difference_products`), bit for bit.

Also used by ``python -m benchmarks.sharded_layouts`` at 4 and 8 ranks on a larger shape (:func:`layouts`)."""

from __future__ import annotations

import torch

from losslens.geometry.operators.data_parallel import split_batches
from tests.gloo_ranks import gloo_group, record
from tests.tiny_models import lm_loss, micro_llama, random_batches

SIZES = [3, 5, 2]


def lm_batches() -> list[torch.Tensor]:
    return [random_batches(n_batches=1, batch=b, seq=8, seed=20 + i)[0] for i, b in enumerate(SIZES)]


def bf16_model(seed: int = 1) -> torch.nn.Module:
    """The float64 micro Llama with every weight rounded to bfloat16 (as a bfloat16 checkpoint)."""
    return micro_llama(seed=seed).to(torch.bfloat16).to(torch.float64)


def estimator_calls(lanczos_steps: int = 12, hutchpp_matvecs: int = 9) -> dict:
    """The layouts: ``{name: fn(op) -> result}``."""
    from losslens.geometry import hutchinson_trace, hutchpp_trace, top_eigenvalues

    return {
        "hutchinson": lambda op: hutchinson_trace(op, num_matvecs=4, seed=3, block_size=1),
        "lanczos": lambda op: top_eigenvalues(op, k=1, method="lanczos", max_iter=lanczos_steps, tol=1e-9, seed=5),
        "lanczos-disk": lambda op: top_eigenvalues(
            op, k=1, method="lanczos", max_iter=lanczos_steps, tol=1e-9, seed=5, basis_device="disk"
        ),
        "hutchpp-disk": lambda op: hutchpp_trace(op, num_matvecs=hutchpp_matvecs, seed=4, basis_device="disk"),
    }


def layouts(op, calls: dict) -> dict:
    """Run each layout on ``op`` once (the pass measured first, outside the tracked calls) and return
    ``{name: {value, peak, plan, host_peak, host_plan, transfer, unchanged}}`` (peaks: largest over ranks)."""
    from losslens.geometry.base.state_store import DISK_USE
    from losslens.geometry.memory.graphs import peak_new_bytes

    op.pass_bytes(1)
    before = [t.clone() for t in op.locals]
    out = {}
    for name, call in calls.items():
        DISK_USE.reset()
        res, peak = peak_new_bytes(lambda: call(op))
        mem = res.memory
        out[name] = {
            "value": res.value if hasattr(res, "value") else res.values[0],
            "peak": max(op.parallel.gather_objects(int(peak))),
            "plan": mem["predicted_bytes"],
            "host_peak": max(op.parallel.gather_objects(int(DISK_USE.peak))),
            "host_plan": mem.get("host_bytes", 0),
            "transfer": mem.get("transfer", {}),
            "settings": mem["settings"],
            "unchanged": all(torch.equal(a, b) for a, b in zip(before, op.locals)),
        }
    return out


def old_loop_equal(op) -> bool:
    """One product of the operator against the one-process loop (``.grad`` shards, full master), bitwise."""
    from losslens.geometry.operators.backend import ReducedVectors
    from losslens.geometry.operators.difference import difference_products

    g = torch.Generator().manual_seed(7)
    V = torch.randn(2, op.dim, generator=g, dtype=op.dtype)
    new = op.matmat_flat(V)
    old = torch.zeros_like(V)
    space = ReducedVectors(lambda values: op.parallel.sum_floats(values, op.device), op.global_dim)

    def loss_of(_batch, i):
        scale, batch = op._round(i)
        return op.loss_fn(op.model, batch) * scale

    with op._call_context():
        difference_products(
            list(op.params.values()),
            [(i, 1.0, i) for i in range(op.rounds)],
            loss_of,
            op._views(V),
            op._views(old),
            op.product_backend.step(op),
            op.richardson,
            space,
            tensors=op.locals,
            grad_of=lambda g: g.to_local(),
        )
    return bool(torch.equal(new, old))


def run(rank: int, world: int, port: int, out: str) -> None:
    from losslens.geometry.operators.sharded import ShardedHessianOperator
    from losslens.geometry.operators.sharded_products import master_dtypes
    from losslens.lm.models.sharding import shard_model

    with gloo_group(rank, world, port, timeout_s=120):
        mine = split_batches(lm_batches(), rank, world)
        model = shard_model(bf16_model())

        def scenario():
            op = ShardedHessianOperator(model, lm_loss, mine, max_memory=10**9)
            res = layouts(op, estimator_calls())
            res["masters"] = sorted({str(d) for d in master_dtypes(op.locals)})
            res["old_loop_equal"] = old_loop_equal(op)
            return res

        record(out, "layouts", rank, scenario)
