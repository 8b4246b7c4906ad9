"""The ``grad_norm`` probe: the norm of the loss gradient at the checkpoint, on the curvature set.

Plan: ``grad_norm = true``. One row per checkpoint, spec ``""``: metrics ``grad_norm`` = ‖∇L‖₂ and
``loss`` = L, the batch-weighted mean loss (nats) on the curvature set, both w.r.t. the plan's
``curvature_params`` (the space of the trace and eigen probes); extra: ``dim`` (n, the parameters),
``grad_rms`` = ‖∇L‖₂/√n, ``grad_max`` = ``‖∇L‖_∞``. Why: a checkpoint far from a stationary point
makes the first-order term gᵀδ of a quantizer's loss change (``directional``, ``explain``) large
whatever the curvature; ‖∇L‖ is that term's scale (``|gᵀδ| ≤ ‖∇L‖·‖δ‖``) and a confounder of
sharpness-vs-error correlations. Cost: one gradient per curvature batch, no HVP
(:meth:`losslens.geometry.operators.hessian.HessianOperator.gradient` of the operator the curvature probes
share; data-parallel: each rank's batches, all-reduced).
"""

from __future__ import annotations

import math

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, metric
from losslens.measure.probes.tasks import curvature_options, make_task
from losslens.measure.probes.validation import flag


def tasks(plan) -> list:
    return [make_task("grad_norm", "", curvature_options(plan), curvature=True)] if plan.grad_norm else []


def run(st, task) -> ProbeRow:
    op = st.hessian()
    loss, g = op.gradient()
    norm = float(g.double().norm())
    return ProbeRow(
        st.label,
        "grad_norm",
        "",
        metrics=[metric("grad_norm", norm), metric("loss", loss)],
        extra={"dim": int(op.dim), "grad_rms": norm / math.sqrt(op.dim), "grad_max": float(g.abs().max())},
    )


def figure(draw, df, phases, specs) -> dict:
    return {
        "grad_norm": draw.series_figure(
            df,
            "grad_norm",
            "grad_norm",
            phases,
            log_y=True,
            ytitle="‖∇L‖₂",
            title="gradient norm on the curvature set vs step",
        )
    }


PROBE = Probe("grad_norm", "bool", False, lambda v: flag("grad_norm", v), tasks, run, metric="grad_norm", figure=figure)
