"""What the robustness monitor measures, fixed before training starts (:class:`MonitorSettings`),
and its errors.

The settings become a sweep :class:`~losslens.study.sweep.plan.Plan` (:meth:`MonitorSettings.plan`), so the
monitor's rows carry the same ``config_hash`` per probe as a sweep with the same settings, and
``losslens report`` / ``correlate`` read a monitored run like any sweep store. Only *when* the
monitor measures adapts during training (to the time budget); *what* and *how precisely* never do,
so rows of one run stay comparable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from losslens.geometry.base.errors import LosslensError
from losslens.geometry.memory.budget import MemoryBudgetError

from losslens.measure.probes.eigen import EigenProbe
from losslens.measure.probes.trace import TraceProbe
from losslens.study.sweep.plan import DataSpec, Plan, canonical_spec

__all__ = ["MonitorSettings", "MonitorError", "MonitorMemoryError", "DEFAULT_SPECS"]

#: The default quantizers: RTN INT3 (g128) and INT2 in groups of 32 -- calibration-free, O(params).
DEFAULT_SPECS = ("rtn:3", "rtn:2:g32")


class MonitorError(LosslensError, ValueError):
    """Bad monitor settings or inputs (an unknown spec, a token set of the wrong shape, a missing
    calibration set for GPTQ/AWQ, a negative budget)."""


class MonitorMemoryError(MemoryBudgetError):
    """The monitor's measurement would not fit beside training in memory; raised before training
    starts (by ``prepare``), with the bytes needed and available."""


@dataclass(frozen=True)
class MonitorSettings:
    """The monitor's measurement, fixed for a whole run and recorded in the store.

    Attributes:
        specs: quantizer specs whose ΔQ L = L(θ̂)/L(θ) − 1 is measured on the held-out eval set
            (RTN by default; GPTQ/AWQ need a calibration set).
        trace_hvps: Hessian-vector products of the Hutchinson trace (Rademacher probes), fixed.
        lanczos_steps: Lanczos steps (one HVP each) for λ_max; stops early when converged.
        lanczos_tol: λ_max counts as converged when ‖Hv − λv‖ ≤ tol·``|λ|`` (docs/science.md §4).
        trace_ci_floor: precision floor of the trace: the 95% interval's half-width divided by
            ``|trace|`` must not exceed it; a row above it is flagged ``below_floor`` (so is an
            unconverged λ_max).
        curvature: measure trace and λ_max (False: ΔQ and loss only).
        seed: seed of the trace probes and the Lanczos start vector (the same at every step).
        curvature_params, quant_modules: parameter / module globs (None: every parameter; every
            Linear in the decoder blocks).
        every: measure every ``every`` optimizer steps (plain loop, Lightning; the HF callback's
            default None = at each evaluation).
        time_budget: the most the monitor may cost, as a fraction of training wall time (0.10 =
            10%). A measurement that would push the monitor's total time past the budget is skipped
            (and counted), so the interval stretches on slow steps; the first is always taken.
        alarm_spec: the quantizer whose ΔQ the alarm watches (must be one of ``specs``).
        alarm_threshold, alarm_window, alarm_min_improvement, alarm_lr_drop: the alarm (see
            :mod:`losslens.study.monitor.alarm`).
        max_memory: bytes (or ``"2GB"``) the monitor may use beside training; None: the geometry
            memory model's default (a fraction of what is free when training starts).
    """

    specs: tuple[str, ...] = DEFAULT_SPECS
    trace_hvps: int = 8
    lanczos_steps: int = 12
    lanczos_tol: float = 1e-2
    trace_ci_floor: float = 0.25
    curvature: bool = True
    seed: int = 0
    curvature_params: tuple[str, ...] | None = None
    quant_modules: tuple[str, ...] | None = None
    every: int | None = None
    time_budget: float = 0.10
    alarm_spec: str = "rtn:2:g32"
    alarm_threshold: float = 0.06
    alarm_window: int = 100
    alarm_min_improvement: float = 0.01
    alarm_lr_drop: float = 0.05
    max_memory: int | str | None = None

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        specs = (self.specs,) if isinstance(self.specs, str) else tuple(self.specs)
        if not specs:
            raise MonitorError("specs is empty: give at least one quantizer spec such as 'rtn:3'")
        try:
            specs = tuple(canonical_spec(s, "monitor specs") for s in specs)
            alarm = canonical_spec(self.alarm_spec, "monitor alarm_spec") if self.alarm_spec else None
        except ValueError as exc:
            raise MonitorError(str(exc)) from exc
        set_("specs", specs)
        set_("alarm_spec", alarm)
        if alarm is not None and alarm not in specs:
            raise MonitorError(
                f"alarm_spec {alarm!r} is not among the measured specs {list(specs)}; add it to specs "
                "or set alarm_spec=None (no alarm)"
            )
        for name in ("trace_hvps", "lanczos_steps", "alarm_window"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise MonitorError(f"{name} must be an integer >= 1, got {v!r}")
        if self.trace_hvps < 2:
            raise MonitorError("trace_hvps must be >= 2 (the trace's interval needs two probes)")
        if self.every is not None and (
            not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1
        ):
            raise MonitorError(f"every must be None (at each evaluation) or an integer >= 1, got {self.every!r}")
        for name, lo, hi in (
            ("lanczos_tol", 0.0, 1.0),
            ("trace_ci_floor", 0.0, float("inf")),
            ("time_budget", 0.0, float("inf")),
            ("alarm_threshold", 0.0, float("inf")),
            ("alarm_min_improvement", 0.0, float("inf")),
            ("alarm_lr_drop", 0.0, 1.0),
        ):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo < v < hi:
                raise MonitorError(f"{name} must be a number in ({lo}, {hi}), got {v!r}")
        for name in ("curvature_params", "quant_modules"):
            v = getattr(self, name)
            if v is not None:
                set_(name, (v,) if isinstance(v, str) else tuple(v))
        if self.max_memory is not None:
            from losslens.geometry.memory.budget import parse_bytes

            try:
                parse_bytes(self.max_memory)
            except MemoryBudgetError as exc:
                raise MonitorError(f"max_memory: {exc}") from exc

    def plan(
        self,
        eval_shape: tuple[int, int, int],
        curvature_shape: tuple[int, int, int],
        calibration_shape: tuple[int, int, int] | None = None,
        name: str = "monitor",
    ) -> Plan:
        """The sweep plan whose tasks the monitor runs at each measurement: loss, quant per spec,
        Hutchinson trace and Lanczos top-1 (when ``curvature``). ``calibration_shape`` defaults to
        the curvature set's shape (recorded only; RTN needs no calibration)."""
        data = DataSpec(
            eval=tuple(eval_shape),
            calibration=tuple(calibration_shape or curvature_shape),
            curvature=tuple(curvature_shape),
        )
        return Plan(
            loss=True,
            quant=self.specs,
            data=data,
            seed=self.seed,
            name=name,
            trace=TraceProbe("hutchinson", self.trace_hvps) if self.curvature else None,
            eigen=EigenProbe(k=1, method="lanczos", tol=self.lanczos_tol, max_iter=self.lanczos_steps)
            if self.curvature
            else None,
            curvature_params=self.curvature_params,
            quant_modules=self.quant_modules,
            max_memory=self.max_memory,
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("specs", "curvature_params", "quant_modules"):
            if d[k] is not None:
                d[k] = list(d[k])
        return d
