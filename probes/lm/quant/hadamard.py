"""Randomized Hadamard rotations of linear layers' inputs: the ``had+`` prefix of any weight quantizer.

For a linear y = x Wᵀ with in_features n, take the orthogonal R = D · (I_{n/b} ⊗ H_b) / √b: D a
diagonal of random signs (seeded), H_b the Sylvester–Hadamard matrix of order b, b the **largest
power of two dividing n** (block-diagonal when n is not a power of two; b = n when it is). Since
R Rᵀ = I, y = (x R)(W R)ᵀ: the layer computes the same function with rotated weights W R and an
online rotation x ↦ x R of its input (QuaRot/SpinQuant's online Hadamard). ``had+SPEC`` quantizes
in that basis and rotates back, so the fake-quantized weight is Q(W R) Rᵀ, exactly the function of
the deployed pair (Q(W R), online R) up to float rounding (docs/science.md §3d).

Norm layers: nothing is folded. The rotation is per linear and the activation rotation is applied
at that linear's input, so RMSNorm/LayerNorm weights (and biases, and the residual stream) stay in
the original basis and no norm-weight folding into the next linear is needed. (QuaRot's
residual-stream rotation, which needs the norm scales folded into the following linears first, is a
different, model-wide transformation not done here.)

Refused: in_features odd (b = 1: the "rotation" would only flip signs). Every linear with the same
in_features uses the same R (one seed per spec), so linears that read one input (q/k/v, gate/up)
still share it: calibration-based quantizers (GPTQ, AWQ) see the rotated inputs through the online
rotation hook, which returns the *same* rotated tensor to all readers of one input.

The rotated weight W R is held in the weight's own dtype while SPEC runs (for bfloat16 weights one
extra rounding before Q). A weight shared with another module (tied embeddings) is refused.

Cost: O(n log b) per rotated row (fast Walsh–Hadamard transform), no n×n matrix is formed; memory
one rotated copy of the most recent input per distinct in_features.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn

from losslens.lm.quant.quant_errors import QuantizeError


def hadamard_block(n: int) -> int:
    """The largest power of two dividing ``n`` (the block order b)."""
    return n & -n


def fwht(x: torch.Tensor, b: int) -> torch.Tensor:
    """(I ⊗ H_b) / √b applied to the last dim of ``x`` [..., n] (n a multiple of b; H_b symmetric, H_b² = b·I)."""
    shape = x.shape
    y = x.reshape(-1, shape[-1] // b, b)
    h = 1
    while h < b:
        y = y.reshape(y.shape[0], y.shape[1], b // (2 * h), 2, h)
        y = torch.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), dim=-2)
        h *= 2
    return (y.reshape(shape) / math.sqrt(b)).to(x.dtype)


class Rotation:
    """R = diag(signs) · (I ⊗ H_b)/√b for one input width ``n``; :meth:`apply` is v ↦ v R, :meth:`apply_t` v ↦ v Rᵀ."""

    def __init__(self, n: int, seed: int):
        self.n, self.b = n, hadamard_block(n)
        if self.b < 2:
            raise QuantizeError(
                f"had+ needs an even in_features (a Hadamard block of order >= 2); this layer has {n}. "
                "Exclude it with modules=... or drop the had+ prefix"
            )
        g = torch.Generator().manual_seed(int(seed) * 1_000_003 + n)
        self.signs = torch.randint(0, 2, (n,), generator=g).to(torch.float64) * 2 - 1
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None

    def _s(self, like: torch.Tensor) -> torch.Tensor:
        return self.signs.to(device=like.device, dtype=like.dtype)

    def apply(self, v: torch.Tensor) -> torch.Tensor:
        return fwht(v * self._s(v), self.b)

    def apply_t(self, v: torch.Tensor) -> torch.Tensor:
        return fwht(v, self.b) * self._s(v)

    def online(self, mod, args):
        """Forward pre-hook: the input x ↦ x R (one rotated tensor per input object, shared by its readers)."""
        x = args[0]
        if self._last is None or self._last[0] is not x:
            self._last = (x, self.apply(x))
        return (self._last[1],) + tuple(args[1:])


@contextmanager
def rotated_inputs(model: nn.Module, linears: dict[str, nn.Linear], seed: int = 0):
    """Inside: every linear in ``linears`` holds W R and rotates its input online (same function).

    On exit the hooks go and each weight becomes W' Rᵀ, W' being whatever the linear holds then (its
    quantized W R), so the model is an ordinary model again. Yields {name: note} describing each rotation.
    """
    owners: dict[int, int] = {}
    for mod in model.modules():
        for p in mod.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    tied = [name for name, lin in linears.items() if owners.get(id(lin.weight), 0) > 1]
    if tied:
        raise QuantizeError(
            f"had+ cannot rotate {', '.join(tied)}: the weight is shared with another module (tied "
            "embeddings), which would be rotated too; exclude it with modules=..."
        )
    rotations: dict[int, Rotation] = {}
    for lin in linears.values():
        if lin.in_features not in rotations:
            rotations[lin.in_features] = Rotation(lin.in_features, seed)
    handles, notes = [], {}
    with torch.no_grad():
        for name, lin in linears.items():
            rot = rotations[lin.in_features]
            lin.weight.copy_(rot.apply(lin.weight.to(torch.promote_types(lin.weight.dtype, torch.float32))))
            handles.append(lin.register_forward_pre_hook(rot.online))
            kind = "" if rot.b == rot.n else f", block-diagonal in blocks of {rot.b}"
            notes[name] = f"randomized Hadamard rotation of the {rot.n} input features (seed {seed}{kind})"
    try:
        yield notes
    finally:
        for h in handles:
            h.remove()
        for rot in rotations.values():
            rot._last = None
        with torch.no_grad():
            for lin in linears.values():
                rot = rotations[lin.in_features]
                lin.weight.copy_(rot.apply_t(lin.weight.to(torch.promote_types(lin.weight.dtype, torch.float32))))
