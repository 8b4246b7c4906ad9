"""llama.cpp's Q4_K k-quant (``quantize_row_q4_K_ref`` then ``dequantize_row_q4_K``), vectorised over blocks.

A super-block is 256 consecutive values of a row: 8 sub-blocks of 32, each with a 6-bit scale
index sc_j and a 6-bit min index m_j, and two fp16 super-scales d and dmin; a value is
x̂ = (fp16(d)·sc_j)·q − fp16(dmin)·m_j with q in 0..15 (docs/science.md §3c). The reference picks
them in three steps, reproduced here operation by operation in float32:

1. per sub-block, weights w_l = sqrt(Σ x²/32) + abs(x_l) and ggml's ``make_qkx2_quants(32, 15, x, w,
   rmin=−1, rdelta=0.1, nstep=20)``: min := min(min x, 0); start from the grid
   (max − min)/15 and try the 21 inverse scales (15 − 1 + 0.1·i)/(max − min), i = 0..20; for each,
   q = clamp(nearest(iscale·(x − min)), 0, 15), then the weighted least-squares scale and offset
   for those q (offset clipped to ≤ 0), kept when its weighted squared error is strictly smaller
   (a kept step's offset replaces min in the later steps' grids, as in the C loop);
2. sc_j = min(63, nearest(63/max_j(scale)·scale_j)), m_j likewise on the mins; d = fp16(max
   scale/63), dmin = fp16(max min/63);
3. requantize every sub-block with its stored scale: q = clamp(nearest((x + dmin·m_j)/(d·sc_j)), 0, 15)
   (a sub-block with d·sc_j = 0 dequantizes to −dmin·m_j whatever its q).

"nearest" is ggml's ``nearest_int`` (the 1.5·2²³ trick: round half to even). Every sum is
accumulated sequentially in element order as the C loops do, so the result equals the C reference
(compiled without FMA contraction) bit for bit; ``tests/test_quant_formats_gguf.py`` checks it
against a scalar transcription whose packed blocks the ``gguf`` package dequantizes.

Cost: about 21 × 5 passes over the weights with length-32 sequential loops (vectorised over all
sub-blocks); memory a few copies of the weight.
"""

from __future__ import annotations

import numpy as np
import torch

QK_K = 256
SUB = 32
_F = np.float32


def fp16(x: torch.Tensor) -> torch.Tensor:
    """float32 → fp16 (round to nearest even) → float32: ggml's GGML_FP32_TO_FP16 and back."""
    return x.to(torch.float16).to(torch.float32)


def _seq_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ over dim 1 of [n, k], added left to right in t's dtype (the C loop's order), [n]."""
    acc = t[:, 0].clone()
    for i in range(1, t.shape[1]):
        acc = acc + t[:, i]
    return acc


def _clamp_round(v: torch.Tensor, hi: int) -> torch.Tensor:
    return torch.clamp(torch.round(v), 0, hi)


def make_qkx2(
    x: torch.Tensor, w: torch.Tensor, nmax: int = 15, rmin: float = -1.0, rdelta: float = 0.1, nstep: int = 20
) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's ``make_qkx2_quants`` (use_mad = false) on sub-blocks ``x`` [n, 32] with weights ``w``.

    Returns (scale [n], the_min [n]) with the_min = −offset ≥ 0.
    """
    mn = torch.clamp(x.amin(dim=1), max=0.0)
    mx = x.amax(dim=1)
    flat = mx == mn
    span = torch.where(flat, torch.ones_like(mx), mx - mn)
    sum_w = _seq_sum(w)
    sum_x = _seq_sum(w * x)
    iscale = float(nmax) / span
    scale = 1.0 / iscale
    L = _clamp_round(iscale[:, None] * (x - mn[:, None]), nmax)
    diff = scale[:, None] * L + mn[:, None] - x
    best = _seq_sum(w * (diff * diff))
    for i in range(nstep + 1):
        num = float(_F(rmin) + _F(rdelta) * _F(i) + _F(nmax))  # float32 arithmetic, as in C
        # the C loop reads the *current* min (replaced whenever a step wins) in both places
        span = torch.where(flat, torch.ones_like(mx), mx - mn)
        la = _clamp_round((num / span)[:, None] * (x - mn[:, None]), nmax)
        wl = w * la
        sum_l, sum_l2, sum_xl = _seq_sum(wl), _seq_sum(wl * la), _seq_sum(wl * x)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        safe_D = torch.where(ok, D, torch.ones_like(D))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / safe_D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / safe_D
        pos = this_min > 0
        this_min = torch.where(pos, torch.zeros_like(this_min), this_min)
        this_scale = torch.where(pos, sum_xl / torch.where(sum_l2 == 0, torch.ones_like(sum_l2), sum_l2), this_scale)
        d2 = this_scale[:, None] * la + this_min[:, None] - x
        cur = _seq_sum(w * (d2 * d2))
        better = ok & (cur < best) & ~flat
        best = torch.where(better, cur, best)
        scale = torch.where(better, this_scale, scale)
        mn = torch.where(better, this_min, mn)
    scale = torch.where(flat, torch.zeros_like(scale), scale)
    return scale, -mn


def _six_bit(values: torch.Tensor, vmax: torch.Tensor) -> torch.Tensor:
    """min(63, (uint8) nearest(63/vmax · v)) per sub-block; 0 where vmax = 0 (ggml's inv = 0)."""
    inv = torch.where(vmax > 0, 63.0 / torch.where(vmax > 0, vmax, torch.ones_like(vmax)), torch.zeros_like(vmax))
    idx = torch.remainder(torch.round(inv[:, None] * values), 256)  # the C code stores it in a uint8
    return torch.clamp(idx, max=63)


def q4_k_codes(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Q4_K of super-blocks ``x`` [n, 256] float32 → d, dmin [n] (fp16 values as float32), sc, m [n, 8]
    and q [n, 256] (all integer-valued float32)."""
    n = x.shape[0]
    sub = x.reshape(n * 8, SUB)
    av_x = torch.sqrt(_seq_sum(sub * sub) / float(SUB))
    scales, mins = make_qkx2(sub, av_x[:, None] + sub.abs())
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    max_scale = torch.clamp(scales.amax(dim=1), min=0.0)
    max_min = torch.clamp(mins.amax(dim=1), min=0.0)
    sc, m = _six_bit(scales, max_scale), _six_bit(mins, max_min)
    d, dmin = fp16(max_scale / 63.0), fp16(max_min / 63.0)
    dj = (d[:, None] * sc).reshape(n * 8, 1)
    dm = (dmin[:, None] * m).reshape(n * 8, 1)
    q = _clamp_round((sub + dm) / torch.where(dj == 0, torch.ones_like(dj), dj), 15)
    q = torch.where(dj == 0, torch.zeros_like(q), q)
    return {"d": d, "dmin": dmin, "sc": sc, "m": m, "q": q.reshape(n, QK_K)}


def q4_k_dequantize(codes: dict[str, torch.Tensor]) -> torch.Tensor:
    """x̂ = (d·sc_j)·q − dmin·m_j per sub-block, [n, 256] float32 (``dequantize_row_q4_K``)."""
    n = codes["q"].shape[0]
    dj = (codes["d"][:, None] * codes["sc"]).reshape(n * 8, 1)
    dm = (codes["dmin"][:, None] * codes["m"]).reshape(n * 8, 1)
    return (dj * codes["q"].reshape(n * 8, SUB) - dm).reshape(n, QK_K)


def q4_k(x: torch.Tensor) -> torch.Tensor:
    """Quantize → dequantize float32 super-blocks ``x`` [n, 256]."""
    return q4_k_dequantize(q4_k_codes(x))
