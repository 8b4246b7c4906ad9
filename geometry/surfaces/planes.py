"""Planes and lines through parameter space (docs/science.md §5).

Points are parameter dicts ``{name: Tensor}`` (state-dict-like pytrees). Nothing here needs a model:
a plane is an origin plus two direction dicts, a line an origin plus one.

- :func:`plane_through_points` -- the *quantization plane* through A = Θ_K, B = Θ_{K−1},
  C = Θ̂_K: u = B − A, v = C − A over the flattened vector of all floating-point keys,
  e₁ = u/‖u‖, e₂ = (v − (v·e₁)e₁)/‖v − (v·e₁)e₁‖ (Gram–Schmidt). Coordinates A = (0, 0),
  B = (‖u‖, 0), C = (v·e₁, ‖v − (v·e₁)e₁‖), all computed in float64. Plane points are
  θ(x, y) = A + x·e₁ + y·e₂, x and y in parameter-space (Euclidean) units.
- :func:`~geometry.surfaces.random_planes.random_plane` -- two seeded Gaussian directions,
  filter-normalised (Li et al. 2018): :mod:`geometry.surfaces.random_planes`.
- :func:`line` -- a 1-D slice origin + x·e₁.

Cost: every constructor makes a constant number of passes over the parameters, one key at a time
(float64 temporaries of one tensor at a time), and stores the directions in the dtype of the origin.
Memory: the plane holds three dicts the size of the model (origin, e₁, e₂), a line two;
:func:`estimate_memory` states it and every constructor checks it against ``max_memory`` first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from ..base.jsonable import jsonable
from ..memory.model import MemoryEstimate, first_fitting, resolve_budget
from ..base.errors import LosslensError

Params = Mapping[str, torch.Tensor]


class PlaneError(LosslensError, ValueError):
    """The points do not define a plane (different architectures, coincident or collinear points)."""


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _float_keys(points: Sequence[Params], labels: Sequence[str]) -> list[str]:
    """Keys shared by all points (same order as the first), checked for architecture equality."""
    first = points[0]
    keys = list(first.keys())
    for lab, p in zip(labels[1:], points[1:]):
        missing = [k for k in keys if k not in p]
        extra = [k for k in p if k not in first]
        if missing or extra:
            raise PlaneError(
                f"point {labels[0]!r} and point {lab!r} have different parameter names "
                f"(missing in {lab!r}: {missing[:4]}, extra: {extra[:4]}); they come from different "
                "architectures and cannot span a plane"
            )
        for k in keys:
            if tuple(first[k].shape) != tuple(p[k].shape):
                raise PlaneError(
                    f"parameter {k!r} has shape {tuple(first[k].shape)} in {labels[0]!r} but "
                    f"{tuple(p[k].shape)} in {lab!r}: different architectures cannot span a plane"
                )
    out = []
    for k in keys:
        if torch.is_floating_point(first[k]):
            out.append(k)
        else:  # integer buffers cannot move along a plane; they must agree
            for lab, p in zip(labels[1:], points[1:]):
                if not torch.equal(first[k].cpu(), p[k].cpu()):
                    raise PlaneError(f"non-floating entry {k!r} differs between {labels[0]!r} and {lab!r}")
    if not out:
        raise PlaneError("the points have no floating-point parameters")
    return out


def _dot(a: Params, b: Params, keys: Sequence[str]) -> float:
    """float64 inner product over ``keys`` (one tensor at a time)."""
    s = 0.0
    for k in keys:
        s += float(torch.sum(a[k].double() * b[k].double()))
    return s


def _norm(a: Params, keys: Sequence[str]) -> float:
    return math.sqrt(max(_dot(a, a, keys), 0.0))


# --------------------------------------------------------------------------------------------
# Plane and Line
# --------------------------------------------------------------------------------------------
@dataclass
class Plane:
    """A 2-D affine slice θ(x, y) = origin + x·e1 + y·e2 of parameter space.

    Attributes
    ----------
    origin, e1, e2 : dict name -> Tensor (the origin's shapes, dtype and device).
    coords : label -> (x, y) coordinates of the marked points (e.g. A, B, C), float64-exact.
    norms : named scalars describing the plane (``|B-A|``, ``|C-A|``, ``cos(B-A,C-A)``, ``|e1|``...).
    kind : ``"points"`` (through three points), ``"points+random"`` (degenerate points with the
        random fallback), ``"random"`` (Li et al.), ``"line"`` (a :class:`Line` promoted to a plane).
    scale : a natural half-width of the plot when the marked points do not span an axis
        (random planes: 1.0 = one filter-normalised direction length).
    meta : free-form provenance (seed, filter normalisation settings, labels).
    """

    origin: dict[str, torch.Tensor]
    e1: dict[str, torch.Tensor]
    e2: dict[str, torch.Tensor]
    coords: dict[str, tuple[float, float]]
    norms: dict[str, float]
    kind: str
    scale: float = 1.0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """Parameter names the plane moves."""
        return list(self.origin.keys())

    @property
    def dim(self) -> int:
        return int(sum(t.numel() for t in self.origin.values()))

    def point(self, x: float, y: float) -> dict[str, torch.Tensor]:
        """θ(x, y) = origin + x·e1 + y·e2 as a new dict (allocates one model-sized copy)."""
        return {k: torch.add(o, self.e1[k], alpha=float(x)).add_(self.e2[k], alpha=float(y)) for k, o in self.origin.items()}

    def describe(self) -> dict[str, Any]:
        """JSON-able metadata (no tensors): kind, coords, norms, scale, dim, meta."""
        return {
            "kind": self.kind,
            "coords": {k: [float(v[0]), float(v[1])] for k, v in self.coords.items()},
            "norms": {k: float(v) for k, v in self.norms.items()},
            "scale": float(self.scale),
            "dim": self.dim,
            "n_tensors": len(self.origin),
            "meta": jsonable(self.meta),
        }


@dataclass
class Line:
    """A 1-D slice θ(x) = origin + x·e1 (``e1`` unit-norm unless built with ``normalize=False``).

    ``coords`` maps labels to x; ``norms`` holds ``|direction|`` (and ``|e1|``).
    """

    origin: dict[str, torch.Tensor]
    e1: dict[str, torch.Tensor]
    coords: dict[str, float]
    norms: dict[str, float]
    kind: str = "line"
    scale: float = 1.0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.origin.keys())

    def point(self, x: float) -> dict[str, torch.Tensor]:
        return {k: torch.add(o, self.e1[k], alpha=float(x)) for k, o in self.origin.items()}

    def as_plane(self) -> Plane:
        """This line as a plane with a zero second direction (so the grid code can evaluate it)."""
        return Plane(
            origin=self.origin,
            e1=self.e1,
            e2={k: torch.zeros_like(v) for k, v in self.e1.items()},
            coords={k: (float(x), 0.0) for k, x in self.coords.items()},
            norms=dict(self.norms),
            kind="line",
            scale=self.scale,
            meta=dict(self.meta),
        )

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "coords": {k: float(v) for k, v in self.coords.items()},
            "norms": {k: float(v) for k, v in self.norms.items()},
            "scale": float(self.scale),
            "meta": jsonable(self.meta),
        }


# --------------------------------------------------------------------------------------------
# constructors
# --------------------------------------------------------------------------------------------
def estimate_memory(A: Params, max_memory=None, kind: str = "points") -> MemoryEstimate:
    """Memory of building a plane (``kind`` ``"points"``/``"random"``) or line (``"line"``) from
    points like ``A``: the result holds the origin and one direction per axis in A's dtypes
    (3 model-size dicts for a plane, 2 for a line); temporaries are float64 copies of one tensor at
    a time (three of the largest). Raises :class:`~geometry.memory.model.MemoryBudgetError` when over
    ``max_memory`` (default: :func:`geometry.memory.model.default_budget` of A's device)."""
    keys = [k for k, t in A.items() if torch.is_floating_point(t)]
    if not keys:
        raise PlaneError("the point has no floating-point parameters")
    model = sum(A[k].numel() * A[k].element_size() for k in keys)
    largest = max(A[k].numel() for k in keys) * 8
    n = 2 if kind == "line" else 3
    device = A[keys[0]].device
    parts = {f"origin and {n - 1} direction(s) ({n} model-size dicts)": n * model,
             "float64 temporaries (one tensor at a time)": 3 * largest}
    return first_fitting([MemoryEstimate(parts, resolve_budget(max_memory, device), {"kind": kind})],
                         f"a {kind} plane" if kind != "line" else "a line",
                         "select fewer tensors (e.g. only the quantized matrices), or raise max_memory")


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
    max_memory : bytes (or ``"8GB"``) the construction may allocate (:func:`estimate_memory`).
    copy_origin : ``False`` makes A's tensors the plane's origin without a copy (saves one model of
        memory when the caller owns A and will not modify it).

    Returns
    -------
    Plane with ``kind="points"`` (or ``"points+random"``), ``coords`` {A: (0, 0), B: (‖u‖, 0),
    C: (v·e₁, ‖v⊥‖)} computed in float64, and ``norms`` {``|B-A|``, ``|C-A|``, ``cos(B-A,C-A)``,
    ``|A|``}. e₁, e₂ are stored in A's dtype.

    Cost: four passes over the parameters, each in float64 one tensor at a time; e₁ and e₂ are
    formed in float64 per tensor and stored in A's dtype. Memory: :func:`estimate_memory`.
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
    uu, vv, uv = (_sum(keys, lambda k: (u(k) * u(k)).sum()), _sum(keys, lambda k: (v(k) * v(k)).sum()),
                  _sum(keys, lambda k: (u(k) * v(k)).sum()))
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
                "direction, or use geometry.surfaces.planes.line for a 1-D slice."
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
        c1 = uv / nu                                          # v·e₁, exactly from the float64 scalars
        nw = math.sqrt(_sum(keys, lambda k: ((v(k) - (c1 / nu) * u(k)) ** 2).sum()))
        if nw <= tol * max(nv, 1e-30) or c_eq_a:
            if fallback != "random":
                what = f"{lc!r} equals {la!r}" if c_eq_a else f"{lc!r} lies on the line through {la!r} and {lb!r}"
                raise PlaneError(
                    f"degenerate plane: {what} (distance from the line {nw:.3g}, ‖{lc}−{la}‖ = {nv:.3g}); "
                    "the three points do not span a plane. Pass fallback='random' to use a random second "
                    "direction, or use geometry.surfaces.planes.line for a 1-D slice."
                )
            e2 = _random_orthogonal(A, keys, e1, seed)
            kind = "points+random"
        else:
            e2 = {k: ((v(k) - (c1 / nu) * u(k)) / nw).to(A[k].dtype) for k in keys}
    if kind == "points":  # the definitions, exactly
        coords = {la: (0.0, 0.0), lb: (nu, 0.0), lc: (c1, nw)}
    else:
        coords = {la: (0.0, 0.0),
                  lb: (_sum(keys, lambda k: (u(k) * e1_64(k)).sum()), _sum(keys, lambda k: (u(k) * e2[k].double()).sum())),
                  lc: (_sum(keys, lambda k: (v(k) * e1_64(k)).sum()), _sum(keys, lambda k: (v(k) * e2[k].double()).sum()))}
    cos_uv = uv / (nu * nv) if nu > 0 and nv > 0 else float("nan")
    norms = {f"|{lb}-{la}|": nu, f"|{lc}-{la}|": nv, f"cos({lb}-{la},{lc}-{la})": cos_uv, f"|{la}|": norm_a}
    origin = {k: (A[k].detach().clone() if copy_origin else A[k].detach()) for k in keys}
    xs = [c[0] for c in coords.values()]
    ys = [c[1] for c in coords.values()]
    scale = max(max(xs) - min(xs), max(ys) - min(ys), 1e-12) / 2
    return Plane(origin, e1, e2, coords, norms, kind, scale=scale,
                 meta={"labels": list(labels), "fallback": fallback, "seed": seed if kind != "points" else None})


def _sum(keys: Sequence[str], term) -> float:
    """Σ over keys of a float64 scalar ``term(k)`` (each evaluated on one tensor at a time)."""
    return float(sum(float(term(k)) for k in keys))


def _random_orthogonal(A: Params, keys: Sequence[str], e1: Params, seed: int) -> dict[str, torch.Tensor]:
    """A seeded random unit direction orthogonal to ``e1`` (Gram–Schmidt in float64 per tensor,
    stored in A's dtypes; drawn on CPU in float32 in key order, so the same on every device)."""
    gen = torch.Generator().manual_seed(int(seed))
    r = {k: torch.randn(A[k].shape, generator=gen, dtype=torch.float32).to(device=A[k].device, dtype=A[k].dtype)
         for k in keys}
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
    Memory: two model-size dicts (:func:`estimate_memory`), checked against ``max_memory`` first.
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


def orthonormality(plane: Plane) -> dict[str, float]:
    """float64 Gram entries of the plane's basis: {"e1.e1", "e2.e2", "e1.e2"} (1, 1, 0 when orthonormal)."""
    keys = plane.names
    return {"e1.e1": _dot(plane.e1, plane.e1, keys), "e2.e2": _dot(plane.e2, plane.e2, keys),
            "e1.e2": _dot(plane.e1, plane.e2, keys)}
