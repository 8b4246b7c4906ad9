"""GPTQModel's default GPTQ on one layer, and its Hessian accumulation (the ``gptq:…:gptqmodel`` preset).

The reference-exact GPTQ (:mod:`losslens.lm.quant.gptq`) follows IST-DASLab; the GPTQ that GPTQModel
7.7.0 runs with ``QuantizeConfig(bits=B, group_size=G)`` and defaults otherwise differs from it in
the steps below. Each is written from GPTQModel's source (``gptqmodel/quantization/gptq.py``
``GPTQ.quantize`` / ``GPTQ.hessian_inverse`` / ``GPTQ.process_batch``, ``quantization/gar.py``,
``quantization/quantizer.py``, ``looper/gptq_processor.py``; docs/science.md, "GPTQ: the GPTQModel
preset", names the function for each step):

1. everything in float32 (``clone_module`` returns ``W.float()``; H is accumulated in float32);
2. H: per calibration *sequence* x [s, d] (padding removed; losslens' blocks have none),
   X = xᵀx by one ``matmul``, summed in calibration order into one float32 matrix, then multiplied
   in place by 2/n, n = the number of token rows (:class:`SequenceHessian`);
3. per-row grid fitted on W as given, then dead inputs (H_ii = 0): H_ii := 1, W[:, i] := 0 — as the
   reference; the grid (``find_params``, mse 0) is the reference's symmetric/asymmetric min/max grid
   (:func:`losslens.lm.quant.rtn.fit_grid`, bit for bit);
4. order: ``act_group_aware`` (default; :func:`group_aware_order`) or ``desc_act`` (``act``: columns
   by decreasing diag H, ``torch.argsort`` as the reference);
5. damping: λ = 0.05, then 0.06, 0.07, … (repeated float addition of 0.01, λ < 1) until the Cholesky
   factorisation of H + λ·mean(diag H)·I and the upper factor of its inverse both succeed; if none
   does, a diagonal floor 1e-6·max|diag H|·10^k (k = 0..5) is added and the λ walk repeated
   (:func:`gptqmodel_inverse_factor`). GPTQModel bisects the λ list assuming success is monotone
   in λ; this walks it in order, which picks the same λ whenever that assumption holds;
6. blocks of 128 columns with lazy updates, group grid refitted when the (permuted) column index is a
   multiple of g, on the outer W (the reference's rule and quirk), un-permute.

Cost: as :func:`losslens.lm.quant.gptq.gptq_quantize` (one Cholesky + inverse per λ tried, O(out·in²)).
"""

from __future__ import annotations

import math
import time

import torch

from losslens.lm.quant.quant_errors import CholeskyError
from losslens.lm.quant.gptq import GPTQResult
from losslens.lm.quant.rtn import fit_grid, quantize_grid

BLOCK = 128  # GPTQModel's blocksize (GPTQProcessor calls g.quantize() with its default)
DAMP_STEP = 0.01  # QuantizeConfig.damp_auto_increment default for GPTQ
_FLOOR_ATTEMPTS = 6  # hessian_inverse: max_floor_attempts


class SequenceHessian:
    """Forward pre-hook accumulating GPTQModel's H = (2/n) Σ_sequences xᵀx in float32.

    Each call's input [..., s, d] is split into its sequences (the leading dims); each sequence adds
    one float32 ``xᵀx`` [d, d]. ``stop``: raise ``stop_exc`` after accumulating (ends the forward).
    Memory: one [d, d] float32 accumulator plus one [d, d] temporary.
    """

    def __init__(self, in_features: int, device, stop_exc: type[Exception] | None = None):
        self.S = torch.zeros(in_features, in_features, device=device, dtype=torch.float32)
        self.n = 0
        self.stop_exc = stop_exc

    def __call__(self, mod, args):
        x = args[0].detach()
        seqs = x.reshape(-1, x.shape[-2], x.shape[-1]) if x.ndim >= 3 else x.reshape(1, -1, x.shape[-1])
        for seq in seqs:
            m = seq.contiguous().to(torch.float32)
            self.S.add_(torch.matmul(m.T, m))
            self.n += m.shape[0]
        if self.stop_exc is not None:
            raise self.stop_exc

    def hessian(self) -> torch.Tensor:
        """H = S·(2/n) (float32; n = token rows seen)."""
        return self.S.clone().mul_(2.0 / float(max(self.n, 1)))


def group_aware_order(diag: torch.Tensor, group_size: int) -> torch.Tensor:
    """GPTQModel's ``act_group_aware`` column order (GAR): p[new position] = old column.

    The first ⌊in/g⌋·g columns form groups of g consecutive columns; inside each group the columns
    are sorted by decreasing diag H (``torch.sort(descending=True)``, GPTQModel's CPU path), the
    groups are ordered by their largest diag H (stable, descending; ties keep the original group
    order); the tail columns (in mod g) stay in place at the end. Groups therefore stay whole, so
    every quantization group still holds the columns of one original group.
    """
    n = diag.numel()
    groups = n // group_size
    head = groups * group_size
    if groups == 0:
        return torch.arange(n, device=diag.device)
    values, local = torch.sort(diag[:head].view(groups, group_size), dim=1, descending=True)
    order = torch.argsort(values[:, 0], descending=True, stable=True)
    base = (torch.arange(groups, device=diag.device) * group_size).view(groups, 1)
    perm = (local + base)[order].reshape(-1)
    return torch.cat((perm, torch.arange(head, n, device=diag.device)))


def _damp_schedule(damp: float, step: float) -> list[float]:
    """λ = damp, damp + step, … by repeated float addition while it grows and stays < 1."""
    values = [float(damp)]
    while step > 0:
        nxt = values[-1] + step
        if not values[-1] < nxt < 1.0:
            break
        values.append(nxt)
    return values


def gptqmodel_inverse_factor(
    H: torch.Tensor, damp: float, step: float = DAMP_STEP, name: str = "", notes: list[str] | None = None
) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor U of (H + λ·mean(diag)·I)⁻¹ with GPTQModel's λ schedule and floor.

    ``H`` is modified on its diagonal only while trying and restored (to the floored diagonal when a
    floor was needed). Returns (U, λ). Raises :class:`CholeskyError` where GPTQModel would give up
    and fall back to RTN (every λ < 1 at every floor failed).
    """
    notes = notes if notes is not None else []
    diag = H.diagonal()
    orig = diag.clone()
    floor_base = None
    schedule = _damp_schedule(damp, step)
    for attempt in range(_FLOOR_ATTEMPTS + 1):
        if attempt == 0:
            current = orig
        else:
            floor = floor_base * math.pow(10.0, attempt - 1)
            current = torch.clamp(orig + floor, min=floor)
        diag.copy_(current)
        mean = torch.mean(current)
        for lam in schedule:
            diag.add_(lam * mean)
            L, info = torch.linalg.cholesky_ex(H, check_errors=False)
            diag.copy_(current)
            if int(info.item()) != 0:
                continue
            try:
                torch.cholesky_inverse(L, out=L)
                U = torch.linalg.cholesky(L, upper=True)
            except torch.linalg.LinAlgError:
                continue
            if lam != damp or attempt:
                notes.append(
                    f"gptqmodel damping: Cholesky failed at damp={damp:g}; used damp={lam:g}"
                    + (f" with a diagonal floor of {floor:.3g}" if attempt else "")
                )
            return U, lam
        if attempt == 0:
            top = torch.max(orig.abs()).item()
            floor_base = (top if math.isfinite(top) and top != 0.0 else 1.0) * 1e-6
    raise CholeskyError(
        f"layer {name or '?'}: the damped Hessian stayed non positive-definite for every damp in "
        f"[{damp:g}, 1) and every diagonal floor (GPTQModel would fall back to RTN here); check the "
        "calibration data for NaN/inf"
    )


@torch.no_grad()
def gptqmodel_quantize(
    W: torch.Tensor,
    H: torch.Tensor,
    bits: int,
    group_size: int = 128,
    sym: bool = True,
    desc_act: bool = False,
    damp: float = 0.05,
    *,
    damp_step: float = DAMP_STEP,
    name: str = "",
) -> GPTQResult:
    """GPTQModel's default GPTQ of ``W`` [out, in] given ``H`` [in, in] (module docstring, steps 1, 3–6).

    Float32 throughout; the result is in ``W``'s dtype. ``desc_act`` replaces the group-aware order
    by plain act-order (GPTQModel turns ``act_group_aware`` off then); ``group_size = -1`` needs
    ``desc_act`` (GPTQModel refuses group-aware order without groups). Neither input is modified.
    """
    t0 = time.perf_counter()
    notes: list[str] = []
    W = W.detach().to(dtype=torch.float32, copy=True)
    H = H.detach().to(device=W.device, dtype=torch.float32, copy=True)
    cols = W.shape[1]
    if H.shape != (cols, cols):
        raise ValueError(f"H must be [{cols}, {cols}] for a weight of shape {tuple(W.shape)}, got {tuple(H.shape)}")
    if group_size == -1 and not desc_act:
        raise ValueError("group-aware reordering needs group_size > 0 (or desc_act=True)")
    if not bool(torch.isfinite(H).all()):
        raise CholeskyError(
            f"layer {name or '?'}: the Hessian has NaN/inf entries (calibration activations overflowed?)"
        )
    scale, zero = fit_grid(W, bits, sym)  # find_params(W) before the dead columns are zeroed
    dead = torch.diagonal(H) == 0
    H.diagonal().masked_fill_(dead, 1.0)
    W.masked_fill_(dead.unsqueeze(0), 0.0)
    if bool(dead.any()):
        notes.append(f"{int(dead.sum())} dead input column(s) (H_ii = 0) set to zero")
    if desc_act:
        perm = torch.argsort(torch.diag(H), descending=True)
    else:
        perm = group_aware_order(torch.diag(H), group_size)
    W = W[:, perm]
    H = H[perm][:, perm]
    U, lam = gptqmodel_inverse_factor(H, damp, damp_step, name, notes)
    del H

    Q = torch.zeros_like(W)
    loss = torch.zeros((), dtype=torch.float32, device=W.device)
    for i1 in range(0, cols, BLOCK):
        i2 = min(i1 + BLOCK, cols)
        W1 = W[:, i1:i2].clone()
        E1 = torch.empty_like(W1)
        U1 = U[i1:i2, i1:i2]
        for i in range(i2 - i1):
            j = i1 + i
            if group_size != -1 and j % group_size == 0:
                scale, zero = fit_grid(W[:, j : j + group_size], bits, sym)  # outer W, as GPTQModel
            w = W1[:, i]
            q = quantize_grid(w.unsqueeze(1), scale, zero, bits).flatten()
            Q[:, j] = q
            d = U1[i, i]
            delta = E1[:, i]
            torch.sub(w, q, out=delta)
            loss += (delta.square() / d.square()).sum() / 2
            delta.div_(d)
            W1[:, i:] -= delta.unsqueeze(1) * U1[i, i:]
        W[:, i2:] -= E1.matmul(U[i1:i2, i2:])
    Q = Q[:, torch.argsort(perm)]
    return GPTQResult(weight=Q, damping=lam, loss=float(loss), seconds=time.perf_counter() - t0, notes=notes)
