"""Planes and lines through given points of parameter space (docs/science.md §5); the data they
return (:class:`~losslens.geometry.surfaces.planes.Plane`, :class:`~losslens.geometry.surfaces.planes.Line`) and their
memory plan (:func:`~losslens.geometry.surfaces.planes.estimate_memory`) are in
:mod:`losslens.geometry.surfaces.planes`.

- :func:`plane_through_points` -- the *quantization plane* through A = Θ_K, B = Θ_{K−1},
  C = Θ̂_K: u = B − A, v = C − A over the flattened vector of all floating-point keys,
  e₁ = u/‖u‖, e₂ = (v − (v·e₁)e₁)/‖v − (v·e₁)e₁‖ (Gram–Schmidt). Coordinates A = (0, 0),
  B = (‖u‖, 0), C = (v·e₁, ‖v − (v·e₁)e₁‖), all computed in float64. Plane points are
  θ(x, y) = A + x·e₁ + y·e₂, x and y in parameter-space (Euclidean) units.
- :func:`line` -- a 1-D slice origin + x·e₁ through a point, along a direction or to an end point.

Cost: a constant number of passes over the parameters, one key at a time (float64 temporaries of one
tensor at a time); the directions are stored in the dtype of the origin. Memory: checked against
``max_memory`` first (:func:`~losslens.geometry.surfaces.planes.estimate_memory`).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from losslens.geometry.surfaces.planes import Line, Params, Plane, PlaneError, _float_keys, _norm, estimate_memory

__all__ = ["plane_through_points", "line"]


def plane_through_points(
    A: Params,
    B: Params,
    C: Params,
    labels: Sequence[str] = ("A", "B", "C"),
    fallback: str | None = None,
    seed: int = 0,
    tol: float = 1e-6,
    max_memory: int | str | None = None,
    copy_origin: bool = True,
) -> Plane:
    """The plane through A (origin), B and C with an orthonormal basis (Gram–Schmidt).

    Parameters
    ----------
    A, B, C : parameter dicts with the same keys and shapes (e.g. ``model.state_dict()`` of the
        checkpoint Θ_K, its predecessor Θ_{K−1} and its quantized self Θ̂_K). Only floating-point
        entries span the plane; non-floating entries (integer buffers) must be equal.
    labels : names of the three points in ``Plane.coords``.
    fallback : ``None`` (default) raises :class:`PlaneError` on a degenerate plane. ``"random"``
        opts in to a seeded random unit direction orthogonal to the non-degenerate one: when C lies
        on the line AB (or C = A), e₂ is random; when A = B but C ≠ A, e₁ = (C − A)/‖C − A‖ and e₂ is
        random. A = B = C always raises. (For a 1-D slice use :func:`line`.)
    seed : seed of the random fallback direction.
    tol : degeneracy threshold: ‖u‖ ≤ tol·max(‖A‖, tiny) means A = B; ‖v − (v·e₁)e₁‖ ≤ tol·‖v‖ means
        C is on the line through A and B (float32 points carry ~1e-7 relative rounding).
    max_memory : bytes (or ``"8GB"``) the construction may allocate
        (:func:`~losslens.geometry.surfaces.planes.estimate_memory`).
    copy_origin : ``False`` makes A's tensors the plane's origin without a copy (saves one model of
        memory when the caller owns A and will not modify it).

    Returns
    -------
    Plane with ``kind="points"`` (or ``"points+random"``), ``coords`` {A: (0, 0), B: (‖u‖, 0),
    C: (v·e₁, ‖v⊥‖)} computed in float64, and ``norms`` {``|B-A|``, ``|C-A|``, ``cos(B-A,C-A)``,
    ``|A|``}. e₁, e₂ are stored in A's dtype.

    Cost: four passes over the parameters, each in float64 one tensor at a time; e₁ and e₂ are
    formed in float64 per tensor and stored in A's dtype. Memory:
    :func:`~losslens.geometry.surfaces.planes.estimate_memory`.
    """
    labels = tuple(labels)
    if len(labels) != 3:
        raise PlaneError(f"labels must name three points, got {labels!r}")
    if fallback not in (None, "random"):
        raise PlaneError(f"fallback must be None or 'random', got {fallback!r}")
    keys = _float_keys([A, B, C], labels)
    estimate_memory(A, max_memory, "points")
    la, lb, lc = labels

    def u(k):  # B − A and C − A, one tensor at a time in float64
        return B[k].double() - A[k].double()

    def v(k):
        return C[k].double() - A[k].double()

    norm_a = _norm(A, keys)
    uu, vv, uv = (
        _sum(keys, lambda k: (u(k) * u(k)).sum()),
        _sum(keys, lambda k: (v(k) * v(k)).sum()),
        _sum(keys, lambda k: (u(k) * v(k)).sum()),
    )
    nu, nv = math.sqrt(uu), math.sqrt(vv)
    scale_ref = max(norm_a, 1e-30)
    a_eq_b, c_eq_a = nu <= tol * scale_ref, nv <= tol * scale_ref
    kind = "points"
    if a_eq_b:
        if fallback != "random" or c_eq_a:
            raise PlaneError(
                f"degenerate plane: {lb!r} equals {la!r} (‖{lb}−{la}‖ = {nu:.3g}, ‖{la}‖ = {norm_a:.3g})"
                + (f" and {lc!r} equals {la!r} too" if c_eq_a else "")
                + "; the three points do not span a plane. Pass fallback='random' to use a random second "
                "direction, or use losslens.geometry.surfaces.point_planes.line for a 1-D slice."
            )

        def e1_64(k):
            return v(k) / nv

        e1 = {k: e1_64(k).to(A[k].dtype) for k in keys}
        e2 = _random_orthogonal(A, keys, e1, seed)
        kind = "points+random"
    else:

        def e1_64(k):
            return u(k) / nu

        e1 = {k: e1_64(k).to(A[k].dtype) for k in keys}
        c1 = uv / nu  # v·e₁, exactly from the float64 scalars
        nw = math.sqrt(_sum(keys, lambda k: ((v(k) - (c1 / nu) * u(k)) ** 2).sum()))
        if nw <= tol * max(nv, 1e-30) or c_eq_a:
            if fallback != "random":
                what = f"{lc!r} equals {la!r}" if c_eq_a else f"{lc!r} lies on the line through {la!r} and {lb!r}"
                raise PlaneError(
                    f"degenerate plane: {what} (distance from the line {nw:.3g}, ‖{lc}−{la}‖ = {nv:.3g}); "
                    "the three points do not span a plane. Pass fallback='random' to use a random second "
                    "direction, or use losslens.geometry.surfaces.point_planes.line for a 1-D slice."
                )
            e2 = _random_orthogonal(A, keys, e1, seed)
            kind = "points+random"
        else:
            e2 = {k: ((v(k) - (c1 / nu) * u(k)) / nw).to(A[k].dtype) for k in keys}
    if kind == "points":  # the definitions, exactly
        coords = {la: (0.0, 0.0), lb: (nu, 0.0), lc: (c1, nw)}
    else:
        coords = {
            la: (0.0, 0.0),
            lb: (_sum(keys, lambda k: (u(k) * e1_64(k)).sum()), _sum(keys, lambda k: (u(k) * e2[k].double()).sum())),
            lc: (_sum(keys, lambda k: (v(k) * e1_64(k)).sum()), _sum(keys, lambda k: (v(k) * e2[k].double()).sum())),
        }
    cos_uv = uv / (nu * nv) if nu > 0 and nv > 0 else float("nan")
    norms = {f"|{lb}-{la}|": nu, f"|{lc}-{la}|": nv, f"cos({lb}-{la},{lc}-{la})": cos_uv, f"|{la}|": norm_a}
    origin = {k: (A[k].detach().clone() if copy_origin else A[k].detach()) for k in keys}
    xs = [c[0] for c in coords.values()]
    ys = [c[1] for c in coords.values()]
    scale = max(max(xs) - min(xs), max(ys) - min(ys), 1e-12) / 2
    return Plane(
        origin,
        e1,
        e2,
        coords,
        norms,
        kind,
        scale=scale,
        meta={"labels": list(labels), "fallback": fallback, "seed": seed if kind != "points" else None},
    )


def _sum(keys: Sequence[str], term) -> float:
    """Σ over keys of a float64 scalar ``term(k)`` (each evaluated on one tensor at a time)."""
    return float(sum(float(term(k)) for k in keys))


def _random_orthogonal(A: Params, keys: Sequence[str], e1: Params, seed: int) -> dict[str, torch.Tensor]:
    """A seeded random unit direction orthogonal to ``e1`` (Gram–Schmidt in float64 per tensor,
    stored in A's dtypes; drawn on CPU in float32 in key order, so the same on every device)."""
    gen = torch.Generator().manual_seed(int(seed))
    r = {
        k: torch.randn(A[k].shape, generator=gen, dtype=torch.float32).to(device=A[k].device, dtype=A[k].dtype)
        for k in keys
    }
    proj = _sum(keys, lambda k: (r[k].double() * e1[k].double()).sum())
    nr = math.sqrt(_sum(keys, lambda k: ((r[k].double() - proj * e1[k].double()) ** 2).sum()))
    for k in keys:
        r[k] = ((r[k].double() - proj * e1[k].double()) / nr).to(A[k].dtype)
    return r


def line(
    origin: Params,
    direction: Params | None = None,
    end: Params | None = None,
    normalize: bool = True,
    labels: Sequence[str] = ("A", "B"),
    max_memory: int | str | None = None,
) -> Line:
    """A 1-D slice θ(x) = origin + x·e₁.

    Give either ``direction`` (a parameter dict, e.g. B − A or a random direction) or ``end`` (a
    point: direction = end − origin). With ``normalize=True`` (default) e₁ is unit-norm and x is a
    Euclidean distance in parameter space; with ``normalize=False`` e₁ = direction (x = 1 reaches
    ``end``). ``coords`` holds {labels[0]: 0} and, when ``end`` is given, {labels[1]: x of end}.
    Memory: two model-size dicts (:func:`~losslens.geometry.surfaces.planes.estimate_memory`), checked against
    ``max_memory`` first.
    """
    if (direction is None) == (end is None):
        raise PlaneError("give exactly one of `direction` (a parameter dict) or `end` (a point)")
    if end is not None:
        keys = _float_keys([origin, end], labels[:2])

        def d(k):
            return end[k].double() - origin[k].double()
    else:
        keys = _float_keys([origin, direction], [labels[0], "direction"])

        def d(k):
            return direction[k].double()

    estimate_memory(origin, max_memory, "line")
    nd = math.sqrt(_sum(keys, lambda k: (d(k) ** 2).sum()))
    if nd == 0:
        raise PlaneError("degenerate line: the direction is zero (end equals origin)")
    e1 = {k: (d(k) / nd if normalize else d(k)).to(origin[k].dtype) for k in keys}
    coords = {labels[0]: 0.0}
    if end is not None:
        coords[labels[1]] = nd if normalize else 1.0
    return Line(
        origin={k: origin[k].detach().clone() for k in keys},
        e1=e1,
        coords=coords,
        norms={"|direction|": nd, "|e1|": 1.0 if normalize else nd},
        scale=(nd if normalize else 1.0) if end is not None else 1.0,
        meta={"normalize": normalize, "labels": list(labels)},
    )
