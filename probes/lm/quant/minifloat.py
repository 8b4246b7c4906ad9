"""Small floating-point element formats (FP8 E4M3/E5M2, FP4 E2M1) and the ``fp8`` weight quantizer.

A :class:`Minifloat` is defined by its exponent bits, mantissa bits, bias and largest finite value
(docs/science.md §3b). :func:`round_minifloat` maps real values onto its grid with IEEE
round-to-nearest, **ties to even** (the OCP 8-bit FP / MX v1.0 conversion rule and torch's
``float8_*`` casts), subnormals included, and **saturates** values beyond the largest finite value
to ±max (the OCP MX rule for FP4/FP6 and the "saturating" mode for FP8; torch's cast would give
NaN/inf there, which only matters for inputs outside the grid, never for scaled weights below).

Formats (value = (−1)^s · 2^(e − bias) · 1.m, subnormal 2^(1 − bias) · 0.m):

======  ====  ====  ====  ==========  =================================================
name    e     m     bias  max         note
======  ====  ====  ====  ==========  =================================================
e4m3    4     3     7     448         OCP E4M3 = torch.float8_e4m3fn (no inf; S.1111.111 NaN)
e5m2    5     2     15    57344       OCP E5M2 = torch.float8_e5m2 (IEEE-like, has inf)
e2m1    2     1     1     6           OCP FP4: 0, 0.5, 1, 1.5, 2, 3, 4, 6 (no inf/NaN)
======  ====  ====  ====  ==========  =================================================

``fp8_quantize``: ŵ = s · E(w / s) with s = amax / max_E (float32, per output channel or per
tensor), the usual FP8 weight recipe (the scale is kept in float32, not quantized). An all-zero
channel (s = 0) is left exact. Cost O(out·in), no data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Minifloat:
    """A sign + ``exp_bits`` + ``man_bits`` floating-point format with ``bias`` and largest finite ``max_value``."""

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    max_value: float

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (subnormals share its quantum 2^(emin − man_bits))."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number, floor(log2 max) (the OCP MX ``emax_elem``)."""
        return math.floor(math.log2(self.max_value))


E4M3 = Minifloat("e4m3", 4, 3, 7, 448.0)
E5M2 = Minifloat("e5m2", 5, 2, 15, 57344.0)
E2M1 = Minifloat("e2m1", 2, 1, 1, 6.0)
FORMATS = {f.name: f for f in (E4M3, E5M2, E2M1)}


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype formats compute in: at least float32 (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


def round_minifloat(x: torch.Tensor, fmt: Minifloat) -> torch.Tensor:
    """``x`` rounded to the nearest value of ``fmt`` (ties to even, saturating at ±max), same dtype.

    Exact in float32/float64 for the formats above: the quantum 2^(e − m) of ``|x|``'s binade is a
    power of two, so ``|x| / quantum`` is exact and ``torch.round`` (half to even) does the rounding.
    NaN stays NaN; ±inf saturates. Zero keeps its sign.
    """
    a = x.abs()
    _, e = torch.frexp(a)  # a = f · 2^e, f in [0.5, 1): floor(log2 a) = e − 1
    e = torch.clamp(e - 1, min=fmt.emin)
    quantum = torch.ldexp(torch.ones_like(a), e - fmt.man_bits)
    q = torch.clamp(torch.round(a / quantum) * quantum, max=fmt.max_value)
    return torch.copysign(q, x)


@torch.no_grad()
def fp8_quantize(W: torch.Tensor, fmt: Minifloat = E4M3, per_channel: bool = True) -> torch.Tensor:
    """FP8 fake quantization of ``W`` [out, in] with a float32 scale per output channel (or per tensor).

    Returns ŵ = s · round(w / s) in ``W``'s dtype, s = amax / ``fmt.max_value``.
    """
    work = W.detach().to(work_dtype(W.dtype))
    amax = work.abs().amax(dim=1, keepdim=True) if per_channel else work.abs().amax().reshape(1, 1)
    s = amax / fmt.max_value
    safe = torch.where(s == 0, torch.ones_like(s), s)
    q = round_minifloat(work / safe, fmt) * safe
    return torch.where(s == 0, work, q).to(W.dtype)
