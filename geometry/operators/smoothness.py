"""Which of a model's activations are not smooth, for the gradient-difference backend.

Gradient differences assume a smooth loss. The piecewise activations that LMs use (ReLU,
LeakyReLU, Hardtanh/ReLU6, ReLU², HF's xIELU) are frozen on their branch at θ during the products
(:mod:`losslens.geometry.operators.branches`), which makes the differenced function smooth with the same
Hessian at θ. The ones it does not cover (Hardswish, Hardsigmoid, PReLU, RReLU: a gradient that
jumps at a kink) are reported by :func:`activation_smoothness`: an input crossing the kink adds
``(f'₊ − f'₋)/(2ε)`` to the product, so the error does not vanish as ε → 0; the measured error
(``HessianOperator.checked()``) shows it, the warning names the activation, and an exact backend
is the fix.

HF's xIELU also clamps its negative branch at ``eps = −1e-6`` (``expm1(min(x, eps))``), which makes
its *derivative* jump by ``αn`` on ``(eps, 0]``: a perturbed point that puts one activation in that
window adds ``αn/(2ε)`` to the product (measured on a tiny bfloat16 Apertus: relative error 1.54
instead of 3e-3). The frozen pieces are evaluated without the clamp; where a module cannot be frozen
(called twice per forward), :func:`continuous_gradients` sets the clamp to 0 for the products: its
value then moves by at most ``αn·|eps|`` ≈ 1e-6 per activation, only inside the window.

Detection is by module class (HF registers activations as modules: ``ACT2CLS``); an activation
applied as a plain function is not seen, and the model then counts as smooth.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

__all__ = ["SMOOTH", "NOT_SMOOTH", "activation_smoothness", "continuous_gradients"]

#: Orders of smoothness: every detected activation smooth (or frozen on its branch), or not.
SMOOTH, NOT_SMOOTH = 2, 0

_NOT_SMOOTH_CLASSES = ("Hardswish", "Hardsigmoid", "PReLU", "RReLU")


def activation_smoothness(model: nn.Module) -> tuple[int, list[str]]:
    """``(order, names)``: :data:`NOT_SMOOTH` and the sorted class names of ``model``'s activation
    modules whose gradient jumps and which :mod:`losslens.geometry.operators.branches` does not freeze, or
    ``(SMOOTH, [])``. Cost: one walk over the modules."""
    found = {
        type(m).__name__
        for m in model.modules()
        if type(m).__name__ in _NOT_SMOOTH_CLASSES and type(m).__module__.startswith("torch.nn")
    }
    return (NOT_SMOOTH, sorted(found)) if found else (SMOOTH, [])


@contextlib.contextmanager
def continuous_gradients(model: nn.Module) -> Iterator[int]:
    """Within the block, xIELU modules' negative-branch clamp ``eps`` is 0 (module docstring): their
    gradient is continuous. Yields the number of modules changed; restores ``eps`` bit-exactly
    (the buffer's values in whatever dtype it holds at entry, and the scalar copy HF keeps)."""
    saved = []
    for module in model.modules():
        eps = getattr(module, "eps", None)
        if type(module).__name__ == "XIELUActivation" and isinstance(eps, torch.Tensor) and bool((eps != 0).any()):
            saved.append((module, eps.detach().clone(), getattr(module, "_eps_scalar", None)))
    try:
        with torch.no_grad():
            for module, _, scalar in saved:
                module.eps.zero_()
                if scalar is not None:
                    module._eps_scalar = 0.0
        yield len(saved)
    finally:
        with torch.no_grad():
            for module, value, scalar in saved:
                module.eps.copy_(value)
                if scalar is not None:
                    module._eps_scalar = scalar
