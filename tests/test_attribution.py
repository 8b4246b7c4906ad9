"""losslens.geometry.estimators.attribution: the factorisation ½dᵀHd = ½‖d‖²(tr H/n)κ and per-block parts, against exact
Hessians."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from losslens.geometry.estimators.attribution import (
    attribute,
    direction_parts,
    factorise,
    group_parts,
    within_block_curvature,
)
from losslens.geometry.operators.dense import DenseOperator, exact_hessian
from losslens.geometry.estimators.directional import directional_curvature
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.base.results import EstimatorError, TraceEstimate
from tests.tiny_models import lm_loss, micro_gptneox, mlp_batches, mlp_loss, random_batches, tiny_mlp


class Quadratic(nn.Module):
    """L(θ) = ½ θᵀAθ + bᵀθ + c over θ = (a [3, 2], w [6]): an exact quadratic (dim 12)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = nn.Parameter(torch.randn(3, 2, generator=g, dtype=torch.float64))
        self.w = nn.Parameter(torch.randn(6, generator=g, dtype=torch.float64))
        M = torch.randn(12, 12, generator=g, dtype=torch.float64)
        self.register_buffer("A", M @ M.T / 12 + torch.diag(torch.linspace(0.1, 3.0, 12, dtype=torch.float64)))
        self.register_buffer("b", torch.randn(12, generator=g, dtype=torch.float64))

    def theta(self) -> torch.Tensor:
        return torch.cat([self.a.reshape(-1), self.w])


def quad_loss(model: Quadratic, batch) -> torch.Tensor:
    t = model.theta()
    return 0.5 * t @ model.A @ t + model.b @ t + 1.5


def _dense_parts(H, space, d, groups):
    Hd = H @ d
    members = space.groups(groups)
    out = {}
    for gname, names in members.items():
        idx = torch.cat([torch.arange(space.slices[n].start, space.slices[n].stop) for n in names])
        out[gname] = (float(d[idx] @ Hd[idx]), float(d[idx] @ H[idx][:, idx] @ d[idx]))
    return out


def test_exact_quadratic_prediction_equals_actual_and_kappa_is_dense():
    model = Quadratic()
    op = HessianOperator(model, quad_loss, [torch.zeros(1)])
    g = torch.Generator().manual_seed(1)
    d = torch.randn(12, generator=g, dtype=torch.float64) * 0.7
    base = float(quad_loss(model, None).detach())
    with torch.no_grad():
        moved = Quadratic()
        moved.a.add_(d[:6].reshape(3, 2))
        moved.w.add_(d[6:])
    actual = float(quad_loss(moved, None).detach()) - base
    res = attribute(op, d, groups="parameter", trace_matvecs=12, actual=actual, within=True)
    f = res.factors
    assert f.trace_method == "exact" and f.trace == pytest.approx(float(torch.trace(model.A)), rel=1e-12)
    assert f.predicted == pytest.approx(actual, rel=1e-12) and abs(f.remainder) < 1e-12 * abs(actual)
    assert f.dHd == pytest.approx(float(d @ model.A @ d), rel=1e-12)
    kappa = float(d @ model.A @ d) / float(d @ d) / (float(torch.trace(model.A)) / 12)
    assert f.kappa == pytest.approx(kappa, rel=1e-12) and f.kappa_ci_low == f.kappa_ci_high == f.kappa
    assert f.product == pytest.approx(f.quadratic, rel=1e-12)
    for gname, (part, own) in _dense_parts(model.A, op.space, d, "parameter").items():
        assert res.dHd[gname] == pytest.approx(part, rel=1e-12) and res.within[gname] == pytest.approx(own, rel=1e-12)
    assert res.num_matvecs == 1 + 2 + 12  # direction, one per block, exact trace
    json.dumps(res.to_dict())


@pytest.mark.parametrize("family", ["mlp", "gptneox"])
def test_blocks_and_kappa_equal_their_dense_values(family):
    if family == "mlp":
        model, batches, loss_fn, groups = tiny_mlp(seed=2), mlp_batches(2, 8, seed=2), mlp_loss, "module"
    else:
        model = micro_gptneox(seed=3)
        batches, loss_fn = random_batches(n_batches=2, batch=2, seq=6, seed=3), lm_loss
        groups = {"layer0": "gpt_neox.layers.0.*", "layer1": "gpt_neox.layers.1.*"}  # + "other"
    H, space = exact_hessian(model, loss_fn, batches)
    op = HessianOperator(model, loss_fn, batches)
    g = torch.Generator().manual_seed(5)
    d = torch.randn(space.dim, generator=g, dtype=torch.float64) * 0.05
    trace = float(torch.trace(H))
    res = attribute(op, d, groups=groups, trace=trace, within=True)
    dense = _dense_parts(H, space, d, groups)
    assert set(res.groups) == set(dense)
    for gname, (part, own) in dense.items():
        assert res.dHd[gname] == pytest.approx(part, rel=1e-9, abs=1e-12)
        assert res.within[gname] == pytest.approx(own, rel=1e-9, abs=1e-12)
    dHd = float(d @ H @ d)
    # the block parts sum to the total to float precision, and the total is the dense dᵀHd
    assert math.fsum(res.dHd.values()) == pytest.approx(res.factors.dHd, rel=1e-14, abs=1e-15)
    assert res.factors.dHd == pytest.approx(dHd, rel=1e-9)
    assert res.cross == pytest.approx(dHd - sum(own for _, own in dense.values()), rel=1e-8, abs=1e-12)
    kappa = dHd / float(d @ d) / (trace / space.dim)
    assert res.factors.kappa == pytest.approx(kappa, rel=1e-9)
    dc = directional_curvature(HessianOperator(model, loss_fn, batches), d)
    assert res.factors.gTd == pytest.approx(dc.gTd, rel=1e-12) and res.factors.dHd == pytest.approx(dc.dHd, rel=1e-12)
    assert math.fsum(res.gTd.values()) == pytest.approx(dc.gTd, rel=1e-12)
    assert math.fsum(res.norm2.values()) == pytest.approx(float(d @ d), rel=1e-12)
    assert res.factors.actual != res.factors.actual  # not measured: nan, and so is the remainder
    assert math.isnan(res.factors.remainder)


def test_estimated_trace_interval_propagates_into_kappa():
    model = tiny_mlp(seed=1)
    batches = mlp_batches(1, 16, seed=1)
    op = HessianOperator(model, mlp_loss, batches)
    d = {n: 0.01 * torch.ones_like(p) for n, p in model.named_parameters()}
    res = attribute(op, d, groups="module", trace_matvecs=30, seed=4)
    f, t = res.factors, res.trace
    assert t is not None and t.method == "hutch++" and t.num_matvecs == 30 and res.num_matvecs == 31
    assert (f.trace, f.trace_stderr, f.trace_ci_low, f.trace_ci_high) == (t.value, t.stderr, t.ci_low, t.ci_high)
    assert f.trace_per_param_ci_low == pytest.approx(t.ci_low / op.dim)
    assert t.ci_low > 0
    assert f.kappa_ci_low == pytest.approx(f.rayleigh * op.dim / t.ci_high)
    assert f.kappa_ci_high == pytest.approx(f.rayleigh * op.dim / t.ci_low)
    assert f.kappa_ci_low < f.kappa < f.kappa_ci_high
    assert f.kappa_stderr == pytest.approx(abs(f.kappa) * t.stderr / t.value)


def test_factorise_arithmetic_and_refusals():
    est = TraceEstimate(value=50.0, stderr=10.0, ci_low=-5.0, ci_high=105.0, num_matvecs=10, seconds=0.0, seed=0)
    f = factorise(gTd=-0.1, dHd=2.0, norm2=4.0, trace=est, dim=100, actual=0.95)
    assert f.rayleigh == 0.5 and f.trace_per_param == 0.5 and f.kappa == pytest.approx(1.0)
    assert (f.kappa_ci_low, f.kappa_ci_high) == (-math.inf, math.inf)  # the trace's interval reaches 0
    assert f.predicted == pytest.approx(0.9) and f.remainder == pytest.approx(0.05)
    assert f.product == pytest.approx(f.quadratic)
    with pytest.raises(EstimatorError, match="direction is zero"):
        factorise(0.0, 0.0, 0.0, 10.0, 5)
    with pytest.raises(EstimatorError, match="tr H = 0"):
        factorise(0.0, 1.0, 1.0, 0.0, 5)
    with pytest.raises(EstimatorError, match="not finite"):
        factorise(0.0, math.nan, 1.0, 1.0, 5)


def test_group_parts_refuse_groups_that_do_not_partition():
    model = tiny_mlp(seed=0)
    op = HessianOperator(model, mlp_loss, mlp_batches(1, 8))
    parts = direction_parts(op, {n: torch.ones_like(p) for n, p in model.named_parameters()})
    assert parts.num_matvecs == 1 and parts.num_gradients == 1 and len(parts.names) == len(list(model.parameters()))
    with pytest.raises(EstimatorError, match="leave out"):
        group_parts(parts, {"first": ["0.weight"]})
    with pytest.raises(EstimatorError, match="partition"):
        group_parts(parts, {"a": list(parts.names), "b": ["0.weight"]})
    with pytest.raises(EstimatorError, match="gradient"):
        direction_parts(DenseOperator(torch.eye(3)), torch.ones(3))
    with pytest.raises(EstimatorError, match="parameter space"):
        within_block_curvature(DenseOperator(torch.eye(3)), torch.ones(3), "module")


def test_within_blocks_of_a_dense_operator_with_a_space():
    model = nn.Sequential(nn.Linear(3, 2), nn.Tanh(), nn.Linear(2, 2)).double()
    H, space = exact_hessian(
        model,
        lambda m, b: F.cross_entropy(m(b[0]), b[1]),
        [(torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 2, (8,)))],
    )
    d = torch.linspace(-1, 1, space.dim, dtype=torch.float64)
    within, spent = within_block_curvature(DenseOperator(H, space), d, "parameter", max_memory="1GB")
    assert spent == len(space.names)
    for gname, (_, own) in _dense_parts(H, space, d, "parameter").items():
        assert within[gname] == pytest.approx(own, rel=1e-12, abs=1e-15)
