"""Issue #48's layouts at 2, 4 and 8 gloo ranks: per-rank measured peak ÷ plan, state on disk, equality
with the unsharded operator, θ bit-identical (``python -m benchmarks.sharded_layouts [--ranks 4,8]``).

Model: a random-init Llama of ``--shape`` (``benchmarks.shapes``, default ``llama-128x6``) in float64
with every weight rounded to bfloat16 (a bfloat16 checkpoint: the sharded master is kept in bfloat16),
every block and the root ``fully_shard``-ed on a CPU mesh; ``--batches`` batches of 1 × 32 tokens split
over the ranks (at least one per rank); one torch thread per process. Each rank runs the layouts of
``tests.fsdp_memory_worker.estimator_calls`` (Hutchinson, Lanczos with the basis in RAM and on disk,
Hutch++ with the sketch on disk) and records the tracked peak against the plan; one process runs the
same estimators on the unsharded difference backend over all batches. Both run HF's float32 islands
(RMSNorm, rotary) in float64 (:func:`losslens.lm.models.fidelity.with_float64_fidelity`): without it
the gradients carry float32 rounding that the step of a float64 difference amplifies (a 6.7% product
error), and sharded and unsharded differ by their summation order at that level.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

BATCH_SEQ = 32


def _batches(shape: str, n: int) -> list[torch.Tensor]:
    from benchmarks.shapes import SHAPES

    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, SHAPES[shape][4], (1, BATCH_SEQ), generator=g) for _ in range(n)]


def _model(shape: str) -> torch.nn.Module:
    from benchmarks.shapes import build

    return build(shape, torch.float32).to(torch.bfloat16).to(torch.float64)


def _rank(rank: int, world: int, port: int, out: str, shape: str, batches: int) -> None:
    from losslens.geometry.operators.data_parallel import split_batches
    from losslens.geometry.operators.sharded import ShardedHessianOperator
    from losslens.lm.models.fidelity import with_float64_fidelity
    from losslens.lm.models.sharding import shard_model
    from tests.fsdp_memory_worker import estimator_calls, layouts, old_loop_equal
    from tests.gloo_ranks import gloo_group, record
    from tests.tiny_models import lm_loss

    with gloo_group(rank, world, port, timeout_s=1800):
        model = shard_model(_model(shape))
        mine = split_batches(_batches(shape, batches), rank, world)

        def scenario():
            loss = with_float64_fidelity(lm_loss, model)  # HF's float32 islands (RMSNorm, rotary) run in float64
            op = ShardedHessianOperator(model, loss, mine, max_memory=10**10)
            res = layouts(op, estimator_calls(lanczos_steps=8))
            res["old_loop_equal"] = old_loop_equal(op)
            res["local_dim"], res["global_dim"] = op.local_dim, op.global_dim
            return res

        record(out, f"world{world}", rank, scenario)


def run(ranks: tuple[int, ...] = (4, 8), shape: str = "llama-128x6", batches: int = 8) -> list[dict]:
    from losslens.geometry import HessianOperator
    from tests.fsdp_memory_worker import estimator_calls
    from tests.gloo_ranks import run_ranks
    from tests.tiny_models import lm_loss

    from losslens.lm.models.fidelity import with_float64_fidelity

    torch.set_num_threads(1)
    model = _model(shape)
    op = HessianOperator(model, with_float64_fidelity(lm_loss, model), _batches(shape, batches), backend="difference")
    single = {}
    for name, call in estimator_calls(lanczos_steps=8).items():
        res = call(op)
        single[name] = res.value if hasattr(res, "value") else res.values[0]
    rows = []
    for world in ranks:
        with tempfile.TemporaryDirectory() as tmp:
            results = run_ranks(_rank_entry(shape, batches), Path(tmp), world)[f"world{world}"]
        if not all("ok" in r for r in results):
            raise RuntimeError(str([r.get("trace") for r in results]))
        first = results[0]["ok"]
        for name in single:
            res = first[name]
            rows.append(
                {
                    "shape": shape,
                    "ranks": world,
                    "layout": name,
                    "elements_per_rank": max(r["ok"]["local_dim"] for r in results),
                    "peak_MB": res["peak"] / 1e6,
                    "plan_MB": res["plan"] / 1e6,
                    "measured_over_plan": res["peak"] / res["plan"],
                    "disk_peak_MB": res["host_peak"] / 1e6,
                    "disk_plan_MB": res["host_plan"] / 1e6,
                    "value": res["value"],
                    "rel_diff_vs_unsharded": abs(res["value"] - single[name]) / abs(single[name]),
                    "theta_bit_identical": all(r["ok"][name]["unchanged"] for r in results),
                    "products_bit_identical_to_grad_loop": all(r["ok"]["old_loop_equal"] for r in results),
                }
            )
    return rows


def rounding(shape: str = "llama-128x6", batches: int = 8) -> list[dict]:
    """How far float64 rounding alone moves each one-process estimate on the layouts' problem: the same
    estimators with the batches summed in reverse order (another summation order, as the ranks'
    reduce-scatter is), the products' relative change ``‖ΔHV‖/‖HV‖`` on two Gaussian vectors, and
    Hutch++'s sketch (seed 4, s = 3): the condition number of ``Y = H S`` (√ of its Gram matrix's
    eigenvalue ratio) and the cancellation ``(|tr QᵀHQ| + |residual|) / |value|``. Cost: the three
    estimators twice, 10 more products (each ``2 · batches`` gradients); one process, one thread."""
    from losslens.geometry import HessianOperator
    from losslens.geometry.base._linalg import gram, orthonormalize_rows, rowdot
    from losslens.geometry.estimators.sampling import rademacher
    from losslens.lm.models.fidelity import with_float64_fidelity
    from tests.fsdp_memory_worker import estimator_calls
    from tests.tiny_models import lm_loss

    torch.set_num_threads(1)
    model = _model(shape)
    data = _batches(shape, batches)
    loss = with_float64_fidelity(lm_loss, model)
    ops = [HessianOperator(model, loss, order, backend="difference") for order in (data, data[::-1])]
    calls = {k: v for k, v in estimator_calls(lanczos_steps=8).items() if not k.endswith("-disk")}
    calls["hutchpp"] = estimator_calls(lanczos_steps=8)["hutchpp-disk"]
    rows = []
    for name, call in calls.items():
        a, b = (call(op) for op in ops)
        va, vb = (r.value if hasattr(r, "value") else r.values[0] for r in (a, b))
        rows.append(
            {"shape": shape, "estimator": name, "value": va, "rel_diff_reversed_batches": abs(va - vb) / abs(va)}
        )
    V = torch.randn(2, ops[0].dim, generator=torch.Generator().manual_seed(11), dtype=ops[0].dtype)
    HA, HB = (op.matmat_flat(V) for op in ops)
    product_change = float(((HA - HB).norm(dim=1) / HA.norm(dim=1)).max())
    op = ops[0]
    Y = op.matmat_flat(rademacher(op.generator(4), 3, op.dim, op.dtype, op.device))
    lam = torch.linalg.eigvalsh(gram(Y, Y))
    Q = orthonormalize_rows(Y)
    low = float(rowdot(Q, op.matmat_flat(Q)).sum())
    value = rows[-1]["value"]
    rows.append(
        {
            "shape": shape,
            "products_rel_change_reversed_batches": product_change,
            "hutchpp_sketch_condition": float((lam.max() / lam.min()).sqrt()),
            "hutchpp_low_rank_part": low,
            "hutchpp_residual_part": value - low,
            "hutchpp_cancellation": (abs(low) + abs(value - low)) / abs(value),
        }
    )
    return rows


class _rank_entry:  # picklable for spawn: binds the shape and batches
    def __init__(self, shape: str, batches: int):
        self.shape, self.batches = shape, batches

    def __call__(self, rank: int, world: int, port: int, out: str) -> None:
        _rank(rank, world, port, out, self.shape, self.batches)


def main(argv: list[str] | None = None) -> list[dict]:
    from benchmarks import emit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="4,8")
    parser.add_argument("--shape", default="llama-128x6")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--json", default=None)
    parser.add_argument("--rounding", action="store_true", help="one process: the estimates with the batches reversed")
    args = parser.parse_args(argv)
    if args.rounding:
        return emit(rounding(args.shape, args.batches), args.json)
    return emit(run(tuple(int(r) for r in args.ranks.split(",")), args.shape, args.batches), args.json)


if __name__ == "__main__":
    main()
