"""Extreme eigenvalues of a curvature operator: Lanczos (default) and deflated power iteration.

Eigenvalues are ranked by magnitude with their sign kept: a Hessian away from a minimum can have
a negative eigenvalue larger in magnitude than the largest positive one, and power iteration finds
exactly that one. Both methods start from a seeded Gaussian unit vector drawn from
``op.generator(seed)`` (CPU generator; identical numbers on every device).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from ._checks import _check_int, _check_op
from ._lanczos import lanczos, ritz
from .operator import CurvatureOperator
from .results import EigenResult, EstimatorError

__all__ = ["top_eigenvalues"]


def _gaussian_unit(g: torch.Generator, dim: int, dtype, device) -> torch.Tensor:
    x = torch.randn(dim, generator=g, dtype=torch.float64)
    return (x / x.norm()).to(device=device, dtype=dtype)


def top_eigenvalues(
    op: CurvatureOperator,
    k: int = 1,
    method: str = "lanczos",
    tol: float = 1e-4,
    max_iter: int = 100,
    seed: int = 0,
) -> EigenResult:
    """The k eigenvalues of largest magnitude (sign kept), with residual norms.

    Args:
        op: any symmetric curvature operator of dimension ``dim``.
        k: how many eigenvalues, ``1 <= k <= dim``.
        method:
            ``"lanczos"`` — Lanczos with full re-orthogonalisation from one random start vector:
            after every step the tridiagonal T is diagonalised (cheap, m × m) and the run stops when
            every one of the k largest-|θ| Ritz values has residual estimate
            ``|β_{m+1} s_{m,i}| < tol·|θ_i|``, or after ``max_iter`` steps (at least k, at most dim;
            an invariant Krylov space is continued from a fresh random vector orthogonal to it).
            Cost: one HVP per step, plus one block of k HVPs for the true residuals of the Ritz
            vectors. Memory: the basis, ``max_iter × dim`` numbers.

            ``"power"`` — power iteration for the largest-|λ| eigenpair, then deflated power
            iteration (iterates orthogonalised against the eigenvectors already found, as PyHessian
            does) for the next ones; each value stops when the Rayleigh quotient changes by less
            than ``tol·|λ|`` between iterations, or after ``max_iter`` iterations. The residual is
            that of the last iterate, whose H v was already computed (no extra HVP). Cost: one HVP
            per iteration, ≤ k · max_iter. Converges at rate |λ_{i+1}/λ_i| — slowly for clustered
            spectra; prefer Lanczos for k > 1.
        tol: relative tolerance (see above), > 0.
        max_iter: Lanczos steps, or power iterations per eigenvalue, ≥ 1.
        seed: seed of the random start vector(s).

    Returns:
        :class:`EigenResult` with ``values`` sorted by |λ| (largest first), ``residuals``
        ``‖H v_i − λ_i v_i‖`` for unit v_i, ``converged`` flags (Lanczos: true residual
        ≤ tol·|λ_i| up to float round-off, 10·eps·√dim·|λ_1|; power: the relative-change criterion
        was met), ``vectors`` [k, dim] and ``num_matvecs``.
    """
    _check_op(op)
    dim = op.dim
    k = _check_int("k", k, 1)
    if k > dim:
        raise EstimatorError(f"k must be <= the operator dimension {dim}, got k={k}")
    max_iter = _check_int("max_iter", max_iter, 1)
    if not (isinstance(tol, (int, float)) and tol > 0 and math.isfinite(tol)):
        raise EstimatorError(f"tol must be a positive finite number, got {tol!r}")
    if method not in ("lanczos", "power"):
        raise EstimatorError(f"method must be 'lanczos' or 'power', got {method!r}")
    t0, n0 = time.perf_counter(), op.num_matvecs
    g = op.generator(seed)
    if method == "lanczos":
        values, residuals, converged, vectors, iters = _lanczos_topk(op, k, tol, max_iter, g)
    else:
        values, residuals, converged, vectors, iters = _power_topk(op, k, tol, max_iter, g)
    for name, xs in (("eigenvalue", values), ("eigen residual", residuals)):
        if not all(math.isfinite(x) for x in xs):
            raise EstimatorError(f"{name} estimates are not finite ({xs}); check the loss and the operator")
    return EigenResult(
        values=tuple(values), residuals=tuple(residuals), converged=tuple(converged),
        num_matvecs=op.num_matvecs - n0, seconds=time.perf_counter() - t0, seed=int(seed),
        method=method, iterations=iters, vectors=vectors,
    )


def _select(theta: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest |theta| (ties: larger value first), stable."""
    order = np.lexsort((-theta, -np.abs(theta)))
    return order[:k]


def _lanczos_topk(op, k, tol, max_iter, g):
    dim = op.dim
    steps = min(dim, max(max_iter, k))

    def stop(alphas, betas, beta_next):
        m = len(alphas)
        if m < k:
            return False
        from scipy.linalg import eigh_tridiagonal

        a = np.asarray(alphas)
        if m == 1:
            theta, S = a, np.ones((1, 1))
        else:
            theta, S = eigh_tridiagonal(a, np.asarray(betas))
        sel = _select(theta, k)
        est = np.abs(beta_next * S[-1, sel])
        return bool(np.all(est < tol * np.abs(theta[sel])))

    v0 = _gaussian_unit(g, dim, op.dtype, op.device)
    (run,) = lanczos(op, v0.unsqueeze(0), steps, generator=g, on_breakdown="restart", stop=stop)
    theta, S = ritz(run)
    sel = _select(theta, k)
    vals = theta[sel]
    Sk = torch.as_tensor(S[:, sel].T.copy(), dtype=op.dtype, device=op.device)   # [k, m]
    Y = Sk @ run.basis                                                            # [k, dim]
    Y = Y / Y.norm(dim=1, keepdim=True)
    HY = op.matmat_flat(Y)                                                        # k HVPs
    lam = torch.as_tensor(vals, dtype=op.dtype, device=op.device)
    res = (HY - lam[:, None] * Y).norm(dim=1).double().cpu().numpy()
    floor = 10.0 * float(torch.finfo(op.dtype).eps) * math.sqrt(dim) * float(np.max(np.abs(theta)))
    conv = [bool(r <= tol * abs(v) + floor) for r, v in zip(res, vals)]
    return [float(v) for v in vals], [float(r) for r in res], conv, Y, run.steps


def _power_topk(op, k, tol, max_iter, g):
    found: list[torch.Tensor] = []
    vals, res, conv = [], [], []
    iters = 0
    for _ in range(k):
        B = torch.stack(found) if found else None

        def deflate(x):
            if B is None:
                return x
            for _ in range(2):
                x = x - B.T @ (B @ x)
            return x

        v = deflate(_gaussian_unit(g, op.dim, op.dtype, op.device))
        v = v / v.norm()
        lam_prev, lam, r, ok = None, 0.0, math.inf, False
        pair = v                  # the vector that lam and r belong to
        for _ in range(max_iter):
            w = op.matvec_flat(v)
            iters += 1
            pair = v
            lam = float(torch.dot(v.double(), w.double()))
            r = float((w - lam * v).norm())
            if lam_prev is not None and abs(lam - lam_prev) < tol * abs(lam):
                ok = True
                break
            if r == 0.0:          # exact eigenvector
                ok = True
                break
            lam_prev = lam
            w = deflate(w)
            n = w.norm()
            if not float(n) > 0:  # H v lies in the span of the found vectors: nothing left to iterate
                ok = True
                break
            v = w / n
        found.append(pair)
        vals.append(lam)
        res.append(r)
        conv.append(ok)
    order = _select(np.asarray(vals), k)
    V = torch.stack(found)[torch.as_tensor(order.copy(), device=op.device)]
    return [vals[i] for i in order], [res[i] for i in order], [conv[i] for i in order], V, iters
