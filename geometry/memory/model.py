"""The memory model and budget of the curvature estimators.

Every estimator in losslens states its peak memory as a formula and checks it before it starts:

    peak ≈ resident (model weights, data: already allocated, not counted)
         + state   (the full-dim vectors the estimator holds, n · dim · bytes(dtype), and the float64 chunk
                    temporaries of its reductions for that dtype: :func:`temporaries_bytes`)
         + pass    (one product on k vectors: the double-backward graph of one batch, or of every batch when
                    kept, plus the second backward's transient: ``HessianOperator.pass_bytes``)

``max_memory`` is the number of bytes an estimator may add on top of what is resident. It is an int (bytes), a
size string such as ``"8GB"``/``"512MiB"`` (:mod:`losslens.geometry.memory.sizes`: a unit, 1 MB up to the
device's memory), or None for :func:`default_budget`: a fixed fraction of the device's *total* memory (host
RAM, or the GPU's memory less what this process's tensors hold), never of what happens to be free at call
time, so the same machine and settings give the same plan and the same numbers. Estimators pick the largest
fitting setting (block size, Hutch++ sketch, Lanczos basis, graph cache) and record it in their result
(``memory`` field; sweeps make the numerically relevant ones part of a row's identity,
:func:`identity_settings`); when even the smallest setting does not fit they raise :class:`MemoryBudgetError`
before any work, with the bytes needed, the bytes available and what would fit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from losslens.geometry.base._linalg import CHUNK
from losslens.geometry.base.results import EstimatorError
from losslens.geometry.base.state_store import DISK, disk_free_bytes
from losslens.geometry.memory.sizes import SizeError, parse_size

__all__ = [
    "MemoryBudgetError",
    "MemoryEstimate",
    "available_bytes",
    "total_bytes",
    "default_budget",
    "parse_bytes",
    "resolve_budget",
    "identity_settings",
    "format_bytes",
    "vector_bytes",
    "temporaries_bytes",
    "chunk_temporaries",
    "TEMPORARIES_PART",
    "CPU_FRACTION",
    "CUDA_FRACTION",
]

#: Fraction of the total memory an estimator takes by default. CPU RAM is shared with the OS, other
#: processes and the model itself, so a third; a GPU's memory (less this process's tensors) is ours.
CPU_FRACTION = 1 / 3
#: The same for a GPU, whose free memory is ours.
CUDA_FRACTION = 0.8
#: Environment variable overriding the default fraction (of total host RAM or GPU memory). Worker
#: processes that share one machine get ``CPU_FRACTION / N`` each (losslens.lm.core.workers).
MEMORY_FRACTION_ENV = "LOSSLENS_MEMORY_FRACTION"


class MemoryBudgetError(EstimatorError):
    """A curvature plan cannot fit in its memory budget (raised before any work is done)."""


def format_bytes(n: float) -> str:
    """``1.5e9`` -> ``"1.50 GB"`` (decimal units, as ``--max-memory`` takes them)."""
    n = float(n)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def parse_bytes(value: Any, device: torch.device | str | None = None) -> int:
    """Bytes of a size string (:func:`losslens.geometry.memory.sizes.parse_size`, at most the memory of ``device``)
    or an int of bytes; :class:`MemoryBudgetError` otherwise."""
    limits = _room(device) if isinstance(value, str) else ()  # a size string may not exceed the device's memory
    try:
        return parse_size(value, *limits)
    except SizeError as exc:
        raise MemoryBudgetError(str(exc)) from exc


def _room(device: torch.device | str | None) -> tuple[int, str]:
    """(bytes, what) no size may exceed: a CUDA device's memory, else the host's RAM; None: the larger
    of the RAM and each GPU's memory."""
    dev = None if device is None else torch.device(device)
    if dev is not None and dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(dev).total_memory, f"the memory of {dev}"
    rooms = [(_host_total(), "this machine's RAM")]
    if dev is None and torch.cuda.is_available():
        rooms += [
            (torch.cuda.get_device_properties(i).total_memory, f"the memory of cuda:{i}")
            for i in range(torch.cuda.device_count())
        ]
    return max(rooms)


def _cgroup_limit() -> int | None:
    """A cgroup-v2 memory limit (containers) in bytes, or None without one."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        return None if limit == "max" else int(limit)
    except (OSError, ValueError):
        return None


def _cgroup_free() -> int | None:
    """Bytes left under a cgroup-v2 memory limit (containers), or None without a limit."""
    limit = _cgroup_limit()
    if limit is None:
        return None
    try:
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        return max(0, limit - used)
    except (OSError, ValueError):
        return None


def _host_memory(meminfo_key: str, sysconf_pages: str, cgroup_cap: int | None) -> int:
    """Bytes of the Linux ``/proc/meminfo`` entry ``meminfo_key`` (elsewhere ``sysconf_pages`` ×
    the page size, else 8 GiB), capped by ``cgroup_cap`` when there is one."""
    value = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(meminfo_key + ":"):
                    value = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if value is None:
        try:
            value = os.sysconf(sysconf_pages) * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            value = 8 * 2**30
    return min(value, cgroup_cap) if cgroup_cap is not None else value


def _host_total() -> int:
    """Bytes of physical RAM (Linux ``MemTotal``), capped by a cgroup limit."""
    return _host_memory("MemTotal", "SC_PHYS_PAGES", _cgroup_limit())


def _host_available() -> int:
    """Bytes of RAM available to new allocations (MemAvailable, capped by what a cgroup limit leaves)."""
    return _host_memory("MemAvailable", "SC_AVPHYS_PAGES", _cgroup_free())


def available_bytes(device: torch.device | str) -> int:
    """Bytes free for new tensors on ``device`` now: CUDA free memory plus what torch's caching
    allocator holds unused; host RAM available (Linux ``MemAvailable``, cgroup limits respected)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + max(0, cached))
    return int(_host_available())


def total_bytes(device: torch.device | str) -> int:
    """Bytes of memory ``device`` has for this process's new tensors, independent of what other
    processes use: a GPU's total memory less what this process's tensors hold now (the model,
    the data); host RAM: the physical total (a cgroup limit when lower)."""
    device = torch.device(device)
    if device.type == "cuda":
        _free, total = torch.cuda.mem_get_info(device)
        return int(max(0, total - torch.cuda.memory_allocated(device)))
    return int(_host_total())


def default_budget(device: torch.device | str) -> int:
    """The default ``max_memory``: :data:`CUDA_FRACTION` of :func:`total_bytes` on a GPU,
    :data:`CPU_FRACTION` of the host's total RAM on a CPU; ``$LOSSLENS_MEMORY_FRACTION`` overrides
    the fraction (set for worker processes that share the machine). It does not depend on how much
    memory happens to be free when an estimator starts, so its choices (sketch size, basis) and
    numbers do not either; a plan larger than what is free then fails or swaps rather than
    silently changing the result (pass a smaller ``max_memory`` on a busy machine)."""
    device = torch.device(device)
    frac = CUDA_FRACTION if device.type == "cuda" else CPU_FRACTION
    env = os.environ.get(MEMORY_FRACTION_ENV, "").strip()
    if env:
        try:
            frac = float(env)
        except ValueError:
            raise MemoryBudgetError(f"{MEMORY_FRACTION_ENV} must be a fraction such as 0.25, got {env!r}") from None
        if not 0 < frac <= 1:
            raise MemoryBudgetError(f"{MEMORY_FRACTION_ENV} must be in (0, 1], got {env!r}")
    return int(frac * total_bytes(device))


def resolve_budget(max_memory: Any, device: torch.device | str) -> int:
    """``max_memory`` (None, bytes or a size string) as bytes; None gives :func:`default_budget`."""
    return default_budget(device) if max_memory is None else parse_bytes(max_memory, device)


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
