"""losslens.geometry.surfaces.planes: exact coordinates, orthonormal bases, filter normalisation, grids, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from losslens.geometry.surfaces.grid import GridError, GridSpec
from losslens.geometry.surfaces.random_planes import filter_normalize, random_plane
from losslens.geometry.surfaces.planes import PlaneError, orthonormality
from losslens.geometry.surfaces.point_planes import line, plane_through_points


def _point(seed: int, scale: float = 1.0, dtype=torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "layer.weight": scale * torch.randn(6, 5, generator=g, dtype=dtype),
        "layer.bias": scale * torch.randn(6, generator=g, dtype=dtype),
        "norm.weight": 1 + 0.1 * torch.randn(6, generator=g, dtype=dtype),
        "head.weight": scale * torch.randn(3, 6, generator=g, dtype=dtype),
    }


def _flat(p):
    return torch.cat([v.double().reshape(-1) for v in p.values()])


def _points():
    A = _point(0)
    B = {k: v + 0.3 * _point(1)[k] for k, v in A.items()}
    C = {k: v + 0.2 * _point(2)[k] for k, v in A.items()}
    return A, B, C


def test_coordinates_match_the_definition_in_float64():
    A, B, C = _points()
    plane = plane_through_points(A, B, C)
    a, b, c = _flat(A), _flat(B), _flat(C)
    u, v = b - a, c - a
    e1 = u / u.norm()
    w = v - (v @ e1) * e1
    assert plane.kind == "points"
    assert plane.coords["A"] == (0.0, 0.0)
    assert plane.coords["B"][0] == pytest.approx(float(u.norm()), rel=1e-12)
    assert plane.coords["B"][1] == 0.0
    assert plane.coords["C"][0] == pytest.approx(float(v @ e1), rel=1e-10)
    assert plane.coords["C"][1] == pytest.approx(float(w.norm()), rel=1e-10)
    assert plane.norms["|B-A|"] == pytest.approx(float(u.norm()), rel=1e-12)
    assert plane.norms["|C-A|"] == pytest.approx(float(v.norm()), rel=1e-12)
    # the plane's points reproduce B and C (float32 rounding only)
    for label, P in (("B", B), ("C", C)):
        rec = plane.point(*plane.coords[label])
        for k in P:
            torch.testing.assert_close(rec[k], P[k], rtol=1e-5, atol=1e-6)


def test_basis_is_orthonormal():
    A, B, C = _points()
    g = orthonormality(plane_through_points(A, B, C))
    assert g["e1.e1"] == pytest.approx(1.0, abs=1e-6)
    assert g["e2.e2"] == pytest.approx(1.0, abs=1e-6)
    assert abs(g["e1.e2"]) < 1e-6


def test_float64_points_are_exact():
    A = _point(0, dtype=torch.float64)
    B = {k: v + 0.3 * _point(1, dtype=torch.float64)[k] for k, v in A.items()}
    C = {k: v + 0.2 * _point(2, dtype=torch.float64)[k] for k, v in A.items()}
    plane = plane_through_points(A, B, C, labels=("K", "K-1", "Q"))
    assert set(plane.coords) == {"K", "K-1", "Q"}
    g = orthonormality(plane)
    assert abs(g["e1.e2"]) < 1e-14 and g["e1.e1"] == pytest.approx(1, abs=1e-14)
    rec = plane.point(*plane.coords["Q"])
    for k in C:
        torch.testing.assert_close(rec[k], C[k], rtol=1e-13, atol=1e-13)


def test_different_architectures_raise():
    A, B, C = _points()
    C2 = dict(C)
    C2["extra.weight"] = torch.zeros(2)
    with pytest.raises(PlaneError, match="different"):
        plane_through_points(A, B, C2)
    B2 = dict(B)
    B2["layer.weight"] = torch.zeros(6, 4)
    with pytest.raises(PlaneError, match="shape"):
        plane_through_points(A, B2, C)


def test_degenerate_planes_say_so():
    A, B, C = _points()
    with pytest.raises(PlaneError, match="degenerate.*'B' equals 'A'"):
        plane_through_points(A, {k: v.clone() for k, v in A.items()}, C)
    on_line = {k: A[k] + 2.0 * (B[k] - A[k]) for k in A}
    with pytest.raises(PlaneError, match="degenerate.*lies on the line"):
        plane_through_points(A, B, on_line)
    with pytest.raises(PlaneError, match="fallback='random'"):
        plane_through_points(A, B, {k: v.clone() for k, v in A.items()})


def test_random_fallback_is_opt_in_and_orthonormal():
    A, B, C = _points()
    on_line = {k: A[k] + 2.0 * (B[k] - A[k]) for k in A}
    p = plane_through_points(A, B, on_line, fallback="random", seed=3)
    assert p.kind == "points+random"
    g = orthonormality(p)
    assert abs(g["e1.e2"]) < 1e-6 and g["e2.e2"] == pytest.approx(1, abs=1e-6)
    assert p.coords["C"][0] == pytest.approx(2 * p.coords["B"][0], rel=1e-5)
    assert abs(p.coords["C"][1]) < 1e-5
    # A = B: e1 along C - A, e2 random
    q = plane_through_points(A, {k: v.clone() for k, v in A.items()}, C, fallback="random")
    assert q.coords["B"] == pytest.approx((0.0, 0.0), abs=1e-12)
    assert q.coords["C"][0] == pytest.approx(q.norms["|C-A|"], rel=1e-9)
    with pytest.raises(PlaneError):
        plane_through_points(A, A, A, fallback="random")
    with pytest.raises(PlaneError, match="fallback"):
        plane_through_points(A, B, C, fallback="line")


def test_filter_normalised_rows_have_the_weights_row_norms():
    W = _point(0)
    W["emb.weight"] = torch.randn(7, 6)
    W["conv.weight"] = torch.randn(4, 2, 3, 3)
    p = random_plane(W, seed=5)
    for d in (p.e1, p.e2):
        for k, w in W.items():
            if w.ndim >= 2 and "bias" not in k and "norm" not in k:
                rows_d = d[k].reshape(w.shape[0], -1).double().norm(dim=1)
                rows_w = w.reshape(w.shape[0], -1).double().norm(dim=1)
                torch.testing.assert_close(rows_d, rows_w, rtol=1e-5, atol=1e-7)
            else:  # 1-D params and ignored names are zeroed (Li et al. ignore='biasbn')
                assert torch.count_nonzero(d[k]) == 0, k
    assert p.kind == "random" and p.coords == {"center": (0.0, 0.0)}
    assert abs(p.norms["cos(e1,e2)"]) < 0.5


def test_random_plane_is_seeded_and_options_work():
    W = _point(0)
    a, b, c = random_plane(W, seed=1), random_plane(W, seed=1), random_plane(W, seed=2)
    for k in W:
        assert torch.equal(a.e1[k], b.e1[k]) and torch.equal(a.e2[k], b.e2[k])
    assert not torch.equal(a.e1["layer.weight"], c.e1["layer.weight"])
    kept = random_plane(W, seed=1, ignore=(), one_d="weights")
    assert torch.equal(kept.e1["layer.bias"], W["layer.bias"])
    filt = random_plane(W, seed=1, ignore=(), one_d="filter")
    assert float(filt.e1["norm.weight"].norm()) == pytest.approx(float(W["norm.weight"].norm()), rel=1e-5)
    raw = random_plane(W, seed=1, filter_normalize=False)
    assert torch.count_nonzero(raw.e1["layer.bias"]) == 0 and torch.count_nonzero(raw.e1["norm.weight"]) == 0
    assert torch.count_nonzero(raw.e1["layer.weight"]) == 30
    with pytest.raises(PlaneError):
        random_plane(W, ignore=("weight", "bias"))
    with pytest.raises(PlaneError):
        filter_normalize(a.e1, W, one_d="bogus")


def test_line_through_two_points():
    A, B, _ = _points()
    ln = line(A, end=B)
    d = _flat(B) - _flat(A)
    assert ln.coords["B"] == pytest.approx(float(d.norm()), rel=1e-12)
    rec = ln.point(ln.coords["B"])
    for k in B:
        torch.testing.assert_close(rec[k], B[k], rtol=1e-5, atol=1e-6)
    raw = line(A, direction={k: B[k] - A[k] for k in A}, normalize=False)
    assert raw.norms["|e1|"] == pytest.approx(float(d.norm()), rel=1e-6)
    with pytest.raises(PlaneError):
        line(A, end=A)
    with pytest.raises(PlaneError):
        line(A)
    plane = ln.as_plane()
    assert plane.coords["B"][1] == 0.0 and all(torch.count_nonzero(v) == 0 for v in plane.e2.values())


def test_grid_covers_points_with_margin():
    A, B, C = _points()
    plane = plane_through_points(A, B, C)
    x, y = GridSpec(resolution=11, margin=0.25).axes(plane)
    assert len(x) == len(y) == 11
    xs = [c[0] for c in plane.coords.values()]
    ys = [c[1] for c in plane.coords.values()]
    ext_x, ext_y = max(xs) - min(xs), max(ys) - min(ys)
    assert x[0] == pytest.approx(min(xs) - 0.25 * ext_x) and x[-1] == pytest.approx(max(xs) + 0.25 * ext_x)
    assert y[0] == pytest.approx(min(ys) - 0.25 * ext_y) and y[-1] == pytest.approx(max(ys) + 0.25 * ext_y)
    x2, y2 = GridSpec(resolution=(5, 3), x_range=(-1, 2)).axes(plane)
    assert len(x2) == 5 and len(y2) == 3 and x2[0] == -1 and x2[-1] == 2
    xr, yr = GridSpec(resolution=5).axes(random_plane(A))
    assert (xr[0], xr[-1], yr[0], yr[-1]) == (-1, 1, -1, 1)


@pytest.mark.parametrize("bad", [1, 0, (2, 1), (1, 5)])
def test_grid_resolution_below_two_raises(bad):
    with pytest.raises(GridError, match="at least 2"):
        GridSpec(resolution=bad)


def test_grid_bad_ranges_raise():
    with pytest.raises(GridError):
        GridSpec(x_range=(1.0, 1.0))
    with pytest.raises(GridError):
        GridSpec(margin=-0.1)
    with pytest.raises(GridError):
        GridSpec(y_range=(0.0, math.inf))


def test_describe_is_json_able():
    import json

    A, B, C = _points()
    d = plane_through_points(A, B, C).describe()
    json.dumps(d)
    assert d["kind"] == "points" and d["dim"] == sum(v.numel() for v in A.values())
    assert np.isfinite(d["norms"]["cos(B-A,C-A)"])
