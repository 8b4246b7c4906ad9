"""The closed-form, chunked linear head + cross-entropy equals autograd's, to float64 rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from losslens.geometry.operators.dense import exact_hessian
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.operators.linear_ce import linear_cross_entropy
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.core.lm_head import lean_head_status, lm_loss_lean
from losslens.lm.models.families import FAMILIES, tiny_model
from tests.tiny_models import micro_gptneox, micro_llama, random_batches


def _problem(seed, bias, T=13, d=5, V=11):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, d, dtype=torch.float64, generator=g).requires_grad_()
    W = torch.randn(V, d, dtype=torch.float64, generator=g).requires_grad_()
    b = torch.randn(V, dtype=torch.float64, generator=g).requires_grad_() if bias else None
    y = torch.randint(0, V, (T,), generator=g)
    return h, W, b, y


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 4, 13])
def test_loss_gradient_and_hvp_equal_autograd(seed, bias, chunk):
    h, W, b, y = _problem(seed, bias)
    ps = [t for t in (h, W, b) if t is not None]
    plain = F.cross_entropy(h @ W.T + (b if bias else 0), y)
    lean = linear_cross_entropy(h, W, y, b, chunk=chunk)
    assert float((lean - plain).abs()) < 1e-14
    ga = torch.autograd.grad(plain, ps, create_graph=True)
    gb = torch.autograd.grad(lean, ps, create_graph=True)
    g = torch.Generator().manual_seed(seed + 10)
    v = [torch.randn(t.shape, dtype=t.dtype, generator=g) for t in ps]
    ha = torch.autograd.grad(ga, ps, grad_outputs=v)
    hb = torch.autograd.grad(gb, ps, grad_outputs=v)
    for x, z in list(zip(ga, gb)) + list(zip(ha, hb)):
        assert torch.allclose(x, z, rtol=1e-12, atol=1e-14)


def test_a_third_derivative_is_refused():
    h, W, b, y = _problem(0, True)
    g = torch.autograd.grad(linear_cross_entropy(h, W, y, b), [h, W], create_graph=True)
    hv = torch.autograd.grad(g, [h, W], grad_outputs=[torch.ones_like(h), torch.ones_like(W)], create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(hv[0].sum(), [h])


@pytest.mark.parametrize("factory", [micro_gptneox, micro_llama])
def test_exact_hessian_of_the_lean_lm_loss_equals_the_plain_one(factory):
    model = factory(seed=3, exact64=False)
    batches = random_batches(n_batches=2, seed=3)
    H_plain, _ = exact_hessian(model, lm_loss, batches)
    H_lean, _ = exact_hessian(model, lm_loss_lean, batches)
    assert lean_head_status(model) == "lean"
    assert float((H_lean - H_plain).abs().max()) <= 1e-13 * float(
        H_plain.abs().max()
    )  # README's claim (measured ~2e-16)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_lean_products_equal_plain_products(family):
    model = tiny_model(family, seed=1, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 96, (2, 12), generator=g) for _ in range(2)]
    a, b = HessianOperator(model, lm_loss, batches), HessianOperator(model, lm_loss_lean, batches)
    V = torch.randn(2, a.dim, dtype=torch.float64, generator=g)
    ha, hb = a.matmat(V), b.matmat(V)
    assert float((ha - hb).norm() / ha.norm()) < 1e-13  # README's claim
    assert lean_head_status(model) == "lean"


def test_a_logit_transform_after_the_head_falls_back_to_the_plain_loss():
    model = tiny_model("llama", seed=2, dtype=torch.float64)
    head = model.get_output_embeddings()
    head.register_forward_hook(lambda _m, _i, out: 30.0 * torch.tanh(out / 30.0))  # soft-capping
    batch = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(2))
    loss = lm_loss_lean(model, batch)  # the lean path would skip the hook: it must refuse
    assert lean_head_status(model).startswith("weight @ trunk(ids) differs")
    assert float((loss - lm_loss(model, batch)).abs()) < 1e-12


def test_half_precision_lean_loss_matches_the_plain_loss():
    model = tiny_model("olmo2", seed=3, dtype=torch.bfloat16)
    batch = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(3))
    assert lm_loss_lean(model, batch).dtype == torch.float32
    assert float(lm_loss_lean(model, batch)) == pytest.approx(float(lm_loss(model, batch)), rel=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_the_head_allocates_no_weight_sized_temporary_beyond_its_gradients(bias):
    """Every allocation of a gradient build and one HVP through the head, tracked op by op: the
    gradients themselves plus at most transient_bytes (the [chunk, vocab] temporaries)."""
    from losslens.geometry.memory.graphs import peak_new_bytes
    from losslens.geometry.operators.linear_ce import transient_bytes

    T, d, V, chunk = 96, 256, 4096, 32
    g = torch.Generator().manual_seed(0)
    h = torch.randn(T, d, generator=g).requires_grad_()
    W = (0.02 * torch.randn(V, d, generator=g)).requires_grad_()
    b = torch.zeros(V).requires_grad_() if bias else None
    y = torch.randint(0, V, (T,), generator=g)
    params = (h, W) + ((b,) if bias else ())
    grads_bytes = sum(p.numel() * 4 for p in params)

    def build():
        return torch.autograd.grad(linear_cross_entropy(h, W, y, b, chunk=chunk), params, create_graph=True)

    grads, built = peak_new_bytes(build)
    vs = [torch.randn_like(p) for p in params]
    _, second = peak_new_bytes(lambda: torch.autograd.grad(grads, params, vs))
    temps = transient_bytes(T, V, torch.float32, chunk=chunk)
    assert built <= grads_bytes + temps + 4 * T * 8  # + the saved log-sum-exps
    assert second <= 2 * grads_bytes + temps  # Hv and the float32 accumulators
