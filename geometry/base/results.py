"""Result records of the curvature estimators: small frozen dataclasses, plain data.

Every estimator in :mod:`geometry.estimators.trace`, :mod:`geometry.estimators.eigen`, :mod:`geometry.estimators.density` and
:mod:`geometry.estimators.directional` returns one of these instead of a bare float. Each carries the
value(s), error bars where the method has them, ``num_matvecs`` (Hessian-vector products actually
spent, read from the operator's counter), ``seconds`` (wall time of the call) and ``seed``.
``to_dict()`` gives JSON-ready builtins (floats, ints, bools, strings, lists, dicts); arrays and
eigenvectors are converted to lists or left out as documented per class.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from .errors import LosslensError
from .jsonable import jsonable

__all__ = ["EstimatorError", "TraceEstimate", "EigenResult", "SpectralDensity", "BlockTraces", "DirectionalCurvature",
           "QuadraticFactors", "DirectionParts", "Attribution"]


class EstimatorError(LosslensError, ValueError):
    """Bad input to an estimator (``num_matvecs < 1``, ``k > dim``, ...) or a non-finite result."""


def _unchanged(x: Any) -> Any:
    return x


class _ToDict:
    _skip: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Fields as JSON-ready builtins (numpy arrays become nested lists)."""
        return {f.name: jsonable(getattr(self, f.name), _unchanged) for f in fields(self) if f.name not in self._skip}


@dataclass(frozen=True)
class TraceEstimate(_ToDict):
    """A stochastic estimate of tr(H).

    Attributes:
        value: the trace estimate (units of the loss per parameter², summed over the diagonal).
        stderr: standard error of ``value``: sample standard deviation of the per-probe samples
            (ddof=1) divided by sqrt(number of samples); for Hutch++ only the residual Hutchinson
            part contributes (the low-rank part is deterministic given the sketch). ``inf`` when
            only one sample was drawn, ``0.0`` when the value is exact.
        ci_low, ci_high: 95% confidence interval, ``value ± t_{0.975, n-1} · stderr`` (Student t
            with n-1 degrees of freedom, n = number of samples; equals the normal interval ±1.96·stderr
            for large n).
        num_matvecs: Hessian-vector products spent.
        seconds: wall time of the call.
        seed: the seed of the probes.
        method: ``"hutchinson"``, ``"hutch++"`` or ``"exact"`` (Hutch++ with budget ≥ dim).
        converged: Hutchinson with ``tol``: whether the relative standard error fell below ``tol``;
            without ``tol`` (nothing to reach) and for Hutch++: ``True``.
        num_samples: number of Rademacher samples behind ``stderr`` (Hutch++: the residual part).
        dim: dimension of the operator.
        memory: the memory plan it ran with (:meth:`geometry.memory.model.MemoryEstimate.to_dict`:
            predicted bytes, budget, and the settings chosen: block size, Hutch++ sketch size, ...).
    """

    value: float
    stderr: float
    ci_low: float
    ci_high: float
    num_matvecs: int
    seconds: float
    seed: int
    method: str = "hutchinson"
    converged: bool = True
    num_samples: int = 0
    dim: int = 0
    memory: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def rel_stderr(self) -> float:
        """``stderr / |value|`` (``inf`` for a zero value with nonzero error)."""
        if self.stderr == 0:
            return 0.0
        return self.stderr / abs(self.value) if self.value != 0 else math.inf


@dataclass(frozen=True)
class EigenResult(_ToDict):
    """Extreme eigenvalues of H.

    Attributes:
        values: k eigenvalue estimates sorted by magnitude, largest first, sign kept.
        residuals: ``‖H v_i − λ_i v_i‖`` for the unit eigenvector estimate v_i (same units as λ).
        converged: per value, whether the method's stopping criterion was met (see
            :func:`geometry.estimators.eigen.top_eigenvalues`).
        num_matvecs, seconds, seed: cost, wall time, seed of the random start.
        method: ``"lanczos"`` or ``"power"``.
        iterations: Lanczos steps taken, or power iterations summed over the k values.
        memory: the memory plan (predicted bytes, budget, basis size, restarts, graph cache).
        vectors: the unit eigenvector estimates as a ``[k, dim]`` tensor on the operator's device
            (not part of ``to_dict()`` or equality).
    """

    values: tuple[float, ...]
    residuals: tuple[float, ...]
    converged: tuple[bool, ...]
    num_matvecs: int
    seconds: float
    seed: int
    method: str
    iterations: int = 0
    vectors: Any = field(default=None, repr=False, compare=False)
    memory: dict = field(default_factory=dict, compare=False, hash=False)

    _skip = ("vectors",)

    @property
    def lambda_max(self) -> float:
        """The largest-magnitude eigenvalue estimate (sign kept)."""
        return self.values[0]


@dataclass(frozen=True, eq=False)
class SpectralDensity(_ToDict):
    """Stochastic Lanczos quadrature (SLQ) estimate of the eigenvalue density of H.

    Per run r (a normalised Rademacher start vector v_r), Lanczos gives a tridiagonal T_r whose
    eigenvalues are the quadrature ``nodes[r]`` and whose eigenvectors' squared first components are
    the ``weights[r]`` (each run's weights sum to 1). Then for any f,
    ``Σ_i weights[r][i] f(nodes[r][i]) ≈ v_rᵀ f(H) v_r / ‖v_r‖²``, whose expectation is ``tr f(H) / dim``.

    Attributes:
        nodes, weights: one float64 numpy array per run (length = Lanczos steps of that run, which
            is ``num_steps`` unless the Krylov space became invariant earlier).
        grid: ``[grid_size]`` float64 eigenvalue axis, spanning all nodes with a margin.
        density: ``[grid_size]`` float64: mean over runs of ``Σ_i w_i N(t; λ_i, sigma²)``, then
            normalised so that its Riemann sum over the grid is 1 (as PyHessian draws it).
        sigma: standard deviation of the Gaussian kernel (eigenvalue units).
        dim: dimension of the operator.
        num_runs, num_steps: as requested (``num_steps`` capped at ``dim``).
        num_matvecs, seconds, seed: cost (≤ num_runs · num_steps HVPs), wall time, seed.
        steps: Lanczos steps each run actually took (fewer than ``num_steps`` after a breakdown).
        breakdowns: runs that ended on an invariant Krylov space (their quadrature is exact).
        memory: the memory plan (re-orthogonalisation mode, runs per group, predicted bytes).
    """

    nodes: tuple[np.ndarray, ...]
    weights: tuple[np.ndarray, ...]
    grid: np.ndarray
    density: np.ndarray
    sigma: float
    dim: int
    num_runs: int
    num_steps: int
    num_matvecs: int
    seconds: float
    seed: int
    steps: tuple[int, ...] = ()
    breakdowns: int = 0
    memory: dict = field(default_factory=dict, compare=False, hash=False)

    def moment(self, p: int) -> float:
        """Mean over runs of ``Σ_i w_i λ_i^p``: an unbiased estimate of ``tr(H^p) / dim``.

        Exact per run (equal to ``v_rᵀ H^p v_r / ‖v_r‖²``) for ``p ≤ 2·steps − 1``.
        """
        return float(np.mean([np.sum(w * lam ** p) for lam, w in zip(self.nodes, self.weights)]))

    def run_moments(self, p: int) -> np.ndarray:
        """``[num_runs]`` per-run quadratures ``Σ_i w_i λ_i^p``."""
        return np.array([np.sum(w * lam ** p) for lam, w in zip(self.nodes, self.weights)])

    @property
    def trace_estimate(self) -> float:
        """``dim · moment(1)``: the Hutchinson trace estimate with these start vectors."""
        return self.dim * self.moment(1)


@dataclass(frozen=True)
class BlockTraces(_ToDict):
    """Trace of the diagonal blocks H_gg of H for a partition of the parameters into groups.

    All groups share the same Rademacher probes v_i: the block estimate is the mean over probes of
    ``v_{i,g}ᵀ (H v_i)_g``, so the block values sum to ``total.value`` (the Hutchinson estimate of
    tr H with the same probes) up to float64 round-off.

    Attributes:
        values, stderr, ci_low, ci_high: per group name (95% Student-t interval as in TraceEstimate).
        sizes: number of scalar parameters per group.
        members: parameter names per group.
        total: the full-trace :class:`TraceEstimate` from the same probes.
        num_matvecs, seconds, seed: cost (= number of probes), wall time, seed.
    """

    values: dict[str, float]
    stderr: dict[str, float]
    ci_low: dict[str, float]
    ci_high: dict[str, float]
    sizes: dict[str, int]
    members: dict[str, tuple[str, ...]]
    total: TraceEstimate
    num_matvecs: int
    seconds: float
    seed: int

    def __hash__(self) -> int:  # dict fields: hash by identity
        return id(self)


@dataclass(frozen=True)
class DirectionalCurvature(_ToDict):
    """First- and second-order change of the loss along a direction d (e.g. quantization δ = θ̂ − θ).

    Attributes:
        loss: L(θ) at the operator's parameters (nats when the loss is a cross-entropy).
        gTd: ``gᵀd``, the directional derivative times ‖d‖.
        dHd: ``dᵀHd``.
        predicted_delta: ``gᵀd + ½ dᵀHd``, the second-order Taylor prediction of L(θ + d) − L(θ).
        direction_norm: ``‖d‖₂``.
        num_matvecs: HVPs spent (1).
        seconds: wall time (one gradient + one HVP).
        num_gradients: gradient evaluations spent (1).
        memory: the memory plan (predicted bytes and budget).
    """

    loss: float
    gTd: float
    dHd: float
    predicted_delta: float
    direction_norm: float
    num_matvecs: int
    seconds: float
    num_gradients: int = 1
    memory: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def curvature(self) -> float:
        """Rayleigh quotient ``dᵀHd / ‖d‖²`` (``nan`` for d = 0)."""
        return self.dHd / self.direction_norm**2 if self.direction_norm > 0 else math.nan


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
        memory: the memory plan (as :func:`geometry.estimators.directional.estimate_memory`).
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
            r = {"block": g, "size": self.sizes[g], "norm2": self.norm2[g], "gTd": self.gTd[g], "dHd": self.dHd[g],
                 "quadratic": 0.5 * self.dHd[g], "dHd_share": self.dHd[g] / tot if tot else math.nan,
                 "norm2_share": self.norm2[g] / n2 if n2 else math.nan}
            if self.within is not None:
                r["within"] = self.within[g]
                r["cross"] = self.dHd[g] - self.within[g]
            out.append(r)
        return out
