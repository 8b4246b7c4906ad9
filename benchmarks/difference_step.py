"""The gradient-difference step constant (benchmarks/README.md, "Step constant"): error against c.

``python -m benchmarks.difference_step [--factors 0.5,1,2,3,4] [--seeds 5] [--families apertus]``

For the tiny bfloat16 models of :mod:`benchmarks.precision` (float32 compute), the worst relative
error over 3 Gaussian vectors of the central difference products with the step
``f · relative_step(float32)`` for each factor f, against the float64 reverse products of
the same weights (HF's float32 islands in float64); ``--lanczos`` adds λ_max (80 Lanczos steps) of a
float32 copy against float64 Lanczos (the refined Rayleigh quotient). Factors multiply the default
rule. One thread; errors only. One JSON row per model.
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

from losslens.geometry import HessianOperator, top_eigenvalues
from losslens.geometry.operators.difference import DifferenceBackend, relative_step
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.models.families import FAMILIES
from losslens.lm.models.fidelity import float64_fidelity

from .precision import OTHERS, batches_of, bf16_model


def product_errors(family: str, seed: int, factors: list[float]) -> list[float]:
    """Worst-vector relative error of the float32 central products at each step factor."""
    model = bf16_model(family, seed)
    batches = batches_of(model, seed)
    with float64_fidelity():
        exact = HessianOperator(copy.deepcopy(model).double(), lm_loss, batches)
        V = torch.randn(3, exact.dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        ref = exact.matmat_flat(V)
    h = relative_step(torch.float32)
    out = []
    for f in factors:
        got = HessianOperator(model, lm_loss, batches, backend=DifferenceBackend(step=f * h))
        got = got.matmat_flat(V.float()).double()
        out.append(max(float((got[i] - ref[i]).norm() / ref[i].norm()) for i in range(3)))
    return out


def lambda_errors(family: str, seed: int, factors: list[float]) -> list[float]:
    """Relative error of float32 difference Lanczos λ_max (80 steps) at each step factor."""
    model = bf16_model(family, seed).double()
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, 96, (2, 16), generator=g) for _ in range(2)]
    with float64_fidelity():
        ref = top_eigenvalues(
            HessianOperator(model, lm_loss, batches), k=1, method="lanczos", max_iter=80, tol=1e-7, seed=0
        ).values[0]
    h = relative_step(torch.float32)
    out = []
    for f in factors:
        op = HessianOperator(copy.deepcopy(model).float(), lm_loss, batches, backend=DifferenceBackend(step=f * h))
        got = top_eigenvalues(op, k=1, method="lanczos", max_iter=80, tol=1e-7, seed=0).values[0]
        out.append(abs(got - ref) / abs(ref))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factors", default="0.5,1,2,3,4")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--families", default=",".join(list(FAMILIES) + list(OTHERS)))
    parser.add_argument("--lanczos", action="store_true", help="also λ_max of Lanczos (slower)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    factors = [float(f) for f in args.factors.split(",")]
    for family in args.families.split(","):
        for seed in range(args.seeds):
            row = {
                "family": family,
                "seed": seed,
                "factors": factors,
                "products": product_errors(family, seed, factors),
            }
            if args.lanczos:
                row["lambda_max"] = lambda_errors(family, seed, factors)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
