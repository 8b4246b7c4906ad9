"""Stochastic trace estimators of the whole Hessian: Hutchinson and Hutch++ (exact for small problems).

All of them run on any :class:`~losslens.geometry.operators.interface.CurvatureOperator` through
``op.matmat_flat(V[k, dim])`` and apply the probes in blocks of k vectors, so a batched HVP
backend (one gradient graph reused for k vectors) pays off. Probes are Rademacher
(:func:`~losslens.geometry.estimators.sampling.rademacher`: a CPU generator's stream, independent of the block
size, so the same seed gives bit-identical probes on every device, run and memory plan). Per-probe
quadratic forms are accumulated in float64. Per-block traces from the same probes are in
:mod:`losslens.geometry.estimators.blocks`.

Memory (n = dim, b = bytes of ``op.dtype``, float32 at least): Hutchinson and block traces hold
one block of probes and its products, ``2 · block · n · b``; Hutch++ holds its sketch basis,
``s · n · b`` (``s`` = sketch size), plus one block of ``2 · block · n · b``; each adds one
operator pass (:meth:`~losslens.geometry.operators.hessian.HessianOperator.pass_bytes`). Within ``max_memory``
(see :mod:`losslens.geometry.memory.model`) they pick the fastest block size and graph cache, and Hutch++ the
largest sketch up to m/3, and record the choice in the result's ``memory``.

Cost is counted in Hessian-vector products (HVPs, ≈ 2 gradients each with the reverse backend)
and read from ``op.num_matvecs``.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from losslens.geometry.estimators._checks import check_int, check_op, on_operator_vectors
from losslens.geometry.estimators.sampling import (
    _ADVICE,
    _blocks,
    _finite,
    _interval,
    _mean_stderr,
    plan_probe_blocks,
    rademacher,
)
from losslens.geometry.base._linalg import orthonormalize_rows, project_out, rowdot
from losslens.geometry.base.state_store import state_rows, state_transfer
from losslens.geometry.memory.model import (
    Candidate,
    MemoryEstimate,
    basis_storage,
    choose,
    pass_options,
    state_budget,
    TEMPORARIES_PART,
    temporaries_bytes,
    vector_bytes,
    with_basis,
)
from losslens.geometry.memory.budget import resolve_budget
from losslens.geometry.operators.interface import CurvatureOperator
from losslens.geometry.base.results import EstimatorError, TraceEstimate

__all__ = ["hutchinson_trace", "hutchpp_trace", "estimate_memory"]


def estimate_memory(
    op: CurvatureOperator,
    method: str = "hutch++",
    num_matvecs: int = 100,
    max_memory=None,
    block_size: int | None = None,
    basis_device=None,
    basis_dtype: torch.dtype | None = None,
) -> MemoryEstimate:
    """The memory plan :func:`hutchinson_trace` / :func:`hutchpp_trace` /
    :func:`~losslens.geometry.estimators.blocks.block_traces` would run with (``method`` ``"hutchinson"``,
    ``"hutch++"`` or ``"blocks"``), without running it. Raises
    :class:`~losslens.geometry.memory.budget.MemoryBudgetError` when nothing fits."""
    if method == "hutch++":
        return _plan_hutchpp(op, num_matvecs, max_memory, basis_device, basis_dtype)
    if method in ("hutchinson", "blocks"):
        return plan_probe_blocks(op, num_matvecs, block_size, max_memory, f"{method} trace")
    raise EstimatorError(f"method must be 'hutchinson', 'hutch++' or 'blocks', got {method!r}")


# ------------------------------------------------------------------------------- Hutchinson
def _hutchinson_samples(op, num_matvecs, seed, block_size, tol, group_slices=None):
    """Run blocks of Rademacher probes; return per-probe samples (float64 numpy), per-group
    samples (dict of arrays or None) and whether the tolerance was reached."""
    g = op.generator(seed)
    full: list[torch.Tensor] = []
    parts: dict[str, list[torch.Tensor]] | None = None if group_slices is None else {k: [] for k in group_slices}
    done, converged = 0, False
    while done < num_matvecs:
        b = min(block_size, num_matvecs - done)
        V = rademacher(g, b, op.dim, op.dtype, op.device)
        HV = op.matmat_flat(V)
        if parts is None:
            full.append(rowdot(V, HV))
        else:
            per = {name: sum(rowdot(V[:, s], HV[:, s]) for s in sl) for name, sl in group_slices.items()}
            for name, x in per.items():
                parts[name].append(x)
            full.append(torch.stack(list(per.values()), 0).sum(0))
        del V, HV
        done += b
        if tol is not None and done >= 2:
            s = torch.cat(full).numpy()
            mean, se = _mean_stderr(s)
            if mean != 0 and se / abs(mean) < tol:
                converged = True
                break
    samples = torch.cat(full).numpy()
    group_samples = None if parts is None else {k: torch.cat(v).numpy() for k, v in parts.items()}
    return samples, group_samples, converged


@on_operator_vectors
def hutchinson_trace(
    op: CurvatureOperator,
    num_matvecs: int = 100,
    tol: float | None = None,
    seed: int = 0,
    block_size: int | None = None,
    max_memory: int | str | None = None,
) -> TraceEstimate:
    """Hutchinson estimate of tr(H): mean of ``vᵢᵀ H vᵢ`` over Rademacher probes vᵢ.

    Args:
        op: any curvature operator of dimension ``dim``.
        num_matvecs: cap on the number of probes m (= HVPs spent), ``>= 1``.
        tol: optional relative standard-error target; checked after each block of probes (once at
            least 2 samples exist); the run stops early when ``stderr / |estimate| < tol``.
        seed: seed of the probes.
        block_size: probes per ``matmat`` call (default: the fastest of 16, 8, 4, 2, 1 that fits
            ``max_memory``). Memory: ``2 · block_size · dim`` numbers plus one operator pass.
        max_memory: bytes (or ``"8GB"``) the call may allocate; default ``op.max_memory`` or
            :func:`losslens.geometry.memory.budget.default_budget`.

    Returns:
        :class:`TraceEstimate` with ``stderr = std(samples, ddof=1)/√m`` and a 95% Student-t
        interval (m − 1 degrees of freedom); ``converged`` tells whether ``tol`` was met (``True``
        when no ``tol`` was given); ``memory`` the plan. Cost: m ≤ ``num_matvecs`` HVPs.
    """
    check_op(op)
    num_matvecs = check_int("num_matvecs", num_matvecs, 1)
    if block_size is not None:
        block_size = check_int("block_size", block_size, 1)
    if tol is not None and not (isinstance(tol, (int, float)) and tol > 0 and math.isfinite(tol)):
        raise EstimatorError(f"tol must be a positive finite number or None, got {tol!r}")
    plan = plan_probe_blocks(op, num_matvecs, block_size, max_memory, "hutchinson_trace")
    t0, n0 = time.perf_counter(), op.num_matvecs
    with op.configured(**plan.operator_settings):
        samples, _, reached = _hutchinson_samples(op, num_matvecs, seed, plan.settings["block_size"], tol)
    value, se = _mean_stderr(samples)
    _finite("hutchinson trace estimate", value)
    lo, hi = _interval(value, se, len(samples))
    return TraceEstimate(
        value=value,
        stderr=se,
        ci_low=lo,
        ci_high=hi,
        num_matvecs=op.num_matvecs - n0,
        seconds=time.perf_counter() - t0,
        seed=int(seed),
        method="hutchinson",
        converged=True if tol is None else reached,
        num_samples=len(samples),
        dim=op.dim,
        memory=plan.to_dict(),
    )


# ---------------------------------------------------------------------------------- Hutch++
def _split(m: int, s: int) -> tuple[int, int]:
    """(sketch size, residual probes) for a budget of m HVPs with sketch s ≤ m/3: 2s + r = m."""
    return s, m - 2 * s


def _plan_hutchpp(op: CurvatureOperator, m: int, max_memory, basis_device=None, basis_dtype=None) -> MemoryEstimate:
    """Largest sketch s ≤ m/3 (then fastest block and cache) within the budget. Memory: the basis
    ``s · dim`` + a block ``2 · block · dim`` + one pass; s = 0 is plain Hutchinson."""
    budget = resolve_budget(op.max_memory if max_memory is None else max_memory, op.device)
    vec = vector_bytes(op.dim, op.dtype)
    bdev, bdtype, on_host = basis_storage(op.device, basis_device, basis_dtype, op.dtype)
    host_budget = state_budget(bdev) if on_host else 0
    bvec = vector_bytes(op.dim, bdtype)
    target = m // 3
    sizes = sorted(
        {target, *[int(target * f) for f in (0.75, 0.5, 0.35, 0.25, 0.15, 0.1)], *range(min(target, 8), -1, -1)},
        reverse=True,
    )
    for s in sizes:
        s, r = _split(m, s)
        cands = []
        for b in _blocks(max(s, r, 1), None):
            calls = (2 * math.ceil(s / b) if s else 0) + math.ceil(r / b)
            for settings, pass_b, cost in pass_options(op, b, max(calls, 1), m):
                parts, host = with_basis(
                    {
                        f"block [{b}, dim]": b * vec,
                        f"block products [{b}, dim]": b * vec,
                        "operator pass": pass_b,
                        TEMPORARIES_PART: temporaries_bytes(op.dim, op.dtype),
                    },
                    f"sketch basis [{s}, dim] {str(bdtype).replace('torch.', '')}",
                    s * bvec,
                    on_host,
                )
                cands.append(
                    Candidate(
                        MemoryEstimate(
                            parts,
                            budget,
                            {
                                "sketch_size": s,
                                "residual_probes": r,
                                "sketch_capped": s < target,
                                "block_size": b,
                                "basis_device": str(bdev),
                                "basis_dtype": str(bdtype).replace("torch.", ""),
                                **settings,
                            },
                            host,
                            host_budget,
                            # off the device: Y written, read for QᵀHQ, 4 times per residual block (2 passes)
                            state_transfer((2 * s + 4 * s * math.ceil(r / b)) * bvec, bdev, op.device)
                            if on_host and s
                            else {},
                        ),
                        cost,
                    )
                )
        if any(c.estimate.fits for c in cands) or s == 0:
            return choose(cands, "hutchpp_trace", _ADVICE)
    raise AssertionError("unreachable")  # s = 0 returns above


@on_operator_vectors
def hutchpp_trace(
    op: CurvatureOperator,
    num_matvecs: int = 100,
    seed: int = 0,
    max_memory: int | str | None = None,
    basis_device=None,
    basis_dtype: torch.dtype | None = None,
) -> TraceEstimate:
    """Hutch++ (Meyer, Musco, Musco & Woodruff, 2021) estimate of tr(H) with a budget of m HVPs.

    With s = m // 3 and r = m − 2s: draw a Rademacher sketch S [s, dim] and compute Y = H S
    (s HVPs); Q = orthonormal basis of the rows of Y (in place, Gram-matrix orthonormalisation in
    float64, two passes; numerically dependent directions are dropped, their HVPs go to the
    residual); the low-rank part tr(QᵀHQ) costs ``|Q|`` HVPs; the rest is Hutchinson with r Rademacher
    probes G projected onto the complement, ``mean_i (P gᵢ)ᵀ H (P gᵢ)`` with P = I − QQᵀ. The
    estimate is ``tr(QᵀHQ) + tr_est(PHP)``; ``stderr`` is the standard error of the residual
    Hutchinson part (the low-rank part is exact given Q), with a 95% Student-t interval on r − 1
    degrees of freedom. The estimator is unbiased for any orthonormal Q.

    **Memory-capped split.** The basis takes ``s · dim`` numbers (21 GB for s = 33 at 162M float32
    parameters). When ``max_memory`` cannot hold it, s is reduced to the largest that fits and
    r = m − 2s grows, keeping the HVP budget: the estimate stays unbiased and its variance moves
    from Hutch++'s towards Hutchinson's (s = 0 is Hutchinson, reported as such). The chosen s is in
    ``memory["settings"]["sketch_size"]``.

    When ``num_matvecs >= dim`` the best use of the budget is the exact trace: H is applied to the
    identity (dim HVPs, in blocks of 16), ``method="exact"``, ``stderr = 0``.

    Args:
        op: any curvature operator; num_matvecs: budget m ≥ 3; seed: seed of S and G;
        max_memory: bytes (or ``"8GB"``) the call may allocate (default ``op.max_memory`` or
            :func:`losslens.geometry.memory.budget.default_budget`).
        basis_device: ``"cpu"`` keeps the sketch basis in host RAM (pinned) when the operator is on a
            GPU, ``"disk"`` on local disk, memory-mapped (:mod:`losslens.geometry.base.state_store`);
            no accuracy cost; projections stream it chunk by chunk (the plan's ``transfer``).
        basis_dtype: e.g. ``torch.bfloat16`` halves the basis (arithmetic stays float32). Accuracy
            cost: Q is orthonormal only to ~4e-3, so P = I − QQᵀ is not an exact projector and the
            estimate carries a bias of that relative order on the low-rank part.
    Returns:
        :class:`TraceEstimate` (``method="hutch++"``, ``"hutchinson"`` when no sketch fits, or
        ``"exact"``). Cost: m HVPs (dim if m ≥ dim). Memory: ``(s + 2·block) · dim`` numbers + one pass.
    """
    check_op(op)
    num_matvecs = check_int("num_matvecs", num_matvecs, 3)
    dim = op.dim
    if num_matvecs >= dim:
        return _exact_trace(op, seed, max_memory)
    plan = _plan_hutchpp(op, num_matvecs, max_memory, basis_device, basis_dtype)
    bdev, bdtype, _ = basis_storage(op.device, basis_device, basis_dtype, op.dtype)
    s, r, b = plan.settings["sketch_size"], plan.settings["residual_probes"], plan.settings["block_size"]
    t0, n0 = time.perf_counter(), op.num_matvecs
    g = op.generator(seed)
    low = 0.0
    with op.configured(**plan.operator_settings):
        if s > 0:
            Q = state_rows(s, dim, bdtype, bdev, pin=torch.device(op.device).type == "cuda")
            for start in range(0, s, b):  # Y = H S, block by block, into Q
                stop = min(start + b, s)
                Q[start:stop] = op.matmat_flat(rademacher(g, stop - start, dim, op.dtype, op.device))
            Q = orthonormalize_rows(Q)
            r += s - Q.shape[0]  # dropped directions: their HVPs go to the residual
            for start in range(0, Q.shape[0], b):  # tr(QᵀHQ), block by block
                stop = min(start + b, Q.shape[0])
                low += float(rowdot(Q[start:stop], op.matmat_flat(Q[start:stop])).sum())
        else:
            Q = torch.empty(0, dim, dtype=bdtype, device=bdev)
        residual = []
        for start in range(0, r, b):
            stop = min(start + b, r)
            G = rademacher(g, stop - start, dim, op.dtype, op.device)
            project_out(G, Q)
            residual.append(rowdot(G, op.matmat_flat(G)))
            del G
    residual = torch.cat(residual).numpy() if residual else np.zeros(0)
    rest, se = _mean_stderr(residual) if residual.size else (0.0, 0.0)
    value = low + rest
    _finite("hutch++ trace estimate", value)
    lo, hi = _interval(value, se, residual.size)
    return TraceEstimate(
        value=value,
        stderr=se,
        ci_low=lo,
        ci_high=hi,
        num_matvecs=op.num_matvecs - n0,
        seconds=time.perf_counter() - t0,
        seed=int(seed),
        method="hutch++" if s > 0 else "hutchinson",
        converged=True,
        num_samples=int(residual.size),
        dim=dim,
        memory={**plan.to_dict(), "basis_rank": int(Q.shape[0])},
    )


def _exact_trace(op: CurvatureOperator, seed: int, max_memory) -> TraceEstimate:
    """tr H from H applied to the identity, in blocks (dim HVPs; tiny problems)."""
    dim = op.dim
    plan = plan_probe_blocks(op, dim, None, max_memory, "hutchpp_trace (exact, m >= dim)")
    b = plan.settings["block_size"]
    t0, n0 = time.perf_counter(), op.num_matvecs
    total = 0.0
    with op.configured(**plan.operator_settings):
        for start in range(0, dim, b):
            k = min(b, dim - start)
            rows = torch.arange(k, device=op.device)
            E = torch.zeros(k, dim, dtype=op.dtype, device=op.device)
            E[rows, rows + start] = 1
            HE = op.matmat_flat(E)
            total += float(HE[rows, rows + start].sum(dtype=torch.float64))
    _finite("exact trace", total)
    return TraceEstimate(
        value=total,
        stderr=0.0,
        ci_low=total,
        ci_high=total,
        num_matvecs=op.num_matvecs - n0,
        seconds=time.perf_counter() - t0,
        seed=int(seed),
        method="exact",
        converged=True,
        num_samples=0,
        dim=dim,
        memory=plan.to_dict(),
    )
