"""What every section of the GPU check shares: the device, timing, peak memory, rows and checks.

A *row* is a dict with at least ``section``, ``what`` and ``status`` (``ok``, ``mismatch``,
``failed``, ``skipped`` or ``info``); a check row also has ``value`` and ``tolerance`` (a relative
difference and its bound). Timings synchronise the device before and after (CUDA kernels are
asynchronous); peak memory is ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` on
CUDA and the kernel's peak resident memory (``VmHWM`` after ``/proc/self/clear_refs``) on the CPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class Context:
    """What the sections run with: the device, toy sizes or real ones, and the time left."""

    device: torch.device
    quick: bool
    deadline: float
    shapes: tuple[str, ...] = ("pythia-160m", "olmo-2-1b")
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, n: int = 3) -> float:
    """Median wall seconds of ``n`` calls, the device synchronised around each."""
    ts = []
    for _ in range(n):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def rel_diff(a: torch.Tensor | float, b: torch.Tensor | float) -> float:
    """‖a − b‖ / ‖b‖ in float64 (scalars: |a − b| / |b|; 0 when both are 0)."""
    a = torch.as_tensor(a, dtype=torch.float64).cpu()
    b = torch.as_tensor(b, dtype=torch.float64).cpu()
    den = float(b.norm())
    num = float((a - b).norm())
    return num / den if den > 0 else num


def check(section: str, what: str, value: float, tolerance: float, **extra: Any) -> dict:
    """A check row: ``status`` ok when ``value <= tolerance`` (a NaN value is a mismatch)."""
    ok = value == value and value <= tolerance
    return {
        "section": section,
        "what": what,
        "value": float(value),
        "tolerance": float(tolerance),
        "status": "ok" if ok else "mismatch",
        **extra,
    }


def info(section: str, what: str, **extra: Any) -> dict:
    """A measurement row (a time, a memory ratio): recorded, never judged."""
    return {"section": section, "what": what, "status": "info", **extra}


class PeakMemory:
    """Peak memory of a block above what was in use at its start (bytes).

    CUDA: ``allocated`` and ``reserved`` (the caching allocator's pool) from torch's counters; CPU:
    ``allocated`` is the kernel's peak resident memory above the start, ``reserved`` None.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.allocated: int | None = None
        self.reserved: int | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            self._a0 = torch.cuda.memory_allocated(self.device)
            self._r0 = torch.cuda.memory_reserved(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_cpu_peak()
            self._a0 = _cpu_rss()[0]
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.allocated = torch.cuda.max_memory_allocated(self.device) - self._a0
            self.reserved = torch.cuda.max_memory_reserved(self.device) - self._r0
        else:
            self.allocated = _cpu_rss()[1] - self._a0


def _cpu_rss() -> tuple[int, int]:
    """(resident, peak resident) bytes of this process; (0, 0) where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            d = dict(line.split(":", 1) for line in f if ":" in line)
        return int(d["VmRSS"].split()[0]) * 1024, int(d["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError):
        return 0, 0


def _reset_cpu_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {'; '.join(lines)[:400]}" if lines else type(exc).__name__
