"""Eigenvalue density of a curvature operator by stochastic Lanczos quadrature (SLQ).

As PyHessian computes and draws it (Ghorbani, Krishnan & Xiao 2019; Yao et al. 2020): for each
run, a Rademacher vector normalised to unit length starts a Lanczos recurrence; the eigenvalues
of the m × m tridiagonal are quadrature nodes and the squared first components of its
eigenvectors are the weights; the density is the average over runs of Gaussians centred at the
nodes, weighted, on a grid, normalised to unit area. Here the runs go in lock-step, so each step
is ONE ``matmat`` with k = number of runs in a group (the HVP backend's batching pays off), and
every run uses full re-orthogonalisation (PyHessian does too) unless its basis cannot fit the
memory budget (:func:`estimate_memory`; the choice is recorded in the result).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from losslens.geometry.estimators._checks import check_int, check_op, refuse_sharded
from losslens.geometry.estimators._lanczos import lanczos, ritz
from losslens.geometry.base._linalg import RowBasis
from losslens.geometry.memory.model import (
    Candidate,
    MemoryEstimate,
    basis_storage,
    choose,
    state_budget,
    pass_options,
    TEMPORARIES_PART,
    temporaries_bytes,
    vector_bytes,
    with_basis,
)
from losslens.geometry.memory.budget import resolve_budget
from losslens.geometry.operators.interface import CurvatureOperator
from losslens.geometry.base.results import EstimatorError, SpectralDensity
from losslens.geometry.estimators.sampling import rademacher

__all__ = ["spectral_density", "estimate_memory"]

_ADVICE = (
    "use fewer runs or steps, reorth='none' (3 vectors per run), fewer or shorter curvature batches, "
    "fewer parameters (params=...), or raise max_memory"
)


def estimate_memory(
    op: CurvatureOperator,
    num_runs: int = 4,
    num_steps: int = 40,
    max_memory=None,
    reorth: str = "auto",
    basis_device=None,
    basis_dtype: torch.dtype | None = None,
) -> MemoryEstimate:
    """The memory plan :func:`spectral_density` would run with: how many runs go in lock-step and
    whether they keep their bases (``reorth="full"``) or not (``"none"``). Full
    re-orthogonalisation is preferred; ``"auto"`` falls back to ``"none"`` only when not even one
    run's basis fits. Raises :class:`~losslens.geometry.memory.budget.MemoryBudgetError` when nothing fits."""
    if reorth not in ("auto", "full", "none"):
        raise EstimatorError(f"reorth must be 'auto', 'full' or 'none', got {reorth!r}")
    budget = resolve_budget(op.max_memory if max_memory is None else max_memory, op.device)
    steps = min(num_steps, op.dim)
    vec = vector_bytes(op.dim, op.dtype)
    bdev, bdtype, on_host = basis_storage(op.device, basis_device, basis_dtype, op.dtype)
    host_budget = state_budget(bdev) if on_host else 0
    groups = sorted({num_runs, *[g for g in (16, 8, 4, 2, 1) if g < num_runs]}, reverse=True)
    modes = ("full", "none") if reorth == "auto" else (reorth,)
    for mode in modes:
        cands = []
        for r in groups:
            calls = -(-num_runs // r) * steps
            for settings, pass_b, cost in pass_options(op, r, calls, num_runs * steps):
                parts = {
                    f"current vectors and products [{2 * r}, dim]": 2 * r * vec,
                    "operator pass": pass_b,
                    TEMPORARIES_PART: temporaries_bytes(op.dim, op.dtype),
                }
                host = {}
                if mode == "full":
                    rows = r * RowBasis.allocated_rows(steps, op.dim, bdtype)  # grown in whole blocks
                    parts, host = with_basis(
                        parts,
                        f"bases [{r} x {rows // r}, dim] {str(bdtype).replace('torch.', '')}",
                        rows * vector_bytes(op.dim, bdtype),
                        on_host,
                    )
                else:
                    parts = {f"previous vectors [{r}, dim]": r * vec, **parts}
                cands.append(
                    Candidate(
                        MemoryEstimate(
                            parts,
                            budget,
                            {"reorth": mode, "runs_per_group": r, "basis_device": str(bdev), **settings},
                            host,
                            host_budget,
                        ),
                        cost,
                    )
                )
        if any(c.estimate.fits for c in cands) or mode == modes[-1]:
            return choose(cands, "spectral_density", _ADVICE)
    raise AssertionError("unreachable")


def spectral_density(
    op: CurvatureOperator,
    num_runs: int = 4,
    num_steps: int = 40,
    seed: int = 0,
    grid_size: int = 500,
    sigma: float | None = None,
    max_memory: int | str | None = None,
    reorth: str = "auto",
    basis_device=None,
    basis_dtype: torch.dtype | None = None,
) -> SpectralDensity:
    """SLQ estimate of the eigenvalue density of H.

    Args:
        op: any symmetric curvature operator of dimension ``dim``.
        num_runs: independent start vectors (Rademacher, normalised), ≥ 1.
        num_steps: Lanczos steps per run, ≥ 1, capped at ``dim``; a run whose Krylov space
            becomes invariant stops early (its quadrature is then exact for every polynomial).
        seed: seed of the start vectors (``op.generator(seed)``).
        grid_size: points of the eigenvalue grid, ≥ 2.
        sigma: standard deviation of the Gaussian kernel, in eigenvalue units. Default:
            ``max(sqrt(1e-5 · max(1, span)), 3 · span / grid_size)`` with span = max − min node —
            PyHessian's kernel width (its "sigma_squared" = 1e-5 · max(1, span)) unless that is
            narrower than the grid can resolve. The grid spans [min node − 4σ, max node + 4σ].
        max_memory: bytes (or ``"8GB"``) the call may allocate (default ``op.max_memory`` or
            :func:`losslens.geometry.memory.budget.default_budget`).
        reorth: ``"full"`` (each run keeps its Lanczos basis; as PyHessian), ``"none"`` (three-term
            recurrence, 3 vectors per run; see ``geometry/estimators/_lanczos.py`` for its accuracy cost) or
            ``"auto"`` (full when at least one run's basis fits, with as many runs in lock-step as
            fit, else none).
        basis_device, basis_dtype: keep the bases in host RAM (operator on a GPU) or in a lower
            precision such as bfloat16 (orthogonality then only to ~4e-3).

    Returns:
        :class:`SpectralDensity` (nodes/weights per run, grid, density normalised to unit area,
        ``moment(p)`` estimating tr(Hᵖ)/dim, the steps of each run, breakdowns, the memory plan).
        Cost: ≤ num_runs · num_steps HVPs, applied to a group of runs at a time. Memory: the current
        vectors and their products, ``2 · group · dim`` numbers, plus with full re-orthogonalisation
        ``group · num_steps · dim`` of bases, else ``group · dim`` (the previous vectors); 3 float64
        chunk temporaries and one operator pass (:func:`estimate_memory`; measured = plan at 10M
        dimensions, tests/test_memory_budget.py).
    """
    check_op(op)
    refuse_sharded(op, "spectral_density")
    num_runs = check_int("num_runs", num_runs, 1)
    num_steps = check_int("num_steps", num_steps, 1)
    grid_size = check_int("grid_size", grid_size, 2)
    if sigma is not None and not (isinstance(sigma, (int, float)) and sigma > 0 and math.isfinite(sigma)):
        raise EstimatorError(f"sigma must be a positive finite number or None, got {sigma!r}")
    plan = estimate_memory(op, num_runs, num_steps, max_memory, reorth, basis_device, basis_dtype)
    per_group, mode = plan.settings["runs_per_group"], plan.settings["reorth"]
    t0, n0 = time.perf_counter(), op.num_matvecs
    dim = op.dim
    steps = min(num_steps, dim)
    g = op.generator(seed)
    nodes, weights, run_steps, breakdowns = [], [], [], 0
    with op.configured(**plan.operator_settings):
        for start in range(0, num_runs, per_group):
            starts = rademacher(g, min(per_group, num_runs - start), dim, op.dtype, op.device)
            runs = lanczos(op, starts, steps, reorth=mode, basis_device=basis_device, basis_dtype=basis_dtype)
            del starts
            for run in runs:
                theta, S = ritz(run)
                nodes.append(theta)
                weights.append(S[0, :] ** 2)
                run_steps.append(run.steps)
                breakdowns += int(run.breakdown)
    all_nodes = np.concatenate(nodes)
    if not np.all(np.isfinite(all_nodes)):
        raise EstimatorError("SLQ nodes are not finite; check the loss and the operator")
    lo0, hi0 = float(all_nodes.min()), float(all_nodes.max())
    span = hi0 - lo0
    if sigma is None:
        sigma = max(math.sqrt(1e-5 * max(1.0, span)), 3.0 * span / grid_size)
    grid = np.linspace(lo0 - 4 * sigma, hi0 + 4 * sigma, grid_size)
    all_w = np.concatenate(weights) / num_runs
    z = (grid[:, None] - all_nodes[None, :]) / sigma
    dens = (np.exp(-0.5 * z**2) / (sigma * math.sqrt(2 * math.pi))) @ all_w
    area = float(dens.sum() * (grid[1] - grid[0]))
    if not (area > 0 and math.isfinite(area)):
        raise EstimatorError("SLQ density has no mass on the grid; pass a larger sigma or grid_size")
    dens = dens / area
    return SpectralDensity(
        nodes=tuple(nodes),
        weights=tuple(weights),
        grid=grid,
        density=dens,
        sigma=float(sigma),
        dim=dim,
        num_runs=num_runs,
        num_steps=steps,
        num_matvecs=op.num_matvecs - n0,
        seconds=time.perf_counter() - t0,
        seed=int(seed),
        steps=tuple(run_steps),
        breakdowns=breakdowns,
        memory=plan.to_dict(),
    )
