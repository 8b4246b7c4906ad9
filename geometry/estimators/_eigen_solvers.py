"""The two iterations behind :func:`losslens.geometry.estimators.eigen.top_eigenvalues`: thick-restart
Lanczos (``_lanczos_topk``, the restart size ``_kept``) and deflated power iteration
(``_power_topk``), with what they share (the round-off floor of a residual); their ranking by
``|θ|`` is ``losslens.geometry.base._linalg.magnitude_order``, their seeded Gaussian start vectors
``losslens.geometry.base._linalg.gaussian_unit``.

Both take an operator already configured by the memory plan and return a :class:`Solve`: the values
ranked by magnitude (sign kept) and their unit vectors ``[k, dim]``, the true residuals and
converged flags where the solve has them (power iteration), which the final block of
:func:`losslens.geometry.estimators.eigen.top_eigenvalues` completes; the memory
each holds is stated in the :mod:`losslens.geometry.estimators.eigen` module docstring (and planned by its
``estimate_memory``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from losslens.geometry.base._linalg import (
    RowBasis,
    gaussian_unit,
    magnitude_order,
    permute_rows_,
    project_out,
    residual_norms,
    row_norms,
    rowdot,
)
from losslens.geometry.operators.interface import CurvatureOperator


@dataclass
class Solve:
    """What a solver returns: ``values`` ranked by ``|λ|`` (sign kept), their unit ``vectors`` [k, dim],
    ``iterations`` (products of the solve), ``floor`` (the round-off floor of their residuals,
    10·ε·``|λ_1|``), power iteration's own ``residuals`` and ``converged`` (from its last products;
    None for Lanczos, whose true residuals need one more block) and ``extra`` (what the result's
    ``memory`` records)."""

    values: list[float]
    vectors: torch.Tensor
    iterations: int
    floor: float
    residuals: list[float] | None = None
    converged: list[bool] | None = None
    extra: dict = field(default_factory=dict)


def _select(theta: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest |theta| (ties: larger value first), stable."""
    return magnitude_order(theta)[:k]


def _breakdown_eps(op: CurvatureOperator) -> float:
    """Relative size under which a residual is rounding noise: 10 × the coarser of the products'
    and the vectors' precision (no √dim factor: dot products are summed pairwise)."""
    return 10.0 * max(op.product_eps, float(torch.finfo(op.dtype).eps))


def _lanczos_topk(op, k, tol, max_iter, g, basis_size, basis_device=None, basis_dtype=None):
    dim = op.dim
    steps_total = min(dim, max(max_iter, k))
    m = max(min(basis_size, steps_total), min(k + 2, dim))
    eps = _breakdown_eps(op)
    pin = torch.device(op.device).type == "cuda"  # host blocks page-locked for the chunks' copies
    Q = RowBasis(dim, basis_dtype or op.dtype, basis_device or op.device, pin=pin)
    Q.append(gaussian_unit(g, dim, op.dtype, op.device))
    T = np.zeros((m + 1, m + 1))
    j, steps, restarts, breakdowns = 0, 0, 0, 0
    tnorm = 0.0
    # state: the basis, and w (one vector: the product, then the residual, then the next basis
    # vector); w is dropped once copied into the basis, so a product never sees two of them
    while True:
        w = op.matvec_flat(Q.row(j)).unsqueeze(0)  # one HVP
        steps += 1
        c = Q.orthogonalize(w)
        T[: j + 1, j] = c
        T[j, : j + 1] = c
        beta = float(row_norms(w)[0])
        theta, S = np.linalg.eigh(T[: j + 1, : j + 1])
        tnorm = max(tnorm, float(np.max(np.abs(theta))))
        sel = _select(theta, min(k, j + 1))
        est = beta * np.abs(S[j, sel])
        done = (j + 1 >= k and bool(np.all(est < tol * np.abs(theta[sel])))) or steps >= steps_total or j + 1 >= dim
        if done:
            break
        if beta <= eps * max(tnorm, np.finfo(float).tiny):  # invariant subspace: fresh direction
            breakdowns += 1
            del w
            w = gaussian_unit(g, dim, op.dtype, op.device).unsqueeze(0)
            Q.orthogonalize(w)
            nx = float(row_norms(w)[0])
            if not nx > eps:
                break
            w /= nx  # in place: no extra full-size vector
            coupling = 0.0
        else:
            w /= beta
            coupling = beta
        if j + 1 < m:
            Q.append(w[0])
            del w
            T[j + 1, j] = T[j, j + 1] = coupling
            j += 1
            continue
        # thick restart: keep the Ritz vectors of largest |θ| (how many: _kept) and the next direction
        keep = _kept(theta, k, m)
        kept = _select(theta, keep)
        Q.keep_combinations(S[:, kept].T.copy())
        Q.append(w[0])
        del w
        T[:] = 0.0
        T[:keep, :keep] = np.diag(theta[kept])
        T[keep, :keep] = T[:keep, keep] = coupling * S[j, kept]
        j = keep
        restarts += 1
    del w
    theta, S = np.linalg.eigh(T[: j + 1, : j + 1])
    sel = _select(theta, k)
    vals = theta[sel]
    Y = Q.combine(S[:, sel].T.copy(), op.dtype, op.device)  # [k, dim]
    del Q  # the basis is freed before H Y
    Y /= row_norms(Y).to(device=Y.device, dtype=Y.dtype)[:, None]
    extra = {"restarts": restarts, "breakdowns": breakdowns, "basis_size": m}
    return Solve([float(v) for v in vals], Y, steps, eps * float(np.max(np.abs(theta))), extra=extra)


def _kept(theta: np.ndarray, k: int, m: int) -> int:
    """How many Ritz vectors a thick restart of an m-vector basis keeps (k wanted): the ℓ in
    [k + 1, m − 2] that maximises ``(m − ℓ) · acosh(1 + 2γ_ℓ)``, the adaptive choice of thick-restart
    Lanczos (Yamazaki, Bai, Simon, Wang & Wu 2010, as in TRLan). A restart cycle adds m − ℓ Krylov
    vectors; a Chebyshev polynomial of that degree that is small on the interval [a, b] of the
    discarded Ritz values grows by ``cosh((m − ℓ) · acosh(1 + 2γ_ℓ))`` at the wanted ones, γ_ℓ =
    (distance of the nearest wanted Ritz value to [a, b]) / (b − a). Keeping more vectors narrows
    the interval (a larger gap) but leaves fewer new steps per cycle; keeping half the basis, as
    before, took 1.6–1.8× the products at m = 6 (0.98–1.35× at m = 8) on the spectra of
    tests/test_estimators_eigen.py (λ_max over a cluster at 0.95–0.99 of it)."""
    if m - 2 < k + 1:
        return min(k + 1, m - 1)
    th = theta[magnitude_order(theta)]
    best, best_l = -1.0, k + 1
    for ell in range(k + 1, m - 1):
        rest = th[ell:]
        a, b = float(rest.min()), float(rest.max())
        d = min(max(a - t, t - b, 0.0) for t in th[:k])
        f = (m - ell) * math.acosh(1.0 + 2.0 * d / max(b - a, np.finfo(float).tiny))
        if f > best:
            best, best_l = f, ell
    return best_l


def _power_topk(op, k, tol, max_iter, g):
    # the vectors found live in the rows of one [k, dim] tensor (B = its first rows, a view); while
    # iterating, v, w = Hv and chunk temporaries are alive besides: k + 2 vectors at most. With
    # k = 1 nothing is deflated and the iterate itself is returned: 2 vectors.
    F = torch.empty(k, op.dim, dtype=op.dtype, device=op.device) if k > 1 else None
    eps = _breakdown_eps(op)
    vals, res, conv = [], [], []
    iters = 0
    for i in range(k):
        B = F[:i] if i else None
        v = gaussian_unit(g, op.dim, op.dtype, op.device).unsqueeze(0)
        if B is not None:
            project_out(v, B)
        v = v[0].div_(float(row_norms(v)[0]))
        # round-off floor of the residual: products of the largest |λ| found so far
        lam, r, scale = 0.0, math.inf, max((abs(x) for x in vals), default=0.0)
        # a vector that later ones are deflated against is refined to tol / 10: its error would
        # otherwise hold their residuals near tol·|λ_1|
        stop = tol if i == k - 1 else tol / 10
        # v and (lam, r) always belong together; the next iterate is normalised in place in w
        for it in range(max_iter):
            w = op.matvec_flat(v)
            iters += 1
            lam = float(rowdot(v[None], w[None])[0])
            r = float(residual_norms(w[None], v[None], [lam])[0])
            scale = max(scale, abs(lam))
            if r <= stop * abs(lam) + eps * scale:  # a small true residual
                break
            if it == max_iter - 1:
                break
            if B is not None:
                w = w.unsqueeze(0)
                project_out(w, B)
                w = w[0]
            n = float(row_norms(w[None])[0])
            if not n > 0:  # H v lies in the span of the found vectors: nothing left to iterate
                break
            v = w.div_(n)
            del w
        del w  # noqa: F821 -- every exit of the loop is a break taken before the ``del w`` above
        if F is None:
            F = v.unsqueeze(0)
        else:
            F[i].copy_(v)
        del v
        vals.append(lam)
        res.append(r)
        conv.append(bool(r <= tol * abs(lam) + eps * scale))
    order = [int(j) for j in magnitude_order(vals)]
    permute_rows_(F, order)
    vals = [vals[i] for i in order]
    floor = eps * max(abs(x) for x in vals)  # the products' round-off of the largest |λ|
    return Solve(vals, F, iters, floor, [res[i] for i in order], [conv[i] for i in order])
