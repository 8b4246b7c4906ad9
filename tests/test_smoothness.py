"""Activation smoothness and the gradient-difference step (geometry/operators/smoothness.py).

The oracle for the xIELU window is the activation's analytic second derivative αn·eˣ (x < 0),
written out here, not taken from the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from geometry import HessianOperator
from geometry.operators.difference import relative_step
from geometry.operators.smoothness import C1, NOT_C1, SMOOTH, activation_smoothness, continuous_gradients
from probes.models.families import tiny_model

transformers = pytest.importorskip("transformers")


def _xielu() -> nn.Module:
    from transformers.activations import XIELUActivation

    return XIELUActivation(dtype=torch.float64)


class _Shifted(nn.Module):
    """L(w) = xIELU(w − b): one parameter, its activation input placed by the buffer b."""

    def __init__(self, w: float, b: float):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([w], dtype=torch.float64))
        self.register_buffer("b", torch.tensor([b], dtype=torch.float64))
        self.act = _xielu()

    def forward(self) -> torch.Tensor:
        return self.act(self.w - self.b).sum()


def test_smoothness_orders_of_models():
    assert activation_smoothness(tiny_model("llama", seed=0)) == (SMOOTH, [])
    assert activation_smoothness(tiny_model("apertus", seed=0)) == (C1, ["XIELUActivation"])
    assert activation_smoothness(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), _xielu())) == (NOT_C1, ["ReLU"])
    h = relative_step(torch.float32)
    assert relative_step(torch.float32, order=C1) < h  # the O(ε) kink balances at a smaller step


def test_continuous_gradients_closes_the_clamp_window_and_restores_it_bit_exactly():
    model = nn.Sequential(_xielu(), _xielu())
    before = [m.eps.clone() for m in model]
    with continuous_gradients(model) as changed:
        assert changed == 2 and all(float(m.eps) == 0.0 and m._eps_scalar == 0.0 for m in model)
    assert all(torch.equal(m.eps, b) and m._eps_scalar == -1e-6 for m, b in zip(model, before))
    with pytest.raises(RuntimeError), continuous_gradients(model):
        raise RuntimeError("restored on error too")
    assert all(torch.equal(m.eps, b) for m, b in zip(model, before))


def test_a_perturbed_point_in_the_xielu_clamp_window_does_not_break_the_product():
    """θ + εv puts the activation input at −5e-7, inside HF's clamp window (−1e-6, 0] where the
    derivative is β − αn instead of ≈ β: the plain difference was off by a factor of ~500."""
    h = 1e-3  # ε = h·max(1, |w|)·|v|/(√1·v²) = h for w = 1, v = 1
    model = _Shifted(1.0, 1.0 + h + 5e-7)
    x = float(model.w.detach() - model.b)  # the activation input at θ: −(1e-3 + 5e-7)
    act = model.act
    alpha_n = float(act.beta + nn.functional.softplus(act.alpha_n.detach()))
    exact = alpha_n * math.exp(x)  # d²/dx² of αn·(eˣ − 1 − x) + βx
    op = HessianOperator(model, lambda m, _: m(), [None], params="w", backend="difference", difference_step=h)
    got = float(op.matmat_flat(torch.ones(1, 1, dtype=torch.float64)))
    # the central difference of a smooth f' over [x − ε, x + ε]: αn·(e^{x+ε} − e^{x−ε})/(2ε)
    assert got == pytest.approx(alpha_n * (math.exp(x + h) - math.exp(x - h)) / (2 * h), rel=1e-6)
    assert got == pytest.approx(exact, rel=1e-6)
    assert torch.equal(act.eps, torch.tensor(-1e-6, dtype=torch.float64))  # the model is unchanged after
    reverse = float(
        HessianOperator(model, lambda m, _: m(), [None], params="w").matmat_flat(torch.ones(1, 1, dtype=torch.float64))
    )
    assert reverse == pytest.approx(exact, rel=1e-12)


def test_a_warning_names_non_smooth_activations_as_the_cause():
    from probes.models.curvature import error_warning

    check = {"rel_error": 0.05, "non_smooth_activations": ["ReLU"]}
    warning = error_warning(check, torch.float32)
    assert "not smooth (ReLU)" in warning["cause"] and "--backend reverse" in warning["fix"]
    model = nn.Sequential(nn.Linear(3, 3, dtype=torch.float64), nn.ReLU(), nn.Linear(3, 1, dtype=torch.float64))
    op = HessianOperator(
        model, lambda m, x: m(x).square().mean(), [torch.randn(4, 3, dtype=torch.float64)], backend="difference"
    )
    assert op.checked()["non_smooth_activations"] == ["ReLU"]
