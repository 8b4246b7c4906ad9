"""Stochastic Lanczos quadrature: exact per-run moments, moment expectations, nodes/weights, density."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from losslens.geometry.operators.dense import DenseOperator
from losslens.geometry.estimators.density import spectral_density
from losslens.geometry.base.results import EstimatorError
from losslens.geometry.estimators.sampling import rademacher
from losslens.geometry.estimators.trace import hutchinson_trace
from tests.tiny_models import classifier_mlp_hessian, sym_with_spectrum


EIGS = np.concatenate([[25.0, 10.0, -6.0], np.linspace(-1, 3, 37)])


def start_vectors(op, seed, runs):
    return rademacher(op.generator(seed), runs, op.dim, op.dtype, op.device)


@pytest.mark.parametrize("steps", [2, 5, 40, 60])
def test_per_run_quadrature_is_exact_for_low_moments(steps):
    H = sym_with_spectrum(EIGS)
    op = DenseOperator(H)
    res = spectral_density(op, num_runs=3, num_steps=steps, seed=4)
    V = start_vectors(op, 4, 3)
    for p in (0, 1, 2):
        want = [float(v @ torch.linalg.matrix_power(H, p) @ v) / float(v @ v) for v in V]
        np.testing.assert_allclose(res.run_moments(p), want, rtol=1e-10, atol=1e-12)
    assert res.num_steps == min(steps, 40) and res.num_runs == 3
    assert res.num_matvecs == op.num_matvecs <= 3 * min(steps, 40)
    if steps < 40:
        assert res.num_matvecs == 3 * steps


def test_full_krylov_nodes_are_eigenvalues_with_projection_weights():
    H = sym_with_spectrum(EIGS)
    op = DenseOperator(H)
    res = spectral_density(op, num_runs=2, num_steps=40, seed=1)
    w, U = np.linalg.eigh(H.numpy())
    for r, v in enumerate(start_vectors(op, 1, 2).numpy()):
        nodes, weights = res.nodes[r], res.weights[r]
        assert len(nodes) <= 40
        big = weights > 1e-8
        # every node carrying weight is an eigenvalue, with weight (u_iᵀv)²/‖v‖²
        for lam, wt in zip(nodes[big], weights[big]):
            i = np.argmin(np.abs(w - lam))
            assert lam == pytest.approx(w[i], abs=1e-8)
            assert wt == pytest.approx((U[:, i] @ v) ** 2 / (v @ v), rel=1e-6)


def test_moments_average_to_normalised_traces():
    H = sym_with_spectrum(EIGS, seed=2)
    dim = H.shape[0]
    res = spectral_density(DenseOperator(H), num_runs=400, num_steps=6, seed=0)
    assert res.moment(0) == pytest.approx(1.0, abs=1e-12)
    for p in (1, 2):
        exact = float(torch.trace(torch.linalg.matrix_power(H, p))) / dim
        per_run = res.run_moments(p)
        se = per_run.std(ddof=1) / math.sqrt(len(per_run))
        assert abs(per_run.mean() - exact) < 4 * se, (p, per_run.mean(), exact, se)
    # dim · moment(1) is the Hutchinson estimate with the same Rademacher vectors
    hutch = hutchinson_trace(DenseOperator(H), num_matvecs=400, seed=0, block_size=400)
    assert res.trace_estimate == pytest.approx(hutch.value, rel=1e-10)


def test_moments_on_tiny_mlp_hessian():
    H, _ = classifier_mlp_hessian()
    dim = H.shape[0]
    res = spectral_density(DenseOperator(H), num_runs=300, num_steps=4, seed=3)
    assert res.moment(0) == pytest.approx(1.0, abs=1e-12)
    for p in (1, 2):
        exact = float(torch.trace(torch.linalg.matrix_power(H, p))) / dim
        per_run = res.run_moments(p)
        assert abs(per_run.mean() - exact) < 4 * per_run.std(ddof=1) / math.sqrt(len(per_run))


def test_density_grid_and_normalisation():
    H = sym_with_spectrum(EIGS)
    res = spectral_density(DenseOperator(H), num_runs=4, num_steps=20, seed=0, grid_size=300)
    assert res.grid.shape == (300,) and res.density.shape == (300,)
    assert np.all(res.density >= 0)
    assert float(res.density.sum() * (res.grid[1] - res.grid[0])) == pytest.approx(1.0)
    nodes = np.concatenate(res.nodes)
    assert res.grid[0] < nodes.min() and res.grid[-1] > nodes.max()
    for w in res.weights:
        assert w.sum() == pytest.approx(1.0, abs=1e-12)
    res2 = spectral_density(DenseOperator(H), num_runs=4, num_steps=20, seed=0, sigma=0.5)
    assert res2.sigma == 0.5
    # the smoothed density's mean matches the quadrature's first moment
    mean = float((res2.grid * res2.density).sum() * (res2.grid[1] - res2.grid[0]))
    assert mean == pytest.approx(res2.moment(1), abs=1e-3)


def test_density_seeded_and_serialisable():
    H = sym_with_spectrum(EIGS)
    a = spectral_density(DenseOperator(H), num_runs=2, num_steps=10, seed=7)
    b = spectral_density(DenseOperator(H), num_runs=2, num_steps=10, seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a.nodes, b.nodes))
    assert np.array_equal(a.density, b.density)
    d = a.to_dict()
    json.dumps(d)
    assert len(d["nodes"]) == 2 and len(d["density"]) == 500


def test_density_bad_input():
    op = DenseOperator(torch.eye(5, dtype=torch.float64))
    for kw, name in [
        ({"num_runs": 0}, "num_runs"),
        ({"num_steps": 0}, "num_steps"),
        ({"grid_size": 1}, "grid_size"),
        ({"sigma": -1.0}, "sigma"),
    ]:
        with pytest.raises(EstimatorError, match=name):
            spectral_density(op, **kw)


def test_density_of_identity_is_one_atom():
    res = spectral_density(DenseOperator(2 * torch.eye(10, dtype=torch.float64)), num_runs=2, num_steps=5)
    for nodes, w in zip(res.nodes, res.weights):
        assert len(nodes) == 1 and nodes[0] == pytest.approx(2.0) and w[0] == pytest.approx(1.0)
    assert res.num_matvecs == 2
    assert res.grid[np.argmax(res.density)] == pytest.approx(2.0, abs=0.01)


@pytest.mark.parametrize("reorth", ["full", "none"])
def test_lock_step_runs_that_stop_early_leave_the_others_unchanged(reorth):
    """Runs in one group whose Krylov spaces become invariant at different steps (2, 4, 8) give the
    tridiagonals each run gives alone: the runs that go on move up in place (no copy of the rest)."""
    from losslens.geometry.estimators._lanczos import lanczos
    from losslens.geometry.operators.dense import DenseOperator

    H = torch.diag(torch.tensor([1.0, 2.0, 3.5, 5.0, 6.0, 7.5, 9.0, 10.0] + [0.0] * 12, dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    starts = torch.zeros(3, 20, dtype=torch.float64)
    for row, support in enumerate((2, 4, 8)):
        starts[row, :support] = torch.rand(support, generator=g, dtype=torch.float64) + 0.5
    together = lanczos(DenseOperator(H), starts.clone(), 10, reorth=reorth)
    assert [r.steps for r in together] == [2, 4, 8] and all(r.breakdown for r in together)
    for row, run in enumerate(together):
        alone = lanczos(DenseOperator(H), starts[row : row + 1].clone(), 10, reorth=reorth)[0]
        np.testing.assert_allclose(run.alphas, alone.alphas, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(run.betas, alone.betas, rtol=1e-12, atol=1e-14)
