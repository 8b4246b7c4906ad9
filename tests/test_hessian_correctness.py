"""Regression tests for wrong Hessian-vector products that earlier versions returned silently.

- ``nn.Embedding(padding_idx=p)`` zeroes the gradient of row p, so autograd's gradient is not the
  derivative of the loss when token p occurs: the forward backend returned P·H·v, the reverse one
  H·P·v (3–1,300× apart on the OLMo/OLMo-2/SmolLM3/Apertus families, whose pad token is a real row).
- a gradient without an autograd graph was taken as a zero Hessian row even when an op's backward
  was not differentiable.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from losslens.geometry.operators.derivatives import padding_modules
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.operators.interface import OperatorError
from losslens.lm.models.families import FAMILIES, tiny_model
from losslens.lm.core.next_token_loss import lm_loss
from tests.fixtures_trajectory import tiny_trajectory  # noqa: F401  (pytest fixture)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def batches_with_pad(model, seed, n=2, shape=(2, 12)):
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    out = [torch.randint(0, vocab, shape, generator=g) for _ in range(n)]
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 1
    out[-1][0, 3] = pad  # the padding row is used by the forward
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forward_and_reverse_backends_agree_with_the_pad_token_present(family, seed):
    model = tiny_model(family, seed=seed, dtype=torch.float64, attn="eager")
    pads_before = _pads(model)
    batches = batches_with_pad(model, seed)
    rev = HessianOperator(model, lm_loss, batches, backend="reverse")
    fwd = HessianOperator(model, lm_loss, batches, backend="forward")
    V = torch.randn(2, rev.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    a, b = rev.matmat(V), fwd.matmat(V)
    assert rel(b, a) < 1e-6
    # symmetric, as a Hessian is: uᵀ(Hv) = vᵀ(Hu)
    assert abs(float(V[0] @ a[1] - V[1] @ a[0])) < 1e-6 * float(a.norm() * V.norm())
    assert _pads(model) == pads_before  # padding_idx is restored after every call


def _pads(model):
    return [m.padding_idx for _, m in padding_modules(model)]


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_llama_tied_and_untied_with_a_padding_row(tie, dtype):
    model = tiny_model("llama", seed=3, dtype=dtype, attn="eager", tie_word_embeddings=tie, pad_token_id=1)
    assert padding_modules(model)
    batches = batches_with_pad(model, 3)
    a = HessianOperator(model, lm_loss, batches).matmat(
        torch.ones(1, sum(p.numel() for p in model.parameters()), dtype=dtype)
    )
    b = HessianOperator(model, lm_loss, batches, backend="forward").matmat(
        torch.ones(1, sum(p.numel() for p in model.parameters()), dtype=dtype)
    )
    assert rel(b, a) < (1e-6 if dtype == torch.float64 else 2e-3)


class _Indexed(nn.Module):
    """Embedding (with a padding row) -> tanh -> linear -> CE, the embedding as an nn.Embedding."""

    def __init__(self, padding_idx):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = nn.Embedding(7, 3, padding_idx=padding_idx).double()
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(7, 3, generator=g, dtype=torch.float64))
        self.out = nn.Linear(3, 7).double()

    def forward(self, ids):
        return self.out(torch.tanh(self.emb(ids)))


def _ce(model, ids):
    logits = model(ids[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, 7), ids[:, 1:].reshape(-1))


def _plain_hessian(model, ids):
    """Independent oracle: the same function written with plain indexing (no padding rule),
    Hessian row by row with double backward."""
    W, A, c = (
        model.emb.weight.detach().clone().requires_grad_(),
        model.out.weight.detach().clone().requires_grad_(),
        model.out.bias.detach().clone().requires_grad_(),
    )
    x = torch.tanh(W[ids[:, :-1]])
    loss = nn.functional.cross_entropy((x @ A.T + c).reshape(-1, 7), ids[:, 1:].reshape(-1))
    ps = [W, A, c]
    g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, ps, create_graph=True)])
    rows = [
        torch.cat([r.reshape(-1) for r in torch.autograd.grad(g[i], ps, retain_graph=True)]) for i in range(g.numel())
    ]
    return torch.stack(rows)


def test_padding_row_curvature_is_the_true_hessian():
    model = _Indexed(padding_idx=2)
    ids = torch.tensor([[0, 2, 5, 2, 1, 6], [3, 4, 2, 0, 6, 1]])
    H = _plain_hessian(model, ids)
    assert torch.allclose(H, H.T, atol=1e-12)
    op = HessianOperator(model, _ce, [ids])
    E = torch.eye(op.dim, dtype=torch.float64)
    for backend in ("reverse", "forward"):
        got = HessianOperator(model, _ce, [ids], backend=backend).matmat(E)
        assert torch.allclose(got, H, atol=1e-10), backend
    _, grad = op.gradient()
    assert float(grad[2 * 3 : 3 * 3].norm()) > 0  # the pad row's true gradient, not zero
    assert model.emb.padding_idx == 2  # restored after the calls


class _SquareNoDoubleGrad(torch.autograd.Function):
    """x² whose backward detaches x: first derivatives right, second derivatives silently zero."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x.detach()


class _Net(nn.Module):
    def __init__(self, broken: bool):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 3).double()
        self.b = nn.Linear(4, 1).double()
        self.broken = broken

    def forward(self, x):
        sq = _SquareNoDoubleGrad.apply(self.a(x)) if self.broken else self.a(x)  # broken: loss quadratic in a
        return sq.sum() + torch.tanh(self.b(x)).sum()


def _sum_loss(model, x):
    return model(x) / x.shape[0]


def test_a_gradient_without_graph_from_a_non_differentiable_backward_raises():
    x = torch.randn(5, 4, dtype=torch.float64)
    op = HessianOperator(_Net(broken=True), _sum_loss, [x])
    with pytest.raises(OperatorError, match=r"a\.weight.*no autograd graph.*not differentiable"):
        op.matvec(torch.ones(op.dim, dtype=torch.float64))


def test_a_loss_linear_in_a_parameter_keeps_its_zero_rows():
    x = torch.randn(5, 4, dtype=torch.float64)
    model = _Net(broken=False)  # linear in a: a genuine zero Hessian block
    op = HessianOperator(model, _sum_loss, [x])
    hv = op.matvec(torch.ones(op.dim, dtype=torch.float64))
    n_a = sum(p.numel() for p in model.a.parameters())
    assert float(hv[:n_a].abs().max()) == 0.0 and float(hv[n_a:].abs().max()) > 0


def test_half_precision_model_gets_float32_estimator_vectors():
    model = tiny_model("gpt_neox", seed=0, dtype=torch.bfloat16)
    batches = batches_with_pad(model, 0)
    assert HessianOperator(model, lm_loss, batches).param_dtype == torch.float32  # the default: float32 compute
    op = HessianOperator(model, lm_loss, batches, compute_dtype="bfloat16")
    assert op.dtype == torch.float32 and op.param_dtype == torch.bfloat16
    out = op.matmat(torch.ones(2, op.dim))
    loss, g = op.gradient()
    assert out.dtype == torch.float32 and g.dtype == torch.float32
    ref = HessianOperator(tiny_model("gpt_neox", seed=0, dtype=torch.float32), lm_loss, batches).matmat(
        torch.ones(2, op.dim)
    )
    assert rel(out, ref) < 0.1


def test_bf16_model_trace_and_lambda_max_within_half_a_percent_of_float32_power_one_percent(tiny_trajectory):
    """Same weights, seed and data: products in bfloat16, estimator algebra in float32."""
    from losslens.geometry.estimators.eigen import top_eigenvalues
    from losslens.geometry.estimators.trace import hutchinson_trace, hutchpp_trace
    from losslens.lm.checkpoints import CheckpointLoader
    from losslens.lm.data import default_token_sets

    ref = tiny_trajectory[-1]
    curv = list(default_token_sets(tiny_trajectory, quick=True)["curvature"])
    ops = {
        dt: HessianOperator(CheckpointLoader(tiny_trajectory, dtype=dt).load(ref), lm_loss, curv, compute_dtype=dt)
        for dt in (torch.float32, torch.bfloat16)
    }
    runs = {
        "hutch++": lambda op: hutchpp_trace(op, num_matvecs=30, seed=1).value,
        "hutchinson": lambda op: hutchinson_trace(op, num_matvecs=30, seed=1).value,
        "power": lambda op: top_eigenvalues(op, method="power", tol=1e-4, max_iter=60, seed=1).values[0],
        "lanczos": lambda op: top_eigenvalues(op, tol=1e-4, max_iter=40, seed=1).values[0],
    }
    # power stops once its residual reaches the round-off floor of bfloat16 products (10·eps·|λ|,
    # _eigen_solvers._breakdown_eps): with transformers 5.25 that is after 9 products, 5.1e-3 off
    bound = {"power": 0.01}
    for name, run in runs.items():
        f32, b16 = run(ops[torch.float32]), run(ops[torch.bfloat16])
        # README's claim; measured 2026-12-07 (transformers 5.25): Hutch++, Hutchinson, Lanczos ≤ 1e-3, power 5.1e-3
        assert f32 > 0 and abs(b16 - f32) <= bound.get(name, 0.005) * abs(f32), (name, f32, b16)
