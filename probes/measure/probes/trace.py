"""The ``trace`` probe: the Hessian trace on the curvature set.

Plan: ``trace = { method = "hutch++", num_matvecs = 100 }`` (:class:`TraceProbe`). One row, spec =
the method: metric ``trace`` with stderr, 95% CI and the estimator's converged flag (extra:
``method``, ``dim``, ``rel_stderr``, ``memory``). The estimate is kept on the checkpoint state for
an ``explain`` probe that asks for the same parameters, method, budget and seed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from losslens.measure.sharpness import TRACE_METHODS

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, hvp_error_flag, metric
from losslens.measure.probes.tasks import curvature_options, make_task
from losslens.measure.probes.validation import PlanError, optional_settings, positive_int


@dataclass(frozen=True)
class TraceProbe:
    """Hessian trace by ``method`` ('hutch++' | 'hutchinson') with a budget of ``num_matvecs`` HVPs."""

    method: str = "hutch++"
    num_matvecs: int = 100

    def __post_init__(self):
        if self.method not in TRACE_METHODS:
            raise PlanError(f"trace method {self.method!r} is unknown; valid: {', '.join(TRACE_METHODS)}")
        positive_int("trace.num_matvecs", self.num_matvecs, minimum=3 if self.method == "hutch++" else 1)


def tasks(plan) -> list:
    t = plan.trace
    if t is None:
        return []
    return [make_task("trace", t.method, {**asdict(t), **curvature_options(plan), "seed": plan.seed}, curvature=True)]


def run(st, task) -> ProbeRow:
    from losslens.geometry.estimators.trace import hutchinson_trace, hutchpp_trace
    from losslens.lm.models.zero_embeddings import row_extra as excluded

    o = task.opts
    op = st.hessian()
    if task.spec == "hutch++":
        est = hutchpp_trace(op, num_matvecs=o["num_matvecs"], seed=o["seed"])
    else:
        est = hutchinson_trace(op, num_matvecs=o["num_matvecs"], seed=o["seed"])
    st.traces[(tuple(op.space.names), task.spec, o["num_matvecs"], o["seed"])] = est
    return ProbeRow(
        st.label,
        "trace",
        task.spec,
        metrics=[metric("trace", est.value, est.stderr, est.ci_low, est.ci_high, converged=est.converged)],
        extra={
            "method": est.method,
            "dim": op.dim,
            "rel_stderr": est.rel_stderr,
            "converged": bool(est.converged),
            "memory": est.memory,
            **excluded(op),
            **hvp_error_flag(op),
        },
        n_hvp=int(est.num_matvecs),
        seed=o["seed"],
    )


def figure(draw, df, phases, specs) -> dict:
    return {"sharpness": draw.curvature_figure(df, phases)}


PROBE = Probe(
    "trace",
    "TraceProbe | None",
    None,
    lambda v: optional_settings("trace", TraceProbe, v),
    tasks,
    run,
    to_dict=lambda s: None if s is None else asdict(s),
    metric="trace",
    aliases={"trace": "trace"},
    figure=figure,
    flags_in_extra=True,
)
