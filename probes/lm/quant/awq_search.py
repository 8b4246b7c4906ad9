"""AWQ's search on one input-sharing group of linears, from its calibration statistics (the Gram
matrix XᵀX and the mean ``|x|`` per input channel): the scale search over α (:func:`awq_search`), the
per-(row, input group) clipping search (:func:`clip_search`) and the clipped INT-b rounding
(:func:`quantize_clipped`). The algorithm, its guarantee (E ≤ E(α*) ≤ E_RTN on the calibration
inputs) and its differences from the reference are described in :mod:`losslens.lm.quant.awq`, which runs
this search block by block over a model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from losslens.lm.quant.quant_errors import QuantizeError
from losslens.lm.quant.rtn import fit_grid, quantize_grid, rtn_quantize

__all__ = ["AWQGroupResult", "awq_search", "clip_search", "quantize_clipped", "N_GRID", "CLIP_GRID", "MAX_SHRINK"]

N_GRID = 20
CLIP_GRID = 20
MAX_SHRINK = 0.5
MIN_SCALE = 1e-4


@dataclass
class AWQGroupResult:
    """The search on one input-sharing group.

    Attributes:
        names: the group's linears (execution order).
        alpha: chosen exponent α*.
        scales: chosen per-input-channel scales s [in] (normalised).
        errors: E(α) for every α of the grid (group output MSE, see :mod:`losslens.lm.quant.awq`).
        rtn_error: E with plain RTN (= ``errors[0]``, α = 0).
        scaled_error: E(α*) before clipping.
        error: final group output MSE (after clipping).
        clip_ratios: per linear the chosen shrink ratio per (row, input group), [out, n_groups].
        clipped: per linear whether the clipped weight was kept (guard, see :mod:`losslens.lm.quant.awq`).
        weights: per linear the fake-quantized weight Q(W·diag(s))·diag(s)⁻¹ (W's dtype).
        n_tokens: calibration token rows the search used.
    """

    names: list[str]
    alpha: float
    scales: torch.Tensor
    errors: list[float]
    rtn_error: float
    scaled_error: float
    error: float
    clip_ratios: dict[str, torch.Tensor] = field(default_factory=dict)
    clipped: dict[str, bool] = field(default_factory=dict)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    n_tokens: int = 0
    seconds: float = 0.0


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _group_bounds(cols: int, group_size: int) -> list[tuple[int, int]]:
    g = cols if group_size == -1 else min(group_size, cols)
    return [(a, min(a + g, cols)) for a in range(0, cols, g)]


def quantize_clipped(
    W: torch.Tensor, bits: int, group_size: int, sym: bool = False, ratios: torch.Tensor | None = None
) -> torch.Tensor:
    """RTN of ``W`` [out, in] per (row, group) after shrinking each group's range [min(w,0), max(w,0)]
    by ``ratios`` [out, n_groups] (None: no clipping, equal to :func:`rtn_quantize`). All-zero groups
    stay exact. Returns the dequantized weight in the working dtype (≥ float32)."""
    work = W.to(_work_dtype(W.dtype))
    out = torch.empty_like(work)
    for k, (a, b) in enumerate(_group_bounds(work.shape[1], group_size)):
        blk = work[:, a:b]
        if ratios is not None:
            zero = torch.zeros(blk.shape[0], dtype=blk.dtype, device=blk.device)
            r = ratios[:, k].to(blk.dtype)
            lo = torch.minimum(blk.min(dim=1).values, zero) * r
            hi = torch.maximum(blk.max(dim=1).values, zero) * r
            blk = torch.minimum(torch.maximum(blk, lo[:, None]), hi[:, None])
        scale, zp = fit_grid(blk, bits, sym)
        q = quantize_grid(blk, scale, zp, bits)
        exact = (blk == 0).all(dim=1, keepdim=True)
        out[:, a:b] = torch.where(exact, blk, q)
    return out


def _sq_err(D: torch.Tensor, G: torch.Tensor) -> float:
    """‖X Dᵀ‖²_F = Σ (D G) ⊙ D for G = XᵀX (float64 accumulation)."""
    return float(((D @ G) * D).sum(dtype=torch.float64))


def clip_search(
    Wp: torch.Tensor,
    G: torch.Tensor,
    n_tokens: int,
    bits: int,
    group_size: int,
    sym: bool = False,
    ratios: Sequence[float] | None = None,
) -> torch.Tensor:
    """Per (row, input group) shrink ratio of the range minimising that group's partial output error.

    Args:
        Wp: the (scaled) weight [out, in]; G: Gram matrix XᵀX of its inputs [in, in] (scaled inputs);
        n_tokens: rows of X (only normalises the errors); ratios: candidates, default 1.0 … 0.5.
    Returns the chosen ratios [out, n_groups] (first minimum on ties: 1.0 unless clipping helps).
    """
    if ratios is None:
        ratios = [1 - MAX_SHRINK * i / CLIP_GRID for i in range(CLIP_GRID + 1)]
    work = Wp.to(_work_dtype(Wp.dtype))
    G = G.to(work.dtype)
    R = torch.tensor(list(ratios), dtype=work.dtype, device=work.device)
    bounds = _group_bounds(work.shape[1], group_size)
    best = torch.empty(work.shape[0], len(bounds), dtype=work.dtype, device=work.device)
    rows = work.shape[0]
    for k, (a, b) in enumerate(bounds):
        w = work[:, a:b]  # [rows, gs]
        zero = torch.zeros(rows, dtype=w.dtype, device=w.device)
        lo = torch.minimum(w.min(dim=1).values, zero)
        hi = torch.maximum(w.max(dim=1).values, zero)
        cand = torch.minimum(torch.maximum(w[None], (R[:, None] * lo)[..., None]), (R[:, None] * hi)[..., None])
        flat = cand.reshape(-1, b - a)  # [R*rows, gs]
        scale, zp = fit_grid(flat, bits, sym)
        q = quantize_grid(flat, scale, zp, bits)
        q = torch.where((flat == 0).all(dim=1, keepdim=True), flat, q).reshape(len(R), rows, b - a)
        d = q - w[None]
        err = torch.einsum("kri,ij,krj->kr", d, G[a:b, a:b], d) / max(n_tokens, 1)
        best[:, k] = R[torch.argmin(err, dim=0)]
    return best


def awq_search(
    G: torch.Tensor,
    x_abs_mean: torch.Tensor,
    n_tokens: int,
    weights: dict[str, torch.Tensor],
    bits: int,
    group_size: int = 128,
    sym: bool = False,
    n_grid: int = N_GRID,
    clip: bool = True,
    clip_ratios: Sequence[float] | None = None,
) -> AWQGroupResult:
    """AWQ scale + clipping search for one input-sharing group (see :mod:`losslens.lm.quant.awq`).

    Args:
        G: XᵀX of the group's calibration inputs [in, in]; x_abs_mean: mean_t ``|x_t|`` [in];
        n_tokens: n (token rows of X); weights: ``{name: W [out, in]}`` of the group's linears.
        bits, group_size, sym: the RTN grid (docs/science.md §3); n_grid: α grid size N;
        clip: run the clipping search; clip_ratios: its candidates (default 1.0 … 0.5, 21 values).
    Returns :class:`AWQGroupResult` (weights in each W's dtype).
    """
    t0 = time.perf_counter()
    first = next(iter(weights.values()))
    dt = _work_dtype(first.dtype)
    G = G.to(dt)
    xm = x_abs_mean.to(dt)
    Ws = {n: W.detach().to(dt) for n, W in weights.items()}
    denom = max(n_tokens, 1) * sum(W.shape[0] for W in Ws.values())
    errors: list[float] = []
    best = (float("inf"), 0.0, None)
    for i in range(n_grid):
        alpha = i / n_grid
        s = xm.pow(alpha).clamp(min=MIN_SCALE)
        s = s / (s.max() * s.min()).sqrt()
        total = 0.0
        for W in Ws.values():
            Wq = rtn_quantize(W * s, bits, group_size, sym) / s
            total += _sq_err(Wq - W, G)
        err = total / denom
        errors.append(err)
        if err < best[0]:
            best = (err, alpha, s)
    scaled_error, alpha, s = best
    if s is None:
        raise QuantizeError("AWQ scale search produced no finite error (NaN/Inf in calibration activations?)")
    Gs = G / s[:, None] / s[None, :]  # Gram of the scaled inputs X·diag(s)⁻¹
    out_w, ratios_out, clipped = {}, {}, {}
    total = 0.0
    for name, W in Ws.items():
        Wp = W * s
        plain = quantize_clipped(Wp, bits, group_size, sym)
        e_plain = _sq_err(plain - Wp, Gs)
        chosen, use, e = plain, False, e_plain
        if clip:
            r = clip_search(Wp, Gs, n_tokens, bits, group_size, sym, clip_ratios)
            ratios_out[name] = r
            if bool((r < 1).any()):
                cq = quantize_clipped(Wp, bits, group_size, sym, r)
                e_clip = _sq_err(cq - Wp, Gs)
                if e_clip <= e_plain:
                    chosen, use, e = cq, True, e_clip
        clipped[name] = use
        total += e
        out_w[name] = (chosen / s).to(weights[name].dtype)
    return AWQGroupResult(
        names=list(weights),
        alpha=alpha,
        scales=s,
        errors=errors,
        rtn_error=errors[0],
        scaled_error=scaled_error,
        error=total / denom,
        clip_ratios=ratios_out,
        clipped=clipped,
        weights=out_w,
        n_tokens=n_tokens,
        seconds=time.perf_counter() - t0,
    )
