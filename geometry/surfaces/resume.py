"""Resuming a surface evaluation (:func:`losslens.geometry.surfaces.surface.evaluate_surface` with
``checkpoint_path``): every finished grid row is written atomically to a ``.npz`` file together with
a fingerprint of the plane, the grid axes, the data and the evaluation settings; a rerun with the same
fingerprint skips the finished rows, and a file written for anything else raises
:class:`~losslens.geometry.surfaces.moving.SurfaceError` rather than being overwritten.

Cost: the fingerprint hashes the axes, the plane's description and every batch tensor once (SHA-256);
each save writes the whole ``[ny, nx]`` float64 loss array and the ``[ny]`` row flags.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Sequence

import numpy as np
import torch

from losslens.geometry.surfaces.moving import SurfaceError
from losslens.geometry.surfaces.planes import Plane

__all__ = ["surface_fingerprint", "load_rows", "save_rows"]


def surface_fingerprint(
    plane: Plane, x: np.ndarray, y: np.ndarray, batches: Sequence[Any], weights: Sequence[float], names: Sequence[str]
) -> str:
    """SHA-256 hex digest of the grid axes ``x`` [nx] and ``y`` [ny], ``plane.describe()``, ``names`` (the
    moved tensors and the evaluation settings), the batch ``weights`` and every tensor of ``batches``."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(x, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.float64).tobytes())
    h.update(json.dumps(plane.describe(), sort_keys=True, default=str).encode())
    h.update(json.dumps(list(names)).encode())
    h.update(np.asarray(weights, dtype=np.float64).tobytes())
    for b in batches:
        for t in b if isinstance(b, (tuple, list)) else [b]:
            if isinstance(t, torch.Tensor):
                h.update(str(tuple(t.shape)).encode())
                h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def load_rows(path: str, fp: str, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(loss ``[ny, nx]`` float64, done ``[ny]`` bool) from the row file at ``path`` (all NaN and none done
    when there is no file); raises :class:`~losslens.geometry.surfaces.moving.SurfaceError` when the file holds
    another fingerprint ``fp`` or another ``shape`` (ny, nx)."""
    ny, nx = shape
    if not os.path.exists(path):
        return np.full((ny, nx), np.nan), np.zeros(ny, dtype=bool)
    with np.load(path, allow_pickle=False) as f:
        if str(f["fingerprint"]) != fp or tuple(f["loss"].shape) != (ny, nx):
            raise SurfaceError(
                f"{path} holds a surface for a different plane, grid or data set; delete it or pass "
                "another checkpoint_path"
            )
        return f["loss"].astype(float).copy(), f["done"].astype(bool).copy()


def save_rows(path: str, fp: str, x, y, loss, done) -> None:
    """Write the fingerprint, the axes, ``loss`` and the ``done`` row flags to ``path`` atomically (a
    temporary file in the same folder, then ``os.replace``)."""
    d = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".npz")
    os.close(fd)
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, fingerprint=np.array(fp), x=x, y=y, loss=loss, done=done)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
