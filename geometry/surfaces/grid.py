"""The grid of plane coordinates a surface is evaluated on (docs/science.md §5).

:class:`GridSpec` covers every marked point of a :class:`~losslens.geometry.surfaces.planes.Plane` (or
:class:`~losslens.geometry.surfaces.planes.Line`) with a margin, or explicit ranges; :meth:`GridSpec.axes` gives the
float64 x and y axes; :func:`grid_axes` reads the ``grid`` argument of
:func:`~losslens.geometry.surfaces.surface.evaluate_surface` (a spec, a resolution or explicit axes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from losslens.geometry.surfaces.moving import SurfaceError
from losslens.geometry.surfaces.planes import Line, Plane
from losslens.geometry.base.errors import LosslensError


class GridError(LosslensError, ValueError):
    """A grid specification cannot produce a grid (resolution < 2, empty range, ...)."""


@dataclass(frozen=True)
class GridSpec:
    """Grid of plane coordinates.

    Parameters
    ----------
    resolution : points per axis (int) or ``(nx, ny)``; each ≥ 2.
    margin : fraction of the marked points' extent added on each side of each axis (0.25 = 25%).
        An axis the points do not span (random planes, a point on the x axis) gets the half-width
        ``max(plane.scale, the other axis' extent / 2)`` around the points.
    x_range, y_range : explicit ``(lo, hi)`` ranges overriding the automatic ones.
    """

    resolution: int | tuple[int, int] = 21
    margin: float = 0.25
    x_range: tuple[float, float] | None = None
    y_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        nx, ny = self.shape
        if nx < 2 or ny < 2:
            raise GridError(f"grid resolution must be at least 2 points per axis, got {self.resolution!r}")
        if self.margin < 0 or not math.isfinite(self.margin):
            raise GridError(f"margin must be a finite non-negative fraction, got {self.margin!r}")
        for name, r in (("x_range", self.x_range), ("y_range", self.y_range)):
            if r is not None and not (len(r) == 2 and math.isfinite(r[0]) and math.isfinite(r[1]) and r[1] > r[0]):
                raise GridError(f"{name} must be (lo, hi) with lo < hi, got {r!r}")

    @property
    def shape(self) -> tuple[int, int]:
        """(nx, ny)."""
        r = self.resolution
        if isinstance(r, (tuple, list)):
            if len(r) != 2:
                raise GridError(f"resolution must be an int or (nx, ny), got {r!r}")
            return int(r[0]), int(r[1])
        return int(r), int(r)

    def axes(self, plane: Plane | Line | Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(x[nx], y[ny]) float64 grid axes covering every marked point of ``plane`` with the margin."""
        nx, ny = self.shape
        coords: dict = {}
        scale = 1.0
        if isinstance(plane, Line):
            plane = plane.as_plane()
        if isinstance(plane, Plane):
            coords, scale = plane.coords, plane.scale
        elif isinstance(plane, Mapping):
            coords = plane.get("coords", {})
            scale = float(plane.get("scale", 1.0))
        pts = np.array([[float(c[0]), float(c[1])] for c in coords.values()]) if coords else np.zeros((1, 2))
        lo, hi = pts.min(axis=0), pts.max(axis=0)
        ext = hi - lo
        ranges = []
        for i, explicit in enumerate((self.x_range, self.y_range)):
            if explicit is not None:
                ranges.append((float(explicit[0]), float(explicit[1])))
                continue
            if ext[i] > 1e-12 * max(1.0, float(np.abs(pts).max())):
                pad = self.margin * ext[i]
                ranges.append((lo[i] - pad, hi[i] + pad))
            else:
                half = max(scale, ext[1 - i] / 2)
                ranges.append((lo[i] - half, hi[i] + half))
        x = np.linspace(ranges[0][0], ranges[0][1], nx)
        y = np.linspace(ranges[1][0], ranges[1][1], ny)
        return x, y


def grid_axes(grid: GridSpec | int | tuple, plane: Plane) -> tuple[np.ndarray, np.ndarray]:
    """(x[nx], y[ny]) float64 axes of ``grid`` on ``plane``: a :class:`GridSpec`, an int resolution,
    ``(nx, ny)`` or explicit ``(x_axis, y_axis)`` arrays (non-empty, finite; else
    :class:`~losslens.geometry.surfaces.moving.SurfaceError`)."""
    if isinstance(grid, GridSpec):
        return grid.axes(plane)
    if isinstance(grid, int):
        return GridSpec(resolution=grid).axes(plane)
    if isinstance(grid, (tuple, list)) and len(grid) == 2 and not isinstance(grid[0], (int, float)):
        x, y = np.asarray(grid[0], float).ravel(), np.asarray(grid[1], float).ravel()
        if len(x) < 1 or len(y) < 1 or not (np.isfinite(x).all() and np.isfinite(y).all()):
            raise SurfaceError("explicit grid axes must be non-empty and finite")
        return x, y
    if isinstance(grid, (tuple, list)) and len(grid) == 2:
        return GridSpec(resolution=(int(grid[0]), int(grid[1]))).axes(plane)
    raise SurfaceError(f"grid must be a GridSpec, an int resolution, (nx, ny) or (x_axis, y_axis); got {grid!r}")
