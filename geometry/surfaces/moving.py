"""Moving a model along a plane and evaluating a loss there -- the machinery of
:func:`losslens.geometry.surfaces.surface.evaluate_surface` (docs/science.md §5).

:class:`PlaneMover` writes θ(x, y) = origin + x·e₁ + y·e₂ into the model's own tensors in place
(``t.copy_(origin).add_(e1, alpha=x).add_(e2, alpha=y)``) and copies the originals, cloned once,
back at the end, so the model is restored bit-exactly; ``evaluate_stacked`` evaluates several
grid points in one vmapped forward instead; :func:`concat_batches` concatenates batches for
``merge_batches``. Memory: one clone of the moved parameters (plus the plane's tensors moved to
the model's device/dtype when they differ).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from losslens.geometry.memory.graphs import first_rows, one_row, peak_new_bytes
from losslens.geometry.memory.model import MemoryEstimate, first_fitting
from losslens.geometry.memory.budget import resolve_budget
from losslens.geometry.base.modes import module_modes
from losslens.geometry.base.params import ParamGlobs, iter_names
from losslens.geometry.surfaces.planes import Plane
from losslens.geometry.base.errors import LosslensError

LossFn = Callable[[nn.Module, Any], torch.Tensor]


class SurfaceError(LosslensError, ValueError):
    """The surface cannot be evaluated as asked (plane does not fit the model, bad grid, bad resume file)."""


# --------------------------------------------------------------------------------------------
# moving a model along a plane
# --------------------------------------------------------------------------------------------
def forward_bytes(model: nn.Module, loss_fn, batch) -> int:
    """Peak bytes one no-grad, eval-mode ``loss_fn(model, batch)`` allocates beyond the model
    (activations, logits, the loss's temporaries), measured by running it once
    (:func:`losslens.geometry.memory.graphs.peak_new_bytes`); every module's mode is restored."""
    with module_modes(model, training=False), torch.no_grad():
        return peak_new_bytes(lambda: loss_fn(model, batch))[1]


def planned_forward_bytes(model: nn.Module, loss_fn, batches: Sequence[Any], points_per_forward: int = 1) -> int:
    """The peak bytes of one grid evaluation's forwards, planned before any grid point.

    Batches are evaluated one after another, so the peak is that of the largest batch (most
    elements). For a tensor batch (or a tuple of tensors sharing dim 0) of B > 2 rows it is
    measured (:func:`forward_bytes`, at the model's own weights) on copies of its first 1 and
    2 rows and extrapolated linearly, ``p(B) = p(1) + (B − 1)·(p(2) − p(1))``: activations and
    logits grow with the rows, the loss's fixed temporaries do not. Other batches are measured
    whole. ``points_per_forward`` = k > 1 vmaps k points: k times one point's forward. Cost: two
    forwards of one and two rows (one forward of the batch when it cannot be sliced). Memory:
    what those forwards allocate."""

    def size(b) -> int:
        return sum(t.numel() for t in (b if isinstance(b, (tuple, list)) else [b]) if isinstance(t, torch.Tensor))

    batch = max(batches, key=size)
    rows = one_row(batch)[0]
    one, two = first_rows(batch, 1), first_rows(batch, 2)
    if rows <= 2 or one is None or two is None:
        peak = forward_bytes(model, loss_fn, batch)
    else:
        p1, p2 = forward_bytes(model, loss_fn, one), forward_bytes(model, loss_fn, two)
        peak = p1 + (rows - 1) * max(0, p2 - p1)
    return int(max(1, int(points_per_forward)) * peak)


def estimate_memory(
    model: nn.Module,
    plane: Plane,
    params: ParamGlobs = None,
    points_per_forward: int = 1,
    max_memory=None,
    forward: int = 0,
) -> MemoryEstimate:
    """Memory of evaluating a surface (beyond the model and the plane): the clone of the moved
    tensors that restores them, the plane's tensors converted when their dtype or device differ
    from the model's (3 dicts), ``points_per_forward`` stacked copies when vmapping several
    points (> 1), and ``forward``: the peak bytes of one evaluation's forwards (of all its
    points, measured: :func:`forward_bytes` or :func:`~losslens.geometry.memory.graphs.peak_new_bytes`; 0
    leaves it out). Raises :class:`~losslens.geometry.memory.budget.MemoryBudgetError` when over
    ``max_memory``."""
    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(dict(model.named_buffers(remove_duplicate=False)))
    names = [n for n in iter_names(plane.names, params) if n in targets]
    moved = sum(targets[n].numel() * targets[n].element_size() for n in names)
    converted = sum(
        3 * targets[n].numel() * targets[n].element_size()
        for n in names
        if (plane.origin[n].dtype, plane.origin[n].device) != (targets[n].dtype, targets[n].device)
    )
    parts = {"originals (restored at the end)": moved, "plane tensors converted to the model's dtype/device": converted}
    if points_per_forward > 1:
        parts[f"{points_per_forward} stacked points"] = points_per_forward * moved
    if forward:
        parts["forwards of one evaluation (measured)"] = int(forward)
    device = next(iter(targets.values())).device if targets else "cpu"
    return first_fitting(
        [MemoryEstimate(parts, resolve_budget(max_memory, device), {"points_per_forward": points_per_forward})],
        "evaluate_surface",
        "use points_per_forward=1, move fewer tensors (params=...), or raise max_memory",
    )


class PlaneMover:
    """Writes θ(x, y) into the model's tensors in place; restores the originals exactly."""

    def __init__(self, model: nn.Module, plane: Plane, params: ParamGlobs = None):
        names = iter_names(plane.names, params)
        if not names:
            raise SurfaceError(f"params={params!r} selects none of the plane's {len(plane.names)} tensors")
        targets: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
        targets.update(dict(model.named_buffers(remove_duplicate=False)))
        missing = [n for n in names if n not in targets]
        if missing:
            raise SurfaceError(
                f"the plane moves tensors the model does not have: {missing[:4]} "
                f"({len(missing)} of {len(names)}); was the plane built from another architecture?"
            )
        self.names = names
        self.targets = {n: targets[n] for n in names}
        for n in names:
            t = self.targets[n]
            if tuple(t.shape) != tuple(plane.origin[n].shape):
                raise SurfaceError(f"{n}: model tensor {tuple(t.shape)} vs plane {tuple(plane.origin[n].shape)}")

        def _to(d: Mapping[str, torch.Tensor], n: str) -> torch.Tensor:
            t = self.targets[n]
            return d[n].to(device=t.device, dtype=t.dtype)

        self.origin = {n: _to(plane.origin, n) for n in names}
        self.e1 = {n: _to(plane.e1, n) for n in names}
        self.e2 = {n: _to(plane.e2, n) for n in names}
        self.originals = {n: t.detach().clone() for n, t in self.targets.items()}

    @torch.no_grad()
    def set(self, x: float, y: float) -> None:
        for n, t in self.targets.items():
            t.copy_(self.origin[n])
            if x != 0.0:
                t.add_(self.e1[n], alpha=float(x))
            if y != 0.0:
                t.add_(self.e2[n], alpha=float(y))

    def stacked(self, xy: Sequence[tuple[float, float]]) -> dict[str, torch.Tensor]:
        xs = torch.tensor([p[0] for p in xy], dtype=torch.float64)
        ys = torch.tensor([p[1] for p in xy], dtype=torch.float64)
        out = {}
        for n in self.names:
            o, a, b = self.origin[n], self.e1[n], self.e2[n]
            shape = (len(xy),) + (1,) * o.ndim
            cx = xs.to(device=o.device, dtype=o.dtype).reshape(shape)
            cy = ys.to(device=o.device, dtype=o.dtype).reshape(shape)
            out[n] = o.unsqueeze(0) + cx * a.unsqueeze(0) + cy * b.unsqueeze(0)
        return out

    @torch.no_grad()
    def restore(self) -> None:
        for n, t in self.targets.items():
            t.copy_(self.originals[n])


def concat_batches(batches: list, w: list[float], merge: bool | int, weights) -> tuple[list, list[float]]:
    """Concatenate equal-shaped tensor batches along dim 0 (see ``merge_batches``)."""
    if merge is None or merge is False or (merge is not True and int(merge) == 1) or len(batches) == 1:
        return batches, w
    if weights is not None:
        raise SurfaceError("merge_batches needs the default batch weights (weights=None)")
    if not all(isinstance(b, torch.Tensor) and b.ndim >= 1 for b in batches):
        raise SurfaceError("merge_batches needs tensor batches (e.g. [b, s] token ids)")
    if len({(tuple(b.shape[1:]), b.dtype, b.device) for b in batches}) != 1:
        raise SurfaceError("merge_batches needs batches of one shape (after dim 0), dtype and device")
    k = len(batches) if merge is True else int(merge)
    if k < 1:
        raise SurfaceError(f"merge_batches must be True, False or a positive int, got {merge!r}")
    out, ow = [], []
    for s in range(0, len(batches), k):
        out.append(torch.cat(batches[s : s + k]))
        ow.append(sum(w[s : s + k]))
    return out, ow


def evaluate_point(model: nn.Module, loss_fn: LossFn, batches: Sequence[Any], weights: Sequence[float]) -> float:
    total = 0.0
    for b, w in zip(batches, weights):
        val = float(loss_fn(model, b))
        total += w * val
    return total


def evaluate_stacked(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    weights: Sequence[float],
    stacked: dict[str, torch.Tensor],
) -> list[float]:
    from torch.func import vmap

    def one(p, b):  # loss_fn takes a model: give it a view whose forward runs functional_call
        return loss_fn(FunctionalModel(model, p), b)

    k = next(iter(stacked.values())).shape[0]
    total = np.zeros(k)
    for b, w in zip(batches, weights):
        vals = vmap(one, in_dims=(0, None))(stacked, b)
        total += w * vals.detach().double().cpu().numpy()
    return total.tolist()


class FunctionalModel(nn.Module):
    """A model view whose forward runs ``functional_call(model, params, ...)`` (for vmap)."""

    def __init__(self, model: nn.Module, params: dict[str, torch.Tensor]):
        super().__init__()
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_params", params)
        object.__setattr__(self, "config", getattr(model, "config", None))

    def parameters(self, recurse: bool = True):  # device/dtype queries in loss functions
        return self._model.parameters(recurse)

    def forward(self, *args, **kwargs):
        from torch.func import functional_call

        return functional_call(self._model, self._params, args, kwargs, strict=False)
