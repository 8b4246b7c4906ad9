"""Lanczos tridiagonalisation for quadrature: several independent runs in lock-step.

The core of :func:`losslens.geometry.estimators.density.spectral_density`. Each step applies the operator to the
current Lanczos vector of every active run in ONE ``matmat_flat`` call (k = number of active
runs). Two re-orthogonalisation modes:

``"full"``
    each run keeps its basis (:class:`~losslens.geometry.base._linalg.RowBasis`, grown as used; on the host or
    in a lower precision on request) and every new vector is orthogonalised against all of it
    twice (classical Gram–Schmidt, "twice is enough"), as PyHessian does. Memory: runs × steps ×
    dim numbers.
``"none"``
    the three-term recurrence with a local re-orthogonalisation against the previous two vectors
    only. Memory: 3 × runs × dim numbers. Accuracy cost: orthogonality is lost once Ritz values
    converge, so converged eigenvalues reappear as "ghost" copies; the quadrature weights split
    between the copies, and the Gauss quadrature of smooth functions (moments, the smoothed
    density) stays accurate (Greenbaum 1989; Knizhnerman 1996), while individual node positions
    and multiplicities are not to be read off.

A run stops when its Krylov space becomes invariant (‖residual‖ ≤ 10·ε·‖T‖, ε the coarser of
the products' and the vectors' precision): its Gauss quadrature is then exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from losslens.geometry.base._linalg import RowBasis, gram, rowdot
from losslens.geometry.operators.interface import CurvatureOperator

REORTH_MODES = ("full", "none")


@dataclass
class LanczosRun:
    """One Lanczos run: T = tridiag(betas, alphas, betas) of size m.

    ``beta_next`` is the norm of the residual after the last step (the (m+1, m) entry that was not
    used); ``breakdown`` tells whether the run ended on an invariant Krylov space (then
    ``beta_next`` is 0 and the quadrature is exact).
    """

    alphas: np.ndarray
    betas: np.ndarray
    beta_next: float
    breakdown: bool = False

    @property
    def steps(self) -> int:
        return len(self.alphas)

    def tridiagonal(self) -> np.ndarray:
        m = self.steps
        T = np.diag(self.alphas)
        if m > 1:
            T += np.diag(self.betas, 1) + np.diag(self.betas, -1)
        return T


def lanczos(
    op: CurvatureOperator,
    starts: torch.Tensor,
    num_steps: int,
    *,
    reorth: str = "full",
    basis_device=None,
    basis_dtype: torch.dtype | None = None,
) -> list[LanczosRun]:
    """Run ``r`` Lanczos recurrences from the rows of ``starts`` [r, dim] (normalised and then
    overwritten in place when they already have the operator's dtype and device).

    Args:
        num_steps: steps per run, capped at ``dim``.
        reorth: ``"full"`` or ``"none"`` (module docstring).
        basis_device, basis_dtype: where and in which dtype the ``"full"`` bases are stored
            (default: the operator's device and ``op.dtype``).
    Returns:
        One :class:`LanczosRun` per start vector. Cost: ≤ r · num_steps HVPs.
    """
    if reorth not in REORTH_MODES:
        raise ValueError(f"reorth must be one of {REORTH_MODES}, got {reorth!r}")
    r, dim = starts.shape
    m_max = int(min(num_steps, dim))
    dtype, device = op.dtype, op.device
    bdtype = basis_dtype or dtype
    eps = 10.0 * max(op.product_eps, float(torch.finfo(dtype).eps), float(torch.finfo(bdtype).eps))
    cur = starts.to(device=device, dtype=dtype)  # normalised in place: no copy of the starts
    norms = rowdot(cur, cur).sqrt()
    if not torch.all(norms > 0):
        raise ValueError("a Lanczos start vector is zero")
    cur /= norms.to(device=device, dtype=dtype)[:, None]
    prev = torch.zeros_like(cur) if reorth == "none" else None
    bases = [RowBasis(dim, bdtype, basis_device or device) for _ in range(r)] if reorth == "full" else None
    if bases is not None:
        for run in range(r):
            bases[run].append(cur[run])
    alphas: list[list[float]] = [[] for _ in range(r)]
    betas: list[list[float]] = [[] for _ in range(r)]
    beta_next = [0.0] * r
    anorm = [0.0] * r
    broke = [False] * r
    active = list(range(r))
    # state: cur [r, dim] (the active runs' current vectors in its first rows, in order), W [a, dim]
    # (their products; each row becomes the run's next vector, copied into cur), and with "none"
    # prev [r, dim]. W and every view of it are dropped before the next product.
    for j in range(m_max):
        if not active:
            break
        W = op.matmat_flat(cur[: len(active)])  # [a, dim]: one HVP per active run
        still = []
        for pos, run in enumerate(active):
            w = W[pos : pos + 1]
            prev_beta = betas[run][-1] if betas[run] else 0.0
            if bases is not None:
                a = float(bases[run].orthogonalize(w)[j])
            else:
                a = float(rowdot(cur[pos : pos + 1], w)[0])
                w.add_(cur[pos], alpha=-a)
                if prev_beta:
                    w.add_(prev[pos], alpha=-prev_beta)
                c = gram(w, prev[pos : pos + 1]), gram(w, cur[pos : pos + 1])  # one local re-orthogonalisation
                w.add_(prev[pos], alpha=-float(c[0][0, 0]))  # pass, in place (no stacked copy)
                w.add_(cur[pos], alpha=-float(c[1][0, 0]))
                a += float(c[1][0, 0])
            b = float(rowdot(w, w)[0] ** 0.5)
            alphas[run].append(a)
            anorm[run] = max(anorm[run], abs(a) + b + prev_beta)
            beta_next[run] = b
            if j + 1 >= m_max:
                continue
            if b <= eps * max(anorm[run], np.finfo(float).tiny):
                broke[run] = True
                beta_next[run] = 0.0
                continue
            w.div_(b)  # in place: W's row becomes the next vector
            if bases is not None:
                bases[run].append(w[0])
            betas[run].append(b)
            still.append((pos, run))
        del w
        # the runs that go on move to the first rows, in order (in place: a row only moves up)
        for new_pos, (pos, run) in enumerate(still):
            if prev is not None:
                prev[new_pos].copy_(cur[pos])
            cur[new_pos].copy_(W[pos])
        active = [run for _, run in still]
        del W
    out = []
    for run in range(r):
        m = len(alphas[run])
        out.append(
            LanczosRun(
                alphas=np.asarray(alphas[run], dtype=np.float64),
                betas=np.asarray(betas[run][: m - 1], dtype=np.float64),
                beta_next=float(beta_next[run]),
                breakdown=broke[run],
            )
        )
    return out


def ritz(run: LanczosRun) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of the run's tridiagonal: (theta [m], S [m, m]) with T = S diag(theta) Sᵀ."""
    from scipy.linalg import eigh_tridiagonal

    if run.steps == 1:
        return run.alphas.copy(), np.ones((1, 1))
    theta, S = eigh_tridiagonal(run.alphas, run.betas)
    return theta, S
