"""Loss on a plane (or a line) of parameter space, evaluated on a grid (docs/science.md §5).

:func:`evaluate_surface` moves the model's weights to θ(x, y) = origin + x·e₁ + y·e₂ for every grid
point and evaluates ``loss_fn`` over a fixed set of batches. The model is never copied: the moved
tensors are written in place (``t.copy_(origin).add_(e1, alpha=x).add_(e2, alpha=y)``) and the
original tensors -- cloned once before the first point -- are copied back at the end (also on
error or Ctrl-C), so the model is restored bit-exactly (the machinery: :mod:`losslens.geometry.surfaces.moving`).
:class:`Surface` and :class:`Profile` are plain data; their figures are drawn in
:mod:`losslens.study.report.surface_figures`.

Batching work per forward (the measured throughput, and the machine it was measured on, are in
``benchmarks/README.md``, section "Loss surfaces"):

- ``points_per_forward=k > 1`` evaluates k grid points in one vmapped forward
  (:func:`torch.func.functional_call` under :func:`torch.func.vmap` over stacked weights). On CPU
  it was slower than in-place evaluation (CPU matmuls are already compute-bound and SDPA has no
  vmap batching rule), so the default is ``1`` (in place). vmap may pay off on a GPU with a tiny
  model (unmeasured).
- ``merge_batches=True`` concatenates the evaluation batches into one forward per grid point
  (fewer, larger matmuls; less per-call overhead). Valid for losses that are means over batch
  rows; opt-in.

The marked points are always evaluated in place, batch by batch, like a direct evaluation.

Resuming. With ``checkpoint_path`` (a ``.npz`` file) every finished grid row is written atomically;
a rerun with the same plane, grid and data skips the finished rows. A file written for a different
plane/grid/data raises :class:`SurfaceError` rather than being overwritten
(:mod:`losslens.geometry.surfaces.resume`).

NaN. A non-finite loss at a grid point is kept (NaN/inf in ``Surface.loss``), counted in
``Surface.n_nonfinite``, reported with a warning, and drawn as a hole (never interpolated). A
non-finite loss at a *marked* point (A, B, the quantized C) raises :class:`SurfaceError`: the
surface is drawn around those points and means nothing without them.

Cost: (nx·ny + number of marked points) × len(batches) forward passes, plus two passes over the
moved parameters per point; memory: one clone of the moved parameters (plus the plane's tensors
moved to the model's device/dtype when they differ).
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from losslens.geometry.base.batches import normalise_batch_weights
from losslens.geometry.surfaces.grid import GridSpec, grid_axes
from losslens.geometry.base.modes import module_modes
from losslens.geometry.surfaces.moving import (
    LossFn,
    PlaneMover,
    SurfaceError,
    concat_batches,
    estimate_memory,
    evaluate_point,
    evaluate_stacked,
    planned_forward_bytes,
)
from losslens.geometry.base.params import ParamGlobs
from losslens.geometry.base.progress import ProgressArg
from losslens.geometry.surfaces.planes import Line, Plane
from losslens.geometry.surfaces.resume import load_rows, save_rows, surface_fingerprint


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------
def _nan_to_none(a: np.ndarray) -> list:
    return [None if not math.isfinite(v) else float(v) for v in np.asarray(a, dtype=float).ravel()]


@dataclass
class Surface:
    """Loss on a grid of a plane.

    Attributes
    ----------
    x : float64 [nx] plane coordinates along e₁; y : float64 [ny] along e₂.
    loss : float64 [ny, nx]; ``loss[j, i]`` is the loss at (x[i], y[j]); NaN where non-finite.
    points : label -> (x, y, loss) of the marked points (A, B, C ...), evaluated directly.
    plane : the plane's metadata (:meth:`Plane.describe`: kind, coords, norms, scale, meta).
    n_nonfinite : number of grid points whose loss was NaN/inf (kept as holes).
    seconds : wall time of the evaluation; meta : data and throughput facts (n_batches,
        points_per_second, forwards, loss name, resumed rows ...).
    """

    x: np.ndarray
    y: np.ndarray
    loss: np.ndarray
    points: dict[str, tuple[float, float, float]]
    plane: dict[str, Any] = field(default_factory=dict)
    n_nonfinite: int = 0
    seconds: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.x = np.asarray(self.x, dtype=float)
        self.y = np.asarray(self.y, dtype=float)
        self.loss = np.asarray(self.loss, dtype=float).reshape(len(self.y), len(self.x))

    # -- data -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (non-finite losses as ``None``)."""
        return {
            "x": self.x.tolist(),
            "y": self.y.tolist(),
            "loss": [_nan_to_none(row) for row in self.loss],
            "points": {
                k: [float(v[0]), float(v[1]), (float(v[2]) if math.isfinite(v[2]) else None)]
                for k, v in self.points.items()
            },
            "plane": self.plane,
            "n_nonfinite": int(self.n_nonfinite),
            "seconds": float(self.seconds),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Surface":
        loss = np.array([[np.nan if v is None else v for v in row] for row in d["loss"]], dtype=float)
        points = {
            k: (float(v[0]), float(v[1]), float("nan") if v[2] is None else float(v[2])) for k, v in d["points"].items()
        }
        return cls(
            np.array(d["x"], float),
            np.array(d["y"], float),
            loss,
            points,
            dict(d.get("plane", {})),
            int(d.get("n_nonfinite", 0)),
            float(d.get("seconds", 0.0)),
            dict(d.get("meta", {})),
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_dict` as JSON."""
        with open(path, "w") as fh:
            json.dump(self.to_dict(), fh)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Surface":
        with open(path) as fh:
            return cls.from_dict(json.load(fh))

    def at(self, x: float, y: float) -> float:
        """Loss at the grid node nearest to (x, y)."""
        return float(self.loss[int(np.argmin(np.abs(self.y - y))), int(np.argmin(np.abs(self.x - x)))])


@dataclass
class Profile:
    """Loss along a line: x [n], loss [n] (NaN where non-finite), points label -> (x, loss)."""

    x: np.ndarray
    loss: np.ndarray
    points: dict[str, tuple[float, float]]
    line: dict[str, Any] = field(default_factory=dict)
    n_nonfinite: int = 0
    seconds: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "x": np.asarray(self.x, float).tolist(),
            "loss": _nan_to_none(self.loss),
            "points": {k: [float(v[0]), float(v[1]) if math.isfinite(v[1]) else None] for k, v in self.points.items()},
            "line": self.line,
            "n_nonfinite": int(self.n_nonfinite),
            "seconds": float(self.seconds),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Profile":
        return cls(
            np.array(d["x"], float),
            np.array([np.nan if v is None else v for v in d["loss"]], float),
            {k: (float(v[0]), float("nan") if v[1] is None else float(v[1])) for k, v in d["points"].items()},
            dict(d.get("line", {})),
            int(d.get("n_nonfinite", 0)),
            float(d.get("seconds", 0.0)),
            dict(d.get("meta", {})),
        )


# --------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------


def evaluate_surface(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any] | Any,
    plane: Plane | Line,
    grid: GridSpec | int | tuple = 21,
    params: ParamGlobs = None,
    points: Mapping[str, tuple[float, float]] | None = None,
    progress: ProgressArg = False,
    checkpoint_path: str | os.PathLike | None = None,
    weights: Sequence[float] | None = None,
    points_per_forward: int = 1,
    merge_batches: bool | int = False,
    max_memory: int | str | None = None,
) -> Surface:
    """Loss of ``model`` at every node of ``grid`` on ``plane`` and at the marked points.

    Parameters
    ----------
    model : the model whose tensors named in ``plane`` are moved (parameters or buffers; tied
        names are written consistently). Restored bit-exactly on return (and on error).
    loss_fn : ``loss_fn(model, batch) -> scalar`` mean loss (e.g. :func:`losslens.lm.core.next_token_loss.lm_loss`).
    batches : a non-empty sequence (or iterable, e.g. a TokenSet) of batches, reused at every point.
    plane : a :class:`Plane` (or a :class:`Line`, evaluated with y = 0).
    grid : :class:`GridSpec`, an int resolution, ``(nx, ny)``, or explicit ``(x_axis, y_axis)`` arrays.
    params : optional globs restricting which of the plane's tensors move (default: all of them).
    points : extra marked points ``{label: (x, y)}`` evaluated directly, in addition to the plane's
        marked points (``plane.coords``: A, B, C). Their losses equal direct evaluation of the
        model at those weights to float rounding of origin + x·e₁ + y·e₂.
    progress : the points done / planned with an ETA on stderr (True; a live bar on a terminal, plain
        lines in a pipe), or a :class:`~losslens.geometry.base.progress.Progress` / ``callable(n)``
        (:func:`losslens.geometry.base.progress.progress_bar`).
    checkpoint_path : ``.npz`` file to which finished rows are written; a rerun resumes there.
    weights : per-batch weights of the mean, normalised (default: ``loss_fn.batch_weight(batch)``
        when the loss carries it -- the predicted tokens of :func:`losslens.lm.core.next_token_loss.lm_loss`, so the
        pooled token mean --, else the batch size ``len(batch)``: :mod:`losslens.geometry.base.batches`).
    points_per_forward : grid points per vmapped forward (see module docstring; default 1).
    merge_batches : ``True`` concatenates all batches (``k``: groups of k) along dim 0 into one
        forward per grid node -- fewer, larger forwards (faster on CPU for small batches; measured in
        ``benchmarks/README.md``).
        Valid only when ``loss_fn`` is a mean over the rows of a batch (as
        :func:`losslens.lm.core.next_token_loss.lm_loss`
        with equal sequence lengths) and ``weights`` is None; the grid values then differ from
        batch-by-batch evaluation by float rounding only (~1e-7 relative). The marked points are
        always evaluated batch by batch, exactly as a direct evaluation would.

    max_memory : bytes (or ``"8GB"``) the evaluation may allocate beyond the model and the plane
        (:func:`losslens.geometry.surfaces.moving.estimate_memory`: one copy of the moved tensors, more when the plane's
        dtype/device differ or several points are vmapped, checked before any forward; then with the
        peak of one grid evaluation's forwards, planned from forwards of 1 and 2 rows of the largest
        batch at the model's own weights (:func:`losslens.geometry.surfaces.moving.planned_forward_bytes`),
        checked before the model is moved or any grid point is evaluated).

    Notes
    -----
    Returns a :class:`Surface`. Cost: (nx·ny + #points) × len(batches) forward passes. The model is
    in eval mode during the call (every module's own mode is restored after,
    :func:`losslens.geometry.base.modes.module_modes`). Autograd is off.
    """
    if isinstance(plane, Line):
        plane = plane.as_plane()
    if not isinstance(plane, Plane):
        raise SurfaceError(
            f"plane must be a losslens.geometry.surfaces.planes.Plane or Line, got {type(plane).__name__}"
        )
    batches = list(batches)
    if not batches:
        raise SurfaceError("no batches: the loss needs at least one batch")
    w = list(normalise_batch_weights(batches, weights, SurfaceError, loss_fn))
    grid_batches, grid_w = concat_batches(batches, w, merge_batches, weights)
    x, y = grid_axes(grid, plane)
    nx, ny = len(x), len(y)
    marked = {k: (float(v[0]), float(v[1])) for k, v in plane.coords.items()}
    if points:
        marked.update({k: (float(v[0]), float(v[1])) for k, v in points.items()})
    k_pts = int(points_per_forward)
    if k_pts < 1:
        raise SurfaceError(f"points_per_forward must be >= 1, got {points_per_forward}")

    estimate_memory(model, plane, params, k_pts, max_memory)  # the mover's copies, before any forward
    forward = planned_forward_bytes(model, loss_fn, list(grid_batches) + list(batches), k_pts)  # 1- and 2-row forwards
    estimate_memory(model, plane, params, k_pts, max_memory, forward=forward)  # the whole plan, before any point
    mover = PlaneMover(model, plane, params)

    fp = (
        surface_fingerprint(plane, x, y, batches, w, list(mover.names) + [f"merge={merge_batches}", f"vmap={k_pts}"])
        if checkpoint_path is not None
        else ""
    )
    if checkpoint_path is not None:
        checkpoint_path = os.fspath(checkpoint_path)
        loss, done = load_rows(checkpoint_path, fp, (ny, nx))
    else:
        loss, done = np.full((ny, nx), np.nan), np.zeros(ny, dtype=bool)
    resumed_rows = int(done.sum())

    from losslens.geometry.base.progress import progress_bar

    t0 = time.perf_counter()
    todo = int((~done).sum()) * nx + len(marked)
    bar = progress_bar(progress, todo, what="loss surface", unit="point")
    point_losses: dict[str, tuple[float, float, float]] = {}
    n_eval = 0
    try:
        with module_modes(model, training=False), torch.no_grad():
            for j in range(ny):
                if done[j]:
                    continue
                if k_pts == 1:
                    for i in range(nx):
                        mover.set(float(x[i]), float(y[j]))
                        loss[j, i] = evaluate_point(model, loss_fn, grid_batches, grid_w)
                        bar.update(1)
                else:
                    mover.restore()
                    for s in range(0, nx, k_pts):
                        xy = [(float(x[i]), float(y[j])) for i in range(s, min(nx, s + k_pts))]
                        vals = evaluate_stacked(model, loss_fn, grid_batches, grid_w, mover.stacked(xy))
                        loss[j, s : s + len(xy)] = vals
                        bar.update(len(xy))
                n_eval += nx
                done[j] = True
                if checkpoint_path is not None:
                    save_rows(checkpoint_path, fp, x, y, loss, done)
            for label, (px, py) in marked.items():
                mover.set(px, py)
                point_losses[label] = (px, py, evaluate_point(model, loss_fn, batches, w))
                bar.update(1)
    finally:
        mover.restore()
        bar.close()
    seconds = time.perf_counter() - t0
    bad = ~np.isfinite(loss)
    n_bad = int(bad.sum())
    loss = np.where(bad, np.nan, loss)
    bad_points = [k for k, v in point_losses.items() if not math.isfinite(v[2])]
    if n_bad:
        warnings.warn(
            f"{n_bad} of {nx * ny} grid points gave a non-finite loss; kept as NaN and drawn as holes",
            RuntimeWarning,
            stacklevel=2,
        )
    if bad_points:  # the surface is drawn around these points: without them it means nothing
        raise SurfaceError(
            f"the loss at marked point(s) {bad_points} is not finite "
            f"({', '.join(f'{k}: {point_losses[k][2]}' for k in bad_points)}): the weights at that point or the loss "
            "on these batches are NaN/inf. Check the checkpoint's weights (and the quantized ones for a quantization "
            "plane) before drawing its surface"
            + (f"; the grid rows done so far are kept in {checkpoint_path}" if checkpoint_path is not None else "")
        )
    n_points = n_eval + len(marked)
    meta = {
        "n_batches": len(batches),
        "batch_weights": w,
        "forwards": n_eval * len(grid_batches) + len(marked) * len(batches),
        "points_evaluated": n_points,
        "resumed_rows": resumed_rows,
        "points_per_second": n_points / seconds if seconds > 0 else float("nan"),
        "points_per_forward": k_pts,
        "grid_forwards_per_point": len(grid_batches),
        "loss_fn": getattr(loss_fn, "__qualname__", repr(loss_fn)),
        "moved_tensors": len(mover.names),
    }
    return Surface(x, y, loss, point_losses, plane.describe(), n_bad, seconds, meta)


def evaluate_line(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any] | Any,
    line: Line,
    xs: int | Sequence[float] | np.ndarray = 21,
    margin: float = 0.25,
    params: ParamGlobs = None,
    progress: bool = False,
    weights: Sequence[float] | None = None,
) -> Profile:
    """Loss along a :class:`Line` at ``xs`` (explicit positions, or a count covering the line's
    marked points with ``margin``). Same machinery and cost as :func:`evaluate_surface` with one row."""
    plane = line.as_plane()
    if isinstance(xs, (int, np.integer)):
        gx, _ = GridSpec(resolution=(int(xs), 2), margin=margin).axes(plane)
    else:
        gx = np.asarray(xs, float).ravel()
    s = evaluate_surface(
        model, loss_fn, batches, plane, (gx, np.array([0.0])), params=params, progress=progress, weights=weights
    )
    return Profile(
        s.x,
        s.loss[0],
        {k: (v[0], v[2]) for k, v in s.points.items()},
        line.describe(),
        s.n_nonfinite,
        s.seconds,
        s.meta,
    )
