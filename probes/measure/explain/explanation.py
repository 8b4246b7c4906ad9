"""Explain the quantization damage of one checkpoint: ``explain(model, spec, curvature)``.

    from losslens.measure.explain import explain_specs, explanations_frame
    exps = explain_specs(model, ["rtn:3:row", "gptq:3:row"], sets["curvature"], calibration=sets["calibration"])
    print(explanations_frame(exps))          # one row per quantizer: ΔL, gᵀδ, ½δᵀHδ, ‖δ‖², tr H/n, κ, remainder
    print(exps[0].frame())                   # one row per layer: its parts of δᵀHδ, gᵀδ and ‖δ‖²

Each :class:`Explanation` splits the measured change of the curvature-set loss ΔL = L(θ̂) − L(θ)
into gᵀδ + ½ δᵀHδ + remainder, the quadratic term into ½ · ‖δ‖² · (tr H/n) · κ (with tr H's 95%
interval carried into κ), and δᵀHδ, gᵀδ, ‖δ‖² into blocks (:mod:`losslens.measure.explain.blocks`), whose
parts sum to the totals exactly. The space is the quantized matrices (n = their size; see
:mod:`losslens.measure.explain.direction`). Several quantizers of one checkpoint share one trace estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from torch import nn

from losslens.geometry.base.progress import ProgressArg, echo, progress_bar
from losslens.geometry.operators.names import DEFAULT_BACKEND
from losslens.geometry.estimators.attribution import assemble, factorise, group_parts
from losslens.geometry.base.jsonable import jsonable
from losslens.geometry.base.attribution_results import Attribution, QuadraticFactors
from losslens.geometry.base.results import TraceEstimate

from losslens.measure.explain.blocks import PARTITIONS, BlockError, block_members
from losslens.measure.explain.direction import (
    TRACE_METHODS,
    DirectionMeasure,
    ExplainError,
    checked_direction_trace,
    measure_direction,
)

#: Factor metrics of an ``explain`` row of a sweep, in order (see :func:`row_metrics`).
FACTOR_METRICS = (
    "actual_delta",
    "rel_delta",
    "gTd",
    "quadratic",
    "pred_delta",
    "remainder",
    "norm2",
    "trace",
    "trace_per_param",
    "rayleigh",
    "kappa",
    "loss",
    "q_loss",
)
BLOCK_QUANTITIES = ("dHd", "gTd", "norm2", "within")


@dataclass(frozen=True)
class Explanation:
    """The second-order explanation of one quantizer's loss change on one checkpoint.

    Attributes:
        spec: canonical quantizer spec; partition: the block partition of :attr:`attribution`.
        attribution: the :class:`losslens.geometry.base.attribution_results.Attribution`: factors (gᵀδ, ½δᵀHδ,
        prediction,
            measured ΔL, remainder, ‖δ‖², tr H with its interval, tr H/n, κ with its interval) and
            per-block δᵀHδ, gᵀδ, ‖δ‖² (and δ_bᵀH_bbδ_b when asked for).
        q_loss: L(θ̂) on the curvature set (nats); L(θ) is ``attribution.loss``.
        trace_source: ``"estimated"`` (by this call), ``"shared"`` (once for several specs), ``"given"``.
        trace_matvecs: HVPs of the trace estimate (0 when given).
        layer_errors: ‖Ŵ − W‖/‖W‖ per quantized linear. seconds: measurement wall time.
        hvp_check: the measured error of the products behind it (δᵀHδ and tr H; the larger of the
            two, :func:`worst_check`; None for an exact backend). error_warning: set when that error is
            over the tolerance (:func:`losslens.lm.models.curvature.error_warning`: error, cause, fix, message).
    """

    spec: str
    partition: str
    attribution: Attribution
    q_loss: float
    trace_source: str
    trace_matvecs: int = 0
    layer_errors: dict = field(default_factory=dict)
    seconds: float = 0.0
    hvp_check: dict | None = None
    error_warning: dict | None = None

    @property
    def factors(self) -> QuadraticFactors:
        return self.attribution.factors

    @property
    def loss(self) -> float:
        """L(θ) on the curvature set (nats)."""
        return self.attribution.loss

    @property
    def delta_loss(self) -> float:
        """ΔL = L(θ̂) − L(θ) on the curvature set (nats)."""
        return self.q_loss - self.loss

    @property
    def rel_delta(self) -> float:
        """ΔQ on the curvature set: L(θ̂)/L(θ) − 1."""
        return self.delta_loss / self.loss

    def summary(self) -> dict[str, Any]:
        """One flat dict: spec, losses, ΔQ, every factor (with intervals), the cross-block term, costs."""
        a = self.attribution
        return {
            "spec": self.spec,
            "loss": self.loss,
            "q_loss": self.q_loss,
            "rel_delta": self.rel_delta,
            **self.factors.to_dict(),
            "cross": a.cross,
            "trace_source": self.trace_source,
            "num_matvecs": a.num_matvecs,
            "trace_matvecs": self.trace_matvecs,
        }

    def frame(self):
        """pandas DataFrame, one row per block (:meth:`losslens.geometry.base.attribution_results.Attribution.rows`)."""
        import pandas as pd

        return pd.DataFrame(self.attribution.rows())

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                **self.summary(),
                "partition": self.partition,
                "blocks": self.attribution.rows(),
                "trace": self.attribution.trace,
                "layer_errors": self.layer_errors,
                "seconds": self.seconds,
                "hvp_check": self.hvp_check,
                "error_warning": self.error_warning,
            }
        )


def build_explanation(
    model: nn.Module,
    m: DirectionMeasure,
    trace: TraceEstimate | float,
    partition: str = "layer",
    trace_source: str = "estimated",
    trace_check: dict | None = None,
    error_tolerance: float = 1e-2,
) -> Explanation:
    """An :class:`Explanation` from a measured direction and a trace of its space (no HVP);
    ``trace_check``: the measured error of the trace's products
    (:func:`losslens.measure.explain.direction.product_check`),
    flagged with the direction's when over ``error_tolerance``."""
    members = block_members(model, m.names, partition)
    a = assemble(
        m.parts,
        members,
        trace,
        within=m.within.get(partition),
        actual=m.actual,
        num_matvecs=m.parts.num_matvecs + m.within_matvecs,
        seconds=m.seconds,
    )
    spent = trace.num_matvecs if isinstance(trace, TraceEstimate) and trace_source != "given" else 0
    check = worst_check([m.hvp_check, trace_check])
    return Explanation(
        spec=m.spec,
        partition=partition,
        attribution=a,
        q_loss=m.q_loss,
        trace_source=trace_source,
        trace_matvecs=spent,
        layer_errors=dict(m.layer_errors),
        seconds=m.seconds,
        hvp_check=check,
        error_warning=product_warning(check, error_tolerance),
    )


def worst_check(checks: Sequence[dict | None]) -> dict | None:
    """The measured product check (:func:`losslens.measure.explain.direction.product_check`) with the largest
    ``rel_error``; one whose error was not measured when none was (its ``reference`` says why);
    None when every product was exact."""
    given = [c for c in checks if c is not None]
    measured = [c for c in given if c.get("rel_error") is not None]
    if measured:
        return max(measured, key=lambda c: c["rel_error"])
    return given[0] if given else None


def product_warning(check: dict | None, tolerance: float = 1e-2) -> dict | None:
    """:func:`losslens.lm.models.curvature.error_warning` of a product check that records its compute dtype."""
    import torch

    from losslens.lm.models.curvature import error_warning

    if check is None:
        return None
    return error_warning(check, getattr(torch, str(check.get("compute_dtype") or "float32")), tolerance)


def _check(partition: str, trace_method: str) -> None:
    if partition not in PARTITIONS:
        raise BlockError(f"unknown block partition {partition!r}; valid: {', '.join(PARTITIONS)}")
    if trace_method not in TRACE_METHODS:
        raise ExplainError(f"trace method {trace_method!r} is unknown; valid: {', '.join(TRACE_METHODS)}")


def explain_specs(
    model: nn.Module,
    specs: Sequence,
    curvature,
    calibration=None,
    modules=None,
    blocks: str = "layer",
    within: bool = False,
    trace: TraceEstimate | float | None = None,
    trace_matvecs: int = 30,
    trace_method: str = "hutch++",
    seed: int = 0,
    max_memory=None,
    backend: str = DEFAULT_BACKEND,
    compute_dtype: str | None = None,
    error_tolerance: float = 1e-2,
    progress: ProgressArg = False,
) -> list[Explanation]:
    """Explain every quantizer in ``specs`` on ``model`` (one shared tr H estimate).

    Args:
        model: the FP model (not modified; its requires_grad flags and mode are restored).
        specs: quantizer specs (``"rtn:4:g128"``, ``"gptq:3:row"``, ``"awq:4:g128"``, ``"int8"``...).
        curvature: curvature token batches (TokenSet or [b, s] LongTensors): the data of ΔL, g and H.
        calibration: calibration batches for GPTQ / AWQ. modules: linear globs to quantize.
        blocks: the block partition of each explanation (:data:`losslens.measure.explain.blocks.PARTITIONS`).
        within: also δ_bᵀH_bbδ_b per block (one HVP per block and spec).
        trace: tr H of the quantized matrices to reuse (a TraceEstimate or an exact float); None
            estimates it once with ``trace_method`` and ``trace_matvecs`` HVPs, ``seed``.
        backend: HVP backend of every product (reverse, forward, difference, auto); ``compute_dtype``:
            the dtype the products run in (None: float32 for half-precision weights).
        error_tolerance: the products' measured relative error above which an explanation carries
            ``error_warning`` (its ``hvp_check`` is recorded either way).
        progress: the specs measured / planned with an ETA, then the tr H stage, on stderr
            (:func:`losslens.geometry.base.progress.progress_bar`).

    Cost: per spec the quantizer, one gradient, 1 HVP (+ blocks with ``within``) and one forward
    pass over the curvature set; once, ``trace_matvecs`` HVPs for tr H.
    """
    _check(blocks, trace_method)
    specs = list(specs)
    if not specs:
        raise ExplainError("no quantizer spec given; pass e.g. ['rtn:4:g128']")
    plan_trace = (trace_method, trace_matvecs) if trace is None else None  # planned before any quantizer runs
    measures = []
    with progress_bar(progress, len(specs), what="specs measured", unit="spec", label="explain") as bar:
        for s in specs:
            bar.describe(str(s))
            measures.append(
                measure_direction(
                    model,
                    s,
                    curvature,
                    calibration,
                    modules,
                    within=(blocks,) if within else (),
                    max_memory=max_memory,
                    plan_trace=plan_trace,
                    backend=backend,
                    compute_dtype=compute_dtype,
                )
            )
            bar.update()
    names = {m.names for m in measures}
    if len(names) != 1:
        raise ExplainError("the quantizers moved different sets of matrices; explain them separately")
    source, trace_check = "given", None
    if trace is None:
        echo(progress, f"tr H: {trace_matvecs} HVPs ({trace_method})", "explain")
        trace, trace_check = checked_direction_trace(
            model, measures[0].names, curvature, trace_matvecs, trace_method, seed, max_memory, backend, compute_dtype
        )
        source = "estimated" if len(specs) == 1 else "shared"
    return [build_explanation(model, m, trace, blocks, source, trace_check, error_tolerance) for m in measures]


def explain(model: nn.Module, spec, curvature, **kwargs) -> Explanation:
    """:func:`explain_specs` for one quantizer spec (same keyword arguments)."""
    return explain_specs(model, [spec], curvature, **kwargs)[0]


def explanations_frame(explanations: Sequence[Explanation]):
    """pandas DataFrame, one row per explanation (:meth:`Explanation.summary`) plus, against the first
    row, ``log_quadratic_ratio = log_norm2_ratio + log_kappa_ratio`` (the trace is shared, so it
    cancels): whether a quantizer's smaller ½δᵀHδ comes from a smaller ‖δ‖ or a smaller κ."""
    import pandas as pd

    df = pd.DataFrame([e.summary() for e in explanations])
    if len(df):
        ref = df.iloc[0]
        for col, key in (
            ("log_norm2_ratio", "norm2"),
            ("log_kappa_ratio", "kappa"),
            ("log_quadratic_ratio", "quadratic"),
        ):
            ratio = df[key] / ref[key]
            df[col] = [math.log(r) if r > 0 else math.nan for r in ratio]
    return df


def row_metrics(m: DirectionMeasure, trace: TraceEstimate, model: nn.Module, partitions: Sequence[str]) -> list[tuple]:
    """The metrics of an ``explain`` sweep row: ``(name, value, stderr, ci_low, ci_high)`` tuples.

    Factors (:data:`FACTOR_METRICS`, the trace-derived ones with their intervals), then per partition
    and block ``dHd[partition:block]``, ``gTd[...]``, ``norm2[...]`` and, when measured, ``within[...]``.
    """
    f = factorise(m.parts.total_gTd, m.parts.total_dHd, m.parts.total_norm2, trace, m.parts.dim, m.actual)
    out = [
        ("actual_delta", f.actual),
        ("rel_delta", f.actual / m.loss),
        ("gTd", f.gTd),
        ("quadratic", f.quadratic),
        ("pred_delta", f.predicted),
        ("remainder", f.remainder),
        ("norm2", f.norm2),
        ("trace", f.trace, f.trace_stderr, f.trace_ci_low, f.trace_ci_high),
        (
            "trace_per_param",
            f.trace_per_param,
            f.trace_stderr / f.dim,
            f.trace_per_param_ci_low,
            f.trace_per_param_ci_high,
        ),
        ("rayleigh", f.rayleigh),
        ("kappa", f.kappa, f.kappa_stderr, f.kappa_ci_low, f.kappa_ci_high),
        ("loss", m.loss),
        ("q_loss", m.q_loss),
    ]
    out = [t + (None,) * (5 - len(t)) for t in out]
    for partition in partitions:
        members = block_members(model, m.names, partition)
        sums = group_parts(m.parts, members)
        within = m.within.get(partition)
        for b in members:
            for q in ("dHd", "gTd", "norm2"):
                out.append((f"{q}[{partition}:{b}]", sums[q][b], None, None, None))
            if within is not None:
                out.append((f"within[{partition}:{b}]", within[b], None, None, None))
    return out


__all__ = [
    "Explanation",
    "explain",
    "explain_specs",
    "explanations_frame",
    "build_explanation",
    "row_metrics",
    "worst_check",
    "product_warning",
    "FACTOR_METRICS",
    "BLOCK_QUANTITIES",
]
