"""Trace estimators (Hutchinson, Hutch++) against exact traces of dense matrices and a tiny MLP."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from losslens.geometry.operators.dense import DenseOperator
from losslens.geometry.operators.interface import OperatorError
from losslens.geometry.base.results import EstimatorError, TraceEstimate
from losslens.geometry.estimators.sampling import rademacher, t_quantile
from losslens.geometry.estimators.trace import hutchinson_trace, hutchpp_trace
from tests.tiny_models import classifier_mlp_hessian, sym_with_spectrum


def low_rank_plus_noise(dim=200, rank=10, noise=0.05, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    top = torch.linspace(100.0, 10.0, rank, dtype=torch.float64)
    rest = noise * torch.randn(dim - rank, generator=g, dtype=torch.float64).abs()
    return sym_with_spectrum(torch.cat([top, rest]), seed)


# ----------------------------------------------------------------------------- Hutchinson
def test_hutchinson_matches_manual_computation_and_interval():
    H = sym_with_spectrum(np.linspace(-3, 10, 40))
    op = DenseOperator(H)
    res = hutchinson_trace(op, num_matvecs=50, seed=3, block_size=7)
    g = op.generator(3)  # the estimator draws blocks of 7 from this stream
    V = torch.cat([rademacher(g, b, 40, torch.float64, "cpu") for b in [7] * 7 + [1]])
    samples = ((V @ H) * V).sum(1).numpy()
    assert res.value == pytest.approx(samples.mean(), rel=1e-12)
    assert res.stderr == pytest.approx(samples.std(ddof=1) / math.sqrt(50), rel=1e-10)
    h = t_quantile(50) * res.stderr
    assert (res.ci_low, res.ci_high) == pytest.approx((res.value - h, res.value + h))
    assert t_quantile(50) == pytest.approx(2.0096, abs=1e-3)
    assert res.num_matvecs == 50 == op.num_matvecs and res.num_samples == 50
    assert res.method == "hutchinson" and res.converged and res.seed == 3 and res.dim == 40


def test_hutchinson_is_unbiased_with_the_rademacher_variance():
    H = sym_with_spectrum(np.linspace(-2, 5, 30), seed=1)
    op = DenseOperator(H)
    res = hutchinson_trace(op, num_matvecs=3000, seed=0)
    exact = float(torch.trace(H))
    assert abs(res.value - exact) < 4 * res.stderr
    # Var(vᵀHv) = 2 (‖H‖_F² − Σ H_ii²) for Rademacher v
    var = 2 * (float((H**2).sum()) - float((torch.diagonal(H) ** 2).sum()))
    assert res.stderr == pytest.approx(math.sqrt(var / 3000), rel=0.1)


def test_hutchinson_on_exact_hessian_of_tiny_mlp():
    H, _ = classifier_mlp_hessian()
    op = DenseOperator(H)
    res = hutchinson_trace(op, num_matvecs=400, seed=1)
    assert abs(res.value - float(torch.trace(H))) < 4 * res.stderr


def test_hutchinson_tolerance_stops_early_and_counts_matvecs():
    H = sym_with_spectrum(np.linspace(1, 2, 50))  # well conditioned: relative stderr small fast
    op = DenseOperator(H)
    res = hutchinson_trace(op, num_matvecs=200, tol=0.05, seed=0, block_size=4)
    assert res.converged and res.num_matvecs < 200 and res.num_matvecs % 4 == 0
    assert res.num_matvecs == op.num_matvecs == res.num_samples
    assert res.rel_stderr < 0.05
    op2 = DenseOperator(H)
    res2 = hutchinson_trace(op2, num_matvecs=20, tol=1e-9, seed=0, block_size=8)
    assert not res2.converged and res2.num_matvecs == 20 == op2.num_matvecs


def test_hutchinson_seeded_reruns_are_bit_identical():
    H = sym_with_spectrum(np.linspace(-1, 4, 25))
    a = hutchinson_trace(DenseOperator(H), num_matvecs=33, seed=11)
    b = hutchinson_trace(DenseOperator(H), num_matvecs=33, seed=11)
    c = hutchinson_trace(DenseOperator(H), num_matvecs=33, seed=12)
    assert (a.value, a.stderr, a.ci_low) == (b.value, b.stderr, b.ci_low)
    assert c.value != a.value


def test_hutchinson_single_probe_has_infinite_error_bar():
    res = hutchinson_trace(DenseOperator(torch.eye(5, dtype=torch.float64)), num_matvecs=1)
    assert res.value == pytest.approx(5.0) and math.isinf(res.stderr) and math.isinf(res.ci_high)


def test_hutchinson_float32_operator():
    H = sym_with_spectrum(np.linspace(0, 3, 30)).float()
    res = hutchinson_trace(DenseOperator(H), num_matvecs=64, seed=0)
    assert isinstance(res.value, float) and abs(res.value - float(torch.trace(H))) < 5 * res.stderr


# -------------------------------------------------------------------------------- Hutch++
@pytest.mark.parametrize("budget", [30, 31, 45, 100])
def test_hutchpp_exact_when_budget_reaches_dimension(budget):
    H = sym_with_spectrum(np.linspace(-5, 20, 30))
    op = DenseOperator(H)
    res = hutchpp_trace(op, num_matvecs=budget, seed=0)
    assert res.value == pytest.approx(float(torch.trace(H)), rel=1e-8, abs=1e-10)
    assert res.stderr == 0.0 and res.ci_low == res.ci_high == res.value
    assert res.num_matvecs == 30 == op.num_matvecs and res.method == "exact"


def test_hutchpp_exact_on_tiny_mlp_hessian_which_is_singular():
    H, _ = classifier_mlp_hessian()
    dim = H.shape[0]
    assert torch.linalg.matrix_rank(H) < dim  # softmax/CE Hessians are singular
    res = hutchpp_trace(DenseOperator(H), num_matvecs=dim + 5, seed=2)
    assert res.value == pytest.approx(float(torch.trace(H)), rel=1e-8)


def test_hutchpp_budget_split_and_accounting():
    H = low_rank_plus_noise(dim=120)
    op = DenseOperator(H)
    res = hutchpp_trace(op, num_matvecs=31, seed=0)  # s = 10 sketch + 10 for Q + 11 residual
    assert res.num_matvecs == 31 == op.num_matvecs
    assert res.num_samples == 11 and res.method == "hutch++"
    h = t_quantile(11) * res.stderr
    assert res.ci_high - res.value == pytest.approx(h)


def test_hutchpp_beats_hutchinson_on_low_rank_plus_noise():
    H = low_rank_plus_noise(dim=200, rank=10)
    exact = float(torch.trace(H))
    errs_h, errs_pp = [], []
    for seed in range(20):
        errs_h.append(hutchinson_trace(DenseOperator(H), num_matvecs=36, seed=seed).value - exact)
        errs_pp.append(hutchpp_trace(DenseOperator(H), num_matvecs=36, seed=seed).value - exact)
    mse_h, mse_pp = np.mean(np.square(errs_h)), np.mean(np.square(errs_pp))
    assert mse_pp * 100 < mse_h, (mse_h, mse_pp)


def test_hutchpp_is_unbiased_and_its_stderr_matches_the_spread():
    H = sym_with_spectrum(np.concatenate([[30, -20, 10], np.linspace(-1, 1, 57)]), seed=4)
    exact = float(torch.trace(H))
    res = [hutchpp_trace(DenseOperator(H), num_matvecs=24, seed=s) for s in range(200)]
    vals = np.array([r.value for r in res])
    assert abs(vals.mean() - exact) < 4 * vals.std(ddof=1) / math.sqrt(len(vals))
    assert np.mean([r.stderr for r in res]) == pytest.approx(vals.std(ddof=1), rel=0.3)


def test_hutchpp_seeded_reruns_are_bit_identical():
    H = low_rank_plus_noise(dim=60)
    a = hutchpp_trace(DenseOperator(H), num_matvecs=21, seed=5)
    b = hutchpp_trace(DenseOperator(H), num_matvecs=21, seed=5)
    assert a.value == b.value and a.stderr == b.stderr


# ------------------------------------------------------------------------------ bad input
def test_bad_budgets_raise_clear_errors():
    op = DenseOperator(torch.eye(4, dtype=torch.float64))
    with pytest.raises(EstimatorError, match="num_matvecs"):
        hutchinson_trace(op, num_matvecs=0)
    with pytest.raises(ValueError, match="num_matvecs"):
        hutchpp_trace(op, num_matvecs=2)
    with pytest.raises(EstimatorError, match="tol"):
        hutchinson_trace(op, num_matvecs=4, tol=-1.0)
    with pytest.raises(EstimatorError, match="block_size"):
        hutchinson_trace(op, num_matvecs=4, block_size=0)
    with pytest.raises(EstimatorError, match="num_matvecs"):
        hutchinson_trace(op, num_matvecs=2.5)
    with pytest.raises(EstimatorError, match="CurvatureOperator"):
        hutchinson_trace(torch.eye(4))


def test_non_finite_operator_raises():
    H = torch.eye(6, dtype=torch.float64)
    H[2, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        hutchinson_trace(DenseOperator(H), num_matvecs=4)
    with pytest.raises(OperatorError):
        hutchpp_trace(DenseOperator(H), num_matvecs=3)


def test_trace_estimate_to_dict_is_json():
    res = hutchpp_trace(DenseOperator(low_rank_plus_noise(dim=40)), num_matvecs=12)
    d = res.to_dict()
    assert set(d) >= {"value", "stderr", "ci_low", "ci_high", "num_matvecs", "seconds", "seed", "method", "converged"}
    json.dumps(d)
    with pytest.raises(Exception):
        res.value = 1.0  # frozen
    assert isinstance(res, TraceEstimate)
