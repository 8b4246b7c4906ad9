"""top_eigenvalues (Lanczos, power) against numpy/torch eigh on dense matrices and a tiny MLP."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from losslens.geometry.operators.dense import DenseOperator
from losslens.geometry.estimators.eigen import top_eigenvalues
from losslens.geometry.base.results import EstimatorError
from tests.tiny_models import classifier_mlp_hessian, sym_with_spectrum


def goe(dim=60, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    return (A + A.T) / 2


def top_by_magnitude(H: torch.Tensor, k: int) -> np.ndarray:
    w = np.linalg.eigvalsh(H.numpy())
    return w[np.argsort(-np.abs(w), kind="stable")][:k]


SPECTRUM = np.concatenate([[50.0, -35.0, 20.0, 12.0, -8.0], np.linspace(-2, 2, 55)])


@pytest.mark.parametrize("k", [1, 3, 5])
def test_lanczos_topk_matches_eigh_default_tol(k):
    H = sym_with_spectrum(SPECTRUM)
    op = DenseOperator(H)
    res = top_eigenvalues(op, k=k)
    np.testing.assert_allclose(res.values, top_by_magnitude(H, k), rtol=1e-6)
    assert all(res.converged) and len(res.residuals) == k
    assert res.num_matvecs == op.num_matvecs == res.iterations + k  # steps + one block for residuals
    assert res.method == "lanczos"


@pytest.mark.parametrize("k", [1, 4])
def test_lanczos_on_goe_spectrum_tight_tol(k):
    H = goe(80, seed=1)
    res = top_eigenvalues(DenseOperator(H), k=k, tol=1e-10, max_iter=80)
    np.testing.assert_allclose(res.values, top_by_magnitude(H, k), rtol=1e-6)
    assert all(res.converged)


def test_lanczos_residuals_are_true_residuals():
    H = sym_with_spectrum(SPECTRUM, seed=2)
    res = top_eigenvalues(DenseOperator(H), k=3, tol=1e-3)
    V = res.vectors
    assert V.shape == (3, 60)
    for lam, v, r in zip(res.values, V, res.residuals):
        assert float(v.norm()) == pytest.approx(1.0)
        assert float((H @ v - lam * v).norm()) == pytest.approx(r, rel=1e-6, abs=1e-12)
        assert r <= 1e-3 * abs(lam) * 1.01


def test_lanczos_on_tiny_mlp_hessian():
    H, _ = classifier_mlp_hessian()
    res = top_eigenvalues(DenseOperator(H), k=3, tol=1e-8)
    np.testing.assert_allclose(res.values, top_by_magnitude(H, 3), rtol=1e-6)


def test_lanczos_low_rank_restarts_after_invariant_subspace():
    H = sym_with_spectrum([7.0, -3.0] + [0.0] * 18)
    res = top_eigenvalues(DenseOperator(H), k=4, tol=1e-8)
    np.testing.assert_allclose(res.values[:2], [7.0, -3.0], rtol=1e-10)
    np.testing.assert_allclose(res.values[2:], [0.0, 0.0], atol=1e-10)
    assert all(r < 1e-8 for r in res.residuals)


def test_lanczos_k_equals_dim_gives_the_whole_spectrum():
    H = sym_with_spectrum([5.0, -4.0, 3.0, 2.5, -1.0, 0.5, 0.25, 0.1])
    res = top_eigenvalues(DenseOperator(H), k=8, tol=1e-10)
    np.testing.assert_allclose(res.values, top_by_magnitude(H, 8), rtol=1e-8, atol=1e-12)


def test_negative_dominant_eigenvalue_keeps_its_sign():
    H = sym_with_spectrum(np.concatenate([[-10.0, 4.0], np.linspace(0, 1, 28)]))
    for method in ("lanczos", "power"):
        res = top_eigenvalues(DenseOperator(H), k=1, method=method, tol=1e-10, max_iter=500)
        assert res.values[0] == pytest.approx(-10.0, rel=1e-6) and res.lambda_max < 0


def test_power_top1_and_deflated_topk():
    H = sym_with_spectrum(SPECTRUM, seed=3)
    op = DenseOperator(H)
    res = top_eigenvalues(op, k=3, method="power", tol=1e-12, max_iter=2000)
    np.testing.assert_allclose(res.values, top_by_magnitude(H, 3), rtol=1e-6)
    assert all(res.converged) and res.method == "power"
    assert res.num_matvecs == op.num_matvecs == res.iterations  # residuals come free
    for lam, v, r in zip(res.values, res.vectors, res.residuals):
        assert float((H @ v - lam * v).norm()) == pytest.approx(r, rel=1e-6, abs=1e-12)


def test_power_stops_on_a_small_residual_and_flags_nonconvergence():
    H = sym_with_spectrum(np.concatenate([[1.0, 0.99], np.linspace(0, 0.5, 18)]))
    res = top_eigenvalues(DenseOperator(H), k=1, method="power", tol=1e-14, max_iter=5)
    assert res.converged == (False,) and res.num_matvecs == 5
    res2 = top_eigenvalues(DenseOperator(H), k=1, method="power", tol=1e-2, max_iter=100)
    assert res2.converged == (True,) and res2.num_matvecs < 100


def test_eigen_seeded_reruns_identical_and_to_dict():
    H = goe(40, seed=5)
    a = top_eigenvalues(DenseOperator(H), k=2, seed=9)
    b = top_eigenvalues(DenseOperator(H), k=2, seed=9)
    assert a.values == b.values and a.residuals == b.residuals and a.iterations == b.iterations
    d = a.to_dict()
    assert "vectors" not in d and d["values"] == list(a.values)
    json.dumps(d)


def test_float32_operator_lanczos():
    H = sym_with_spectrum(SPECTRUM).float()
    res = top_eigenvalues(DenseOperator(H), k=2)
    np.testing.assert_allclose(res.values, top_by_magnitude(H.double(), 2), rtol=1e-4)


def test_eigen_bad_input():
    op = DenseOperator(torch.eye(5, dtype=torch.float64))
    with pytest.raises(EstimatorError, match="k must be"):
        top_eigenvalues(op, k=0)
    with pytest.raises(EstimatorError, match="k must be <= "):
        top_eigenvalues(op, k=6)
    with pytest.raises(EstimatorError, match="method"):
        top_eigenvalues(op, method="arnoldi")
    with pytest.raises(EstimatorError, match="tol"):
        top_eigenvalues(op, tol=0)
    with pytest.raises(EstimatorError, match="max_iter"):
        top_eigenvalues(op, max_iter=0)
    H = torch.eye(5, dtype=torch.float64)
    H[0, 0] = float("inf")
    with pytest.raises(ValueError):
        top_eigenvalues(DenseOperator(H))


def test_power_unconverged_vectors_match_their_residuals():
    H = sym_with_spectrum(np.concatenate([[1.0, 0.95, -0.9], np.linspace(0, 0.5, 17)]))
    res = top_eigenvalues(DenseOperator(H), k=2, method="power", tol=1e-14, max_iter=7)
    assert res.converged == (False, False) and res.num_matvecs == 14
    for lam, v, r in zip(res.values, res.vectors, res.residuals):
        assert float(v @ H @ v) == pytest.approx(lam, rel=1e-12)
        assert float((H @ v - lam * v).norm()) == pytest.approx(r, rel=1e-9)


def slow_spectrum(dim: int = 300, seed: int = 0, k: int = 1) -> np.ndarray:
    """λ_max = 1 over a cluster just below it (λ₂/λ₁ = 0.95–0.99) and a bulk of both signs; k = 3:
    1, 0.97, 0.94 over a bulk reaching 0.9 (slowly separating top three)."""
    rng = np.random.default_rng(seed)
    if k == 1:
        return np.concatenate([[1.0], rng.uniform(0.95, 0.99, dim // 8), rng.uniform(-0.9, 0.9, dim - 1 - dim // 8)])
    return np.concatenate([[1.0, 0.97, 0.94], rng.uniform(-0.9, 0.9, dim - 3)])


def true_residuals(H: torch.Tensor, values, vectors) -> np.ndarray:
    """‖H v − λ v‖ in float64 from the dense matrix (not the estimator's code path)."""
    Hd, V = H.double(), vectors.double()
    V = V / V.norm(dim=1, keepdim=True)
    return np.array([float((Hd @ v - lam * v).norm()) for lam, v in zip(values, V)])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_power_converged_means_a_small_true_residual(seed, dtype):
    """A Rayleigh quotient that stalls on a slowly separating spectrum is not convergence."""
    tol = 1e-3
    H = sym_with_spectrum(slow_spectrum(seed=seed), seed=seed).to(dtype)
    for max_iter in (15, 40, 3000):
        res = top_eigenvalues(DenseOperator(H), k=1, method="power", tol=tol, max_iter=max_iter, seed=seed)
        lam, r = res.values[0], true_residuals(H, res.values, res.vectors)[0]
        assert res.residuals[0] == pytest.approx(r, rel=1e-3)
        if res.converged[0]:
            assert r <= 1.01 * tol * abs(lam), (max_iter, lam, r)
        else:
            assert r > 0.99 * tol * abs(lam) and res.num_matvecs == max_iter
    assert res.converged[0] and 0.99 < lam <= 1.0 + 1e-6


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1])
def test_deflated_power_converged_means_small_true_residuals(seed, dtype):
    tol = 1e-3
    H = sym_with_spectrum(slow_spectrum(seed=seed, k=3), seed=seed).to(dtype)
    for max_iter in (30, 3000):
        res = top_eigenvalues(DenseOperator(H), k=3, method="power", tol=tol, max_iter=max_iter, seed=seed)
        r = true_residuals(H, res.values, res.vectors)
        np.testing.assert_allclose(res.residuals, r, rtol=1e-3)
        for ok, lam, ri in zip(res.converged, res.values, r):
            assert ok == bool(ri <= tol * abs(lam) * 1.001), (max_iter, lam, ri)
    assert all(res.converged)
    np.testing.assert_allclose(res.values, [1.0, 0.97, 0.94], atol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_thick_restart_on_a_small_basis_converges_in_few_products(seed, dtype):
    """k = 1 on a basis of 6 or 8 vectors: within 1.8× (6) and 1.4× (8) the products of an
    unrestarted Lanczos run, and at least 3× fewer than power iteration, on a top eigenvalue over
    a cluster at 0.95–0.99 of it."""
    tol = 1e-3
    H = sym_with_spectrum(slow_spectrum(seed=seed), seed=seed).to(dtype)
    run = lambda **kw: top_eigenvalues(DenseOperator(H), k=1, tol=tol, max_iter=2000, seed=seed, **kw)
    full, power = run(), run(method="power")
    assert full.memory["restarts"] == 0 and full.converged[0] and power.converged[0]
    for m, factor in ((6, 1.8), (8, 1.4)):
        res = run(max_basis=m)
        r = true_residuals(H, res.values, res.vectors)[0]
        assert res.converged[0] and r <= 1.01 * tol * abs(res.values[0]) and res.memory["restarts"] > 0
        assert 0.99 < res.values[0] <= 1.0 + 1e-6
        assert res.num_matvecs <= factor * full.num_matvecs, (m, res.num_matvecs, full.num_matvecs)
        assert 3 * res.num_matvecs <= power.num_matvecs, (m, res.num_matvecs, power.num_matvecs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_thick_restart_k3_on_a_small_basis(seed, dtype):
    tol = 1e-3
    eigs = slow_spectrum(seed=seed, k=3)
    H = sym_with_spectrum(eigs, seed=seed).to(dtype)
    full = top_eigenvalues(DenseOperator(H), k=3, tol=tol, max_iter=2000, seed=seed)
    res = top_eigenvalues(DenseOperator(H), k=3, tol=tol, max_iter=2000, seed=seed, max_basis=8)
    r = true_residuals(H, res.values, res.vectors)
    assert all(res.converged) and np.all(r <= 1.01 * tol * np.abs(res.values)) and res.memory["restarts"] > 0
    np.testing.assert_allclose(res.values, [1.0, 0.97, 0.94], atol=2e-3)
    assert res.num_matvecs <= 2.5 * full.num_matvecs, (res.num_matvecs, full.num_matvecs)
