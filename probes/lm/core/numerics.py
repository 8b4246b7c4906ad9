"""Relative error: the one definition behind every "how far is A from B" number.

Used for the per-layer weight error of quantizers (``LayerReport.rel_weight_error``), the
second-order check's agreement with finite differences, and the benchmarks' accuracy columns.
"""

from __future__ import annotations

import torch

__all__ = ["rel_error"]


def rel_error(new, old) -> float:
    """‖new − old‖ / ‖old‖ over all entries (Frobenius / Euclidean norm), computed in float64.

    ``new``, ``old``: tensors of one shape, or numbers (then ``|new − old|`` / ``|old|``). Returns 0 when
    both are zero and inf when only ``old`` is.
    """
    new, old = _float64(new), _float64(old)
    num = float(torch.linalg.vector_norm(new - old))
    den = float(torch.linalg.vector_norm(old))
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return num / den


def _float64(x) -> torch.Tensor:
    return x.double() if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.float64)
