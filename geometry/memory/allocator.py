"""The host allocator: freed tensor memory goes back to the OS, so the budget holds as a cap.

The memory plan (:mod:`geometry.memory.model`) counts the bytes of live tensors. On Linux, torch's
CPU tensors come from glibc ``malloc``. By default glibc serves requests below a *dynamic* mmap
threshold (128 kB, raised up to 32 MB each time a larger mapped block is freed) from its heaps
and arenas, which keep freed space for reuse and fragment: the process's resident memory then
grows beyond its live tensors (measured 0.8–1.5 GB over the plan at the Pythia-160m shape,
benchmarks/README.md "Scale"). :func:`return_freed_memory` fixes the threshold, so every tensor of
at least ``mmap_threshold`` bytes gets its own mapping, returned to the OS when the tensor is freed,
and trims the heaps' free tops.

It changes process-wide allocator settings, so library code never calls it at import: the
``losslens`` CLI calls it once at start (and exports the same settings through the environment to
the worker processes it starts), and so does ``benchmarks/scale.py``. A Python user can call it
too. It does nothing off glibc (macOS, musl) and for CUDA memory (torch's caching allocator
keeps its own reserve there).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["return_freed_memory", "trim", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

#: Allocations of at least this many bytes get their own mapping (returned to the OS on free).
#: 1 MiB: a [1024]-float32 row is below it, every full-dim vector, gradient and activation of a
#: 14M+ model above it. Measured cost: benchmarks/README.md "Scale" (seconds with and without).
MMAP_THRESHOLD = 1 << 20
#: The heaps return their free top to the OS once it exceeds this many bytes.
TRIM_THRESHOLD = 1 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3           # glibc malloc.h
_ENV = {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD}


def _libc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return lib if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


def return_freed_memory(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD,
                        children: bool = True) -> bool:
    """Make freed host memory go back to the OS (glibc ``mallopt``; see the module docstring).

    Args:
        mmap_threshold: bytes from which an allocation is mapped on its own (fixed: glibc's
            dynamic raising of the threshold is switched off by setting it).
        trim_threshold: free bytes at a heap's top above which the heap is trimmed.
        children: also export ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` so processes
            started from now on (sweep workers) get the same settings (existing values are kept).

    Returns True when the settings were applied (glibc), False otherwise (nothing changed).
    Changes process-wide state: call it from an application's entry point, never at import.
    """
    lib = _libc()
    if lib is None:
        return False
    ok = bool(lib.mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(lib.mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)))
    if ok and children:
        for key, value in (("MALLOC_MMAP_THRESHOLD_", mmap_threshold), ("MALLOC_TRIM_THRESHOLD_", trim_threshold)):
            os.environ.setdefault(key, str(int(value)))
    lib.malloc_trim(0)
    return ok


def trim() -> bool:
    """Return the heaps' free memory to the OS now (glibc ``malloc_trim(0)``); False off glibc."""
    lib = _libc()
    return bool(lib.malloc_trim(0)) if lib is not None else False
