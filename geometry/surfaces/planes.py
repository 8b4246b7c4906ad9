"""Planes and lines through parameter space as data (docs/science.md §5).

Points are parameter dicts ``{name: Tensor}`` (state-dict-like pytrees). Nothing here needs a model:
a :class:`Plane` is an origin plus two direction dicts, a :class:`Line` an origin plus one.
They are built by

- :func:`~losslens.geometry.surfaces.point_planes.plane_through_points` -- the *quantization plane* through
  A = Θ_K, B = Θ_{K−1}, C = Θ̂_K, and :func:`~losslens.geometry.surfaces.point_planes.line` -- a 1-D slice
  origin + x·e₁ (:mod:`losslens.geometry.surfaces.point_planes`);
- :func:`~losslens.geometry.surfaces.random_planes.random_plane` -- two seeded Gaussian directions,
  filter-normalised (Li et al. 2018): :mod:`losslens.geometry.surfaces.random_planes`;
- :meth:`losslens.geometry.surfaces.trajectory_axes.TrajectoryPCA.plane` -- the top principal axes of a
  trajectory.

Memory: a plane holds three dicts the size of the model (origin, e₁, e₂), a line two;
:func:`estimate_memory` states it and every constructor checks it against ``max_memory`` first.
:func:`orthonormality` gives the float64 Gram entries of a plane's basis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from losslens.geometry.base.jsonable import jsonable
from losslens.geometry.memory.model import MemoryEstimate, first_fitting
from losslens.geometry.memory.budget import resolve_budget
from losslens.geometry.base.errors import LosslensError

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
        return {
            k: torch.add(o, self.e1[k], alpha=float(x)).add_(self.e2[k], alpha=float(y)) for k, o in self.origin.items()
        }

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
# memory and checks
# --------------------------------------------------------------------------------------------
def estimate_memory(A: Params, max_memory=None, kind: str = "points") -> MemoryEstimate:
    """Memory of building a plane (``kind`` ``"points"``/``"random"``) or line (``"line"``) from
    points like ``A``: the result holds the origin and one direction per axis in A's dtypes
    (3 model-size dicts for a plane, 2 for a line); temporaries are float64 copies of one tensor at
    a time (three of the largest). Raises :class:`~losslens.geometry.memory.budget.MemoryBudgetError` when over
    ``max_memory`` (default: :func:`losslens.geometry.memory.budget.default_budget` of A's device)."""
    keys = [k for k, t in A.items() if torch.is_floating_point(t)]
    if not keys:
        raise PlaneError("the point has no floating-point parameters")
    model = sum(A[k].numel() * A[k].element_size() for k in keys)
    largest = max(A[k].numel() for k in keys) * 8
    n = 2 if kind == "line" else 3
    device = A[keys[0]].device
    parts = {
        f"origin and {n - 1} direction(s) ({n} model-size dicts)": n * model,
        "float64 temporaries (one tensor at a time)": 3 * largest,
    }
    return first_fitting(
        [MemoryEstimate(parts, resolve_budget(max_memory, device), {"kind": kind})],
        f"a {kind} plane" if kind != "line" else "a line",
        "select fewer tensors (e.g. only the quantized matrices), or raise max_memory",
    )


def orthonormality(plane: Plane) -> dict[str, float]:
    """float64 Gram entries of the plane's basis: {"e1.e1", "e2.e2", "e1.e2"} (1, 1, 0 when orthonormal)."""
    keys = plane.names
    return {
        "e1.e1": _dot(plane.e1, plane.e1, keys),
        "e2.e2": _dot(plane.e2, plane.e2, keys),
        "e1.e2": _dot(plane.e1, plane.e2, keys),
    }
