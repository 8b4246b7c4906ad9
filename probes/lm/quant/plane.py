"""The quantization plane of one checkpoint (docs/science.md §5): A = Θ_K, B = Θ_{K−1}, C = Θ̂_K.

Shared by ``losslens surface``, the demo and notebooks. Weights of A and B are read through one
:class:`~losslens.lm.checkpoints.CheckpointLoader` (so legacy key names such as GPT-NeoX's
``embed_out`` are mapped exactly as for any other load), C is the fake-quantized copy of A.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from losslens.geometry.surfaces.grid import GridSpec
from losslens.geometry.surfaces.planes import Plane
from losslens.geometry.surfaces.point_planes import plane_through_points
from losslens.geometry.surfaces.surface import Surface, evaluate_surface
from losslens.lm.core.next_token_loss import lm_loss

from losslens.lm.quant.dispatch import quantize


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def quantization_plane(loader, ref, previous, spec: str, calibration=None) -> tuple[Plane, torch.nn.Module]:
    """The plane through ``ref`` (A), ``previous`` (B) and ``ref`` quantized with ``spec`` (C).

    Returns the plane and the loader's model holding A's weights (ready for
    :func:`losslens.geometry.surfaces.surface.evaluate_surface`). Cost: two checkpoint loads and one quantization.
    Memory: at the peak the model, copies of A and B, the quantized copy C and the plane's two
    directions (6 model-size sets of tensors; A's copy becomes the plane's origin).
    """
    B = _params(loader.load(previous))
    model = loader.load(ref)
    A = _params(model)
    qm = quantize(model, spec, calibration=calibration)
    C = {n: p.detach().to(A[n].device, A[n].dtype) for n, p in qm.model.named_parameters()}
    del qm
    return plane_through_points(A, B, C, labels=("A", "B", "C"), copy_origin=False), model


def quantization_surface(
    loader,
    ref,
    previous,
    spec: str,
    token_sets: Mapping[str, Any],
    grid: int | GridSpec = 21,
    margin: float = 0.25,
    progress: bool = False,
    resume: str | None = None,
) -> Surface:
    """Loss on a ``grid``×``grid`` grid of the quantization plane of ``ref`` (eval set of
    ``token_sets``; GPTQ-like specs are calibrated on its ``"calibration"`` set).

    The marked points A, B, C are evaluated batch by batch and equal direct evaluation of the
    checkpoints. Cost: one quantization plus (grid² + 3) × n_eval_batches forwards.
    """
    gs = grid if isinstance(grid, GridSpec) else GridSpec(resolution=int(grid), margin=margin)
    plane, model = quantization_plane(loader, ref, previous, spec, token_sets.get("calibration"))
    with torch.no_grad():
        return evaluate_surface(
            model, lm_loss, token_sets["eval"], plane, gs, progress=progress, checkpoint_path=resume, merge_batches=True
        )
