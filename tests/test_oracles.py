"""Both HVP backends against oracles that use no autograd at all (issue #23, item 4).

- :func:`tests.oracles.mlp_hessian`: the Hessian of a tanh MLP with softmax cross-entropy written
  by hand (closed form, no autograd);
- :class:`losslens.lm.models.oracles.LossOracle`: second differences of the loss (forward passes only),
  Richardson-extrapolated in float64; uᵀHv by polarisation; entries and blocks.

Every seed family (:data:`losslens.lm.models.families.FAMILIES`) is checked in float64 (products and oracle
inside :func:`~losslens.lm.models.oracles.float64_everywhere`, so HF's float32 upcasts are exact) and in
float32 (the model's own products against the float64 oracle), with two seeds each.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from losslens.geometry.operators.dense import exact_hessian
from losslens.geometry.operators.hessian import HessianOperator
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.models.families import FAMILIES, tiny_model
from losslens.lm.models.fd_references import fd_hvp, probe_vectors
from losslens.lm.models.oracles import LossOracle, float64_everywhere
from tests.oracles import mlp_hessian, mlp_parameters

D, HID, C, N = 5, 7, 4, 24


def mlp(seed: int, dtype=torch.float64) -> nn.Sequential:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(D, HID), nn.Tanh(), nn.Linear(HID, C))
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(3.0)  # a larger scale: tanh well into its curved range
    return model.to(dtype)


def mlp_data(seed: int, dtype=torch.float64, batches: int = 2):
    g = torch.Generator().manual_seed(100 + seed)
    return [
        (
            torch.randn(N // batches, D, generator=g, dtype=torch.float64).to(dtype),
            torch.randint(0, C, (N // batches,), generator=g),
        )
        for _ in range(batches)
    ]


def ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def closed_form(model, data):
    X = torch.cat([x for x, _ in data])
    y = torch.cat([t for _, t in data])
    return mlp_hessian(*mlp_parameters(model), X, y)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closed_form_mlp_hessian_against_both_backends(seed):
    H = closed_form(mlp(seed), mlp_data(seed))
    assert float((H - H.T).abs().max()) < 1e-15 * float(H.abs().max()) and float(torch.linalg.eigvalsh(H)[0]) < 0
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-6)):
        model, data = mlp(seed, dtype), mlp_data(seed, dtype)
        eye = torch.eye(H.shape[0], dtype=dtype)
        for backend in ("reverse", "forward"):
            got = HessianOperator(model, ce, data, backend=backend).matmat(eye)
            assert rel(got, H) < tol, (dtype, backend, rel(got, H))
    ex, _ = exact_hessian(mlp(seed), ce, mlp_data(seed))
    assert rel(ex, H) < 1e-12


def test_loss_oracle_equals_the_closed_form_on_a_block():
    model, data = mlp(3), mlp_data(3)
    H = closed_form(model, data)
    idx = [0, 7, 34, 35, 40, 43, 60, 70, 73]  # W1 (0-34), b1 (35-41), W2 (42-69) and b2 (70-73) entries
    orc = LossOracle(model, ce, data, step=0.05, levels=2)
    B, E = orc.block(idx)
    want = H[idx][:, idx]
    assert float((B - want).abs().max()) < 1e-8 * float(want.abs().max())
    assert float(E.max()) < 2e-6 * float(want.abs().max())  # its own error estimate: small, and conservative


def test_loss_oracle_sees_a_wrong_first_derivative_that_fd_of_gradients_cannot():
    # an op whose backward is not the derivative of its forward (identity forward, backward ×1.02,
    # like a masked or rescaled gradient): double backward and gradient differences agree with each
    # other (both differentiate the wrong gradient, 1.02·∇L), loss values do not
    class Rescaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return 1.02 * g

    model, data = mlp(4), mlp_data(4)
    op = HessianOperator(model, lambda m, b: Rescaled.apply(ce(m, b)), data)
    V = probe_vectors(op, 3, seed=0, dtype=torch.float64)
    HV = op.matmat(V)
    assert rel(fd_hvp(op, V, 1e-5), HV) < 1e-6  # the first-order-trusting reference is fooled
    orc = LossOracle.of(op, step=0.05, levels=2)
    for i in range(3):
        q = orc.quadratic(V[i]).value
        assert float(V[i] @ HV[i]) == pytest.approx(1.02 * q, rel=1e-7)  # the loss-only oracle is not


#: Apertus' xIELU is not C² (a kink at x = eps = −1e-6 and a jump of ~1e-6·α_n at 0): a second
#: difference whose segment crosses them is off by ~2e-6·‖Hv‖ at step 0.05, so its step is smaller
STEP = {"apertus": 3e-3}


def _family_case(family: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, 96, (2, 10), generator=g) for _ in range(2)]
    return tiny_model(family, seed=seed, dtype=torch.float64), batches


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("seed", [0, 1])
def test_both_backends_against_the_loss_oracle_on_every_family(family, seed):
    model64, batches = _family_case(family, seed)
    probe = HessianOperator(model64, lm_loss, batches)
    V = probe_vectors(probe, 2, seed=seed, dtype=torch.float64)  # the second lives on embedding rows
    R = torch.randn(2, probe.dim, generator=torch.Generator().manual_seed(7 + seed), dtype=torch.float64)
    with float64_everywhere():
        S = probe.matmat(V)
    S = S / S.norm(dim=1, keepdim=True)  # the products' own directions: uᵀHv ≈ ‖Hv‖
    orc = LossOracle(model64, lm_loss, batches, step=STEP.get(family, 0.05), levels=2)
    refs = [
        [(V[i], orc.quadratic(V[i]))] + [(u[i], orc.bilinear(u[i], V[i])) for u in (S, R / R.norm(dim=1, keepdim=True))]
        for i in range(2)
    ]
    for dtype, tol in ((torch.float64, 1e-7), (torch.float32, 2e-6)):
        model = model64 if dtype == torch.float64 else tiny_model(family, seed=seed, dtype=torch.float32)
        for backend in ("reverse", "forward"):
            op = HessianOperator(model, lm_loss, batches, backend=backend)
            if dtype == torch.float64:
                with float64_everywhere():
                    HV = op.matmat(V)
            else:
                HV = op.matmat(V.float()).double()
            for i in range(2):
                scale = float(HV[i].norm())
                for u, ref in refs[i]:
                    err = abs(float(u @ HV[i]) - ref.value) / scale
                    assert err < tol + 3 * ref.error / scale, (dtype, backend, i, err, ref)
