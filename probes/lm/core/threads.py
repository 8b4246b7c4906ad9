"""torch's intra-op thread count, set for a block and restored afterwards.

Tiny models (hidden size <= 64) run fastest on one thread: on a small shared machine OpenMP
barriers, not flops, dominate their matrices (2 threads under load were measured 5-30x slower than
1). Training, sweeps, the demo and the benchmarks therefore pin the count for their duration.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["torch_threads"]


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """``torch.set_num_threads(n)`` inside the block; the previous count is restored on exit (also on
    error). ``n`` None or 0 leaves torch's setting as it is."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)
