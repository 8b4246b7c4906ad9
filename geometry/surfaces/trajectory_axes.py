"""The principal axes of a trajectory as data (:class:`TrajectoryPCA`, computed by
:func:`losslens.geometry.surfaces.trajectory_pca.trajectory_pca`; every definition is in that module's
docstring) and further points projected onto them (:class:`ProjectedPoint`).

:meth:`TrajectoryPCA.plane` gives the :class:`~losslens.geometry.surfaces.planes.Plane` of two axes (sharing
the centre and axes, no copy); :meth:`TrajectoryPCA.project` projects a point (a quantized Θ̂, a LAWA
checkpoint): coordinates (θ − c)·e_j and its residual from the plane, or the least-squares fit on
filter-normalised axes. Cost of a projection: one pass over the point, one slice of at most
``CHUNK_ELEMENTS`` numbers at a time, in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from losslens.geometry.surfaces.planes import Plane, PlaneError
from losslens.geometry.surfaces.sources import PointSource, as_rows, as_source, chunk_rows, row_count

__all__ = ["TrajectoryPCA", "ProjectedPoint", "TrajectoryPCAError", "CHUNK_ELEMENTS"]

#: Numbers per slice read from each source (1 Mi: 8 MB of float64 per checkpoint).
CHUNK_ELEMENTS = 1 << 20


class TrajectoryPCAError(PlaneError):
    """The checkpoints cannot give the asked principal components (too few, equal, mismatched)."""


@dataclass
class ProjectedPoint:
    """A point projected onto the trajectory's axes.

    Attributes
    ----------
    label : the point's name.
    coords : ``[k]`` coordinates on the axes (parameter-space units).
    distance : ‖θ − c‖, its distance from the centre.
    residual : its distance from the plane of ``axes``.
    axes : the pair of axes the residual refers to.
    """

    label: str
    coords: np.ndarray
    distance: float
    residual: float
    axes: tuple[int, int] = (0, 1)

    @property
    def relative_residual(self) -> float:
        """residual / distance (0 for the centre itself): how far off the plane, as a fraction."""
        return float(self.residual / self.distance) if self.distance > 0 else 0.0

    def describe(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "coords": [float(v) for v in self.coords],
            "distance": float(self.distance),
            "residual": float(self.residual),
            "relative_residual": self.relative_residual,
            "axes": list(self.axes),
        }


@dataclass
class TrajectoryPCA:
    """Principal axes of a set of checkpoints (see the module docstring for every definition).

    Attributes
    ----------
    center : ``{name: Tensor}`` the centre c (float32 or wider).
    directions : k dicts, the axes e_1..e_k (unit-norm and orthogonal unless filter-normalised).
    labels : the N checkpoints' labels, in the order given.
    coords : ``[N, k]`` float64 coordinates of the checkpoints.
    singular_values : ``[k]`` σ_j; ``explained_variance_ratio`` : ``[k]`` λ_j / Σ λ.
    eigenvalues : ``[N]`` all λ of G (descending), ``eigenvectors`` : ``[N, N]`` U (sign-fixed).
    center_label : ``"mean"`` or the label of the checkpoint used as centre.
    meta : settings (filter normalisation, parameter globs, slice size, sign rule).
    """

    center: dict[str, torch.Tensor]
    directions: list[dict[str, torch.Tensor]]
    labels: list[str]
    coords: np.ndarray
    singular_values: np.ndarray
    explained_variance_ratio: np.ndarray
    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    center_label: str = "mean"
    meta: dict[str, Any] = field(default_factory=dict)
    _fit: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    @property
    def k(self) -> int:
        return len(self.directions)

    @property
    def distances(self) -> np.ndarray:
        """``[N]`` ‖θ_i − c‖."""
        lam = np.clip(self.eigenvalues, 0.0, None)
        return np.sqrt(np.clip((self.eigenvectors**2) @ lam, 0.0, None))

    def plane_coords(self, axes: tuple[int, int] = (0, 1)) -> np.ndarray:
        """``[N, 2]`` the checkpoints' coordinates on the plane of ``axes``."""
        if axes in self._fit:
            return self._fit[axes][0]
        return self.coords[:, list(axes)]

    def residuals(self, axes: tuple[int, int] = (0, 1)) -> np.ndarray:
        """``[N]`` each checkpoint's distance from the plane of ``axes``."""
        if axes in self._fit:
            return self._fit[axes][1]
        keep = np.ones(len(self.eigenvalues), bool)
        keep[list(axes)] = False
        lam = np.clip(self.eigenvalues, 0.0, None) * keep
        return np.sqrt(np.clip((self.eigenvectors**2) @ lam, 0.0, None))

    def plane(self, axes: tuple[int, int] = (0, 1), points: Sequence[ProjectedPoint] = ()) -> Plane:
        """The :class:`~losslens.geometry.surfaces.planes.Plane` c + x·e_a + y·e_b, its marked points the
        checkpoints (and ``points``). Shares the centre and axes (no copy)."""
        a, b = _check_axes(axes, self.k)
        xy = self.plane_coords((a, b))
        coords = {lab: (float(x), float(y)) for lab, (x, y) in zip(self.labels, xy)}
        for p in points:
            coords[p.label] = (float(p.coords[a]), float(p.coords[b]))
        norms = {f"explained variance PC{j + 1}": float(r) for j, r in enumerate(self.explained_variance_ratio)}
        return Plane(
            origin=self.center,
            e1=self.directions[a],
            e2=self.directions[b],
            coords=coords,
            norms=norms,
            kind="trajectory-pca",
            scale=float(max(self.singular_values[a], 1e-12)),
            meta={**self.meta, "axes": [a, b], "center": self.center_label},
        )

    def project(
        self, point: PointSource | Mapping[str, torch.Tensor], label: str | None = None, axes: tuple[int, int] = (0, 1)
    ) -> ProjectedPoint:
        """Coordinates of ``point`` on every axis and its residual from the plane of ``axes``.
        Cost: one pass over the point (one slice at a time, float64)."""
        a, b = _check_axes(axes, self.k)
        src = as_source(point, label)
        names = list(self.center)
        _check_same(names, [src], self.center)
        step = int(self.meta.get("chunk_elements", CHUNK_ELEMENTS))
        dots, dd, gram = np.zeros(self.k), 0.0, np.zeros((self.k, self.k))
        for name in names:
            shape = tuple(self.center[name].shape)
            rows = row_count(shape)
            c_rows = as_rows(self.center[name])
            d_rows = [as_rows(d[name]) for d in self.directions]
            for lo in range(0, rows, chunk_rows(shape, step)):
                hi = min(rows, lo + chunk_rows(shape, step))
                diff = src.rows(name, lo, hi).to(torch.float64) - c_rows[lo:hi].to(torch.float64)
                e = torch.stack([d[lo:hi].to(torch.float64).reshape(-1) for d in d_rows])
                dots += (e @ diff.reshape(-1)).numpy()
                gram += (e @ e.T).numpy()
                dd += float(diff.reshape(-1) @ diff.reshape(-1))
        if self.meta.get("filter_normalize"):
            pair = np.array([a, b])
            sub = gram[np.ix_(pair, pair)]
            xy = np.linalg.solve(sub, dots[pair])
            coords = np.zeros(self.k)
            coords[pair] = xy
            res2 = dd - 2 * xy @ dots[pair] + xy @ sub @ xy
        else:
            coords = dots
            res2 = dd - dots[a] ** 2 - dots[b] ** 2
        return ProjectedPoint(src.label, coords, float(np.sqrt(max(dd, 0.0))), float(np.sqrt(max(res2, 0.0))), (a, b))

    def describe(self, axes: tuple[int, int] = (0, 1)) -> dict[str, Any]:
        """JSON-ready summary: explained variance ratios, every checkpoint's coordinates and residual."""
        res, dist = self.residuals(axes), self.distances
        return {
            "k": self.k,
            "n_checkpoints": len(self.labels),
            "center": self.center_label,
            "axes": list(axes),
            "explained_variance_ratio": [float(v) for v in self.explained_variance_ratio],
            "singular_values": [float(v) for v in self.singular_values],
            "checkpoints": [
                {
                    "label": lab,
                    "coords": [float(v) for v in self.coords[i]],
                    "plane_coords": [float(v) for v in self.plane_coords(axes)[i]],
                    "distance": float(dist[i]),
                    "residual": float(res[i]),
                    "relative_residual": float(res[i] / dist[i]) if dist[i] > 0 else 0.0,
                }
                for i, lab in enumerate(self.labels)
            ],
            "meta": {k: v for k, v in self.meta.items()},
        }


def _check_axes(axes: Sequence[int], k: int) -> tuple[int, int]:
    a, b = (int(v) for v in axes)
    if a == b or not (0 <= a < k and 0 <= b < k):
        raise TrajectoryPCAError(f"axes must be two different indices below k={k}, got {tuple(axes)}")
    return a, b


def _check_same(names: Sequence[str], sources: Sequence[PointSource], ref: Mapping[str, torch.Tensor] | None = None):
    first = sources[0] if ref is None else None
    for src in sources:
        have = set(src.names())
        missing = [n for n in names if n not in have]
        if missing:
            raise TrajectoryPCAError(
                f"point {src.label!r} lacks parameters {missing[:4]}: all points must come from one architecture"
            )
        for n in names:
            want = tuple(ref[n].shape) if ref is not None else first.shape(n)
            if tuple(src.shape(n)) != want:
                raise TrajectoryPCAError(
                    f"parameter {n!r} has shape {tuple(src.shape(n))} in {src.label!r} but "
                    f"{want} elsewhere: different architectures cannot share a plane"
                )
