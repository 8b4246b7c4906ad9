"""The loss over a plane through one checkpoint, from settings objects (``losslens surface``).

:func:`checkpoint_surface` evaluates the quantization plane A = the checkpoint, B = the one before it,
C = A quantized (:func:`losslens.lm.quant.plane.quantization_surface`), or Li et al.'s random
filter-normalised plane around A, on the eval token set, and returns the
:class:`~losslens.geometry.surfaces.surface.Surface` with a description of its inputs (the command
draws them: :mod:`losslens.study.report.surface_figures`); :func:`surface` returns the surface as
JSON-ready data (what ``losslens surface --json PATH`` writes, ``Surface.from_dict`` reads) with the
CLI's options as keyword parameters (``losslens.surface``). Imports torch only when called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from losslens.geometry.base.errors import LosslensError
from losslens.lm.shared_settings import keywords, settings


class SurfaceInputError(LosslensError, ValueError):
    """No B for the quantization plane (no ``previous`` and no checkpoint before A), or a B whose
    weights do not fit A's; the message says what to give."""


@settings
@dataclass(frozen=True)
class SurfaceSettings:
    """What ``losslens surface`` evaluates: B (``previous``: a checkpoint folder, weight file or
    ``hf:ORG/NAME@REV``; None: the real checkpoint before A in its trajectory), A's label inside a
    trajectory and the hub cache, the spec giving C, ``grid`` points per axis (≥ 2) with a ``margin``
    around A, B, C (a fraction of their extent), the token sets (``data`` / ``calibration`` files, else
    the checkpoint's default sets, small with ``quick``), the random plane instead (``random_plane``,
    its ``seed``), the ``.npz`` of finished grid rows (``resume``), the device (None: cpu), no progress
    bar (``quiet``) and the pickle permission."""

    previous: Optional[str] = None
    label: Optional[str] = None
    cache_dir: Optional[Path] = None
    spec: str = "rtn:4:g128"
    grid: int = 31
    margin: float = 0.25
    quick: bool = False
    data: Optional[Path] = None
    calibration: Optional[Path] = None
    random_plane: bool = False
    seed: int = 0
    resume: Optional[Path] = None
    device: Optional[str] = None
    quiet: bool = False
    allow_pickle: bool = False


def _previous_of(traj, ref):
    """The real checkpoint before ``ref`` in ``traj`` (or None)."""
    real = [r for r in traj if not r.derived]
    i = next((i for i, r in enumerate(real) if r.label == ref.label), 0)
    return real[i - 1] if i > 0 else None


def _where(ref) -> str:
    """Where a checkpoint is, for the page: ``hf:ORG/NAME@REV`` for a hub revision, else its path."""
    return f"hf:{ref.location}@{ref.revision}" if ref.kind == "hub" else str(ref.location or ref.label)


def _check_weights(model, label: str) -> None:
    """Refuse a checkpoint with NaN/inf weights before a grid is spent on it."""
    import torch

    from losslens.geometry.surfaces.moving import SurfaceError

    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise SurfaceError(
            f"checkpoint {label} has non-finite (NaN/inf) weights in {len(bad)} tensor(s), e.g. {bad[0]}; "
            "its loss surface would be NaN everywhere. Use a checkpoint from before the divergence."
        )


def _check_surface(surf, checkpoint: str | Path) -> None:
    """A surface whose marked points or every grid value are non-finite is an error, not a page of holes."""
    import numpy as np

    from losslens.geometry.surfaces.moving import SurfaceError

    bad = [k for k, (x, y, loss) in surf.points.items() if not all(math.isfinite(v) for v in (x, y, loss))]
    if bad or not np.isfinite(np.asarray(surf.loss, dtype=float)).any():
        raise SurfaceError(
            f"the loss surface of {checkpoint} is not finite (marked point(s) {bad or 'none'} are NaN/inf, "
            f"{surf.n_nonfinite} of {np.asarray(surf.loss).size} grid points non-finite): the weights "
            "of A or B, or the loss on the eval set, are NaN/inf. No page was written."
        )


def checkpoint_surface(checkpoint: str | Path, settings: SurfaceSettings = SurfaceSettings()):
    """``(surface, info)``: the :class:`~losslens.geometry.surfaces.surface.Surface` on a
    ``grid``×``grid`` grid of the quantization plane through A = ``checkpoint``, B and C = A quantized
    with ``spec`` (or of the random plane around A), and its inputs as ``{item: value}`` (A, B, C, the
    plane and the eval set, for the page). ``checkpoint``: a checkpoint argument of
    :func:`losslens.lm.checkpoints.open_checkpoint` (``label`` picks A in a trajectory folder or hub
    pattern). Without ``data`` the eval set is :func:`losslens.lm.data.default_token_sets`' (it needs
    the checkpoint's tokenizer).

    Raises :class:`~losslens.geometry.surfaces.moving.SurfaceError` for a bad grid (before any loading),
    NaN/inf weights or a non-finite surface, :class:`SurfaceInputError` when there is no B or B's
    weights do not fit A's, and :class:`~losslens.lm.checkpoints.ArchitectureMismatchError` when B's
    config differs from A's (one plane, one function). Cost: one quantization of A plus
    (grid² + 3) × n_eval_batches forwards."""
    import torch

    from losslens.geometry.surfaces.grid import GridSpec
    from losslens.geometry.surfaces.random_planes import random_plane as make_random_plane
    from losslens.geometry.surfaces.surface import evaluate_surface
    from losslens.lm.checkpoints import ArchitectureMismatchError, CheckpointLoader, open_checkpoint
    from losslens.lm.checkpoints.configs import config_differences
    from losslens.lm.core.next_token_loss import lm_loss
    from losslens.lm.core.tokenset import TokenSet
    from losslens.lm.data import default_token_sets
    from losslens.lm.quant.plane import quantization_surface

    s = settings
    gs = GridSpec(resolution=s.grid, margin=s.margin)  # bad grids fail before any loading
    traj, ref_a = open_checkpoint(checkpoint, s.label, cache_dir=s.cache_dir)
    own = traj.only(ref_a)
    loader = CheckpointLoader(own, device=s.device, allow_pickle=s.allow_pickle)
    sets = {"eval": TokenSet.load(s.data)} if s.data is not None else default_token_sets(own, quick=s.quick)
    if s.calibration is not None:
        sets["calibration"] = TokenSet.load(s.calibration)
    info = {
        "A (checkpoint)": _where(ref_a),
        "eval set": f"{sets['eval'].name} {tuple(sets['eval'].tokens.shape)} hash {sets['eval'].content_hash[:12]}",
    }
    resume_path = str(s.resume) if s.resume else None
    if s.random_plane:
        model = loader.load(ref_a)
        _check_weights(model, str(checkpoint))
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        plane = make_random_plane(params, seed=s.seed, label="A")
        info["plane"] = f"random, filter-normalised (Li et al. 2018), seed {s.seed}"
        with torch.no_grad():
            surf = evaluate_surface(
                model,
                lm_loss,
                sets["eval"],
                plane,
                gs,
                progress=not s.quiet,
                checkpoint_path=resume_path,
                merge_batches=True,
            )
        _check_surface(surf, checkpoint)
        return surf, info
    if s.previous is None:
        prev_ref = _previous_of(traj, ref_a)
        if prev_ref is None:
            raise SurfaceInputError(
                f"no --previous given and no checkpoint before {ref_a.label!r} in {traj.name}: give "
                "--previous (a checkpoint folder or hf:ORG/NAME@REV), or name a hub trajectory "
                "(hf:ORG/NAME@step*) with --label"
            )
    else:
        prev_ref = open_checkpoint(s.previous, cache_dir=s.cache_dir)[1]
    diff = config_differences(loader.config(ref_a).to_dict(), loader.config(prev_ref).to_dict())
    if diff:
        raise ArchitectureMismatchError(
            f"--previous {prev_ref.location or prev_ref.label} has a config that differs from "
            f"CHECKPOINT's in {diff}; a plane through both evaluates every point under one "
            "function, so they must share it"
        )
    _check_weights(loader.load(ref_a), str(checkpoint))
    try:
        surf = quantization_surface(
            loader, ref_a, prev_ref, s.spec, sets, grid=gs, progress=not s.quiet, resume=resume_path
        )
    except ArchitectureMismatchError as exc:
        raise SurfaceInputError(f"--previous does not match CHECKPOINT: {exc}") from exc
    _check_surface(surf, checkpoint)
    info.update({"B (previous)": _where(prev_ref), "C": f"A quantized with {s.spec}"})
    return surf, info


def surface_data(checkpoint: str | Path, settings: SurfaceSettings = SurfaceSettings()) -> dict:
    """:func:`checkpoint_surface`'s surface as JSON-ready data (``Surface.to_dict``: the grid ``x``
    [grid], ``y`` [grid], ``loss`` [grid][grid] (nats per token; None where non-finite), the marked
    ``points`` {A, B, C: [x, y, loss]}, the ``plane``, ``n_nonfinite``, ``seconds`` and ``meta``), what
    ``losslens surface --json PATH`` writes. Same errors and cost as :func:`checkpoint_surface`."""
    return checkpoint_surface(checkpoint, settings)[0].to_dict()


surface = keywords(
    surface_data,
    "surface",
    """``surface(checkpoint, *, previous=None, spec="rtn:4:g128", grid=31, margin=0.25, quick=False, ...)``:
    :func:`surface_data` with :class:`SurfaceSettings`' fields as keyword parameters (named like ``losslens
    surface``'s options, with their defaults). Returns the surface as the command's ``--json`` file holds
    it (``losslens.geometry.surfaces.surface.Surface.from_dict`` turns it back into a Surface; the page
    is the command's).""",
)

__all__ = ["SurfaceInputError", "SurfaceSettings", "checkpoint_surface", "surface", "surface_data"]
