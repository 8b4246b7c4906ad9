"""llama.cpp's GGUF weight types as fake quantizers, with ggml's own rounding rules (docs/science.md §3c).

Each type quantizes a row of a weight [out, in] (ggml's row = one output channel, contiguous over
the input features) in blocks of 32 (legacy types) or 256 (k-quants, :mod:`.ggml_kquants`) and is
dequantized back. The arithmetic follows ggml-quants.c's reference quantizers
(``quantize_row_*_ref``, the path ``llama-quantize`` takes without an importance matrix) operation
by operation in float32, so the result is bit-identical to the ``gguf`` Python package's
``quants.quantize`` → ``quants.dequantize`` (tested, ``tests/test_quant_formats_gguf.py``):

* ``Q4_0``: m = the block element of largest ``|x|`` (the first one on ties), d = m / −8,
  q = min(15, trunc(x/d + 8.5)), x̂ = fp16(d)·(q − 8);
* ``Q4_1``: d = (max − min)/15, q = min(15, trunc((x − min)/d + 0.5)), x̂ = fp16(d)·q + fp16(min);
* ``Q5_0``: as Q4_0 with d = m / −16, q = min(31, trunc(x/d + 16.5)), x̂ = fp16(d)·(q − 16);
* ``Q5_1``: as Q4_1 with d = (max − min)/31, q ≤ 31;
* ``Q8_0``: d = amax/127, q = roundf(x/d) (half away from zero), x̂ = fp16(d)·q.

"x/d" is ``x · (1/d)`` in float32 (ggml multiplies by the float32 inverse of the *unrounded* d;
only the stored scale is fp16). A block with d = 0 quantizes to q = 8/16/0... and dequantizes to
exact zeros (or to fp16(min) for the _1 types, i.e. the constant block).

Rows whose length is not a multiple of the block size cannot be stored in these types;
:func:`gguf_quantize` raises, except for the k-quants, where it applies llama.cpp's own fallback
(``llama-quantize``: Q4_K → Q5_0 for tensors whose rows are not a multiple of 256) and says so.
Cost O(out·in), no data; float64 weights are rounded to float32 first (ggml quantizes float32).
"""

from __future__ import annotations

import torch

from losslens.lm.quant.quant_errors import QuantizeError
from losslens.lm.quant.ggml_kquants import fp16 as _fp16
from losslens.lm.quant.ggml_kquants import q4_k

BLOCK = 32


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """ggml's ``id = d ? 1.0f/d : 0.0f``."""
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / torch.where(d == 0, torch.ones_like(d), d))


def _signed_absmax(x: torch.Tensor) -> torch.Tensor:
    """The element of largest abs(x) per row (its sign kept; the first one on ties), [n, 1]."""
    return torch.gather(x, 1, x.abs().argmax(dim=1, keepdim=True))


def _roundf(v: torch.Tensor) -> torch.Tensor:
    """C ``roundf``: half away from zero, exactly (floor(a) + floor(2·(a − floor a)) has no rounding)."""
    a = v.abs()
    fl = torch.floor(a)
    return torch.sign(v) * (fl + torch.floor(2 * (a - fl))) + 0.0  # + 0.0: an integer has no −0


def q4_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_absmax(x) / -8
    q = torch.clamp(torch.trunc(x * _inverse(d) + 8.5), 0, 15)
    return _fp16(d) * (q - 8)


def q5_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_absmax(x) / -16
    q = torch.clamp(torch.trunc(x * _inverse(d) + 16.5), 0, 31)
    return _fp16(d) * (q - 16)


def _affine(x: torch.Tensor, levels: int) -> torch.Tensor:
    lo = x.amin(dim=1, keepdim=True)
    d = (x.amax(dim=1, keepdim=True) - lo) / levels
    q = torch.clamp(torch.trunc((x - lo) * _inverse(d) + 0.5), 0, levels)
    return _fp16(d) * q + _fp16(lo)


def q4_1(x: torch.Tensor) -> torch.Tensor:
    return _affine(x, 15)


def q5_1(x: torch.Tensor) -> torch.Tensor:
    return _affine(x, 31)


def q8_0(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().amax(dim=1, keepdim=True) / 127
    return _fp16(d) * _roundf(x * _inverse(d))


#: type name → (block size, nominal bits, quantize→dequantize of [n_blocks, block] float32 blocks)
TYPES = {
    "Q4_0": (BLOCK, 4, q4_0),
    "Q4_1": (BLOCK, 4, q4_1),
    "Q5_0": (BLOCK, 5, q5_0),
    "Q5_1": (BLOCK, 5, q5_1),
    "Q8_0": (BLOCK, 8, q8_0),
    "Q4_K": (256, 4, q4_k),
}
#: llama-quantize's fallback for tensors whose rows are not a multiple of a k-quant's 256
FALLBACK = {"Q4_K": "Q5_0"}


def resolve_type(name: str, in_features: int) -> tuple[str, str | None]:
    """(the type actually applied to rows of ``in_features``, a note when it is llama.cpp's fallback).

    Raises:
        QuantizeError: the rows cannot be stored in ``name`` (nor in its fallback).
    """
    block = TYPES[name][0]
    if in_features % block == 0:
        return name, None
    fb = FALLBACK.get(name)
    if fb is not None and in_features % TYPES[fb][0] == 0:
        return fb, (
            f"{name} needs rows that are a multiple of {block}; in_features = {in_features}, so "
            f"llama.cpp's fallback {fb} is applied to this layer (as llama-quantize does)"
        )
    raise QuantizeError(
        f"GGUF type {name} stores rows in blocks of {block}, but this layer has in_features = "
        f"{in_features}; llama.cpp cannot quantize it to {name}. Exclude it with modules=... "
        "or choose another type"
    )


@torch.no_grad()
def gguf_quantize(W: torch.Tensor, type_name: str) -> tuple[torch.Tensor, tuple[str, ...]]:
    """Fake-quantize ``W`` [out, in] to the GGUF type ``type_name`` → (dequantized weight in W's dtype, notes)."""
    applied, note = resolve_type(type_name, W.shape[1])
    block, _, fn = TYPES[applied]
    x = W.detach().to(torch.float32)
    out = fn(x.reshape(-1, block)).reshape(W.shape)
    return out.to(W.dtype), (() if note is None else (note,))
