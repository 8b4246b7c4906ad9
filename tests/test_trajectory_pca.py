"""Trajectory PCA (losslens.geometry.surfaces.trajectory_pca) against a float64 SVD of the stacked, centred
weights (numpy, not the Gram trick), on random points of several shapes, seeds and sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from losslens.geometry.memory.budget import MemoryBudgetError
from losslens.geometry.surfaces.sources import DictSource, MeanSource
from losslens.geometry.surfaces.trajectory_axes import TrajectoryPCAError
from losslens.geometry.surfaces.trajectory_pca import trajectory_pca

SHAPES = {
    "emb.weight": (11, 6),
    "layer.0.weight": (6, 6),
    "layer.0.bias": (6,),
    "norm.weight": (6,),
    "conv": (3, 2, 4),
    "scale": (),
}


def _points(n, seed, dtype=torch.float64, spread=0.1):
    g = torch.Generator().manual_seed(seed)
    base = {k: torch.randn(s, generator=g, dtype=torch.float64) for k, s in SHAPES.items()}
    walk, out = dict(base), []
    for _ in range(n):  # a random walk, like a trajectory
        walk = {k: v + spread * torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in walk.items()}
        out.append({k: v.to(dtype) for k, v in walk.items()})
    return out


def _stack(points, names=SHAPES):
    return np.stack([np.concatenate([p[k].double().reshape(-1).numpy() for k in names]) for p in points])


def _flat(d, names=SHAPES):
    return np.concatenate([d[k].double().reshape(-1).numpy() for k in names])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [3, 5, 12, 30])
def test_axes_variance_and_coordinates_equal_a_float64_svd(n, seed):
    pts = _points(n, seed)
    k = min(3, n - 1)
    res = trajectory_pca(pts, k=k, chunk_elements=7)  # small slices: many slice boundaries
    x = _stack(pts)
    xc = x - x.mean(0)
    u, s, vt = np.linalg.svd(xc, full_matrices=False)
    np.testing.assert_allclose(res.singular_values, s[:k], rtol=1e-10)
    np.testing.assert_allclose(res.explained_variance_ratio, s[:k] ** 2 / np.sum(s**2), rtol=1e-10)
    np.testing.assert_allclose(_flat(res.center), x.mean(0), rtol=0, atol=1e-12)
    for j in range(k):
        sign = np.sign(_flat(res.directions[j]) @ vt[j])
        np.testing.assert_allclose(_flat(res.directions[j]), sign * vt[j], atol=1e-9)
        np.testing.assert_allclose(res.coords[:, j], sign * u[:, j] * s[j], atol=1e-9)
        # the stated sign rule: the largest |entry| of each eigenvector is positive
        col = res.eigenvectors[:, j]
        assert col[np.argmax(np.abs(col))] > 0
    # residuals from the plane of the first two axes, directly
    proj = xc @ np.stack([_flat(res.directions[0]), _flat(res.directions[1])]).T
    direct = np.linalg.norm(xc - proj @ np.stack([_flat(res.directions[0]), _flat(res.directions[1])]), axis=1)
    np.testing.assert_allclose(res.residuals((0, 1)), direct, atol=1e-9)
    np.testing.assert_allclose(res.distances, np.linalg.norm(xc, axis=1), rtol=1e-10)


@pytest.mark.parametrize("seed", [0, 3])
def test_three_checkpoints_lie_on_their_plane_exactly(seed):
    pts = _points(3, seed)
    res = trajectory_pca(pts, k=2)
    assert np.all(res.residuals() <= 1e-12 * res.distances.max())
    plane = res.plane()
    for i, p in enumerate(pts):
        x, y = plane.coords[f"point-{i}"]
        back = plane.point(x, y)
        for k in SHAPES:
            torch.testing.assert_close(back[k], p[k], rtol=0, atol=1e-12)


def test_checkpoint_centre_and_reruns_are_identical():
    pts = _points(6, 4)
    a = trajectory_pca(pts, k=2, center=2, labels=[f"s{i}" for i in range(6)])
    b = trajectory_pca(pts, k=2, center="s2", labels=[f"s{i}" for i in range(6)])
    assert a.center_label == "s2"
    np.testing.assert_array_equal(a.coords, b.coords)
    np.testing.assert_allclose(a.coords[2], 0, atol=1e-12)  # the centre sits at the origin
    x = _stack(pts)
    xc = x - x[2]
    _, s, _ = np.linalg.svd(xc, full_matrices=False)
    np.testing.assert_allclose(a.singular_values, s[:2], rtol=1e-10)
    for k in SHAPES:
        torch.testing.assert_close(a.center[k], pts[2][k], rtol=0, atol=0)


def test_projection_of_a_further_point_and_its_residual():
    pts = _points(8, 5)
    res = trajectory_pca(pts, k=3)
    other = {k: v + 0.05 * torch.randn(v.shape, dtype=v.dtype) for k, v in pts[4].items()}
    p = res.project(other, "q")
    d = _flat(other) - _flat(res.center)
    e = np.stack([_flat(res.directions[j]) for j in range(3)])
    np.testing.assert_allclose(p.coords, e @ d, atol=1e-10)
    resid = d - (e[:2] @ d) @ e[:2]
    assert p.residual == pytest.approx(np.linalg.norm(resid), rel=1e-8)
    assert p.relative_residual == pytest.approx(np.linalg.norm(resid) / np.linalg.norm(d), rel=1e-8)
    # a checkpoint projected again lands on its own coordinates
    again = res.project(pts[1], "again")
    np.testing.assert_allclose(again.coords, res.coords[1], atol=1e-9)
    assert again.residual == pytest.approx(res.residuals()[1], rel=1e-6, abs=1e-9)


def test_filter_normalised_axes_fit_by_least_squares():
    pts = _points(6, 6)
    res = trajectory_pca(pts, k=2, filter_normalize=True, one_d="filter", ignore=())
    e = np.stack([_flat(res.directions[0]), _flat(res.directions[1])])
    w = res.center["emb.weight"].double()
    d0 = res.directions[0]["emb.weight"].double()
    torch.testing.assert_close(d0.norm(dim=1), w.norm(dim=1), rtol=1e-8, atol=1e-10)
    xc = _stack(pts) - _flat(res.center)
    coef, *_ = np.linalg.lstsq(e.T, xc.T, rcond=None)
    np.testing.assert_allclose(res.plane_coords(), coef.T, atol=1e-8)
    np.testing.assert_allclose(res.residuals(), np.linalg.norm(xc - coef.T @ e, axis=1), atol=1e-8)
    p = res.project(pts[3], "again")
    np.testing.assert_allclose(p.coords[:2], coef.T[3], atol=1e-8)


def test_float32_and_bfloat16_points_use_float64_arithmetic():
    for dtype in (torch.float32, torch.bfloat16):
        pts = _points(5, 7, dtype=dtype)
        res = trajectory_pca(pts, k=2)
        x = _stack(pts)  # the stored values, exactly, in float64
        _, s, _ = np.linalg.svd(x - x.mean(0), full_matrices=False)
        np.testing.assert_allclose(res.singular_values, s[:2], rtol=1e-10)
        assert all(t.dtype == torch.float32 for t in res.center.values())


def test_mean_source_and_glob_selection():
    pts = _points(5, 8)
    lawa = MeanSource([DictSource(p, f"p{i}") for i, p in enumerate(pts[2:])], "lawa")
    mean = {k: sum(p[k] for p in pts[2:]) / 3 for k in SHAPES}
    for k in SHAPES:
        rows = lawa.rows(k, 0, 1 if not SHAPES[k] else SHAPES[k][0])
        torch.testing.assert_close(rows.reshape(SHAPES[k]), mean[k], rtol=0, atol=1e-15)
    res = trajectory_pca(pts + [lawa], k=2, params=["layer.*"])
    assert set(res.center) == {"layer.0.weight", "layer.0.bias"}
    names = ["layer.0.weight", "layer.0.bias"]
    x = _stack(pts + [mean], names)
    _, s, _ = np.linalg.svd(x - x.mean(0), full_matrices=False)
    np.testing.assert_allclose(res.singular_values, s[:2], rtol=1e-10)


def test_bad_inputs_say_what_to_fix():
    pts = _points(4, 9)
    with pytest.raises(TrajectoryPCAError, match="k=3 needs at least 4"):
        trajectory_pca(pts[:3], k=3)
    with pytest.raises(TrajectoryPCAError, match="span 1 independent"):
        trajectory_pca([pts[0], pts[1], pts[1], pts[0]], k=2)
    broken = dict(pts[1])
    broken["emb.weight"] = torch.zeros(3, 3, dtype=torch.float64)
    with pytest.raises(TrajectoryPCAError, match="different architectures"):
        trajectory_pca([pts[0], broken, pts[2]], k=2)
    with pytest.raises(TrajectoryPCAError, match="neither 'mean'"):
        trajectory_pca(pts, center="nope")
    with pytest.raises(TrajectoryPCAError, match="no floating-point parameter"):
        trajectory_pca(pts, params=["missing.*"])
    with pytest.raises(MemoryBudgetError):
        trajectory_pca(pts, max_memory=100)
