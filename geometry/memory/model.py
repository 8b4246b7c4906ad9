"""The memory model of the curvature estimators: their plans, held against a budget.

Every estimator in losslens states its peak memory as a formula and checks it before it starts:

    peak ≈ resident (model weights, data: already allocated, not counted)
         + state   (the full-dim vectors the estimator holds, n · dim · bytes(dtype), and the float64 chunk
                    temporaries of its reductions for that dtype: :func:`temporaries_bytes`)
         + pass    (one product on k vectors: the double-backward graph of one batch, or of every batch when
                    kept, plus the second backward's transient: ``HessianOperator.pass_bytes``)

``max_memory`` is the number of bytes an estimator may add on top of what is resident. It is an int (bytes), a
size string such as ``"8GB"``/``"512MiB"`` (a unit, 1 MB up to the device's memory), or None for the default
budget: a fixed fraction of the device's *total* memory (host RAM, or the GPU's memory less what this
process's tensors hold), never of what happens to be free at call time, so the same machine and settings give
the same plan and the same numbers (:mod:`losslens.geometry.memory.budget`). Estimators pick the largest
fitting setting (block size, Hutch++ sketch, Lanczos basis, graph cache) and record it in their result
(``memory`` field; sweeps make the numerically relevant ones part of a row's identity,
:func:`identity_settings`); when even the smallest setting does not fit they raise
:class:`~losslens.geometry.memory.budget.MemoryBudgetError`
before any work, with the bytes needed, the bytes available and what would fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from losslens.geometry.base._linalg import CHUNK
from losslens.geometry.base.state_store import DISK, disk_free_bytes
from losslens.geometry.memory.budget import MemoryBudgetError, default_budget, format_bytes

__all__ = [
    "MemoryEstimate",
    "identity_settings",
    "vector_bytes",
    "temporaries_bytes",
    "chunk_temporaries",
    "TEMPORARIES_PART",
]

#: float64 chunk temporaries (``CHUNK`` numbers each) alive at once in the reductions of losslens.geometry.base._linalg
#: for vectors narrower than float64, measured with peak_new_bytes on diagonal operators (tests/test_memory_budget.py):
#: 3 in every estimator (a norm of float32 rows: two float64 copies of a chunk and their product).
CHUNK_TEMPORARIES = 3
#: The same for float64 vectors, whose ``.to(float64)`` is a view: only ``rowdot``'s product (or
#: ``residual_norms``' difference and its square, half chunks) is allocated; measured 1 in every estimator.
FLOAT64_CHUNK_TEMPORARIES = 1
TEMPORARIES_PART = "chunked reductions' temporaries (float64)"


def chunk_temporaries(dtype: torch.dtype | None) -> int:
    """Float64 chunk temporaries alive at once for vectors of ``dtype``: 1 for float64, else (and None) 3."""
    return FLOAT64_CHUNK_TEMPORARIES if dtype == torch.float64 else CHUNK_TEMPORARIES


def temporaries_bytes(dim: int, dtype: torch.dtype | None = None, count: int | None = None) -> int:
    """Bytes of ``count`` (default :func:`chunk_temporaries` of the vectors' ``dtype``) float64 chunks of
    ``8 × min(dim, CHUNK)`` bytes for vectors of ``dim`` numbers (≤ 50.3 MB for float32, 16.8 MB for float64)."""
    count = chunk_temporaries(dtype) if count is None else count
    return int(count) * 8 * min(int(dim), CHUNK)


def vector_bytes(dim: int, dtype: torch.dtype, count: float = 1) -> int:
    """Bytes of ``count`` full-dim vectors of ``dtype``."""
    return int(count * dim * torch.empty((), dtype=dtype).element_size())


@dataclass(frozen=True)
class MemoryEstimate:
    """A planned peak: named parts (bytes) against a budget, and the settings chosen.

    Attributes:
        parts: ``{what: bytes}``, e.g. ``{"sketch basis Q [8, dim] float32": 5.2e9, "operator pass": 3.1e9}``.
        budget: bytes the estimator may add to what is resident (``max_memory``).
        settings: the knobs the planner chose (block size, sketch size, cache, ...).
    """

    parts: dict[str, int]
    budget: int
    settings: dict[str, Any] = field(default_factory=dict)
    host_parts: dict[str, int] = field(default_factory=dict)
    host_budget: int = 0
    #: state off the device (#48): ``{"bytes": moved over the run, "seconds" (assumed rate), "where": "cpu"|"disk"}``
    transfer: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Predicted bytes on the operator's device."""
        return int(sum(self.parts.values()))

    @property
    def host_total(self) -> int:
        """Predicted bytes kept in host RAM for an operator on a GPU (a basis on the host)."""
        return int(sum(self.host_parts.values()))

    @property
    def fits(self) -> bool:
        return self.total <= self.budget and self.host_total <= self.host_budget

    def describe(self) -> str:
        """``"4.10 GB (sketch ... 2.60 GB + pass 1.50 GB) of a 8.00 GB budget"``."""
        inner = " + ".join(f"{k} {format_bytes(v)}" for k, v in self.parts.items())
        out = f"{format_bytes(self.total)} ({inner}) of a {format_bytes(self.budget)} budget"
        if self.host_parts:
            host = " + ".join(f"{k} {format_bytes(v)}" for k, v in self.host_parts.items())
            where = "local disk" if self.transfer.get("where") == "disk" else "host RAM"
            out += f", and {format_bytes(self.host_total)} of {where} ({host}) of {format_bytes(self.host_budget)}"
        if self.transfer.get("seconds"):
            out += (
                f"; moving {format_bytes(self.transfer['bytes'])} to the device takes ~{self.transfer['seconds']:.3g} s"
            )
        return out

    @property
    def operator_settings(self) -> dict[str, Any]:
        """The settings an operator applies for the plan (``op.configured(**...)``)."""
        return {k: self.settings[k] for k in ("chunk_size", "cache_graphs") if k in self.settings}

    def to_dict(self) -> dict[str, Any]:
        out = {
            "predicted_bytes": self.total,
            "budget_bytes": self.budget,
            "parts": {k: int(v) for k, v in self.parts.items()},
            "settings": dict(self.settings),
        }
        if self.host_parts:
            out.update(
                host_bytes=self.host_total,
                host_budget_bytes=self.host_budget,
                host_parts={k: int(v) for k, v in self.host_parts.items()},
            )
        if self.transfer:
            out["transfer"] = dict(self.transfer)
        return out


#: Settings a plan may choose that do not change an estimator's numbers: the graph of a batch is
#: the same graph whether it is kept between products or rebuilt (tests/test_memory_identity.py
#: checks the values are bit-identical). Every other chosen setting (block size, vmapped chunk,
#: Hutch++ sketch, Lanczos basis, restarts, basis dtype and device) can change them.
NEUTRAL_SETTINGS = frozenset({"cache_graphs"})


def identity_settings(memory: Any) -> dict[str, Any]:
    """The chosen settings of a plan that can change its numbers, sorted by name: part of what
    identifies a result (sweep rows are pooled only when these agree). ``memory``: a
    :class:`MemoryEstimate`, its :meth:`~MemoryEstimate.to_dict`, or a result's ``memory`` dict
    (None or {} give {})."""
    if isinstance(memory, MemoryEstimate):
        settings = memory.settings
    elif isinstance(memory, dict):
        settings = memory.get("settings", {}) or {}
    else:
        settings = {}
    return {k: settings[k] for k in sorted(settings) if k not in NEUTRAL_SETTINGS}


def refuse(what: str, smallest: MemoryEstimate, advice: str) -> MemoryBudgetError:
    """The error for a plan whose smallest setting does not fit: needed, available, what would fit."""
    return MemoryBudgetError(
        f"{what} needs at least {format_bytes(smallest.total)} but max_memory is {format_bytes(smallest.budget)} "
        f"(smallest setting: {smallest.describe()}); {advice}"
    )


@dataclass(frozen=True)
class Candidate:
    """One setting an estimator could run with: its memory and its cost in gradient-equivalents."""

    estimate: MemoryEstimate
    cost: float


def choose(candidates: list[Candidate], what: str, advice: str) -> MemoryEstimate:
    """The cheapest fitting candidate (ties: the smaller one); :class:`MemoryBudgetError` naming
    the smallest candidate when none fits. Candidates are listed best-first for equal cost."""
    fitting = [c for c in candidates if c.estimate.fits]
    if not fitting:
        raise refuse(what, min((c.estimate for c in candidates), key=lambda e: e.total), advice)
    best = min(fitting, key=lambda c: (round(c.cost, 9), c.estimate.total))
    return best.estimate


def pass_options(op: Any, k: int, calls: int, hvps: int | None = None) -> list[tuple[dict[str, Any], int, float]]:
    """``(settings, pass bytes, cost)`` of the ways ``op`` can run ``calls`` products of at most
    ``k`` vectors each (``hvps`` vectors in all, default ``k · calls``): graphs rebuilt per call or
    kept (``cache_graphs``), vmapped chunk sizes, as its product backend offers them
    (:meth:`losslens.geometry.operators.backend.ProductBackend.pass_options`).

    Cost in gradient-equivalents over the whole data: 1.5 per graph build of every batch, 2 per
    vector (the reverse backend's measured shape); 4 per vector for the forward backend; 2 (4 with
    Richardson) for the difference backend, whose settings record its measured error (``hvp_check``).
    An explicit matrix (no backend): one option, 2 per vector.
    """
    hvps = k * calls if hvps is None else hvps
    backend = getattr(op, "product_backend", None)
    if backend is None:  # an explicit matrix: nothing to choose
        return [({}, op.pass_bytes(k), 2.0 * hvps)]
    return backend.pass_options(op, k, calls, hvps)


def first_fitting(candidates: list[MemoryEstimate], what: str, advice: str) -> MemoryEstimate:
    """The first candidate (listed best-first) that fits; else :class:`MemoryBudgetError` naming
    the smallest one."""
    for c in candidates:
        if c.fits:
            return c
    raise refuse(what, min(candidates, key=lambda e: e.total), advice)


def basis_storage(
    op_device: Any,
    basis_device: Any = None,
    basis_dtype: torch.dtype | None = None,
    vector_dtype: torch.dtype = torch.float32,
) -> tuple[torch.device, torch.dtype, bool]:
    """``(device, dtype, on_host)`` where an estimator keeps a large basis: the operator's device and the
    vectors' dtype by default; ``"cpu"`` keeps it in host RAM when the operator is on a GPU (counted against
    the host budget); ``"disk"`` on local disk, memory-mapped (:mod:`losslens.geometry.base.state_store`;
    counted against the free disk space; ``device`` is then ``"disk"``); ``basis_dtype`` (e.g. bfloat16)
    stores it in lower precision (arithmetic still in float32)."""
    if basis_dtype is not None and basis_dtype not in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        raise MemoryBudgetError(f"basis_dtype must be a floating dtype, got {basis_dtype}")
    if basis_device == DISK:
        return DISK, basis_dtype or vector_dtype, True  # type: ignore[return-value]
    op_dev = torch.device(op_device)
    dev = op_dev if basis_device is None else torch.device(basis_device)
    same = dev.type == op_dev.type and (dev.index or 0) == (op_dev.index or 0)
    return (op_dev if same else dev), basis_dtype or vector_dtype, not same


def state_budget(where: Any) -> int:
    """The budget of state kept off the device at ``where``: the free space of the state directory for
    ``"disk"``, else :func:`default_budget` of the host's RAM."""
    return disk_free_bytes() if where == DISK else default_budget("cpu")


def with_basis(parts: dict[str, int], name: str, nbytes: int, on_host: bool) -> tuple[dict[str, int], dict[str, int]]:
    """``(device parts, host parts)`` with the basis entry placed where it lives."""
    return (parts, {name: nbytes}) if on_host else ({name: nbytes, **parts}, {})
