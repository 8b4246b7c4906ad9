"""Result records of an attribution along a direction d (:mod:`losslens.geometry.estimators.attribution`):
the factors of ½dᵀHd (:class:`QuadraticFactors`), the per-parameter parts of gᵀd, dᵀHd and ‖d‖²
(:class:`DirectionParts`) and both by block (:class:`Attribution`). Frozen dataclasses, plain data;
``to_dict()`` as every result of :mod:`losslens.geometry.base.results`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from losslens.geometry.base.results import TraceEstimate, _ToDict

__all__ = ["QuadraticFactors", "DirectionParts", "Attribution"]


@dataclass(frozen=True)
class QuadraticFactors(_ToDict):
    """The second-order change of the loss along a direction d, split into factors (n = ``dim``):

    ``½ dᵀHd = ½ · ‖d‖² · (tr H / n) · κ`` with ``κ = (dᵀHd / ‖d‖²) / (tr H / n)``.

    κ compares the curvature along d with the mean curvature of the space: an isotropic random
    direction has E[dᵀHd]/‖d‖² = tr H / n, so κ = 1 means d sees the average curvature, κ > 1 that
    it leans on sharp directions. dᵀHd, gᵀd and ‖d‖ are exact (one HVP, one gradient); tr H is an
    estimate whose 95% interval propagates into tr H/n and κ.

    Attributes:
        gTd, dHd: gᵀd and dᵀHd (loss units).
        quadratic: ``½ dᵀHd``; predicted: ``gᵀd + ½ dᵀHd`` (second-order Taylor change of the loss).
        actual: the measured change L(θ + d) − L(θ) on the same data (``nan`` when not measured).
        remainder: ``actual − predicted`` (third and higher orders; ``nan`` when ``actual`` is).
        norm2: ``‖d‖²``; dim: n, the number of coordinates of the space (of d and of tr H).
        trace, trace_stderr, trace_ci_low, trace_ci_high: the tr H estimate and its 95% interval
            (``stderr = 0`` and a point interval for an exact trace).
        trace_per_param, trace_per_param_ci_low, trace_per_param_ci_high: tr H / n and its interval.
        rayleigh: ``dᵀHd / ‖d‖²``, the curvature along d (loss per parameter²).
        kappa: κ; kappa_stderr: delta-method ``|κ| · stderr(tr H) / |tr H|``; kappa_ci_low,
            kappa_ci_high: ``rayleigh / (tr H/n)`` at the ends of the trace's interval (unbounded,
            ±inf, when the trace's interval reaches 0).
        trace_method: how tr H was obtained (``"hutch++"``, ``"hutchinson"``, ``"exact"``, ``"given"``).
    """

    gTd: float
    dHd: float
    quadratic: float
    predicted: float
    actual: float
    remainder: float
    norm2: float
    dim: int
    trace: float
    trace_stderr: float
    trace_ci_low: float
    trace_ci_high: float
    trace_per_param: float
    trace_per_param_ci_low: float
    trace_per_param_ci_high: float
    rayleigh: float
    kappa: float
    kappa_stderr: float
    kappa_ci_low: float
    kappa_ci_high: float
    trace_method: str = "given"

    @property
    def product(self) -> float:
        """``½ · ‖d‖² · (tr H / n) · κ`` (equals :attr:`quadratic` up to rounding)."""
        return 0.5 * self.norm2 * self.trace_per_param * self.kappa


@dataclass(frozen=True)
class DirectionParts(_ToDict):
    """Per-parameter parts of gᵀd, dᵀHd and ‖d‖² along a direction d, from one gradient and one HVP.

    For every parameter tensor p of the operator's space: ``gTd[i] = d_pᵀ g_p``, ``dHd[i] = d_pᵀ (Hd)_p``
    and ``norm2[i] = ‖d_p‖²`` (float64 sums), so any partition of the parameters into blocks B gives
    ``Σ_B Σ_{p∈B} dHd[p] = dᵀHd`` exactly (the same products, summed in another order).

    Attributes:
        names, numels: the parameters (space order) and their sizes.
        gTd, dHd, norm2: per-parameter parts (tuples aligned with ``names``).
        loss: L(θ) on the operator's data.
        num_matvecs, num_gradients, seconds: cost (1 HVP, 1 gradient) and wall time.
        memory: the memory plan (as :func:`losslens.geometry.estimators.directional.estimate_memory`).
    """

    names: tuple[str, ...]
    numels: tuple[int, ...]
    gTd: tuple[float, ...]
    dHd: tuple[float, ...]
    norm2: tuple[float, ...]
    loss: float
    num_matvecs: int
    num_gradients: int
    seconds: float
    memory: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def total_gTd(self) -> float:
        return float(math.fsum(self.gTd))

    @property
    def total_dHd(self) -> float:
        return float(math.fsum(self.dHd))

    @property
    def total_norm2(self) -> float:
        return float(math.fsum(self.norm2))

    @property
    def dim(self) -> int:
        return int(sum(self.numels))


@dataclass(frozen=True)
class Attribution(_ToDict):
    """gᵀd and dᵀHd along a direction d, by factor (:class:`QuadraticFactors`) and by parameter block.

    Per block b (a group of parameters; the groups partition the space): ``dHd[b] = d_bᵀ (Hd)_b``
    and ``gTd[b] = d_bᵀ g_b`` sum to the totals exactly. ``dHd[b]`` holds the block's own curvature
    ``within[b] = d_bᵀ H_bb d_b`` plus its share of the cross-block terms ``Σ_{c≠b} d_bᵀ H_bc d_c``;
    :attr:`cross` = ``dᵀHd − Σ_b within[b]`` is what the cross-block terms add in all.

    Attributes:
        factors: the factorisation of ½dᵀHd with the trace's interval, and the remainder.
        groups: block names in order; members: parameter names per block; sizes: numbers per block.
        gTd, dHd, norm2: per block.
        within: per block ``d_bᵀ H_bb d_b`` when asked for (one extra HVP per block), else None.
        loss: L(θ) on the operator's data.
        trace: the :class:`TraceEstimate` behind tr H (None when a number was given).
        num_matvecs: HVPs spent by this call (1 + blocks for ``within`` + the trace's when estimated here).
        num_gradients, seconds, memory: cost, wall time, the memory plan.
    """

    factors: QuadraticFactors
    groups: tuple[str, ...]
    members: dict[str, tuple[str, ...]]
    sizes: dict[str, int]
    gTd: dict[str, float]
    dHd: dict[str, float]
    norm2: dict[str, float]
    within: dict[str, float] | None
    loss: float
    trace: TraceEstimate | None
    num_matvecs: int
    num_gradients: int
    seconds: float
    memory: dict = field(default_factory=dict, compare=False, hash=False)

    def __hash__(self) -> int:  # dict fields: hash by identity
        return id(self)

    @property
    def cross(self) -> float:
        """``dᵀHd − Σ_b d_bᵀ H_bb d_b`` (``nan`` without ``within``)."""
        if self.within is None:
            return math.nan
        return self.factors.dHd - float(math.fsum(self.within.values()))

    def rows(self) -> list[dict[str, Any]]:
        """One dict per block: ``block, size, norm2, gTd, dHd, quadratic (= dHd/2), dHd_share,
        norm2_share`` and, with ``within``, ``within`` and ``cross`` (= dHd − within)."""
        tot, n2 = self.factors.dHd, self.factors.norm2
        out = []
        for g in self.groups:
            r = {
                "block": g,
                "size": self.sizes[g],
                "norm2": self.norm2[g],
                "gTd": self.gTd[g],
                "dHd": self.dHd[g],
                "quadratic": 0.5 * self.dHd[g],
                "dHd_share": self.dHd[g] / tot if tot else math.nan,
                "norm2_share": self.norm2[g] / n2 if n2 else math.nan,
            }
            if self.within is not None:
                r["within"] = self.within[g]
                r["cross"] = self.dHd[g] - self.within[g]
            out.append(r)
        return out
