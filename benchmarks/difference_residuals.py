"""Residuals of a difference-backend eigen solve against the true ones (benchmarks/README.md,
"Residuals of a difference eigen solve").

``python -m benchmarks.difference_residuals [--seeds 2] [--families llama,olmo2] [--markdown FILE]``

For the tiny float32 model of every family (:func:`losslens.lm.models.families.tiny_model`, 2 × 16
random tokens, 2 batches), ``top_eigenvalues(k=2, max_iter=40, tol=1e-3)`` on the gradient-difference
operator, Lanczos and power iteration. For each returned unit vector v and value λ it compares:

- ``reported``: the residual the solver returns (since 2026-12-07: ``‖H_R v − λ v‖`` with Richardson's
  refined products H_R, the final block of the solve);
- ``central``: what it returned before, ``‖H_c v − θ v‖`` with the central products H_c and the Ritz
  (or power) value θ, recomputed here on the same vectors;
- ``true``: ``‖H v − λ v‖`` with the float64 reverse (double-backward) products of the same weights,
  an independent code path (no gradient difference).

A row's ratio is reported / true and central / true; ``flag`` says whether ``converged`` (reported)
and the true test ``true ≤ tol·|λ| + 10·ε·|λ₁|`` agree, and how often the central residual would
have claimed convergence that the true residual denies. One thread (``torch.set_num_threads(1)``).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks import emit, show_table

from losslens.geometry.estimators.eigen import top_eigenvalues
from losslens.geometry.operators.hessian import HessianOperator
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.models.families import FAMILIES, tiny_model

TOL = 1e-3
K = 2


def _norms(HV: torch.Tensor, V: torch.Tensor, lam) -> list[float]:
    lam = torch.as_tensor(lam, dtype=torch.float64)
    return (HV.double() - lam[:, None] * V.double()).norm(dim=1).tolist()


def measure(family: str, seed: int, method: str) -> dict:
    """One row: the solve's values, residuals (reported, central, true) and flags for one model."""
    model = tiny_model(family, seed=seed, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, 96, (2, 16), generator=g) for _ in range(2)]
    op = HessianOperator(model, lm_loss, batches, backend="difference")
    res = top_eigenvalues(op, k=K, method=method, max_iter=40, seed=seed, tol=TOL)
    V = res.vectors
    before = res.memory["refined"]["ritz_values"] if "refined" in res.memory else list(res.values)
    central = _norms(op.matmat_flat(V), V, before)
    exact = HessianOperator(tiny_model(family, seed=seed, dtype=torch.float64), lm_loss, batches)
    true = _norms(exact.matmat_flat(V.double()), V, res.values)
    floor = 10 * float(torch.finfo(torch.float32).eps) * abs(res.values[0])
    truly = [t <= TOL * abs(v) + floor for t, v in zip(true, res.values)]
    return {
        "family": family,
        "seed": seed,
        "method": method,
        "values": list(res.values),
        "reported": list(res.residuals),
        "central": central,
        "true": true,
        "converged": list(res.converged),
        "truly_converged": truly,
        "central_claimed": [c <= TOL * abs(v) + floor for c, v in zip(central, before)],
        "products": res.num_matvecs,
    }


def table(rows: list[dict]) -> str:
    """Markdown: the worst ratios per family and method, and the flags."""
    lines = [
        "| family | method | reported / true (range over seeds × values) | central / true | "
        "flags agree | central claimed, not converged |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for fam in dict.fromkeys(r["family"] for r in rows):
        for method in ("lanczos", "power"):
            rs = [r for r in rows if r["family"] == fam and r["method"] == method]
            rep = [a / t for r in rs for a, t in zip(r["reported"], r["true"])]
            cen = [a / t for r in rs for a, t in zip(r["central"], r["true"])]
            agree = sum(c == t for r in rs for c, t in zip(r["converged"], r["truly_converged"]))
            n = sum(len(r["true"]) for r in rs)
            wrong = sum(c and not t for r in rs for c, t in zip(r["central_claimed"], r["truly_converged"]))
            lines.append(
                f"| {fam} | {method} | {min(rep):.2f}–{max(rep):.2f} | {min(cen):.2f}–{max(cen):.2f} | "
                f"{agree}/{n} | {wrong}/{n} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--markdown", default=None, help="write the table to this file")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [
        measure(fam, seed, method)
        for fam in args.families.split(",")
        for seed in range(args.seeds)
        for method in ("lanczos", "power")
    ]
    emit(rows, args.json)
    show_table(table(rows), args.markdown)
    return rows


if __name__ == "__main__":
    main()
