"""HessianOperator: state restored after calls, attention handled, bad input rejected, determinism."""

from __future__ import annotations


import pytest
import torch

from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.operators.reverse import ReverseBackend
from losslens.geometry.operators.interface import OperatorError
from losslens.geometry.base.params import ParameterSelectionError
from tests.tiny_models import lm_loss, micro_gptneox, micro_llama, mlp_batches, mlp_loss, random_batches, tiny_mlp


def rel(a, b):
    return float((a - b).norm() / b.norm())


def _vecs(op, k, seed=0):
    return torch.randn(k, op.dim, generator=torch.Generator().manual_seed(seed), dtype=op.dtype)


@pytest.mark.parametrize("backend", ["reverse", "forward"])
def test_state_restored_params_grads_modes_flags(backend):
    model = micro_gptneox(3, dropout=0.3, layers=1)
    batches = random_batches(sizes=[2, 3], seq=6, seed=4)
    names = [n for n, _ in model.named_parameters()]
    named = dict(model.named_parameters())
    named[names[0]].requires_grad_(False)  # a frozen embedding: not selected, flag kept
    for i, n in enumerate(names[1:]):  # pre-existing grads on some parameters, None on others
        if i % 2 == 0:
            named[n].grad = torch.full_like(named[n], 0.5)
    grads_before = {n: named[n].grad for n in names}
    grad_values = {n: None if g is None else g.clone() for n, g in grads_before.items()}
    params_before = {n: p.detach().clone() for n, p in named.items()}
    model.train()
    model.gpt_neox.layers[0].eval()  # a mixed mode that must come back exactly
    modes = {n: m.training for n, m in model.named_modules()}

    op = HessianOperator(model, lm_loss, batches, backend=backend)
    assert names[0] not in op.space.names
    V = _vecs(op, 3)
    out = op.matmat(V)
    op.matvec(op.space.unflatten(V[0]))
    op.gradient()

    assert {n: m.training for n, m in model.named_modules()} == modes
    assert not named[names[0]].requires_grad and all(named[n].requires_grad for n in names[1:])
    for n in names:
        assert torch.equal(named[n].detach(), params_before[n])
        assert named[n].grad is grads_before[n]
        if grads_before[n] is not None:
            assert torch.equal(named[n].grad, grad_values[n]) and named[n].grad.grad_fn is None
    # dropout was off during the call: the product is the eval-mode one (itself checked against the
    # exact Hessian in test_hessian_operator.py), not a random dropout mask's
    model.eval()
    assert rel(out, op.matmat(V)) < 1e-12
    model.train()


def test_attention_modes_handled_automatically():
    """SDPA (no double-backward in its fused kernels) and HF's own eager code work without any context."""
    batches = random_batches(sizes=[2], seq=6, seed=5)
    eager = micro_gptneox(4)
    sdpa = micro_gptneox(4, attn="sdpa")
    V = None
    outs = []
    for m in (eager, sdpa):
        for backend in ("reverse", "forward"):
            op = HessianOperator(m, lm_loss, batches, backend=backend)
            V = _vecs(op, 2) if V is None else V
            outs.append(op.matmat(V))
    assert all(rel(o, outs[0]) < 1e-12 for o in outs[1:])
    # HF's own code paths (float32 softmax / RMSNorm casts) on float32 models
    for factory in (micro_gptneox, micro_llama):
        for attn in ("eager", "sdpa"):
            m32 = factory(4, dtype=torch.float32, attn=attn)
            m64 = factory(4)
            op32 = HessianOperator(m32, lm_loss, batches)
            op64 = HessianOperator(m64, lm_loss, batches)
            W = _vecs(op64, 2, seed=1)
            assert op32.matmat(W.float()).dtype == torch.float32
            assert rel(op32.matmat(W.float()).double(), op64.matmat(W)) < 1e-4


def test_works_under_no_grad_and_is_deterministic():
    model = micro_llama(5)
    batches = random_batches(sizes=[2, 2], seq=5, seed=6)
    for cfg in (
        dict(backend=ReverseBackend(vectorize=True)),
        dict(backend=ReverseBackend(vectorize=False)),
        dict(backend="forward"),
    ):
        op = HessianOperator(model, lm_loss, batches, **cfg)
        V = _vecs(op, 3, seed=2)
        with torch.no_grad():
            a = op.matmat(V)
        b = op.matmat(V.clone())
        assert torch.equal(a, b)
        assert torch.equal(HessianOperator(micro_llama(5), lm_loss, batches, **cfg).matmat(V), a)


def test_unused_and_linear_parameters_have_zero_rows():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2).double()
            self.unused = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
            self.shift = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))  # loss is linear in it

    m = M()
    x = torch.randn(4, 3, dtype=torch.float64)

    def loss(model, batch):
        return (model.lin(batch) ** 2).mean() + model.shift.sum()

    for backend in ("reverse", "forward"):
        op = HessianOperator(m, loss, [x], backend=backend)
        V = _vecs(op, 2)
        out = op.space.unflatten(op.matmat(V))
        assert torch.equal(out["unused"], torch.zeros(2, 2, dtype=torch.float64))
        assert torch.equal(out["shift"], torch.zeros(2, 2, dtype=torch.float64))
        assert out["lin.weight"].abs().sum() > 0


# ---------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def mlp_setup():
    return tiny_mlp(1), mlp_batches(2, 6, seed=2)


def test_bad_vectors(mlp_setup):
    model, batches = mlp_setup
    op = HessianOperator(model, mlp_loss, batches)
    v = op.space.unflatten(torch.zeros(op.dim, dtype=torch.float64))
    with pytest.raises(ParameterSelectionError, match="missing"):
        op.matvec({n: t for n, t in list(v.items())[1:]})
    with pytest.raises(ParameterSelectionError, match="unexpected"):
        op.matvec({**v, "nope": torch.zeros(1)})
    bad = dict(v)
    bad[op.space.names[0]] = torch.zeros(2, 2, dtype=torch.float64)
    with pytest.raises(ParameterSelectionError, match="shape"):
        op.matvec(bad)
    with pytest.raises(ParameterSelectionError, match="k"):  # batched dict without a leading k
        op.matmat(v)
    with pytest.raises(OperatorError, match="length"):
        op.matvec(torch.zeros(op.dim + 1, dtype=torch.float64))
    with pytest.raises(OperatorError, match="k = 0"):
        op.matmat(torch.zeros(0, op.dim, dtype=torch.float64))
    with pytest.raises(OperatorError, match="k = 0"):
        op.matmat({n: torch.zeros(0, *s, dtype=torch.float64) for n, s in zip(op.space.names, op.space.shapes)})
    with pytest.raises(OperatorError, match="dict of tensors"):
        op.matvec([1.0, 2.0])
    assert op.num_matvecs == 0


def test_bad_construction(mlp_setup):
    model, batches = mlp_setup
    with pytest.raises(ParameterSelectionError, match="nothing_like_this"):
        HessianOperator(model, mlp_loss, batches, params="nothing_like_this.*")
    with pytest.raises(OperatorError, match="empty"):
        HessianOperator(model, mlp_loss, [])
    with pytest.raises(OperatorError, match="weights"):
        HessianOperator(model, mlp_loss, batches, weights=[1.0])
    with pytest.raises(OperatorError, match="non-negative"):
        HessianOperator(model, mlp_loss, batches, weights=[1.0, -1.0])
    with pytest.raises(OperatorError, match="backend"):
        HessianOperator(model, mlp_loss, batches, backend="sideways")
    with pytest.raises(OperatorError, match="chunk_size"):
        HessianOperator(model, mlp_loss, batches, chunk_size=0)


@pytest.mark.parametrize("backend", ["reverse", "forward"])
def test_bad_losses(mlp_setup, backend):
    model, batches = mlp_setup

    def per_example(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1], reduction="none")

    def nan_loss(m, b):
        return mlp_loss(m, b) * float("nan")

    def inf_curvature(m, b):  # finite loss and gradient, infinite second derivative at 0
        return mlp_loss(m, b) + (m[0].bias * 0).abs().pow(1.5).sum()

    V = torch.ones(1, sum(p.numel() for p in model.parameters()), dtype=torch.float64)
    with pytest.raises(OperatorError, match="scalar"):
        HessianOperator(model, per_example, batches, backend=backend).matmat(V)
    with pytest.raises(OperatorError, match="loss is nan"):
        HessianOperator(model, nan_loss, batches, backend=backend).matmat(V)
    with pytest.raises(OperatorError, match="NaN/Inf"):
        HessianOperator(model, inf_curvature, batches, backend=backend).matmat(V)
    if backend == "reverse":
        with pytest.raises(OperatorError, match="no autograd graph"):
            HessianOperator(model, lambda m, b: mlp_loss(m, b).detach(), batches).matmat(V)
        with pytest.raises(OperatorError, match="loss is nan"):
            HessianOperator(model, nan_loss, batches).gradient()
    assert model[0].weight.grad is None and not model.training


def test_constructor_takes_the_operator_settings_and_backends_their_own():
    """``HessianOperator`` takes at most 12 parameters (issue #46): a backend's settings are given on
    its object, and a name gives its defaults."""
    import inspect

    from losslens.geometry.operators.difference import DEFAULT_TOLERANCE, DifferenceBackend

    assert len(inspect.signature(HessianOperator).parameters) <= 12
    model, batches = tiny_mlp(), mlp_batches()
    named = HessianOperator(model, mlp_loss, batches, backend="difference")
    given = HessianOperator(model, mlp_loss, batches, backend=DifferenceBackend(step=1e-3, tolerance=0.5))
    assert named.error_tolerance == DEFAULT_TOLERANCE and given.error_tolerance == 0.5
    assert given.product_backend.step(given) == 1e-3 and named.product_backend.step(named) != 1e-3
