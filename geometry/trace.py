"""Stochastic trace estimators: Hutchinson, Hutch++, and per-block traces.

All three run on any :class:`~geometry.operator.CurvatureOperator` through
``op.matmat_flat(V[k, dim])`` and apply the probes in blocks of k vectors, so a batched HVP
backend (one gradient graph reused for k vectors) pays off. Probes are Rademacher (±1 entries),
drawn from ``op.generator(seed)`` (a CPU generator; probes are moved to the operator's device), so
the same seed gives bit-identical numbers on every device and run. Per-probe quadratic forms are
accumulated in float64.

Cost is counted in Hessian-vector products (HVPs, ≈ 2 gradients each with the reverse backend)
and read from ``op.num_matvecs``.
"""
from __future__ import annotations

import math
import time
from typing import Mapping

import numpy as np
import torch

from ._checks import _check_int, _check_op
from .operator import CurvatureOperator
from .params import ParamGlobs
from .results import BlockTraces, EstimatorError, TraceEstimate

__all__ = ["hutchinson_trace", "hutchpp_trace", "block_traces", "rademacher", "t_quantile"]

DEFAULT_BLOCK_SIZE = 16


# ----------------------------------------------------------------------------------- helpers
def rademacher(generator: torch.Generator, k: int, dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``[k, dim]`` i.i.d. ±1 entries from a CPU ``generator``, cast to ``dtype`` on ``device``."""
    bits = torch.randint(0, 2, (k, dim), generator=generator, dtype=torch.int8)
    return (bits.to(device=device, dtype=dtype) * 2 - 1)


def t_quantile(n: int, level: float = 0.95) -> float:
    """Two-sided Student-t quantile for ``n`` samples (n − 1 degrees of freedom); inf for n < 2."""
    if n < 2:
        return math.inf
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2, n - 1))


def _mean_stderr(samples: np.ndarray) -> tuple[float, float]:
    n = samples.shape[0]
    mean = float(samples.mean())
    if n < 2:
        return mean, math.inf
    return mean, float(samples.std(ddof=1) / math.sqrt(n))


def _interval(value: float, stderr: float, n: int) -> tuple[float, float]:
    if stderr == 0.0:
        return value, value
    if not math.isfinite(stderr):
        return -math.inf, math.inf
    h = t_quantile(n) * stderr
    return value - h, value + h


def _finite(name: str, *xs: float) -> None:
    for x in xs:
        if not math.isfinite(x):
            raise EstimatorError(f"{name} is not finite ({x}); check the loss and the operator")


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
        prod = V * HV
        if parts is None:
            full.append(prod.sum(dim=1, dtype=torch.float64).cpu())
        else:
            per = {name: torch.stack([prod[:, s].sum(dim=1, dtype=torch.float64) for s in sl], 0).sum(0).cpu()
                   for name, sl in group_slices.items()}
            for name, x in per.items():
                parts[name].append(x)
            full.append(torch.stack(list(per.values()), 0).sum(0))
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


def hutchinson_trace(
    op: CurvatureOperator,
    num_matvecs: int = 100,
    tol: float | None = None,
    seed: int = 0,
    block_size: int | None = None,
) -> TraceEstimate:
    """Hutchinson estimate of tr(H): mean of ``vᵢᵀ H vᵢ`` over Rademacher probes vᵢ.

    Args:
        op: any curvature operator of dimension ``dim``.
        num_matvecs: cap on the number of probes m (= HVPs spent), ``>= 1``.
        tol: optional relative standard-error target; checked after each block of probes (once at
            least 2 samples exist); the run stops early when ``stderr / |estimate| < tol``.
        seed: seed of the probes.
        block_size: probes per ``matmat`` call (default ``min(num_matvecs, 16)``); the operator may
            chunk further. Memory: two ``[block_size, dim]`` tensors.

    Returns:
        :class:`TraceEstimate` with ``stderr = std(samples, ddof=1)/√m`` and a 95% Student-t
        interval (m − 1 degrees of freedom); ``converged`` tells whether ``tol`` was met (``True``
        when no ``tol`` was given). Cost: m ≤ ``num_matvecs`` HVPs.
    """
    _check_op(op)
    num_matvecs = _check_int("num_matvecs", num_matvecs, 1)
    block_size = min(num_matvecs, DEFAULT_BLOCK_SIZE) if block_size is None else _check_int("block_size", block_size, 1)
    if tol is not None and not (isinstance(tol, (int, float)) and tol > 0 and math.isfinite(tol)):
        raise EstimatorError(f"tol must be a positive finite number or None, got {tol!r}")
    t0, n0 = time.perf_counter(), op.num_matvecs
    samples, _, reached = _hutchinson_samples(op, num_matvecs, seed, block_size, tol)
    value, se = _mean_stderr(samples)
    _finite("hutchinson trace estimate", value)
    lo, hi = _interval(value, se, len(samples))
    return TraceEstimate(
        value=value, stderr=se, ci_low=lo, ci_high=hi, num_matvecs=op.num_matvecs - n0,
        seconds=time.perf_counter() - t0, seed=int(seed), method="hutchinson",
        converged=True if tol is None else reached, num_samples=len(samples), dim=op.dim,
    )


# ---------------------------------------------------------------------------------- Hutch++
def hutchpp_trace(op: CurvatureOperator, num_matvecs: int = 100, seed: int = 0) -> TraceEstimate:
    """Hutch++ (Meyer, Musco, Musco & Woodruff, 2021) estimate of tr(H) with a budget of m HVPs.

    With s = m // 3 and r = m − 2s: draw a Rademacher sketch S [s, dim] and compute H S (s HVPs,
    one block); Q = orthonormal basis of the columns of (H S)ᵀ (QR); the low-rank part tr(QᵀHQ)
    costs s HVPs (one block); the rest is Hutchinson with r Rademacher probes G projected onto the
    complement, ``mean_i (P gᵢ)ᵀ H (P gᵢ)`` with P = I − QQᵀ (r HVPs, one block), scaled to the
    trace of PHP. The estimate is ``tr(QᵀHQ) + tr_est(PHP)``; ``stderr`` is the standard error of
    the residual Hutchinson part (the low-rank part is exact given Q), with a 95% Student-t
    interval on r − 1 degrees of freedom.

    When ``num_matvecs >= dim`` the best use of the budget is the exact trace: H is applied to the
    identity (dim HVPs, in blocks of 16), ``method="exact"``, ``stderr = 0``. When the sketch
    width reaches dim (never with the split above unless m ≥ dim) Q spans the whole space and the
    residual is zero.

    Args:
        op: any curvature operator; num_matvecs: budget m ≥ 3; seed: seed of S and G.
    Returns:
        :class:`TraceEstimate` (``method="hutch++"`` or ``"exact"``). Cost: m HVPs (dim if m ≥ dim).
        Memory: about four ``[m/3, dim]`` tensors.
    """
    _check_op(op)
    num_matvecs = _check_int("num_matvecs", num_matvecs, 3)
    t0, n0 = time.perf_counter(), op.num_matvecs
    dim = op.dim
    if num_matvecs >= dim:
        total = 0.0
        for start in range(0, dim, DEFAULT_BLOCK_SIZE):
            b = min(DEFAULT_BLOCK_SIZE, dim - start)
            rows = torch.arange(b, device=op.device)
            E = torch.zeros(b, dim, dtype=op.dtype, device=op.device)
            E[rows, rows + start] = 1
            HE = op.matmat_flat(E)
            total += float(HE[rows, rows + start].sum(dtype=torch.float64))
        _finite("exact trace", total)
        return TraceEstimate(
            value=total, stderr=0.0, ci_low=total, ci_high=total, num_matvecs=op.num_matvecs - n0,
            seconds=time.perf_counter() - t0, seed=int(seed), method="exact", converged=True,
            num_samples=0, dim=dim,
        )
    s = num_matvecs // 3
    r = num_matvecs - 2 * s
    g = op.generator(seed)
    S = rademacher(g, s, dim, op.dtype, op.device)
    Y = op.matmat_flat(S)                                   # [s, dim] rows H s_j
    Q = torch.linalg.qr(Y.T, mode="reduced").Q.T.contiguous()  # [min(s,dim), dim] orthonormal rows
    HQ = op.matmat_flat(Q)
    low = float((Q * HQ).sum(dtype=torch.float64))
    residual = np.zeros(0)
    if Q.shape[0] < dim and r > 0:
        G = rademacher(g, r, dim, op.dtype, op.device)
        PG = G - (G @ Q.T) @ Q
        PG = PG - (PG @ Q.T) @ Q                           # second pass: orthogonal to working precision
        HPG = op.matmat_flat(PG)
        residual = (PG * HPG).sum(dim=1, dtype=torch.float64).cpu().numpy()
    if residual.size:
        rest, se = _mean_stderr(residual)
    else:
        rest, se = 0.0, 0.0
    value = low + rest
    _finite("hutch++ trace estimate", value)
    lo, hi = _interval(value, se, residual.size)
    return TraceEstimate(
        value=value, stderr=se, ci_low=lo, ci_high=hi, num_matvecs=op.num_matvecs - n0,
        seconds=time.perf_counter() - t0, seed=int(seed), method="hutch++", converged=True,
        num_samples=int(residual.size), dim=dim,
    )


# ----------------------------------------------------------------------------- block traces
def block_traces(
    op: CurvatureOperator,
    groups: Mapping[str, ParamGlobs] | str,
    num_matvecs: int = 100,
    seed: int = 0,
    block_size: int | None = None,
) -> BlockTraces:
    """Hutchinson estimates of tr(H_gg) for each parameter group g, from one set of probes.

    Args:
        op: a curvature operator with a :class:`~geometry.params.ParamSpace` in ``op.space``.
        groups: as :meth:`ParamSpace.groups` accepts: a mapping ``{group: glob(s)}`` (unmatched
            parameters form ``"other"``), ``"module"`` or ``"parameter"``. The groups partition
            the parameters.
        num_matvecs: number of probes m ≥ 1 (= HVPs spent); seed: seed of the probes (the same
            probes as :func:`hutchinson_trace` with the same seed and block size).
        block_size: probes per ``matmat`` call (default ``min(m, 16)``).

    Returns:
        :class:`BlockTraces`; block g's estimate is ``mean_i v_{i,g}ᵀ (H v_i)_g`` and the blocks
        sum to ``total.value`` (the full Hutchinson estimate) up to float64 round-off. Cost: m HVPs.
    """
    _check_op(op)
    space = getattr(op, "space", None)
    if space is None:
        raise EstimatorError(
            "block_traces needs an operator with a parameter space (op.space); build it from a model "
            "(HessianOperator) or pass space= to DenseOperator"
        )
    num_matvecs = _check_int("num_matvecs", num_matvecs, 1)
    block_size = min(num_matvecs, DEFAULT_BLOCK_SIZE) if block_size is None else _check_int("block_size", block_size, 1)
    members = space.groups(groups)
    slices = space.slices
    group_slices = {gname: [slices[n] for n in names] for gname, names in members.items()}
    t0, n0 = time.perf_counter(), op.num_matvecs
    samples, per_group, _ = _hutchinson_samples(op, num_matvecs, seed, block_size, None, group_slices)
    m = len(samples)
    values, stderr, ci_low, ci_high = {}, {}, {}, {}
    for gname, x in per_group.items():
        v, se = _mean_stderr(x)
        _finite(f"block trace of group {gname!r}", v)
        values[gname], stderr[gname] = v, se
        ci_low[gname], ci_high[gname] = _interval(v, se, m)
    tv, tse = _mean_stderr(samples)
    seconds = time.perf_counter() - t0
    spent = op.num_matvecs - n0
    tlo, thi = _interval(tv, tse, m)
    total = TraceEstimate(value=tv, stderr=tse, ci_low=tlo, ci_high=thi, num_matvecs=spent, seconds=seconds,
                          seed=int(seed), method="hutchinson", converged=True, num_samples=m, dim=op.dim)
    sizes = {gname: int(sum(s.stop - s.start for s in sl)) for gname, sl in group_slices.items()}
    return BlockTraces(values=values, stderr=stderr, ci_low=ci_low, ci_high=ci_high, sizes=sizes,
                       members={k: tuple(v) for k, v in members.items()}, total=total,
                       num_matvecs=spent, seconds=seconds, seed=int(seed))
