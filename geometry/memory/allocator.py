"""The host allocator's retention, and ``--strict-memory`` (glibc ``mallopt``).

The memory plan (:mod:`losslens.geometry.memory.model`) counts the bytes of live tensors. On Linux, torch's
CPU tensors come from glibc ``malloc``, which serves requests below a *dynamic* mmap threshold
(128 kB, raised up to 32 MB each time a larger mapped block is freed) from heaps that keep freed
space: resident memory can exceed the live tensors. :func:`return_freed_memory` fixes the
threshold, so every allocation of at least ``mmap_threshold`` bytes gets its own mapping, returned
to the OS when freed (tests/test_memory_allocator.py shows the mechanism).

Measured (benchmarks/README.md "Scale", Hutchinson, 8 HVPs, graphs kept, float32, 2 threads; the
heap trimmed before the baseline): with glibc's defaults peak RSS exceeds the live tensors by
0.25-0.33 GB at the Pythia-70m shape and 0.72 GB at 160m, about 1.1-1.5 x the saved graphs of the
kept batches; a 1 MiB threshold leaves 0.17 / 0.44 GB of it (activations below 1 MiB still come
from the heaps); 64 kB (:data:`STRICT_MMAP_THRESHOLD`) leaves 0.04 GB, the kernels' own
temporaries, at 1.6-1.7 x the time (every activation is then a fresh mapping). The CLI applies it
with ``--strict-memory``, which is on when ``--max-memory`` is given; with the default budget (a
third of the RAM) it keeps glibc's defaults. (Before issue #22 the
products' finiteness check also cast every product to float64, 8 bytes per parameter outside the
plan: that, not the allocator, was most of the gap once put down to glibc.) It changes
process-wide state: call it from an application's entry point, never at import. It does nothing
off glibc (macOS, musl) and for CUDA memory (torch's caching allocator keeps its own reserve).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["return_freed_memory", "trim", "MMAP_THRESHOLD", "STRICT_MMAP_THRESHOLD", "TRIM_THRESHOLD"]

#: Allocations of at least this many bytes get their own mapping (returned to the OS on free).
MMAP_THRESHOLD = 1 << 20
#: The threshold of ``losslens … --strict-memory``: measured to keep peak RSS within the plan
#: (1 MiB did not: activations below it fragment the heaps; benchmarks/README.md "Scale").
STRICT_MMAP_THRESHOLD = 64 << 10
#: The heaps return their free top to the OS once it exceeds this many bytes.
TRIM_THRESHOLD = 1 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h


def _libc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return lib if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


def return_freed_memory(
    mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD, children: bool = True
) -> bool:
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
    ok = bool(lib.mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(
        lib.mallopt(_M_TRIM_THRESHOLD, int(trim_threshold))
    )
    if ok and children:
        for key, value in (("MALLOC_MMAP_THRESHOLD_", mmap_threshold), ("MALLOC_TRIM_THRESHOLD_", trim_threshold)):
            os.environ.setdefault(key, str(int(value)))
    lib.malloc_trim(0)
    return ok


def trim() -> bool:
    """Return the heaps' free memory to the OS now (glibc ``malloc_trim(0)``); False off glibc."""
    lib = _libc()
    return bool(lib.malloc_trim(0)) if lib is not None else False
