"""Piecewise activations and gradient differences (geometry/operators/smoothness.py, branches.py).

Oracles: the activation's analytic second derivative αn·eˣ (x < 0) for the xIELU window, and the
exact reverse-over-reverse products for frozen branches; neither goes through the difference code.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from losslens.geometry import HessianOperator
from losslens.geometry.operators.branches import FrozenBranches
from losslens.geometry.operators.difference import DifferenceBackend
from losslens.geometry.operators.product_check import product_error
from losslens.geometry.operators.smoothness import NOT_SMOOTH, SMOOTH, activation_smoothness, continuous_gradients
from losslens.lm.models.families import tiny_model

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
    assert activation_smoothness(tiny_model("apertus", seed=0)) == (SMOOTH, [])  # xIELU: frozen
    assert activation_smoothness(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), _xielu())) == (SMOOTH, [])
    assert activation_smoothness(nn.Sequential(nn.Linear(2, 2), nn.Hardswish())) == (NOT_SMOOTH, ["Hardswish"])


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
    op = HessianOperator(model, lambda m, _: m(), [None], params="w", backend=DifferenceBackend(step=h))
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
    from losslens.lm.models.curvature import error_warning

    check = {"rel_error": 0.05, "non_smooth_activations": ["Hardswish"]}
    warning = error_warning(check, torch.float32)
    assert "not smooth (Hardswish)" in warning["cause"] and "--backend reverse" in warning["fix"]
    model = nn.Sequential(nn.Linear(3, 3, dtype=torch.float64), nn.Hardswish(), nn.Linear(3, 1, dtype=torch.float64))
    batches = [torch.randn(4, 3, dtype=torch.float64)]
    op = HessianOperator(model, lambda m, x: m(x).square().mean(), batches, backend="difference")
    assert op.checked()["non_smooth_activations"] == ["Hardswish"]


def _kinked_mlp(act: nn.Module) -> tuple[nn.Module, list[torch.Tensor]]:
    """Linear(4, 16) → act → Linear(16, 1) in float64 with the first row's pre-activations 2–4e-6 from
    the kink at 0 (outside xIELU's clamp window), so that a step of 1e-5 moves some across it."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), act, nn.Linear(16, 1)).double()
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    with torch.no_grad():
        pre = x @ model[0].weight.T  # [6, 16]
        offset = (2 + 2 * torch.rand(16, generator=g, dtype=torch.float64)) * 1e-6
        sign = torch.randint(0, 2, (16,), generator=g).double() * 2 - 1
        model[0].bias.copy_(-pre[0] + sign * offset)
    return model, [x]


@pytest.mark.parametrize("act", [nn.ReLU(), nn.LeakyReLU(0.1), nn.Hardtanh(0.0, 6.0), _xielu()], ids=str)
def test_frozen_branches_make_difference_products_of_a_kinked_model_exact(act, monkeypatch):
    model, batches = _kinked_mlp(act)
    loss = lambda m, x: m(x).square().mean()  # noqa: E731
    exact = HessianOperator(model, loss, batches, params=["0.*", "2.*"])
    frozen = HessianOperator(model, loss, batches, params=["0.*", "2.*"], backend=DifferenceBackend(step=1e-5))
    assert product_error(frozen, exact, 2, seed=0) <= 1e-8
    monkeypatch.setattr(FrozenBranches, "__bool__", lambda self: False)  # the same products, not frozen
    plain = HessianOperator(model, loss, batches, params=["0.*", "2.*"], backend=DifferenceBackend(step=1e-5))
    assert product_error(plain, exact, 2, seed=0) > 1e-3


def test_frozen_branches_are_dropped_after_the_call_and_leave_the_model_as_it_was():
    model, batches = _kinked_mlp(nn.ReLU())
    x = batches[0]
    before, bias = model(x), model[0].bias.detach().clone()
    branches = FrozenBranches(model)
    with branches.active():
        branches.record(0, lambda: model(x))
        assert branches.mask_bytes == x.shape[0] * 16
        with torch.no_grad():
            model[0].bias.add_(1.0)  # moves every pre-activation across the kink ...
        with branches.replay(0):
            replayed = model(x)
        with torch.no_grad():
            model[0].bias.copy_(bias)
        # ... the replayed forward keeps each unit's piece at θ: ReLU units that were off stay off
        mask = (x @ model[0].weight.T + bias) > 0
        expected = model[2](((x @ model[0].weight.T + bias) + 1.0) * mask)
        assert torch.allclose(replayed, expected)
    assert not branches.masks and torch.equal(model(x), before)
    assert not model[1]._forward_hooks
