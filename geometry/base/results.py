"""Result records of the curvature estimators: small frozen dataclasses, plain data.

Every estimator in :mod:`losslens.geometry.estimators.trace`, :mod:`losslens.geometry.estimators.blocks`,
:mod:`losslens.geometry.estimators.eigen`, :mod:`losslens.geometry.estimators.density` and
:mod:`losslens.geometry.estimators.directional` returns one of these instead of a bare float (the records of an
attribution are in :mod:`losslens.geometry.base.attribution_results`). Each carries the value(s), error bars
where the method has them, ``num_matvecs`` (Hessian-vector products actually spent, read from the
operator's counter), ``seconds`` (wall time of the call) and ``seed``.
``to_dict()`` gives JSON-ready builtins (floats, ints, bools, strings, lists, dicts); arrays and
eigenvectors are converted to lists or left out as documented per class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from losslens.geometry.base.errors import LosslensError
from losslens.geometry.base.jsonable import jsonable

__all__ = [
    "EstimatorError",
    "TraceEstimate",
    "EigenResult",
    "SpectralDensity",
    "BlockTraces",
    "DirectionalCurvature",
]


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
        memory: the memory plan it ran with (:meth:`losslens.geometry.memory.model.MemoryEstimate.to_dict`:
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
            :func:`losslens.geometry.estimators.eigen.top_eigenvalues`).
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
        return float(np.mean([np.sum(w * lam**p) for lam, w in zip(self.nodes, self.weights)]))

    def run_moments(self, p: int) -> np.ndarray:
        """``[num_runs]`` per-run quadratures ``Σ_i w_i λ_i^p``."""
        return np.array([np.sum(w * lam**p) for lam, w in zip(self.nodes, self.weights)])

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
