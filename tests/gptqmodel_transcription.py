"""GPTQModel 7.7.0's default GPTQ transcribed from its source (test oracle of the ``gptqmodel`` preset).

Written independently of :mod:`losslens.lm.quant.gptq_preset` and :mod:`losslens.lm.quant.rtn` (no import
from either; its own quantizer, permutation, damping and column loop) from these GPTQModel
functions, keeping their float32 operation order so the two agree to float32 rounding:

* ``quantization/quantizer.py`` ``Quantizer.find_params`` (perchannel, mse 0) and ``quantize``:
  xmin = min(min x, 0), xmax = max(max x, 0); sym: xmax = max(|xmin|, xmax), xmin = −xmax where
  xmin < 0; an all-zero range becomes [−1, 1]; scale = (xmax − xmin)/maxq; zero = (maxq+1)/2 (sym)
  or round(−xmin/scale); q = scale·(clamp(round(x/scale) + zero, 0, maxq) − zero);
* ``quantization/gar.py`` (``compute_local_perms``, ``compute_global_perm`` with metric "max",
  ``compose_final_perm``, ``extend_perm_with_tail``): columns sorted inside each full group of g by
  decreasing diag H, groups ordered by their largest diag H (stable), the tail left in place;
* ``quantization/gptq.py`` ``GPTQ.hessian_inverse``: λ ∈ {0.05, 0.05+0.01, …} (< 1), first λ whose
  Cholesky of H + λ·mean(diag H)·I and the upper Cholesky of its inverse succeed; diagonal floors
  1e-6·max|diag|·10^k after all λ failed;
* ``GPTQ.quantize``: per-row grid fitted on the float32 W as loaded; dead columns (H_ii = 0 → 1,
  W[:, i] = 0); permute; blocks of 128 with lazy updates; a new grid where the permuted column
  index is a multiple of g, fitted on the outer W; un-permute;
* ``GPTQ.process_batch`` / ``materialize_global_hessian``: per sequence xᵀx (float32 matmul),
  summed, times 2/n with n the number of token rows.

Tie rule: inside a group this oracle sorts with Python's stable ``sorted``; GPTQModel (and the
preset) use ``torch.sort(descending=True)``, whose order among *equal* diagonal entries is not
specified. Tests use tie-free diagonals for the within-group order.
"""

from __future__ import annotations

import math

import torch


class Grid:
    """GPTQModel ``Quantizer`` (perchannel, mse = 0) on float32 rows."""

    def __init__(self, bits: int, sym: bool):
        self.maxq = 2**bits - 1
        self.sym = sym

    def fit(self, x: torch.Tensor) -> Grid:
        nil = torch.zeros(x.shape[0], dtype=x.dtype)
        lo_raw, hi_raw = torch.aminmax(x, dim=1)
        lo, hi = torch.minimum(lo_raw, nil), torch.maximum(hi_raw, nil)
        if self.sym:
            hi = torch.maximum(torch.abs(lo), hi)
            lo = torch.where(lo < 0, -hi, lo)
        empty = (hi == 0) if self.sym else ((lo == 0) & (hi == 0))
        lo = torch.where(empty, lo - 1, lo)
        hi = torch.where(empty, hi + 1, hi)
        self.scale = ((hi - lo) / self.maxq).reshape(-1, 1)
        if self.sym:
            self.zero = torch.full_like(self.scale, (self.maxq + 1) / 2)
        else:
            self.zero = torch.round(-lo.reshape(-1, 1) / self.scale)
        return self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        q = torch.clamp(torch.round(x / self.scale) + self.zero, 0, self.maxq)
        return self.scale * (q - self.zero)


def gar_order(diag: torch.Tensor, g: int) -> list[int]:
    """Group-aware order p (p[new] = old), written with Python sorts."""
    vals = diag.tolist()
    n = len(vals)
    groups = [list(range(k * g, (k + 1) * g)) for k in range(n // g)]
    inside = [sorted(cols, key=lambda c: -vals[c]) for cols in groups]
    ranked = sorted(range(len(groups)), key=lambda k: -max(vals[c] for c in groups[k]))
    return [c for k in ranked for c in inside[k]] + list(range(len(groups) * g, n))


def damp_values(damp: float, step: float) -> list[float]:
    out = [damp]
    while step > 0 and out[-1] < out[-1] + step < 1.0:
        out.append(out[-1] + step)
    return out


def inverse_factor(H: torch.Tensor, damp: float, step: float) -> tuple[torch.Tensor, float]:
    """(upper Cholesky factor of (H + λ·mean(diag)·I)⁻¹, λ), GPTQModel's schedule and floors."""
    n = H.shape[0]
    base = torch.diagonal(H).clone()
    eye = torch.eye(n, dtype=H.dtype)
    floor_base = None
    for attempt in range(7):
        if attempt == 0:
            d = base
        else:
            f = floor_base * math.pow(10.0, attempt - 1)
            d = torch.clamp(base + f, min=f)
        Hf = H - torch.diag(torch.diagonal(H)) + torch.diag(d)
        mean = torch.mean(d)
        for lam in damp_values(damp, step):
            try:
                L = torch.linalg.cholesky(Hf + eye * (lam * mean))
                return torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True), lam
            except torch.linalg.LinAlgError:
                continue
        if attempt == 0:
            top = float(base.abs().max())
            floor_base = (top if math.isfinite(top) and top != 0 else 1.0) * 1e-6
    raise RuntimeError("no damping worked")


def hessian(sequences: list[torch.Tensor]) -> torch.Tensor:
    """(2/n) Σ xᵀx over [s, d] sequences, float32 per-sequence products summed in order."""
    total, n = None, 0
    for x in sequences:
        x = x.to(torch.float32).contiguous()
        part = torch.matmul(x.T, x)
        total = part if total is None else total.add_(part)
        n += x.shape[0]
    return total.mul_(2.0 / float(n))


def gptqmodel_gptq(
    W: torch.Tensor,
    H: torch.Tensor,
    bits: int,
    g: int,
    sym: bool = True,
    desc_act: bool = False,
    damp: float = 0.05,
    step: float = 0.01,
    block: int = 128,
) -> tuple[torch.Tensor, float]:
    """(dequantized weight in W's dtype, λ used)."""
    out_dtype = W.dtype
    W = W.to(torch.float32).clone()
    H = H.to(torch.float32).clone()
    cols = W.shape[1]
    grid = Grid(bits, sym).fit(W)
    for i in range(cols):
        if H[i, i] == 0:
            H[i, i] = 1.0
            W[:, i] = 0.0
    if desc_act:
        order = torch.argsort(torch.diagonal(H), descending=True)
    else:
        order = torch.tensor(gar_order(torch.diagonal(H), g), dtype=torch.long)
    W = W[:, order]
    H = H[order][:, order]
    U, lam = inverse_factor(H, damp, step)
    Q = torch.zeros_like(W)
    for start in range(0, cols, block):
        stop = min(start + block, cols)
        Wb = W[:, start:stop].clone()
        Eb = torch.zeros_like(Wb)
        for k in range(stop - start):
            col = start + k
            if g != -1 and col % g == 0:
                grid = Grid(bits, sym).fit(W[:, col : col + g])
            w = Wb[:, k]
            q = grid(w.reshape(-1, 1)).reshape(-1)
            Q[:, col] = q
            e = (w - q) / U[start + k, start + k]
            Wb[:, k:] -= e.reshape(-1, 1) * U[start + k, start:stop][k:]
            Eb[:, k] = e
        W[:, stop:] -= Eb.matmul(U[start:stop, stop:])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(cols)
    return Q[:, inverse].to(out_dtype), lam
