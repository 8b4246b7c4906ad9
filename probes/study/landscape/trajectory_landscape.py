"""A run's own landscape: the loss over the principal plane of whole trajectories (docs/science.md §5.4).

:func:`trajectory_landscape` stacks the checkpoints of one or several runs (e.g. a stable run and
its decay forks), finds their top principal axes (:func:`losslens.geometry.surfaces.trajectory_pca.trajectory_pca`:
the Gram trick, streamed one tensor slice at a time), projects each checkpoint's quantized weights
Θ̂ (and any derived checkpoint: LAWA, soups) onto them, and evaluates the loss on a grid over the
plane of two axes (:func:`losslens.geometry.surfaces.surface.evaluate_surface`: resumable, memory-planned).

A projected point means something only when it lies near the plane: every point carries its
distance from the plane relative to its distance from the centre (``relative_residual``), and the
figure shows it. Every checkpoint's and quantized point's own loss (at its real weights, not its
projection) is recorded beside the loss at its place on the plane.

Cost: the PCA's 2 passes over the N checkpoints' weights; with a spec, N model loads and
quantizations (+ one projection pass each); N (+ N) evaluations of the own losses; and
(grid² + marked points) × eval batches forwards for the surface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from losslens.geometry.base.jsonable import jsonable
from losslens.geometry.base.params import literal_glob
from losslens.geometry.base.progress import ProgressArg
from losslens.geometry.surfaces.grid import GridSpec
from losslens.geometry.surfaces.sources import DictSource
from losslens.geometry.surfaces.surface import Surface, evaluate_surface
from losslens.geometry.surfaces.trajectory_axes import ProjectedPoint, TrajectoryPCA, TrajectoryPCAError
from losslens.geometry.surfaces.trajectory_pca import trajectory_pca
from losslens.lm.checkpoints.loader import CheckpointLoader
from losslens.lm.checkpoints.refs import CheckpointRef
from losslens.lm.checkpoints.trajectory import Trajectory
from losslens.lm.core.next_token_loss import evaluate, lm_loss
from losslens.lm.quant.dispatch import quantize

from losslens.study.landscape.sources import checkpoint_source, model_names

__all__ = ["Landscape", "RunPath", "trajectory_landscape", "point_labels", "residual_flags"]


@dataclass
class RunPath:
    """One run's checkpoints in training order: their labels in the landscape, steps and LRs."""

    name: str
    labels: list[str]
    steps: list[int | None]
    lrs: list[float | None]
    derived: list[bool]


@dataclass
class Landscape:
    """The principal plane of one or several runs, the loss over it and the points on it.

    Attributes
    ----------
    pca : the :class:`~losslens.geometry.surfaces.trajectory_axes.TrajectoryPCA` of every checkpoint.
    runs : the runs' paths (labels in training order).
    quantized : checkpoint label -> its quantized point projected (``spec`` given), with residual.
    own_loss : label -> loss at the point's real weights (checkpoints and quantized points).
    surface : the loss on the grid of the plane of ``axes`` (its marked points: every checkpoint and
        quantized point at its projected coordinates), or None when not evaluated.
    spec, axes, meta : the quantizer, the plane's axes, settings.
    """

    pca: TrajectoryPCA
    runs: list[RunPath]
    quantized: dict[str, ProjectedPoint] = field(default_factory=dict)
    own_loss: dict[str, float] = field(default_factory=dict)
    surface: Surface | None = None
    spec: str | None = None
    axes: tuple[int, int] = (0, 1)
    meta: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """JSON-ready: explained variance ratios, every point's coordinates, residuals and losses."""
        d = self.pca.describe(self.axes)
        for row in d["checkpoints"]:
            row["own_loss"] = self.own_loss.get(row["label"])
            if self.surface is not None and row["label"] in self.surface.points:
                row["plane_loss"] = self.surface.points[row["label"]][2]
        quant = []
        for ck, p in self.quantized.items():
            row = {**p.describe(), "checkpoint": ck, "own_loss": self.own_loss.get(p.label)}
            if self.surface is not None and p.label in self.surface.points:
                row["plane_loss"] = self.surface.points[p.label][2]
            quant.append(row)
        return jsonable(
            {
                "spec": self.spec,
                "axes": list(self.axes),
                "pca": d,
                "quantized": quant,
                "runs": [vars(r) for r in self.runs],
                "meta": self.meta,
                "surface": None
                if self.surface is None
                else {
                    "shape": [len(self.surface.y), len(self.surface.x)],
                    "seconds": self.surface.seconds,
                    "n_nonfinite": self.surface.n_nonfinite,
                },
            }
        )


def point_labels(trajectories: Sequence[Trajectory]) -> list[tuple[str, CheckpointRef, str]]:
    """``(label, ref, run name)`` of every checkpoint; labels are ``run/checkpoint`` with several runs."""
    names = [t.name or f"run-{i}" for i, t in enumerate(trajectories)]
    if len(set(names)) != len(names):
        names = [f"{n}-{i}" for i, n in enumerate(names)]
    many = len(trajectories) > 1
    return [
        (f"{name}/{ref.label}" if many else ref.label, ref, name) for name, t in zip(names, trajectories) for ref in t
    ]


def _runs(items: list[tuple[str, CheckpointRef, str]]) -> list[RunPath]:
    runs: dict[str, RunPath] = {}
    for label, ref, name in items:
        r = runs.setdefault(name, RunPath(name, [], [], [], []))
        r.labels.append(label)
        r.steps.append(ref.step)
        r.lrs.append(ref.lr)
        r.derived.append(ref.derived)
    return list(runs.values())


def trajectory_landscape(
    trajectories: Trajectory | Sequence[Trajectory],
    eval_batches: Sequence[torch.Tensor] | None = None,
    spec: str | None = None,
    grid: int | GridSpec | tuple | None = 21,
    k: int = 2,
    axes: tuple[int, int] = (0, 1),
    center: str | int = "mean",
    params: str | Sequence[str] | None = None,
    filter_normalize: bool = False,
    calibration: Sequence[torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    allow_pickle: bool = False,
    max_memory: int | str | None = None,
    checkpoint_path: str | None = None,
    progress: ProgressArg = False,
    on_stage: Callable[[str], None] | None = None,
) -> Landscape:
    """The landscape of ``trajectories`` (see the module docstring).

    Parameters
    ----------
    trajectories : one :class:`~losslens.lm.checkpoints.trajectory.Trajectory` or several (forks of one
        parent, runs of a grid); derived checkpoints (``with_lawa``) are points like any other.
    eval_batches : ``[b, s]`` token batches for the losses (required unless ``grid`` is None and
        no own losses are wanted; then pass None).
    spec : a quantizer spec (``"rtn:4:g128"``, ``"gptq:4"``): every checkpoint's Θ̂ is projected.
    grid : resolution, :class:`~losslens.geometry.surfaces.grid.GridSpec` or explicit ``(x_axis, y_axis)`` of the
        surface (:func:`~losslens.geometry.surfaces.surface.evaluate_surface`); None: no surface.
    k, axes, center, params, filter_normalize : of the PCA (axes: the pair drawn).
    calibration : batches for calibrated quantizers (GPTQ, AWQ).
    dtype, device : how models are loaded for the quantizer and the losses.
    allow_pickle : read ``.bin``/``.pt`` checkpoints that need full pickle (only files you trust).
    max_memory : budget of the PCA plan and of the surface (each checked before its work).
    checkpoint_path : ``.npz`` file making the surface resumable.
    progress : the surface's points done / planned on stderr (:data:`~losslens.geometry.base.progress.ProgressArg`).
    on_stage : called with a short description as each stage starts (a CLI's progress line).
    """
    trajs = [trajectories] if isinstance(trajectories, Trajectory) else list(trajectories)
    if not trajs or not any(len(t) for t in trajs):
        raise TrajectoryPCAError("no checkpoints: give at least one trajectory with checkpoints")
    items = point_labels(trajs)
    stage = on_stage or (lambda s: None)
    loader = CheckpointLoader(trajs[0], dtype=dtype, device=device, allow_pickle=allow_pickle)
    model = loader.load(items[0][1])
    names = model_names(model)
    cache: dict = {}
    sources = [checkpoint_source(ref, model, allow_pickle, cache=cache) for _, ref, _ in items]
    stage(f"principal axes of {len(items)} checkpoints")
    pca = trajectory_pca(
        sources,
        k=k,
        center=center,
        params=params,
        filter_normalize=filter_normalize,
        labels=[lab for lab, _, _ in items],
        max_memory=max_memory,
    )
    land = Landscape(
        pca,
        _runs(items),
        spec=spec,
        axes=tuple(axes),
        meta={
            "k": k,
            "center": center,
            "params": params,
            "filter_normalize": filter_normalize,
            "n_tensors": len(pca.center),
            "dim": int(sum(t.numel() for t in pca.center.values())),
            "model_tensors": len(names),
        },
    )
    if eval_batches is not None:
        eval_batches = list(eval_batches)
    for label, ref, _ in items:
        if eval_batches is None and spec is None:
            break
        stage(f"{label}: own loss" + (f" and {spec}" if spec else ""))
        m = loader.load(ref)
        if eval_batches is not None:
            land.own_loss[label] = evaluate(m, eval_batches).loss
        if spec is not None:
            qm = quantize(m, spec, calibration=calibration)
            qlabel = f"{label} ⊙ {spec}"
            point = {n: p.detach() for n, p in qm.model.named_parameters() if n in pca.center}
            land.quantized[label] = pca.project(DictSource(point, qlabel), qlabel, axes)
            if eval_batches is not None:
                land.own_loss[qlabel] = evaluate(qm.model, eval_batches).loss
            del qm, point
    if grid is not None:
        if eval_batches is None:
            raise TrajectoryPCAError("a surface needs eval_batches: pass the token batches the loss is taken on")
        stage("loss over the plane")
        plane = pca.plane(axes, points=list(land.quantized.values()))
        spec_grid = GridSpec(resolution=int(grid), margin=0.25) if isinstance(grid, int) else grid
        model = loader.load(items[-1][1])
        with torch.no_grad():
            land.surface = evaluate_surface(
                model,
                lm_loss,
                eval_batches,
                plane,
                spec_grid,
                params=[literal_glob(n) for n in pca.center],
                progress=progress,
                checkpoint_path=checkpoint_path,
                max_memory=max_memory,
            )
        land.meta["unmoved_tensors_from"] = items[-1][0]
    return land


def residual_flags(land: Landscape, threshold: float = 0.5) -> dict[str, bool]:
    """label -> whether the point's relative residual exceeds ``threshold`` (its place on the plane is
    then mostly not where it is)."""
    res = land.pca.residuals(land.axes)
    dist = land.pca.distances
    out = {lab: bool(dist[i] > 0 and res[i] / dist[i] > threshold) for i, lab in enumerate(land.pca.labels)}
    out.update({p.label: p.relative_residual > threshold for p in land.quantized.values()})
    return out
