"""GPTQ transcribed from the paper's equations and the IST-DASLab ``gptq.py`` structure (test oracle).

Written independently of :mod:`losslens.lm.quant.gptq` (no import from it, its own grid code) so that the
native implementation can be checked against the published algorithm at float64 rounding level.

Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers" (ICLR 2023), Algorithm 1, with the engineering of the authors' reference
(IST-DASLab/gptq, ``GPTQ.add_batch`` / ``GPTQ.fasterquant`` and ``quant.Quantizer``):

* H = (2/n) Σ x xᵀ, accumulated batch by batch as a running mean (``add_batch``: H ← H·n/(n+m),
  then H += (2/(n+m)) X Xᵀ), n counting the *leading* dimension of each input (sequences for a
  [b, s, d] input, as the reference does; the result of GPTQ does not depend on H's scale);
* the per-row quantizer is fitted on W **as loaded**, before dead columns are zeroed (``find_params``
  runs before the dead-column step; it is the grid of ``group_size = -1``);
* dead inputs: H_ii = 0 → H_ii = 1 and column i of W = 0;
* static groups: one quantizer per group of g consecutive *original* columns, fitted on the
  dead-zeroed W before any update;
* act-order: columns sorted by decreasing diag H (``torch.argsort(..., descending=True)``);
* damping: λ·mean(diag H) added to the diagonal; U = upper Cholesky factor of H⁻¹;
* columns in blocks of B: inside a block, column j is quantized, e_j = (w_j − q_j)/U_jj and the
  block's later columns get w_k −= e_j U_jk; after the block, all later columns get W −= E·U;
* non-static groups: a new quantizer when the (permuted) column index is a multiple of g, fitted on
  the g columns of the *outer* W from that index — which holds the updates of earlier blocks only;
* un-permute.

The quantizer (``quant.Quantizer.find_params`` with ``perchannel=True``, ``mse=False``): per row,
xmin = min(min x, 0), xmax = max(max x, 0); symmetric: xmax = max(|xmin|, xmax), xmin = −xmax where
xmin < 0; a row with xmin = xmax = 0 gets [−1, 1]; scale = (xmax − xmin)/maxq; zero = (maxq+1)/2
(symmetric) or round(−xmin/scale); q = scale·(clamp(round(x/scale) + zero, 0, maxq) − zero).
"""

from __future__ import annotations

import torch


class RowQuantizer:
    """Per-row INT-b min/max quantizer of the reference (``perchannel=True``, no MSE search)."""

    def __init__(self, bits: int, sym: bool):
        self.maxq = 2**bits - 1
        self.sym = sym
        self.scale: torch.Tensor | None = None
        self.zero: torch.Tensor | None = None

    def fit(self, x: torch.Tensor) -> "RowQuantizer":
        """Fit scale and zero per row of ``x`` [rows, cols]; returns self."""
        nil = torch.zeros(x.shape[0], dtype=x.dtype)
        xmin = torch.minimum(x.amin(dim=1), nil)
        xmax = torch.maximum(x.amax(dim=1), nil)
        if self.sym:
            xmax = torch.maximum(xmin.abs(), xmax)
            neg = xmin < 0
            xmin = xmin.clone()
            xmin[neg] = -xmax[neg]
        both = (xmin == 0) & (xmax == 0)
        xmin = torch.where(both, torch.full_like(xmin, -1.0), xmin)
        xmax = torch.where(both, torch.full_like(xmax, 1.0), xmax)
        self.scale = ((xmax - xmin) / self.maxq)[:, None]
        if self.sym:
            self.zero = torch.full_like(self.scale, (self.maxq + 1) / 2)
        else:
            self.zero = torch.round(-xmin / self.scale[:, 0])[:, None]
        return self

    def copy(self) -> "RowQuantizer":
        other = RowQuantizer(1, self.sym)
        other.maxq, other.scale, other.zero = self.maxq, self.scale, self.zero
        return other

    def __call__(self, column: torch.Tensor) -> torch.Tensor:
        """Dequantized value of one column [rows]."""
        x = column[:, None]
        level = torch.clamp(torch.round(x / self.scale) + self.zero, 0, self.maxq)
        return (self.scale * (level - self.zero))[:, 0]


class HessianAccumulator:
    """H = (2/n) Σ x xᵀ as the reference's running mean over calls (n: leading dim of each input)."""

    def __init__(self, cols: int, dtype=torch.float64):
        self.H = torch.zeros(cols, cols, dtype=dtype)
        self.n = 0

    def add(self, inp: torch.Tensor) -> None:
        if inp.ndim == 2:
            inp = inp[None]
        m = inp.shape[0]
        X = inp.reshape(-1, inp.shape[-1]).to(self.H.dtype).T  # [cols, tokens]
        self.H *= self.n / (self.n + m)
        self.n += m
        X = (2.0 / self.n) ** 0.5 * X
        self.H += X @ X.T


def transcribed_gptq(
    W: torch.Tensor,
    H: torch.Tensor,
    bits: int,
    group_size: int = -1,
    sym: bool = False,
    act_order: bool = False,
    static_groups: bool = False,
    percdamp: float = 0.01,
    blocksize: int = 128,
) -> torch.Tensor:
    """The dequantized GPTQ weight [rows, cols] of ``W`` given ``H`` (both copied, float64 kept)."""
    W = W.clone()
    H = H.clone()
    rows, cols = W.shape
    quant = RowQuantizer(bits, sym).fit(W)  # fitted before the dead columns are zeroed

    dead = torch.nonzero(torch.diagonal(H) == 0).flatten()
    H[dead, dead] = 1
    W[:, dead] = 0

    groups: list[RowQuantizer] = []
    if static_groups:
        for a in range(0, cols, group_size):
            groups.append(RowQuantizer(bits, sym).fit(W[:, a : a + group_size]))

    perm = None
    if act_order:
        perm = torch.argsort(torch.diagonal(H), descending=True)
        W = W[:, perm]
        H = H[perm][:, perm]

    H = H + percdamp * torch.diagonal(H).mean() * torch.eye(cols, dtype=H.dtype)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)

    Q = torch.zeros_like(W)
    for start in range(0, cols, blocksize):
        stop = min(start + blocksize, cols)
        block = W[:, start:stop].clone()
        errors = torch.zeros_like(block)
        Ub = U[start:stop, start:stop]
        for c in range(stop - start):
            col = start + c
            if group_size != -1:
                if static_groups:
                    original = int(perm[col]) if perm is not None else col
                    quant = groups[original // group_size]
                elif col % group_size == 0:
                    quant = RowQuantizer(bits, sym).fit(W[:, col : col + group_size])
            w = block[:, c]
            q = quant(w)
            Q[:, col] = q
            e = (w - q) / Ub[c, c]
            block[:, c:] -= e[:, None] * Ub[c, c:][None, :]
            errors[:, c] = e
        W[:, stop:] -= errors @ U[start:stop, stop:]

    if perm is not None:
        Q = Q[:, torch.argsort(perm)]
    return Q
