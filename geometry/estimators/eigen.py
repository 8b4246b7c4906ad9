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
(2 for k = 1). Both add one operator pass, with every batch's gradient graph kept between steps
when it fits (each step then costs one second backward, not a graph rebuild), and 3 float64 chunk
temporaries; ``tests/test_memory_budget.py`` checks measured = plan at 10M dimensions.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from ._checks import check_int, check_op, on_operator_vectors
from ..base._linalg import RowBasis, gaussian_rows, project_out, residual_norms, row_norms, rowdot
from ..memory.model import (MemoryEstimate, basis_storage, default_budget, first_fitting, pass_options, resolve_budget,
                     TEMPORARIES_PART, temporaries_bytes, vector_bytes, with_basis)
from ..operators.interface import CurvatureOperator
from ..base.results import EigenResult, EstimatorError

__all__ = ["top_eigenvalues", "estimate_memory"]

#: The smallest Lanczos basis worth running is k + SMALLEST_EXTRA vectors: a restart then keeps the
#: k wanted Ritz vectors, at least one more, and adds at least two new Krylov vectors per cycle.
SMALLEST_EXTRA = 4
#: A basis of max(ENOUGH_BASIS, 4k) converges about as fast as an unrestarted one on the spectra of
#: tests/test_estimators_eigen.py (k = 1 and 3, 3 seeds, float32/64: within 2 products, 5%, of an
#: unrestarted run; a basis of 8 took up to 22% more at k = 1); the planner fills the budget
#: with basis vectors up to that size before it keeps the gradient graphs between steps.
ENOUGH_BASIS = 16

_ADVICE = ("lower max_iter or max_basis (Lanczos needs at least k + 4 vectors unless max_basis is given), use "
           "method='power' (k + 2 vectors, many more HVPs), use fewer or shorter curvature batches, select fewer "
           "parameters (params=...), or raise max_memory")


def _gaussian_unit(g: torch.Generator, dim: int, dtype, device) -> torch.Tensor:
    """A Gaussian unit vector drawn on the CPU in ``dtype`` (chunk by chunk: no float64 copy at model
    scale; sharded: this rank's columns of the global vector, ``geometry.base._linalg.gaussian_rows``)."""
    x = gaussian_rows(g, 1, dim, dtype, "cpu")
    x /= float(row_norms(x)[0])
    return x[0].to(device=device)


def estimate_memory(op: CurvatureOperator, k: int = 1, method: str = "lanczos", max_iter: int = 100,
                    max_memory=None, max_basis: int | None = None, basis_device=None,
                    basis_dtype: torch.dtype | None = None) -> MemoryEstimate:
    """The memory plan :func:`top_eigenvalues` would run with, without running it (raises
    :class:`~geometry.memory.model.MemoryBudgetError` when nothing fits)."""
    if k > op.dim:
        raise EstimatorError(f"k must be <= the operator dimension {op.dim}, got k={k}")
    budget = resolve_budget(op.max_memory if max_memory is None else max_memory, op.device)
    vec = vector_bytes(op.dim, op.dtype)
    bdev, bdtype, on_host = basis_storage(op.device, basis_device, basis_dtype, op.dtype)
    host_budget = default_budget("cpu") if on_host else 0
    bvec = vector_bytes(op.dim, bdtype)
    steps = min(op.dim, max(max_iter, k))
    cands = []
    if method == "power":
        for settings, pass_b, _ in pass_options(op, 1, steps):
            # the k rows of the vectors found, the iterate and its product (the next iterate is the
            # product normalised in place); at the end one row for the in-place reordering. k = 1:
            # the iterate is the vector found
            n_vec = k + 2 if k > 1 else 2
            parts = {f"eigenvectors found, iterate and product [{n_vec}, dim]": n_vec * vec,
                     "operator pass": pass_b, TEMPORARIES_PART: temporaries_bytes(op.dim)}
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
    final = {s.get("cache_graphs", False): (s, b) for s, b, _ in pass_options(op, k, 1)}
    for m, cache in order:
        if cache not in options:
            continue
        settings, pass_b = options[cache]
        rows = RowBasis.allocated_rows(m, op.dim, bdtype)       # the basis grows in whole blocks
        basis_here = 0 if on_host else rows * bvec
        # while iterating: the basis, one vector (the product, then the next basis vector) and the
        # reductions' temporaries; at the end the k Ritz vectors are formed beside the basis, which
        # is then freed before their k products: the larger phase counts
        temps = temporaries_bytes(op.dim)
        state = max(basis_here + vec + temps, basis_here + k * vec, 2 * k * vec + temps)
        parts, host = with_basis({"residual (or the Ritz vectors and products at the end)": state - basis_here - temps,
                                  "operator pass": max(pass_b, final[cache][1] if cache in final else pass_b),
                                  TEMPORARIES_PART: temps},
                                 f"basis [{rows}, dim] {str(bdtype).replace('torch.', '')}", rows * bvec, on_host)
        cands.append(MemoryEstimate(parts, budget, {"basis_size": m, "restarted": m < full,
                                                    "basis_device": str(bdev), "basis_dtype": str(bdtype).replace("torch.", ""),
                                                    **settings}, host, host_budget))
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
            block of k HVPs for the true residuals of the Ritz vectors, which decide ``converged``.

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
            :func:`geometry.memory.model.default_budget`); see the module docstring.
        max_basis: Lanczos basis size, ≥ k + 2 (default: the steps wanted, or what fits; see the
            module docstring). Accuracy cost of a small basis: none at convergence, but more steps:
            k = 1 on a top eigenvalue over a cluster at 0.95–0.99 of it took ≤ 1.8× (basis 6) and
            ≤ 1.4× (basis 8) the HVPs of an unrestarted run (tests/test_estimators_eigen.py).
        basis_device: ``"cpu"`` keeps the Lanczos basis in host RAM when the operator is on a GPU
            (no accuracy cost; each step moves the basis through PCIe).
        basis_dtype: store the basis in e.g. ``torch.bfloat16`` (half the memory; arithmetic stays
            float32). Accuracy cost: orthogonality only to ~4e-3, so Ritz values settle at about
            that relative accuracy and ``tol`` below it is not reached.

    Returns:
        :class:`EigenResult` with ``values`` sorted by ``|λ|`` (largest first), ``residuals``
        ``‖H v_i − λ_i v_i‖`` for unit v_i, ``converged`` flags (both methods: that true residual
        ≤ tol·``|λ_i|`` up to the products' round-off, 10·ε·``|λ_1|`` with ε the precision of the products
        or the vectors, whichever is coarser),
        ``vectors`` [k, dim], ``num_matvecs`` and ``memory`` (the plan, plus restarts).
    """
    check_op(op)
    dim = op.dim
    k = check_int("k", k, 1)
    if k > dim:
        raise EstimatorError(f"k must be <= the operator dimension {dim}, got k={k}")
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
            values, residuals, converged, vectors, iters, extra = _lanczos_topk(
                op, k, tol, max_iter, g, plan.settings["basis_size"], basis_device, basis_dtype)
        else:
            values, residuals, converged, vectors, iters = _power_topk(op, k, tol, max_iter, g)
            extra = {}
    for name, xs in (("eigenvalue", values), ("eigen residual", residuals)):
        if not all(math.isfinite(x) for x in xs):
            raise EstimatorError(f"{name} estimates are not finite ({xs}); check the loss and the operator")
    return EigenResult(
        values=tuple(values), residuals=tuple(residuals), converged=tuple(converged),
        num_matvecs=op.num_matvecs - n0, seconds=time.perf_counter() - t0, seed=int(seed),
        method=method, iterations=iters, vectors=vectors, memory={**plan.to_dict(), **extra},
    )


def _select(theta: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest |theta| (ties: larger value first), stable."""
    order = np.lexsort((-theta, -np.abs(theta)))
    return order[:k]


def _breakdown_eps(op: CurvatureOperator) -> float:
    """Relative size under which a residual is rounding noise: 10 × the coarser of the products'
    and the vectors' precision (no √dim factor: dot products are summed pairwise)."""
    return 10.0 * max(op.product_eps, float(torch.finfo(op.dtype).eps))


def _lanczos_topk(op, k, tol, max_iter, g, basis_size, basis_device=None, basis_dtype=None):
    dim = op.dim
    steps_total = min(dim, max(max_iter, k))
    m = max(min(basis_size, steps_total), min(k + 2, dim))
    eps = _breakdown_eps(op)
    Q = RowBasis(dim, basis_dtype or op.dtype, basis_device or op.device)
    Q.append(_gaussian_unit(g, dim, op.dtype, op.device))
    T = np.zeros((m + 1, m + 1))
    j, steps, restarts, breakdowns = 0, 0, 0, 0
    tnorm = 0.0
    # state: the basis, and w (one vector: the product, then the residual, then the next basis
    # vector); w is dropped once copied into the basis, so a product never sees two of them
    while True:
        w = op.matvec_flat(Q.row(j)).unsqueeze(0)                 # one HVP
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
        if beta <= eps * max(tnorm, np.finfo(float).tiny):         # invariant subspace: fresh direction
            breakdowns += 1
            del w
            w = _gaussian_unit(g, dim, op.dtype, op.device).unsqueeze(0)
            Q.orthogonalize(w)
            nx = float(row_norms(w)[0])
            if not nx > eps:
                break
            w /= nx                                               # in place: no extra full-size vector
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
    Y = Q.combine(S[:, sel].T.copy(), op.dtype, op.device)          # [k, dim]
    del Q                                                           # the basis is freed before H Y
    Y /= row_norms(Y).to(device=Y.device, dtype=Y.dtype)[:, None]
    HY = op.matmat_flat(Y)                                          # k HVPs
    lam = torch.as_tensor(vals, dtype=torch.float64)
    res = residual_norms(HY, Y, lam).numpy()
    del HY
    floor = eps * float(np.max(np.abs(theta)))
    conv = [bool(r <= tol * abs(v) + floor) for r, v in zip(res, vals)]
    extra = {"restarts": restarts, "breakdowns": breakdowns, "basis_size": m}
    return [float(v) for v in vals], [float(r) for r in res], conv, Y, steps, extra


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
    order = np.lexsort((-theta, -np.abs(theta)))
    th = theta[order]
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
        v = _gaussian_unit(g, op.dim, op.dtype, op.device).unsqueeze(0)
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
            if r <= stop * abs(lam) + eps * scale:   # a small true residual
                break
            if it == max_iter - 1:
                break
            if B is not None:
                w = w.unsqueeze(0)
                project_out(w, B)
                w = w[0]
            n = float(row_norms(w[None])[0])
            if not n > 0:         # H v lies in the span of the found vectors: nothing left to iterate
                break
            v = w.div_(n)
            del w
        del w
        if F is None:
            F = v.unsqueeze(0)
        else:
            F[i].copy_(v)
        del v
        vals.append(lam)
        res.append(r)
        conv.append(bool(r <= tol * abs(lam) + eps * scale))
    order = [int(j) for j in _select(np.asarray(vals), k)]
    _permute_rows_(F, order)
    return [vals[i] for i in order], [res[i] for i in order], [conv[i] for i in order], F, iters


def _permute_rows_(F: torch.Tensor, order: list[int]) -> None:
    """``F[:] = F[order]`` in place, through one temporary row (cycle by cycle)."""
    tmp, placed = None, set()
    for start in range(len(order)):
        if start in placed or order[start] == start:
            continue
        tmp = F[start].clone() if tmp is None else tmp.copy_(F[start])
        i = start
        while True:
            placed.add(i)
            j = order[i]
            if j == start:
                F[i].copy_(tmp)
                break
            F[i].copy_(F[j])
            i = j
