"""Points of parameter space read a slice at a time (for :mod:`losslens.geometry.surfaces.trajectory_pca`).

A *point source* is one point θ of parameter space (a checkpoint, an average of checkpoints, a
quantized model) that can hand out any rows of any of its tensors without holding the others:
a tensor of shape ``(r, ...)`` is read as a ``[r, m]`` matrix (``m`` = numel / r; a 1-D tensor of
``n`` numbers as ``[n, 1]``, a scalar as ``[1, 1]``), and :meth:`PointSource.rows` returns rows
``start:stop`` of it. Streaming N sources tensor by tensor and rows by rows needs N row-slices in
memory at a time, never N whole points.

- :class:`DictSource`: a point already in memory (``{name: Tensor}``, e.g. a state dict);
- :class:`MeanSource`: the average of other sources (LAWA, soups), computed slice by slice in float64.

File-backed sources (safetensors read lazily) live in :mod:`probes`, which knows checkpoint files;
geometry only needs the protocol.
"""

from __future__ import annotations

import math
from typing import Mapping, Protocol, Sequence, runtime_checkable

import torch

__all__ = ["PointSource", "DictSource", "MeanSource", "as_source", "as_rows", "row_count", "chunk_rows"]


@runtime_checkable
class PointSource(Protocol):
    """One point of parameter space, readable a row-slice at a time.

    Attributes
    ----------
    label : the point's name in results and figures (``"step-000800"``).
    """

    label: str

    def names(self) -> list[str]:
        """Tensor names, in a fixed order."""

    def shape(self, name: str) -> tuple[int, ...]:
        """The full shape of tensor ``name`` (no data read)."""

    def dtype(self, name: str) -> torch.dtype:
        """The stored dtype of tensor ``name`` (no data read)."""

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of tensor ``name`` viewed as ``[r, m]``: a ``[stop - start, m]`` CPU tensor
        (possibly a view of the source's own storage: callers must not modify it)."""


def row_count(shape: Sequence[int]) -> int:
    """Rows of a tensor of ``shape`` as read by :meth:`PointSource.rows` (1 for a scalar)."""
    return int(shape[0]) if len(shape) else 1


def chunk_rows(shape: Sequence[int], chunk_elements: int) -> int:
    """How many rows of a tensor of ``shape`` make at most ``chunk_elements`` numbers (at least one row)."""
    per_row = max(1, math.prod(shape[1:]) if len(shape) > 1 else 1)
    return max(1, int(chunk_elements) // per_row)


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as the ``[r, m]`` matrix :meth:`PointSource.rows` reads (a scalar as ``[1, 1]``)."""
    return t.reshape(1, 1) if t.ndim == 0 else t.reshape(t.shape[0], -1)


class DictSource:
    """A point held in memory: ``{name: Tensor}``. Costs nothing beyond the tensors themselves."""

    def __init__(self, params: Mapping[str, torch.Tensor], label: str = "point") -> None:
        self.params = params
        self.label = str(label)

    def names(self) -> list[str]:
        return list(self.params.keys())

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.params[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.params[name].dtype

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        return as_rows(self.params[name].detach())[start:stop].cpu()


class MeanSource:
    """The (weighted) mean of several sources with equal names and shapes (a LAWA checkpoint, a soup).

    Each :meth:`rows` call reads the same slice of every source and averages it in float64 with
    ``weights`` (default: equal; normalised to sum 1), so the mean costs one slice per source, never
    a whole point. The dtype is the first source's.
    """

    def __init__(
        self, sources: Sequence[PointSource], label: str = "mean", weights: Sequence[float] | None = None
    ) -> None:
        if not sources:
            raise ValueError("a mean of no sources is undefined: give at least one source")
        w = [1.0] * len(sources) if weights is None else [float(v) for v in weights]
        if len(w) != len(sources) or any(not math.isfinite(v) or v < 0 for v in w) or sum(w) <= 0:
            raise ValueError(f"weights must be {len(sources)} finite non-negative numbers with a positive sum, got {w}")
        self.sources = list(sources)
        self.weights = [v / sum(w) for v in w]
        self.label = str(label)

    def names(self) -> list[str]:
        return self.sources[0].names()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.sources[0].shape(name)

    def dtype(self, name: str) -> torch.dtype:
        return self.sources[0].dtype(name)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        acc = None
        for s, w in zip(self.sources, self.weights):
            r = s.rows(name, start, stop).to(torch.float64, copy=True).mul_(w)  # rows may be a view: never in place
            acc = r if acc is None else acc.add_(r)
        return acc.to(self.dtype(name))


def as_source(point: "PointSource | Mapping[str, torch.Tensor]", label: str | None = None) -> PointSource:
    """``point`` itself when it is a :class:`PointSource`, else a :class:`DictSource` of it."""
    if isinstance(point, PointSource) and not isinstance(point, Mapping):
        return point
    if isinstance(point, Mapping):
        return DictSource(point, label or "point")
    raise TypeError(f"a point must be a PointSource or a dict of tensors, got {type(point).__name__}")
