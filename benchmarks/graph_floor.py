"""The set-up's graph floor against the smallest pass it bounds, on real shapes (benchmarks/README.md,
"The graph floor in the compute dtype").

``python -m benchmarks.graph_floor [--shapes pythia-70m,pythia-160m] [--tokens 128] [--markdown FILE]``

For a random-init shape (:func:`benchmarks.shapes.build`), 2 batches of 2 × ``tokens`` random tokens
and each (weights, compute) pair: float32 weights with the default compute dtype and with
``compute_dtype="float64"``, bfloat16 weights with the default (float32). ``floor``: the smallest
``max_memory`` that :func:`losslens.lm.models.lm_setup.plan_lm_setup` accepts (bisection to 0.5%; the
graph of one row bounded on 16 and 32 tokens, extended linearly, plus a gradient and three vectors, all
in the compute dtype). ``pass``: what the operator's memory model gives for the smallest estimator
pass once the whole graph is measured, ``pass_bytes(1, cached=False)`` plus three vectors. The floor
must stay below the pass (it refuses only what no estimator could run); before 2026-12-07 it was
taken in the weights' dtype, so a float64 compute of float32 weights was bounded by the float32
graph. Each case runs in a fresh process (the allocator keeps what a case freed); threads:
``torch.set_num_threads(2)`` (this machine's cores).
"""

from __future__ import annotations

import argparse
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import torch

from benchmarks import emit, show_table
from benchmarks.shapes import build

from losslens.geometry.memory.budget import MemoryBudgetError
from losslens.lm.models.curvature import lm_hessian
from losslens.lm.models.lm_setup import plan_lm_setup

CASES = ((torch.float32, None), (torch.float32, "float64"), (torch.bfloat16, None))


def least_budget(model, batches, compute_dtype) -> int:
    """The smallest ``max_memory`` (bytes, to 0.5%) that the set-up's plan accepts."""
    lo, hi = 10**6, 10**12
    while hi - lo > hi // 200:
        mid = (lo + hi) // 2
        try:
            plan_lm_setup(model, batches, check=False, max_memory=mid, compute_dtype=compute_dtype)
            hi = mid
        except MemoryBudgetError:
            lo = mid
    return hi


def measure(shape: str, tokens: int, weights: torch.dtype, compute: str | None) -> dict:
    """One row: ``shape`` in ``weights`` with products in ``compute`` (None: the default policy)."""
    torch.set_num_threads(2)
    batches = [torch.randint(0, 50_000, (2, tokens), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    model = build(shape, weights).eval()
    floor = least_budget(model, batches, compute)
    op = lm_hessian(model, batches, check=False, compute_dtype=compute)
    smallest = op.pass_bytes(1, cached=False) + 3 * op.dim * op.dtype.itemsize
    return {
        "shape": shape,
        "weights": str(weights).replace("torch.", ""),
        "compute": str(op.param_dtype).replace("torch.", ""),
        "tokens": [2, tokens],
        "floor_bytes": floor,
        "pass_bytes": smallest,
        "floor_over_pass": floor / smallest,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| shape | weights → compute | floor | smallest pass + 3 vectors | floor / pass |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['weights']} → {r['compute']} | {r['floor_bytes'] / 1e9:.3f} GB | "
            f"{r['pass_bytes'] / 1e9:.3f} GB | {r['floor_over_pass']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="pythia-70m,pythia-160m")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--markdown", default=None, help="write the table to this file")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args(argv)
    # each case in a fresh process: the allocator keeps what a case freed (pythia-70m then 160m in one
    # process passed 23 GB), and the 160m float64 graph measurement alone peaks at ~20 GB RSS
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn, max_tasks_per_child=1) as pool:
        jobs = [(shape, args.tokens, w, c) for shape in args.shapes.split(",") for w, c in CASES]
        rows = [pool.submit(measure, *job).result() for job in jobs]
    emit(rows, args.json)
    show_table(table(rows), args.markdown)
    return rows


if __name__ == "__main__":
    main()
