"""Extreme eigenvalues of a curvature operator: thick-restart Lanczos (default) and deflated power
iteration.

Eigenvalues are ranked by magnitude with their sign kept: a Hessian away from a minimum can have
a negative eigenvalue larger in magnitude than the largest positive one, and power iteration finds
exactly that one. Both methods start from a seeded Gaussian unit vector drawn from
``op.generator(seed)`` (CPU generator; identical numbers on every device). Vectors live in
``op.dtype`` (float32 at least); recurrences, Ritz problems and dot products run in float64.

Converged means, for both methods and every value: the true residual of the unit vector returned,
``‖H v − λ v‖ ≤ tol·|λ|`` (plus the products' round-off, 10·ε·``|λ_1|``); never "λ stopped changing",
which stalls on slowly separating spectra (a power iteration stopped 2–3% low with residuals of
6–8% of λ on the spectra of tests/test_estimators_eigen.py, and with 29% of λ on the Pythia-160m shape).

Memory (n = dim, b = bytes of ``op.dtype``): Lanczos holds its basis, at most ``m · n · b`` with
m = the basis size (``max_basis``, or what the planner picks under ``max_memory``), plus one vector
(the product, then the next basis vector) while iterating, and at the end k Ritz vectors beside the
basis, then 2k (the Ritz vectors and their products, the basis freed); when m is smaller than the
steps wanted, the basis is thick-restarted (Wu & Simon 2000): the best Ritz vectors are kept and the
recurrence goes on, so memory stays at m vectors for any number of steps. The planner fills the
budget with basis vectors up to max(16, 4k) (what convergence needs) before it keeps gradient
graphs between steps, and refuses bases below k + 4. Power iteration holds ``(k + 2) · n · b``
(2 for k = 1; at least 2k on an operator with refined products, whose final block of k products
runs beside the k vectors found). Both add one operator pass, with every batch's gradient graph
kept between steps when it fits (each step then costs one second backward, not a graph rebuild),
and 3 float64 chunk temporaries; ``tests/test_memory_budget.py`` checks measured = plan at 10M dimensions.
"""

from __future__ import annotations

import math
import time

import torch

from losslens.geometry.estimators._checks import check_int, check_op, on_operator_vectors
from losslens.geometry.estimators._eigen_solvers import Solve, _lanczos_topk, _power_topk
from losslens.geometry.base._linalg import RowBasis, magnitude_order, permute_rows_, residual_norms, rowdot
from losslens.geometry.base.state_store import state_transfer
from losslens.geometry.memory.model import (
    MemoryEstimate,
    basis_storage,
    first_fitting,
    pass_options,
    state_budget,
    TEMPORARIES_PART,
    temporaries_bytes,
    vector_bytes,
    with_basis,
)
from losslens.geometry.memory.budget import resolve_budget
from losslens.geometry.operators.interface import CurvatureOperator
from losslens.geometry.base.results import EigenResult, EstimatorError

__all__ = ["top_eigenvalues", "estimate_memory"]

#: The smallest Lanczos basis worth running is k + SMALLEST_EXTRA vectors: a restart then keeps the
#: k wanted Ritz vectors, at least one more, and adds at least two new Krylov vectors per cycle.
SMALLEST_EXTRA = 4
#: A basis of max(ENOUGH_BASIS, 4k) converges about as fast as an unrestarted one on the spectra of
#: tests/test_estimators_eigen.py (k = 1 and 3, 3 seeds, float32/64: within 2 products, 5%, of an
#: unrestarted run; a basis of 8 took up to 22% more at k = 1); the planner fills the budget
#: with basis vectors up to that size before it keeps the gradient graphs between steps.
ENOUGH_BASIS = 16

_ADVICE = (
    "lower max_iter or max_basis (Lanczos needs at least k + 4 vectors unless max_basis is given), use "
    "method='power' (k + 2 vectors, many more HVPs), use fewer or shorter curvature batches, select fewer "
    "parameters (params=...), or raise max_memory"
)


def estimate_memory(
    op: CurvatureOperator,
    k: int = 1,
    method: str = "lanczos",
    max_iter: int = 100,
    max_memory=None,
    max_basis: int | None = None,
    basis_device=None,
    basis_dtype: torch.dtype | None = None,
) -> MemoryEstimate:
    """The memory plan :func:`top_eigenvalues` would run with, without running it (raises
    :class:`~losslens.geometry.memory.budget.MemoryBudgetError` when nothing fits; the operator is
    checked first)."""
    check_op(op)
    if k > op.dim:
        raise EstimatorError(f"k must be <= the operator dimension {op.dim}, got k={k}")
    budget = resolve_budget(op.max_memory if max_memory is None else max_memory, op.device)
    vec = vector_bytes(op.dim, op.dtype)
    bdev, bdtype, on_host = basis_storage(op.device, basis_device, basis_dtype, op.dtype)
    host_budget = state_budget(bdev) if on_host else 0
    bvec = vector_bytes(op.dim, bdtype)
    steps = min(op.dim, max(max_iter, k))
    # a basis off a GPU: each product's input is a copy of a basis row on the device
    copied = vec if on_host and torch.device(op.device).type != "cpu" else 0
    cands = []
    # the final block of k products (Lanczos' true residuals; power iteration's only on an operator with
    # refined products, run beside the k vectors found: 2k vectors), by whether graphs are kept
    final = (
        {s.get("cache_graphs", False): b for s, b, _ in pass_options(op, k, 1)}
        if method == "lanczos" or op.refines
        else {}
    )
    temps = temporaries_bytes(op.dim, op.dtype)
    if method == "power":
        for settings, pass_b, _ in pass_options(op, 1, steps):
            # the k rows of the vectors found, the iterate and its product (the next iterate is the
            # product normalised in place); at the end one row for the in-place reordering. k = 1:
            # the iterate is the vector found
            n_vec = max(k + 2 if k > 1 else 2, 2 * k if op.refines else 0)
            parts = {
                f"eigenvectors found, iterate and product [{n_vec}, dim]": n_vec * vec,
                "operator pass": max(pass_b, final.get(settings.get("cache_graphs", False), pass_b)),
                TEMPORARIES_PART: temps,
            }
            cands.append(MemoryEstimate(parts, budget, {**settings}))
        cands.sort(key=lambda e: not e.settings.get("cache_graphs", False))
        return first_fitting(cands, "top_eigenvalues (power)", _ADVICE)
    if method != "lanczos":
        raise EstimatorError(f"method must be 'lanczos' or 'power', got {method!r}")
    full = min(steps, op.dim)
    smallest = min(full, k + SMALLEST_EXTRA)
    enough = min(full, max(ENOUGH_BASIS, 4 * k))
    if max_basis is not None:
        big, small = [min(max_basis, full)], []
    else:
        big = sorted({m for m in (full, min(full, 64), min(full, 32), enough) if m >= enough}, reverse=True)
        small = sorted({m for m in (12, 10, 8, 7, 6, smallest) if smallest <= m < enough}, reverse=True)
    # the basis convergence needs comes first: below `enough` vectors a larger basis beats keeping
    # the graphs (which saves 1.5 of ~3.5 gradient-equivalents per step); from `enough` on, a basis
    # with the graphs kept beats a bigger one rebuilt every step
    order = [(m, c) for c in (True, False) for m in big] + [(m, c) for m in small for c in (True, False)]
    options = {s.get("cache_graphs", False): (s, b) for s, b, _ in pass_options(op, 1, steps)}
    for m, cache in order:
        if cache not in options:
            continue
        settings, pass_b = options[cache]
        rows = RowBasis.allocated_rows(m, op.dim, bdtype)  # the basis grows in whole blocks
        basis_here = 0 if on_host else rows * bvec
        # while iterating: the basis, one vector (the product, then the next basis vector) and the
        # reductions' temporaries; at the end the k Ritz vectors are formed beside the basis, which
        # is then freed before their k products: the larger phase counts
        state = max(basis_here + vec + copied + temps, basis_here + k * vec, 2 * k * vec + temps)
        parts, host = with_basis(
            {
                "residual (or the Ritz vectors and products at the end)": state - basis_here - temps,
                "operator pass": max(pass_b, final.get(cache, pass_b)),
                TEMPORARIES_PART: temps,
            },
            f"basis [{rows}, dim] {str(bdtype).replace('torch.', '')}",
            rows * bvec,
            on_host,
        )
        cands.append(
            MemoryEstimate(
                parts,
                budget,
                {
                    "basis_size": m,
                    "restarted": m < full,
                    "basis_device": str(bdev),
                    "basis_dtype": str(bdtype).replace("torch.", ""),
                    **settings,
                },
                host,
                host_budget,
                # off the device: per step the row in, and two Gram-Schmidt passes that each read the
                # basis twice (its projections, then the update), at most m rows
                state_transfer(steps * (1 + 4 * m) * bvec, bdev, op.device) if on_host else {},
            )
        )
    return first_fitting(cands, "top_eigenvalues (lanczos)", _ADVICE)


@on_operator_vectors
def top_eigenvalues(
    op: CurvatureOperator,
    k: int = 1,
    method: str = "lanczos",
    tol: float = 1e-4,
    max_iter: int = 100,
    seed: int = 0,
    max_memory: int | str | None = None,
    max_basis: int | None = None,
    basis_device: str | torch.device | None = None,
    basis_dtype: torch.dtype | None = None,
) -> EigenResult:
    """The k eigenvalues of largest magnitude (sign kept), with residual norms.

    Args:
        op: any symmetric curvature operator of dimension ``dim``.
        k: how many eigenvalues, ``1 <= k <= dim``.
        method:
            ``"lanczos"`` — Lanczos with full re-orthogonalisation (twice, against the whole basis)
            from one random start vector; the projected matrix T = QᵀHQ is kept dense and
            diagonalised after every step, and the run stops when every one of the k largest-``|θ|``
            Ritz values has residual estimate ``β · |s_{m,i}| < tol·|θ_i|``, or after ``max_iter``
            steps (at least k, at most dim). An invariant Krylov space is continued from a fresh
            random vector orthogonal to it. When the basis reaches its size m (below the steps
            wanted: memory), it is thick-restarted: the ℓ Ritz vectors of largest ``|θ|`` are kept
            with their coupling to the residual (Wu & Simon 2000), ℓ chosen at each restart as
            TRLan's adaptive scheme does (``_kept``). Cost: one HVP per step, plus one
            block of k HVPs for the true residuals of the Ritz vectors, which decide ``converged``
            (refined products on an inexact operator: see Returns).

            ``"power"`` — power iteration for the largest-``|λ|`` eigenpair, then deflated power
            iteration (iterates orthogonalised against the eigenvectors already found, as PyHessian
            does) for the next ones; each value stops when the true residual of the iterate,
            ``‖H v − λ v‖`` with λ its Rayleigh quotient (H v was computed anyway: no extra HVP),
            is ≤ ``tol·|λ|``, or after ``max_iter`` iterations (then ``converged`` is False). For
            k > 1 the vectors that later ones are deflated against are refined to tol / 10.
            Cost: one HVP per iteration, ≤ k · max_iter. Converges at rate ``|λ_{i+1}/λ_i|`` — slowly
            for clustered spectra: ≥ 3× the HVPs of Lanczos on a basis of 6 in the tests.
        tol: relative tolerance (see above), > 0.
        max_iter: Lanczos steps, or power iterations per eigenvalue, ≥ 1.
        seed: seed of the random start vector(s).
        max_memory: bytes (or ``"8GB"``) the call may allocate (default ``op.max_memory`` or
            :func:`losslens.geometry.memory.budget.default_budget`); see the module docstring.
        max_basis: Lanczos basis size, ≥ k + 2 (default: the steps wanted, or what fits; see the
            module docstring). Accuracy cost of a small basis: none at convergence, but more steps:
            k = 1 on a top eigenvalue over a cluster at 0.95–0.99 of it took ≤ 1.8× (basis 6) and
            ≤ 1.4× (basis 8) the HVPs of an unrestarted run (tests/test_estimators_eigen.py).
        basis_device: ``"cpu"`` keeps the Lanczos basis in host RAM (pinned) when the operator is on a
            GPU, ``"disk"`` on local disk, memory-mapped (:mod:`losslens.geometry.base.state_store`);
            no accuracy cost; each step streams the basis to the device chunk by chunk (the plan's
            ``transfer``: bytes and seconds at the assumed rate).
        basis_dtype: store the basis in e.g. ``torch.bfloat16`` (half the memory; arithmetic stays
            float32). Accuracy cost: orthogonality only to ~4e-3, so Ritz values settle at about
            that relative accuracy and ``tol`` below it is not reached.

    Returns:
        :class:`EigenResult` with ``values`` sorted by ``|λ|`` (largest first), ``residuals``
        ``‖H v_i − λ_i v_i‖`` for unit v_i, ``converged`` flags (both methods: that true residual
        ≤ tol·``|λ_i|`` up to the products' round-off, 10·ε·``|λ_1|`` with ε the precision of the products
        or the vectors, whichever is coarser),
        ``vectors`` [k, dim], ``num_matvecs`` and ``memory`` (the plan, plus restarts). On an
        inexact operator (the gradient-difference backend) the final block of k products is its
        refined one (Richardson's stencil, 4 gradients per product): ``values`` are the Rayleigh
        quotients of the Ritz vectors under it, and ``residuals`` and ``converged`` are theirs
        (``memory["refined"]`` keeps the solve's values). Lanczos' final block is that one block;
        power iteration, whose residuals come from its last products, adds it (k more products).
    """
    k = check_int("k", k, 1)  # the operator and k <= its dimension: checked by estimate_memory below
    max_iter = check_int("max_iter", max_iter, 1)
    if not (isinstance(tol, (int, float)) and tol > 0 and math.isfinite(tol)):
        raise EstimatorError(f"tol must be a positive finite number, got {tol!r}")
    if method not in ("lanczos", "power"):
        raise EstimatorError(f"method must be 'lanczos' or 'power', got {method!r}")
    if max_basis is not None:
        max_basis = check_int("max_basis", max_basis, k + 2)
    plan = estimate_memory(op, k, method, max_iter, max_memory, max_basis, basis_device, basis_dtype)
    t0, n0 = time.perf_counter(), op.num_matvecs
    g = op.generator(seed)
    with op.configured(**plan.operator_settings):
        if method == "lanczos":
            solve = _lanczos_topk(op, k, tol, max_iter, g, plan.settings["basis_size"], basis_device, basis_dtype)
        else:
            solve = _power_topk(op, k, tol, max_iter, g)
        values, residuals, converged, vectors, refined = _final_pairs(op, solve, tol)
    for name, xs in (("eigenvalue", values), ("eigen residual", residuals)):
        if not all(math.isfinite(x) for x in xs):
            raise EstimatorError(f"{name} estimates are not finite ({xs}); check the loss and the operator")
    return EigenResult(
        values=tuple(values),
        residuals=tuple(residuals),
        converged=tuple(converged),
        num_matvecs=op.num_matvecs - n0,
        seconds=time.perf_counter() - t0,
        seed=int(seed),
        method=method,
        iterations=solve.iterations,
        vectors=vectors,
        memory={**plan.to_dict(), **solve.extra, **refined},
    )


def _final_pairs(op: CurvatureOperator, solve: Solve, tol: float):
    """The eigenpairs returned for the solve's unit vectors Y [k, dim] and values: their true residuals
    ``‖H yᵢ − λᵢ yᵢ‖`` from one block of k products, and ``converged`` (residual ≤ tol·|λᵢ| + the
    solve's round-off floor). An operator with refined products
    (:meth:`~losslens.geometry.operators.interface.CurvatureOperator.refined_matmat_flat`: the
    gradient-difference backend's Richardson stencil) gives that block, and the values become its
    Rayleigh quotients ``yᵢᵀHyᵢ / yᵢᵀyᵢ``, ranked by ``|λ|`` again (a near tie may swap); otherwise
    power iteration's residuals (from its last products) are kept without a product. Returns
    ``(values, residuals, converged, Y, {"refined": {...}} or {})``, ``refined`` keeping the solve's
    values. Memory: the k products beside Y."""
    Y, values = solve.vectors, solve.values
    HY = op.refined_matmat_flat(Y)
    if HY is None and solve.residuals is not None:
        return values, solve.residuals, solve.converged, Y, {}
    refined = HY is not None
    if not refined:
        HY = op.matmat_flat(Y)
    lam = [float(q) for q in rowdot(Y, HY) / rowdot(Y, Y)] if refined else values
    res = [float(r) for r in residual_norms(HY, Y, torch.as_tensor(lam, dtype=torch.float64))]
    del HY
    conv = [bool(r <= tol * abs(v) + solve.floor) for r, v in zip(res, lam)]
    if not refined:
        return values, res, conv, Y, {}
    order = [int(i) for i in magnitude_order(lam)]
    if order != list(range(len(lam))):
        permute_rows_(Y, order)
    ranked = ([xs[i] for i in order] for xs in (lam, res, conv))
    return *ranked, Y, {"refined": {"ritz_values": list(values), "stencil": "richardson"}}
