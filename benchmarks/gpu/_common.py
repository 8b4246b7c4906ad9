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


#: Optional packages a section may need, and the line that installs each (pyproject.toml's extras;
#: PyHessian is a benchmark peer in the ``dev`` extra; GPTQModel is not an extra: installed on its own).
OPTIONAL_INSTALL: dict[str, str] = {
    "lm_eval": "pip install 'losslens[eval]'",
    "gguf": "pip install 'losslens[gguf]'",
    "accelerate": "pip install 'losslens[monitor]'",
    "lightning": "pip install 'losslens[monitor]'",
    "bitsandbytes": "pip install 'losslens[quant]'",
    "ray": "pip install 'losslens[ray]'",
    "pyhessian": "pip install 'losslens[dev]'",
    "gptqmodel": "pip install gptqmodel",
}


def is_absent(package: str) -> bool:
    """True when the top-level ``package`` cannot be imported because it is not installed.

    A package that is installed but fails on import is *not* absent (that is a failure to report).
    ``sys.modules[package] is None`` (how tests hide a package) counts as absent.
    """
    import importlib.util
    import sys

    top = package.split(".")[0]
    if top in sys.modules:
        return sys.modules[top] is None
    try:
        return importlib.util.find_spec(top) is None
    except (ImportError, ValueError):  # a parent package that raises, or a module without a spec
        return False


def absent_optional(exc: BaseException) -> str | None:
    """The optional package whose absence raised ``exc``, or None when ``exc`` is anything else.

    Only a ``ModuleNotFoundError`` naming a package of :data:`OPTIONAL_INSTALL` that is really not
    installed counts: an ``ImportError`` from losslens itself, or from an installed optional package
    whose submodule is missing (a version mismatch), is a failure.
    """
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    return top if top in OPTIONAL_INSTALL and is_absent(top) else None


def skipped_for_missing(section: str, package: str, what: str | None = None) -> dict:
    """A ``skipped`` row for a section that needs the optional ``package``, with its install line."""
    return {
        "section": section,
        "what": what or f"not run: needs {package}",
        "status": "skipped",
        "reason": f"the optional package {package!r} is not installed",
        "install": OPTIONAL_INSTALL[package],
    }
