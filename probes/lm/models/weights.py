"""Weight statistics: excess kurtosis per matrix and pooled over the quantized matrices (docs/science.md §6).

Excess kurtosis of the entries w of a tensor: ``E[(w - mu)^4] / sigma^4 - 3`` with population
moments (divide by n, not n - 1), computed in float64; 0 for a Gaussian, larger for heavy-tailed
weights (outliers make low-bit grids coarse). Equals ``scipy.stats.kurtosis(w, fisher=True,
bias=True)``. The pooled value treats the entries of all selected matrices as one sample.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import torch
from torch import nn

from losslens.geometry.base.errors import LosslensError
from losslens.lm.core.modules import select_linears

__all__ = ["excess_kurtosis", "weight_kurtosis", "KurtosisResult", "WeightStatsError"]


class WeightStatsError(LosslensError, ValueError):
    """A tensor has too few entries, zero variance, or non-finite values."""


def _central_moments(t: torch.Tensor) -> tuple[int, float, float, float]:
    """(n, mean, m2, m4) of the flattened tensor, population moments in float64."""
    x = t.detach().reshape(-1).to(torch.float64)
    n = x.numel()
    if n == 0:
        raise WeightStatsError("kurtosis of an empty tensor")
    if not bool(torch.isfinite(x).all()):
        raise WeightStatsError("tensor has non-finite entries (NaN/inf); the weights are broken")
    mu = x.mean()
    d2 = (x - mu).pow(2)
    return n, float(mu), float(d2.mean()), float(d2.pow(2).mean())


def excess_kurtosis(t: torch.Tensor) -> float:
    """E[(w - mu)^4] / sigma^4 - 3 over all entries of ``t`` (any shape), population moments, float64.

    Raises :class:`WeightStatsError` for an empty tensor, non-finite entries or zero variance.
    Cost: O(numel), one float64 copy of ``t``.
    """
    n, _, m2, m4 = _central_moments(t)
    if m2 == 0.0:
        raise WeightStatsError(f"kurtosis undefined: all {n} entries are equal (zero variance)")
    return m4 / (m2 * m2) - 3.0


@dataclass(frozen=True)
class KurtosisResult:
    """Excess kurtosis of each selected weight matrix (by module name) and of all their entries pooled."""

    per_matrix: dict
    pooled: float
    n_params: int
    modules: tuple[str, ...]

    @property
    def mean(self) -> float:
        """Unweighted mean of the per-matrix values."""
        return sum(self.per_matrix.values()) / len(self.per_matrix)

    @property
    def max(self) -> float:
        return max(self.per_matrix.values())

    def to_dict(self) -> dict:
        return asdict(self)


def weight_kurtosis(model: nn.Module, modules: "str | Sequence[str] | dict | None" = None) -> KurtosisResult:
    """Excess kurtosis of the weight matrices of ``model``'s quantized linears.

    ``modules``: None -> :func:`losslens.lm.core.modules.select_linears` default (every ``nn.Linear`` in the
    decoder blocks); globs -> ``select_linears(model, globs)``; or a ``{name: nn.Linear}`` dict.
    Biases are excluded. Pooled = kurtosis of the concatenation of all selected weights, computed
    in two passes over the matrices (no concatenated copy). Cost: O(number of weights).
    """
    chosen = modules if isinstance(modules, dict) else select_linears(model, modules)
    if not chosen:
        raise WeightStatsError("no weight matrices selected")
    per: dict[str, float] = {}
    n_tot, total = 0, 0.0
    for name, mod in chosen.items():
        w = mod.weight.detach()
        per[name] = excess_kurtosis(w)
        n_tot += w.numel()
        total += float(w.to(torch.float64).sum())
    mu = total / n_tot
    s2 = s4 = 0.0  # second pass: central moments about the pooled mean (no cancellation)
    for mod in chosen.values():
        d2 = (mod.weight.detach().to(torch.float64) - mu).pow(2)
        s2 += float(d2.sum())
        s4 += float(d2.pow(2).sum())
    m2, m4 = s2 / n_tot, s4 / n_tot
    if m2 <= 0 or not math.isfinite(m4):
        raise WeightStatsError("pooled kurtosis undefined: zero variance across the selected weights")
    return KurtosisResult(per, m4 / (m2 * m2) - 3.0, n_tot, tuple(per))
