"""Float64 fidelity: run an HF model's float32 islands in float64, for exact-arithmetic references.

HF code casts to float32 inside a float64 model (RMSNorm and LayerNorm variants normalise in
float32, eager attention takes its softmax in float32), so a "float64" HF model is only float32
accurate. A finite difference of its gradients with a float64-sized step then measures float32
rounding, not the method. Inside :func:`float64_fidelity` every cast of a float64 tensor to
float32 (``.to(torch.float32)``, ``.float()``, ``.type(torch.float32)``) and every
``softmax(..., dtype=torch.float32)`` of a float64 tensor stays in float64; nothing else changes
(float32 and half models are unaffected). Used by the accuracy table of the gradient-difference
backend (benchmarks/difference.py) and its tests.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["float64_fidelity", "FidelityLoss", "with_float64_fidelity"]

_SOFTMAX = {torch.softmax, F.softmax, torch.Tensor.softmax, torch.log_softmax, F.log_softmax, torch.Tensor.log_softmax}


def _f64(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.float64


class _KeepFloat64(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if args and _f64(args[0]):
            if func is torch.Tensor.float:
                return args[0]
            if func in (torch.Tensor.to, torch.Tensor.type):
                rest = [a for a in args[1:] if a is not torch.float32]
                if len(rest) < len(args) - 1 or kwargs.get("dtype") is torch.float32:
                    kwargs.pop("dtype", None)
                    args = (args[0], *rest)
                    if len(args) == 1 and not kwargs:
                        return args[0]
            if func in _SOFTMAX and kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


@contextlib.contextmanager
def float64_fidelity() -> Iterator[None]:
    """Within the block, float64 tensors are never cast to float32 (see the module docstring)."""
    with _KeepFloat64():
        yield


class FidelityLoss:
    """``loss_fn`` run under :func:`float64_fidelity`: the loss of a float64 model computed in
    float64 throughout. The gradient-difference backend needs it: its step is sized for float64
    rounding, and a forward with float32 islands turns that step's quotient into float32 noise
    (measured: 7.5% error on a tiny HF Llama in "float64", 1e-9 with this wrapper)."""

    def __init__(self, loss_fn):
        self.loss_fn = loss_fn
        self.__name__ = getattr(loss_fn, "__name__", "loss_fn")
        if callable(getattr(loss_fn, "batch_weight", None)):  # the batch weights of the loss it wraps
            self.batch_weight = loss_fn.batch_weight

    def __call__(self, model, batch):
        with float64_fidelity():
            return self.loss_fn(model, batch)


def with_float64_fidelity(loss_fn, model: torch.nn.Module):
    """``loss_fn`` wrapped in :class:`FidelityLoss` when ``model`` has float64 parameters, else itself."""
    if any(p.dtype == torch.float64 for p in model.parameters()):
        return FidelityLoss(loss_fn)
    return loss_fn
