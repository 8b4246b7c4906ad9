"""Round-to-nearest quantizers on one weight matrix (docs/science.md §3), and the shared INT-b grid.

All functions take a weight ``W`` of shape [out_features, in_features] (the ``nn.Linear`` layout)
and return a new tensor of the same shape and dtype holding the dequantized values (weight-only
fake quantization). Cost: O(out·in), no data.

Grid of an INT-b group (one output row × g consecutive input columns), ``maxq = 2^b − 1``:

* asymmetric (default, docs/science.md §3): lo = min(w, 0), hi = max(w, 0), s = (hi − lo)/maxq,
  z = round(−lo/s), q = clamp(round(w/s) + z, 0, maxq), ŵ = s·(q − z);
* symmetric (``sym``; the GPTQ reference ``Quantizer(sym=True)`` rule, kept bit-for-bit so that
  GPTQ matches the reference): hi = max(``|lo|``, hi), lo = −hi if lo < 0, s = (hi − lo)/maxq,
  z = (maxq + 1)/2.

A group whose s would be 0 (only an all-zero group, because the range always contains 0) is left
exact (it is all zeros; the reference gives it the range [−1, 1], which also returns zeros).

Group layout: groups are consecutive input columns [0, g), [g, 2g), ...; when ``in_features`` is
not divisible by g the **last group is short** (in_features mod g columns, its own min/max);
nothing is padded. ``group_size = -1`` means one group per output row.
"""

from __future__ import annotations

import torch


def fit_grid(w: torch.Tensor, bits: int, sym: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point per row of ``w`` [rows, cols] → (scale [rows, 1], zero [rows, 1]).

    All-zero rows get the reference's fallback range [−1, 1] (their values stay exactly 0).
    """
    maxq = 2**bits - 1
    zeros = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
    lo = torch.minimum(w.min(dim=1).values, zeros)
    hi = torch.maximum(w.max(dim=1).values, zeros)
    if sym:
        hi = torch.maximum(lo.abs(), hi)
        lo = torch.where(lo < 0, -hi, lo)
    dead = (lo == 0) & (hi == 0)
    lo = torch.where(dead, -torch.ones_like(lo), lo)
    hi = torch.where(dead, torch.ones_like(hi), hi)
    scale = (hi - lo) / maxq
    zero = torch.full_like(scale, (maxq + 1) / 2) if sym else torch.round(-lo / scale)
    return scale.unsqueeze(1), zero.unsqueeze(1)


def quantize_grid(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """ŵ = s·(clamp(round(x/s) + z, 0, 2^b − 1) − z), broadcasting scale/zero against ``x``."""
    q = torch.clamp(torch.round(x / scale) + zero, 0, 2**bits - 1)
    return scale * (q - zero)


@torch.no_grad()
def rtn_quantize(W: torch.Tensor, bits: int, group_size: int = 128, sym: bool = False) -> torch.Tensor:
    """Round-to-nearest INT-b of ``W`` [out, in] per (row, group of ``group_size`` input columns).

    Computed in at least float32 (float64 stays float64) and returned in ``W``'s dtype.
    """
    work = W.detach().to(torch.promote_types(W.dtype, torch.float32))
    out = torch.empty_like(work)
    rows, cols = work.shape
    g = cols if group_size == -1 else min(group_size, cols)
    full = (cols // g) * g
    parts = []
    if full:  # all full groups at once: [rows * n_groups, g]
        blk = work[:, :full].reshape(rows * (full // g), g)
        parts.append((0, full, blk))
    if full < cols:  # the short last group
        parts.append((full, cols, work[:, full:]))
    for a, b, blk in parts:
        scale, zero = fit_grid(blk, bits, sym)
        q = quantize_grid(blk, scale, zero, bits)
        exact = (blk == 0).all(dim=1, keepdim=True)  # s = 0 groups left exact (all zeros)
        q = torch.where(exact, blk, q)
        out[:, a:b] = q.reshape(rows, b - a)
    return out.to(W.dtype)


@torch.no_grad()
def int8_quantize(W: torch.Tensor) -> torch.Tensor:
    """Per-output-channel symmetric absmax INT8: s_c = max|w_c|/127, ŵ = s_c·clamp(round(w/s_c), −127, 127).

    Rows that are all zero (s_c = 0) are left exact.
    """
    work = W.detach().to(torch.promote_types(W.dtype, torch.float32))
    s = work.abs().amax(dim=1, keepdim=True) / 127
    safe = torch.where(s == 0, torch.ones_like(s), s)
    q = safe * torch.clamp(torch.round(work / safe), -127, 127)
    q = torch.where(s == 0, work, q)
    return q.to(W.dtype)
