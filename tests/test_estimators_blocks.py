"""block_traces and directional_curvature; estimators run through HessianOperator vs exact dense."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from losslens.geometry.operators.dense import DenseOperator, exact_hessian
from losslens.geometry.estimators.density import spectral_density
from losslens.geometry.estimators.directional import directional_curvature
from losslens.geometry.estimators.eigen import top_eigenvalues
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.base.params import ParamSpace, select_parameters
from losslens.geometry.base.results import BlockTraces, EstimatorError
from losslens.geometry.estimators.blocks import block_traces
from losslens.geometry.estimators.trace import hutchinson_trace, hutchpp_trace


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def tiny_problem(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    g = torch.Generator().manual_seed(seed)
    batches = [
        (torch.randn(16, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (16,), generator=g))
        for _ in range(2)
    ]
    H, space = exact_hessian(model, loss_fn, batches)
    return model, batches, H, space


# ---------------------------------------------------------------------------- block traces
def test_block_traces_sum_to_the_full_hutchinson_estimate():
    _, _, H, space = tiny_problem()
    for groups in ("parameter", "module", {"first": "0.*"}):
        op = DenseOperator(H, space=space)
        res = block_traces(op, groups, num_matvecs=40, seed=3)
        full = hutchinson_trace(DenseOperator(H), num_matvecs=40, seed=3)
        assert sum(res.values.values()) == pytest.approx(res.total.value, rel=1e-12, abs=1e-12)
        assert res.total.value == pytest.approx(full.value, rel=1e-12)
        assert res.total.stderr == pytest.approx(full.stderr, rel=1e-10)
        assert res.num_matvecs == 40 == op.num_matvecs
        assert sum(res.sizes.values()) == space.dim
        assert set(res.values) == set(res.stderr) == set(res.ci_low) == set(res.members)
    assert set(res.values) == {"first", "other"}
    assert res.members["first"] == ("0.weight", "0.bias")
    json.dumps(res.to_dict())
    assert isinstance(res, BlockTraces)


def test_block_traces_estimate_the_diagonal_block_traces():
    _, _, H, space = tiny_problem()
    res = block_traces(DenseOperator(H, space=space), "module", num_matvecs=1500, seed=0)
    for gname, names in res.members.items():
        idx = torch.cat([torch.arange(space.slices[n].start, space.slices[n].stop) for n in names])
        exact = float(torch.trace(H[idx][:, idx]))
        assert abs(res.values[gname] - exact) < 4.5 * res.stderr[gname] + 1e-12, gname


def test_block_traces_needs_a_space():
    with pytest.raises(EstimatorError, match="space"):
        block_traces(DenseOperator(torch.eye(3, dtype=torch.float64)), "parameter")
    _, _, H, space = tiny_problem()
    with pytest.raises(ValueError, match="glob"):
        block_traces(DenseOperator(H, space=space), {"x": "nothing.*"})
    with pytest.raises(EstimatorError, match="num_matvecs"):
        block_traces(DenseOperator(H, space=space), "parameter", num_matvecs=0)


# ------------------------------------------------------------------------------ directional
class Quadratic(DenseOperator):
    """L(θ) = ½ θᵀAθ + bᵀθ at a point θ: exact gradient and Hessian for checking."""

    def __init__(self, A, b, theta, space=None):
        super().__init__(A, space)
        self.b, self.theta = b, theta

    def loss_at(self, th):
        return float(0.5 * th @ self.matrix @ th + self.b @ th)

    def gradient(self):
        return self.loss_at(self.theta), self.matrix @ self.theta + self.b


def test_directional_curvature_is_exact_for_a_quadratic():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(12, 12, generator=g, dtype=torch.float64)
    A = A + A.T
    b, theta, d = (torch.randn(12, generator=g, dtype=torch.float64) for _ in range(3))
    op = Quadratic(A, b, theta)
    res = directional_curvature(op, d)
    assert res.predicted_delta == pytest.approx(op.loss_at(theta + d) - op.loss_at(theta), rel=1e-12)
    assert res.gTd == pytest.approx(float((A @ theta + b) @ d))
    assert res.dHd == pytest.approx(float(d @ A @ d))
    assert res.direction_norm == pytest.approx(float(d.norm()))
    assert res.curvature == pytest.approx(res.dHd / float(d @ d))
    assert res.num_matvecs == 1 == op.num_matvecs and res.num_gradients == 1
    json.dumps(res.to_dict())


def test_directional_curvature_dict_direction_and_errors():
    space = ParamSpace.from_params(
        {"w": torch.zeros(2, 3, dtype=torch.float64), "b": torch.zeros(2, dtype=torch.float64)}
    )
    A = torch.eye(8, dtype=torch.float64) * 3
    op = Quadratic(A, torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64), space=space)
    d = {"w": torch.ones(2, 3, dtype=torch.float64), "b": 2 * torch.ones(2, dtype=torch.float64)}
    res = directional_curvature(op, d)
    assert res.dHd == pytest.approx(3 * (6 + 8)) and res.gTd == 0.0
    with pytest.raises(ValueError, match="keys"):
        directional_curvature(op, {"w": torch.ones(2, 3, dtype=torch.float64)})
    with pytest.raises(EstimatorError, match="gradient"):
        directional_curvature(DenseOperator(A), torch.ones(8, dtype=torch.float64))
    with pytest.raises(EstimatorError, match="shape"):
        directional_curvature(op, torch.ones(7, dtype=torch.float64))
    with pytest.raises(EstimatorError, match="NaN"):
        directional_curvature(op, torch.full((8,), float("nan"), dtype=torch.float64))


# ------------------------------------------------------------------ through HessianOperator
@pytest.fixture(scope="module")
def hessian_pair():
    model, batches, H, space = tiny_problem(seed=1)
    op = HessianOperator(model, loss_fn, batches)
    assert op.space.names == space.names
    return model, batches, H, space, op


def test_estimators_through_hessian_operator_match_dense(hessian_pair):
    model, batches, H, space, op = hessian_pair
    dense = DenseOperator(H, space=space)
    for f in (
        lambda o: hutchinson_trace(o, num_matvecs=20, seed=1).value,
        lambda o: hutchpp_trace(o, num_matvecs=21, seed=1).value,
        lambda o: block_traces(o, "module", num_matvecs=10, seed=2).values["2"],
    ):
        assert f(op) == pytest.approx(f(dense), rel=1e-9)
    n0 = op.num_matvecs
    a, b = top_eigenvalues(op, k=2, tol=1e-8), top_eigenvalues(dense, k=2, tol=1e-8)
    np.testing.assert_allclose(a.values, b.values, rtol=1e-9)
    assert a.num_matvecs == op.num_matvecs - n0
    w = np.linalg.eigvalsh(H.numpy())
    np.testing.assert_allclose(a.values, w[np.argsort(-np.abs(w))][:2], rtol=1e-6)
    sa = spectral_density(op, num_runs=2, num_steps=8, seed=0)
    sd = spectral_density(dense, num_runs=2, num_steps=8, seed=0)
    np.testing.assert_allclose(np.concatenate(sa.nodes), np.concatenate(sd.nodes), rtol=1e-8, atol=1e-10)
    big = hutchpp_trace(op, num_matvecs=space.dim, seed=0)
    assert big.value == pytest.approx(float(torch.trace(H)), rel=1e-8)


def test_directional_curvature_through_hessian_operator(hessian_pair):
    model, batches, H, space, op = hessian_pair
    params = select_parameters(model)
    g = torch.Generator().manual_seed(5)
    d = {n: 1e-3 * torch.randn(p.shape, generator=g, dtype=torch.float64) for n, p in params.items()}
    res = directional_curvature(op, d)
    dflat = space.flatten(d)
    loss = sum(loss_fn(model, b) for b in batches) / len(batches)
    grads = torch.autograd.grad(loss, list(params.values()))
    gflat = torch.cat([x.reshape(-1) for x in grads])
    assert res.loss == pytest.approx(float(loss), rel=1e-12)
    assert res.gTd == pytest.approx(float(gflat @ dflat), rel=1e-9)
    assert res.dHd == pytest.approx(float(dflat @ H @ dflat), rel=1e-9)
    # the second-order prediction matches the measured change to third order in ‖d‖
    with torch.no_grad():
        for n, p in params.items():
            p.add_(d[n])
        new = float(sum(loss_fn(model, b) for b in batches) / len(batches))
        for n, p in params.items():
            p.sub_(d[n])
    actual = new - float(loss)
    assert abs(res.predicted_delta - actual) < 1e-3 * abs(actual) + 1e-12
    assert abs(res.gTd - actual) > abs(res.predicted_delta - actual)
