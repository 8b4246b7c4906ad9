"""How smooth a model's activations are, as the gradient-difference backend needs to know.

Gradient differences assume a smooth loss. Two kinds of activation are not:

* **C¹ only** (the second derivative jumps): xIELU (Apertus; ``αp·x² + βx`` above 0,
  ``αn·(eˣ − 1 − x) + βx`` below: f'' jumps from ``αn`` to ``2αp`` at 0) and ReLU² (0 to 2). A
  central difference whose step moves an activation across the kink is off for that activation by
  ``(f''₊ − f''₋)·(Δ − |x|)/(2Δ)``; the fraction of activations within ``Δ`` of the kink is ∝ the
  step, so the truncation error is O(ε), not O(ε²), and Richardson extrapolation cannot cancel it;
  such a model takes a smaller step (:func:`geometry.operators.difference.relative_step` with
  ``order=1``).
* **Not C¹** (the gradient itself jumps: ReLU, ReLU6, LeakyReLU, Hardtanh, Hardswish, PReLU):
  an activation crossing the kink adds ``(f'₊ − f'₋)/(2ε)`` to the difference, so the error does
  not vanish as ε → 0. The difference backend's measured error (``HessianOperator.checked()``)
  shows it; prefer an exact backend.

HF's xIELU also clamps its negative branch at ``eps = −1e-6`` (``expm1(min(x, eps))``), which makes
its *derivative* jump by ``αn`` on ``(eps, 0]``: a perturbed point that puts one activation in that
window adds ``αn/(2ε)`` to the product (measured on a tiny bfloat16 Apertus: relative error 1.54
instead of 3e-3). :func:`continuous_gradients` sets that clamp to 0 for the products: xIELU is
then C¹, and its value moves by at most ``αn·|eps|`` ≈ 1e-6 per activation, only inside the window.

Detection is by module class (HF registers activations as modules: ``ACT2CLS``); an activation
applied as a plain function is not seen, and the model then counts as smooth.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

__all__ = ["SMOOTH", "C1", "NOT_C1", "activation_smoothness", "continuous_gradients"]

#: Orders of smoothness: every detected activation C² (or none detected), C¹ only, not C¹.
SMOOTH, C1, NOT_C1 = 2, 1, 0

_C1_CLASSES = ("XIELUActivation", "ReLUSquaredActivation")
_NOT_C1_CLASSES = ("ReLU", "ReLU6", "LeakyReLU", "Hardtanh", "Hardswish", "Hardsigmoid", "PReLU", "RReLU")


def activation_smoothness(model: nn.Module) -> tuple[int, list[str]]:
    """``(order, names)``: the lowest smoothness order of ``model``'s activation modules
    (:data:`SMOOTH`, :data:`C1` or :data:`NOT_C1`) and the sorted class names that set it
    (empty when smooth). Cost: one walk over the modules."""
    found: dict[int, set[str]] = {C1: set(), NOT_C1: set()}
    for module in model.modules():
        name = type(module).__name__
        if name in _NOT_C1_CLASSES and type(module).__module__.startswith(("torch.nn", "transformers")):
            found[NOT_C1].add(name)
        elif name in _C1_CLASSES:
            found[C1].add(name)
    for order in (NOT_C1, C1):
        if found[order]:
            return order, sorted(found[order])
    return SMOOTH, []


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
