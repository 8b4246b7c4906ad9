"""GPTQ on one layer (Frantar et al. 2023), native PyTorch, device- and dtype-agnostic.

This is the per-layer algorithm only: a weight ``W`` [out, in] and its Hessian proxy ``H`` [in, in]
go in, the fake-quantized weight comes out. Collecting H from calibration inputs and walking the
model block by block lives in :mod:`losslens.lm.quant.sequential`.

It reproduces the IST-DASLab reference (``gptq.py`` ``GPTQ.fasterquant`` + ``quant.py``
``Quantizer``) step for step, so the two agree to float rounding on the same W, H and settings
(tested: ``tests/test_gptq_reference.py`` against an independent transcription, ≤ 1e-12 of max ``|W|``
in float64 over 448 settings; the result does not depend on the scale of H):

0. the per-row grid (used when ``group_size = -1``) is fitted on W as given, before step 1 — so a
   dead column still counts in its row's min/max, as in the reference (``find_params`` runs first);
1. dead inputs (H_ii = 0): H_ii := 1, W[:, i] := 0;
2. static groups: one grid per group of the *original* column layout, fitted on that W;
3. act-order: permute columns by decreasing diag(H);
4. damping: H += λ·mean(diag H)·I;
5. U = upper Cholesky factor of H⁻¹ (``cholesky`` → ``cholesky_inverse`` → ``cholesky(upper)``);
6. columns in blocks of ``block_size`` with lazy batch updates: inside a block column j is
   quantized, e = (w_j − q_j)/U_jj is propagated to the block's remaining columns through U[j, :],
   and after the block all later columns get W[:, i2:] −= E·U[i1:i2, i2:];
7. with groups (and no static groups) the grid is refitted when column index % g == 0, on
   ``W[:, j : j+g]`` of the **outer** matrix — which has all updates of earlier *blocks* but not
   those of earlier columns of the current block (the reference's quirk when a group starts mid-block;
   kept on purpose, the tests pin it);
8. un-permute.

Cost: one Cholesky factorisation and inverse of an [in, in] matrix plus O(out·in²) for the updates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from losslens.lm.quant.quant_errors import CholeskyError
from losslens.lm.quant.rtn import fit_grid, quantize_grid


@dataclass
class GPTQResult:
    """Output of :func:`gptq_quantize`.

    Attributes:
        weight: the fake-quantized weight [out, in] in the input weight's dtype.
        damping: the λ actually used (larger than asked when Cholesky needed retries).
        loss: Σ (w − q)²/U_jj² / 2, GPTQ's proxy of the layer-output error increase.
        seconds: wall time of the call.
        notes: what happened besides the plain algorithm (dead columns, damping retries).
    """

    weight: torch.Tensor
    damping: float
    loss: float
    seconds: float
    notes: list[str] = field(default_factory=list)


def _inverse_cholesky_upper(
    H: torch.Tensor, damp: float, max_damp: float, retry_factor: float, name: str, notes: list[str]
) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor of (H + λ·mean(diag H)·I)⁻¹, raising λ ×retry_factor on failure."""
    mean_diag = torch.mean(torch.diag(H))
    lam = damp
    while True:
        Hd = H.clone()
        Hd.diagonal().add_(lam * mean_diag)
        L, info = torch.linalg.cholesky_ex(Hd)
        if int(info) == 0:
            Hinv = torch.cholesky_inverse(L)
            U, info = torch.linalg.cholesky_ex(Hinv, upper=True)
            if int(info) == 0 and bool(torch.isfinite(U).all()):
                if lam != damp:
                    notes.append(f"Cholesky failed at damp={damp:g}; succeeded with damp={lam:g}")
                return U, lam
        nxt = max(lam * retry_factor, 1e-6 if lam == 0 else 0.0)
        if nxt > max_damp:
            raise CholeskyError(
                f"layer {name or '?'}: the damped Hessian is not positive definite even with damp={lam:g} "
                f"(mean diag H = {float(mean_diag):.3g}); check the calibration data for NaN/inf or pass a larger damp"
            )
        lam = nxt


@torch.no_grad()
def gptq_quantize(
    W: torch.Tensor,
    H: torch.Tensor,
    bits: int,
    group_size: int = -1,
    sym: bool = False,
    act_order: bool = False,
    static_groups: bool = False,
    damp: float = 0.01,
    block_size: int = 128,
    *,
    max_damp: float = 10.0,
    retry_factor: float = 10.0,
    name: str = "",
) -> GPTQResult:
    """GPTQ-quantize ``W`` [out, in] given ``H`` [in, in] (2/n Σ x xᵀ of the layer's inputs).

    Computation runs in ``promote(W.dtype, H.dtype, float32)`` on ``W``'s device (float64 in, float64
    math). Neither input is modified. On a Cholesky failure the damping is multiplied by
    ``retry_factor`` until it works or exceeds ``max_damp`` (then :class:`CholeskyError`); the
    result's ``notes`` say so. ``group_size=-1``: one grid per output row, fitted on the whole W as
    given (dead columns included) before any update, as the reference does.
    """
    t0 = time.perf_counter()
    notes: list[str] = []
    dtype = torch.promote_types(torch.promote_types(W.dtype, H.dtype), torch.float32)
    W = W.detach().to(dtype=dtype, copy=True)
    H = H.detach().to(device=W.device, dtype=dtype, copy=True)
    rows, cols = W.shape
    if H.shape != (cols, cols):
        raise ValueError(f"H must be [{cols}, {cols}] for a weight of shape {tuple(W.shape)}, got {tuple(H.shape)}")
    if not bool(torch.isfinite(H).all()):
        raise CholeskyError(
            f"layer {name or '?'}: the Hessian has NaN/inf entries (calibration activations overflowed?)"
        )
    g = group_size if group_size != -1 else cols

    # per-row grid (the grid of group_size = -1; replaced at group boundaries otherwise), fitted on
    # W as loaded, *before* dead columns are zeroed: the reference calls find_params first
    scale, zero = fit_grid(W, bits, sym)
    dead = torch.diag(H) == 0
    if bool(dead.any()):
        H[dead, dead] = 1
        W[:, dead] = 0
        notes.append(f"{int(dead.sum())} dead input column(s) (H_ii = 0) set to zero")
    static = []
    if static_groups and group_size != -1:
        static = [fit_grid(W[:, i : i + g], bits, sym) for i in range(0, cols, g)]

    perm = None
    if act_order:
        perm = torch.argsort(torch.diag(H), descending=True)
        W = W[:, perm]
        H = H[perm][:, perm]

    U, lam = _inverse_cholesky_upper(H, damp, max_damp, retry_factor, name, notes)
    del H

    Q = torch.zeros_like(W)
    loss = torch.zeros((), dtype=dtype, device=W.device)
    order = perm.tolist() if perm is not None else range(cols)  # original column of each position
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        W1 = W[:, i1:i2].clone()
        E1 = torch.zeros_like(W1)
        U1 = U[i1:i2, i1:i2]
        for i in range(i2 - i1):
            j = i1 + i
            if group_size != -1:
                if static:
                    scale, zero = static[order[j] // g]
                elif j % g == 0:
                    scale, zero = fit_grid(W[:, j : j + g], bits, sym)  # outer W: the reference's quirk
            w = W1[:, i]
            q = quantize_grid(w.unsqueeze(1), scale, zero, bits).flatten()
            Q[:, j] = q
            err = (w - q) / U1[i, i]
            W1[:, i:].sub_(torch.outer(err, U1[i, i:]))
            E1[:, i] = err
        loss += (E1**2).sum() / 2
        W[:, i2:] -= E1 @ U[i1:i2, i2:]

    if perm is not None:
        Q = Q[:, torch.argsort(perm)]
    return GPTQResult(weight=Q, damping=lam, loss=float(loss), seconds=time.perf_counter() - t0, notes=notes)
