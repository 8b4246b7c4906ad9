"""Lanczos with full re-orthogonalisation, several independent runs in lock-step.

Shared core of :func:`geometry.eigen.top_eigenvalues` (one run, Ritz values) and
:func:`geometry.density.spectral_density` (several runs, Gauss quadrature). Each step applies the
operator to the current Lanczos vector of every active run in ONE ``matmat_flat`` call (k = number
of active runs), then orthogonalises against the whole basis of its run twice (classical
Gram–Schmidt, "twice is enough"), so the basis stays orthonormal to working precision.

Cost: one HVP per run per step. Memory: the bases, ``runs × steps × dim`` numbers on the
operator's device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .operator import CurvatureOperator


@dataclass
class LanczosRun:
    """One Lanczos run: T = tridiag(betas, alphas, betas) of size m, and the basis [m, dim].

    ``beta_next`` is the norm of the residual after the last step (the (m+1, m) entry that was not
    used); Ritz pair residual estimates are ``|beta_next · s_{m,i}|``. A zero in ``betas`` marks a
    restart after an invariant subspace was found (``on_breakdown="restart"``).
    """

    alphas: np.ndarray
    betas: np.ndarray
    beta_next: float
    basis: torch.Tensor | None
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


StopFn = Callable[[list, list, float], bool]


def lanczos(
    op: CurvatureOperator,
    starts: torch.Tensor,
    num_steps: int,
    *,
    generator: torch.Generator | None = None,
    on_breakdown: str = "stop",
    stop: StopFn | None = None,
    keep_basis: bool = True,
) -> list[LanczosRun]:
    """Run ``r`` Lanczos recurrences from the rows of ``starts`` [r, dim] (normalised here).

    Args:
        num_steps: steps per run, capped at ``dim``.
        on_breakdown: when the Krylov space of a run becomes invariant (‖residual‖ ≤ 10·eps·√dim·‖T‖):
            ``"stop"`` ends that run (Gauss quadrature is then exact), ``"restart"`` continues
            with a random Gaussian vector from ``generator`` orthogonalised against the basis
            (recorded as a zero off-diagonal), so that more eigenvalues can be found.
        stop: optional ``stop(alphas, betas, beta_next) -> bool`` called after every step of
            every run; True ends that run.
    Returns:
        One :class:`LanczosRun` per start vector. Cost: ≤ r · num_steps HVPs.
    """
    r, dim = starts.shape
    m_max = int(min(num_steps, dim))
    dtype, device = op.dtype, op.device
    eps = float(torch.finfo(dtype).eps)
    bd_tol = 10.0 * eps * float(np.sqrt(dim))
    Q = torch.zeros(r, m_max, dim, dtype=dtype, device=device)
    v0 = starts.to(device=device, dtype=dtype)
    norms = v0.norm(dim=1, keepdim=True)
    if not torch.all(norms > 0):
        raise ValueError("a Lanczos start vector is zero")
    Q[:, 0] = v0 / norms
    alphas: list[list[float]] = [[] for _ in range(r)]
    betas: list[list[float]] = [[] for _ in range(r)]
    beta_next = [0.0] * r
    anorm = [0.0] * r
    broke = [False] * r
    active = list(range(r))
    for j in range(m_max):
        if not active:
            break
        if len(active) == r:                                   # all runs active: views, no copies
            Qa, q = Q[:, : j + 1], Q[:, j]
        else:
            idx = torch.tensor(active, device=device)
            Qa, q = Q[idx, : j + 1], Q[idx, j]                 # [a, j+1, dim], [a, dim]
        W = op.matmat_flat(q.contiguous())                     # [a, dim]: one HVP per active run
        C1 = torch.bmm(Qa, W.unsqueeze(2))                     # [a, j+1, 1]
        W = W - torch.bmm(Qa.transpose(1, 2), C1).squeeze(2)
        C2 = torch.bmm(Qa, W.unsqueeze(2))
        W = W - torch.bmm(Qa.transpose(1, 2), C2).squeeze(2)
        alpha = (C1[:, j, 0].double() + C2[:, j, 0].double()).cpu().tolist()
        bnorm = W.norm(dim=1).double().cpu().tolist()
        still = []
        for pos, run in enumerate(active):
            a, b = alpha[pos], bnorm[pos]
            alphas[run].append(a)
            prev = betas[run][-1] if betas[run] else 0.0
            anorm[run] = max(anorm[run], abs(a) + b + prev)
            beta_next[run] = b
            if j + 1 >= m_max:
                continue
            if b <= bd_tol * max(anorm[run], np.finfo(float).tiny):
                if on_breakdown == "stop" or generator is None:
                    broke[run] = True
                    beta_next[run] = 0.0
                    continue
                x = torch.randn(dim, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)
                for _ in range(2):
                    x = x - Q[run, : j + 1].T @ (Q[run, : j + 1] @ x)
                Q[run, j + 1] = x / x.norm()
                betas[run].append(0.0)
                beta_next[run] = 0.0
            else:
                Q[run, j + 1] = W[pos] / W[pos].norm()
                betas[run].append(b)
            if stop is not None and stop(alphas[run], betas[run][: len(alphas[run]) - 1], beta_next[run]):
                betas[run] = betas[run][: len(alphas[run]) - 1]
                continue
            still.append(run)
        active = still
    out = []
    for run in range(r):
        m = len(alphas[run])
        out.append(LanczosRun(
            alphas=np.asarray(alphas[run], dtype=np.float64),
            betas=np.asarray(betas[run][: m - 1], dtype=np.float64),
            beta_next=float(beta_next[run]),
            basis=Q[run, :m] if keep_basis else None,
            breakdown=broke[run],
        ))
    return out


def ritz(run: LanczosRun) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of the run's tridiagonal: (theta [m], S [m, m]) with T = S diag(theta) Sᵀ."""
    from scipy.linalg import eigh_tridiagonal

    if run.steps == 1:
        return run.alphas.copy(), np.ones((1, 1))
    theta, S = eigh_tridiagonal(run.alphas, run.betas)
    return theta, S

