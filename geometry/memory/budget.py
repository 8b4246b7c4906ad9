"""How many bytes a run may use: ``max_memory`` as a user writes it, the machine's memory, the default.

**Sizes** (``--max-memory 8GB``, a plan's ``max_memory``) have one strict parser, :func:`parse_size`.

A size is a plain decimal number and a unit, with or without a space between (``8GB``, ``8 GB``,
``0.5GB``, ``512MiB``); the unit's case does not matter (``8gb`` is ``8GB``: bytes, never bits):

- decimal units, powers of 1000 (as disks, and as losslens prints sizes): ``B``, ``kB``, ``MB``,
  ``GB``, ``TB`` — ``0.5GB`` is 500,000,000 bytes;
- binary units, powers of 1024: ``KiB``, ``MiB``, ``GiB``, ``TiB`` — ``0.5GiB`` is 536,870,912 bytes.

The value is exact (no float rounding) and rounded down to a whole byte. Refused, each with a message
that says what was read and what is accepted: a bare number (bytes or gigabytes? write ``8GB`` or
``8000000000B``), a single-letter unit (``8G``: tools disagree whether that is 10⁹ or 2³⁰ bytes),
signs, exponents (``1e9``), NaN and infinities, words, anything below :data:`MIN_SIZE` (1 MB) and
anything above ``limit`` (the caller passes the machine's memory: :func:`parse_bytes`).

An ``int`` is a number of bytes computed by code (a budget derived from a measurement, a test that
forces a plan): exact, at least 1, with no upper bound (a budget is a bound, not an allocation).
Everything else (a float, a bool, None) is refused. :func:`parse_bytes` is that parser capped by the
device's memory, refusing with :class:`MemoryBudgetError`.

**The machine's memory**: :func:`total_bytes` (host RAM, or a GPU's memory less this process's
tensors; cgroup limits respected) and :func:`available_bytes` (free now). **The budget**:
:func:`resolve_budget` turns ``max_memory`` (None, bytes or a size string) into bytes, None giving
:func:`default_budget`, a fixed fraction of the total (never of what happens to be free, so the same
machine and settings give the same plans). What the estimators do within it:
:mod:`losslens.geometry.memory.model`.
"""

from __future__ import annotations

import os
import re
from fractions import Fraction
from typing import Any

import torch

from losslens.geometry.base.errors import LosslensError
from losslens.geometry.base.results import EstimatorError

__all__ = [
    "ACCEPTED",
    "CPU_FRACTION",
    "CUDA_FRACTION",
    "MEMORY_FRACTION_ENV",
    "MIN_SIZE",
    "UNITS",
    "MemoryBudgetError",
    "SizeError",
    "available_bytes",
    "default_budget",
    "format_bytes",
    "parse_bytes",
    "parse_size",
    "resolve_budget",
    "total_bytes",
]

#: The smallest size a user may write: 1 MB (10⁶ bytes). Below it no curvature plan fits.
MIN_SIZE = 10**6
#: Bytes per unit, by the unit's lower-case spelling.
UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
#: What a size may look like, for the messages.
ACCEPTED = "a number and a unit, B/kB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024), e.g. 8GB or 512MiB"
_MAX_CHARS = 64
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)")


class SizeError(LosslensError, ValueError):
    """A size that cannot be read, or one outside [1 MB, the machine's memory]."""


def _bytes_text(n: int) -> str:
    return f"{n:,} bytes" if n < 10**24 else f"about 10^{len(str(n)) - 1} bytes"


def _why_unreadable(text: str) -> str:
    low = text.lower()
    if low.lstrip().startswith(("-", "+")):
        return "a size has no sign"
    if re.search(r"nan|inf", low):
        return "it is not a finite number"
    if re.search(r"\d\s*e\s*[+-]?\d", low):
        return "it has an exponent (write plain digits: 2GB, not 2e9B)"
    return "it is not a number followed by a unit"


def parse_size(value: Any, limit: int | None = None, limit_text: str = "this machine's memory") -> int:
    """Bytes of ``value``: a size string (module docstring) or an ``int`` of bytes.

    ``limit``: the largest size accepted, in bytes (None: no upper bound); ``limit_text`` names it in
    the message (e.g. ``"this machine's memory (25.0 GB of RAM)"``). Raises :class:`SizeError`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        shown = f"the {type(value).__name__} {value!r}"
        raise SizeError(f"cannot use {shown} as a size; write {ACCEPTED} (or pass an integer number of bytes)")
    if isinstance(value, int):
        if value < 1:
            raise SizeError(f"a size in bytes must be at least 1, got {value}; or write {ACCEPTED}")
        return value
    text = value.strip()
    if not text:
        raise SizeError(f"read an empty size; write {ACCEPTED}")
    if len(text) > _MAX_CHARS:
        raise SizeError(f"read a size of {len(text)} characters ({text[:20]!r}…); write {ACCEPTED}")
    m = _SIZE.fullmatch(text)
    if m is None:
        raise SizeError(f"cannot read the size {value!r}: {_why_unreadable(text)}; write {ACCEPTED}")
    number, unit = m.group(1), m.group(2)
    if not unit:
        raise SizeError(f"the size {value!r} has no unit (bytes or gigabytes?); write {ACCEPTED} ({number}B for bytes)")
    if unit.lower() not in UNITS:
        if unit.lower() in ("k", "m", "g", "t"):
            u = unit.upper().replace("K", "k")
            raise SizeError(
                f"the unit of {value!r} is ambiguous ({u} means 10^n or 2^n bytes depending on the tool); "
                f"write {number}{u}B (powers of 1000) or {number}{unit.upper()}iB (powers of 1024)"
            )
        raise SizeError(f"the size {value!r} has an unknown unit {unit!r}; write {ACCEPTED}")
    nbytes = int(Fraction(number) * UNITS[unit.lower()])
    if nbytes < MIN_SIZE:
        raise SizeError(
            f"the size {value!r} is {_bytes_text(nbytes)}, below the smallest size, 1 MB "
            f"({MIN_SIZE:,} bytes); write {ACCEPTED}, from 1MB up"
        )
    if limit is not None and nbytes > limit:
        raise SizeError(
            f"the size {value!r} is {_bytes_text(nbytes)}, more than {limit_text} "
            f"({_bytes_text(limit)}); write a size from 1MB to {limit // MIN_SIZE}MB"
        )
    return nbytes


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
    """Bytes of a size string (:func:`parse_size`, at most the memory of ``device``)
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
