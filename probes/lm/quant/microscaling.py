"""Block-scaled FP4/FP8 weight formats: OCP microscaling MXFP4/MXFP8 and NVIDIA's NVFP4 (docs/science.md §3b).

Blocks are consecutive input columns of one output row (the layout of a ``nn.Linear`` weight
[out, in], whose rows are the dot-product vectors). When ``in_features`` is not a multiple of the
block size the **last block is short** (its own amax); that equals zero padding, since zeros change
no amax and quantize to zero.

**MX (OCP Microscaling Formats v1.0, §6.3)**, block k = 32, shared scale X in E8M0 (a power of two
2^e, e in [−127, 127]), elements P_i in E2M1 (MXFP4) or E4M3/E5M2 (MXFP8)::

    shared_exp = floor(log2(max_i |V_i|)) − emax_elem      (emax_elem = 2 for E2M1, 8 E4M3, 15 E5M2)
    X = 2^clamp(shared_exp, −127, 127)
    P_i = round(V_i / X)   to the element format, ties to even, saturating at ±max_elem
    V̂_i = X · P_i

A block of zeros stays zero. floor(log2 amax) is taken exactly from the float's exponent
(``frexp``), not from a rounded ``log2``.

**NVFP4** (NVIDIA Blackwell), block 16, E2M1 elements, an E4M3 block scale and a float32 per-tensor
scale::

    s_t = amax(W) / (448 · 6)                               float32
    s_b = E4M3(amax_b / (6 · s_t))                          ties to even, saturating at 448
    S   = s_b · s_t                                         float32
    ŵ   = S · E2M1(w / S)

A block whose s_b rounds to 0 (amax_b below ~2^−10 of the tensor's amax) becomes zeros, as in the
format. Cost: O(out·in), no data; computed in float32 (float64 weights in float64), returned in
the weight's dtype.
"""

from __future__ import annotations

import torch

from losslens.lm.quant.minifloat import E2M1, E4M3, Minifloat, round_minifloat, work_dtype

MX_BLOCK = 32
NVFP4_BLOCK = 16


def _blocks(work: torch.Tensor, block: int) -> list[tuple[int, int, torch.Tensor]]:
    """(first column, last column + 1, [rows · n, block] view) for the full blocks and the short last one."""
    rows, cols = work.shape
    full = (cols // block) * block
    parts = []
    if full:
        parts.append((0, full, work[:, :full].reshape(rows * (full // block), block)))
    if full < cols:
        parts.append((full, cols, work[:, full:]))
    return parts


def _map_blocks(W: torch.Tensor, block: int, fn) -> torch.Tensor:
    work = W.detach().to(work_dtype(W.dtype))
    out = torch.empty_like(work)
    for a, b, blk in _blocks(work, block):
        out[:, a:b] = fn(blk).reshape(work.shape[0], b - a)
    return out.to(W.dtype)


def mx_shared_exponent(amax: torch.Tensor, elem: Minifloat) -> torch.Tensor:
    """The OCP MX shared exponent floor(log2 amax) − emax_elem, clamped to E8M0's [−127, 127] (int)."""
    _, e = torch.frexp(amax)
    return torch.clamp(e - 1 - elem.emax, -127, 127)


def mx_quantize_blocks(blocks: torch.Tensor, elem: Minifloat) -> torch.Tensor:
    """MX fake quantization of ``blocks`` [n, k] (one shared scale per row)."""
    amax = blocks.abs().amax(dim=1, keepdim=True)
    X = torch.ldexp(torch.ones_like(amax), mx_shared_exponent(amax, elem))
    q = round_minifloat(blocks / X, elem) * X
    return torch.where(amax == 0, torch.zeros_like(blocks), q)


@torch.no_grad()
def mx_quantize(W: torch.Tensor, elem: Minifloat = E2M1, block: int = MX_BLOCK) -> torch.Tensor:
    """MXFP4 (``elem`` = E2M1) or MXFP8 (E4M3 / E5M2) fake quantization of ``W`` [out, in]."""
    return _map_blocks(W, block, lambda blk: mx_quantize_blocks(blk, elem))


def nvfp4_tensor_scale(W: torch.Tensor) -> torch.Tensor:
    """s_t = amax(W) / (448 · 6) as a 0-d tensor in the working dtype."""
    return W.detach().to(work_dtype(W.dtype)).abs().amax() / (E4M3.max_value * E2M1.max_value)


def nvfp4_quantize_blocks(blocks: torch.Tensor, s_t: torch.Tensor) -> torch.Tensor:
    """NVFP4 fake quantization of ``blocks`` [n, 16] given the tensor scale ``s_t``."""
    if float(s_t) == 0:
        return torch.zeros_like(blocks)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    s_b = round_minifloat(amax / (E2M1.max_value * s_t), E4M3)
    S = s_b * s_t
    safe = torch.where(S == 0, torch.ones_like(S), S)
    q = round_minifloat(blocks / safe, E2M1) * safe
    return torch.where(S == 0, torch.zeros_like(blocks), q)


@torch.no_grad()
def nvfp4_quantize(W: torch.Tensor) -> torch.Tensor:
    """NVFP4 fake quantization of ``W`` [out, in] (blocks of 16 input columns)."""
    s_t = nvfp4_tensor_scale(W)
    return _map_blocks(W, NVFP4_BLOCK, lambda blk: nvfp4_quantize_blocks(blk, s_t))
