"""The ``directional`` probe: the loss along δ = θ̂ − θ of each quantizer spec, to second order.

Plan: ``directional = ["rtn:4"]``. One row per spec: metrics ``gTd``, ``dHd``, ``pred_delta`` =
gTd + dHd/2 and ``actual_delta`` = L(θ̂) − L(θ), all on the curvature set w.r.t. the quantized
matrices (δ is zero elsewhere, so this equals the full-space value). δ's measurement (quantizer,
gradient, HVP, loss of θ̂) is shared with an ``explain`` row of the same spec.
"""

from __future__ import annotations

import math

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, metric
from losslens.measure.probes.tasks import curvature_options, make_task, quant_options
from losslens.measure.probes.validation import spec_list


def tasks(plan) -> list:
    return [
        make_task("directional", s, {**quant_options(plan), **curvature_options(plan)}, curvature=True)
        for s in plan.directional
    ]


def run(st, task) -> ProbeRow:
    m = st.direction(task.spec)
    p = m.parts
    gTd, dHd, norm2 = p.total_gTd, p.total_dHd, p.total_norm2
    return ProbeRow(
        st.label,
        "directional",
        task.spec,
        metrics=[
            metric("gTd", gTd),
            metric("dHd", dHd),
            metric("pred_delta", gTd + 0.5 * dHd),
            metric("actual_delta", m.actual),
        ],
        extra={
            "loss": m.loss,
            "q_loss": m.q_loss,
            "direction_norm": math.sqrt(norm2),
            "curvature": dHd / norm2 if norm2 > 0 else math.nan,
            "n_params": p.dim,
            "memory": p.memory,
        },
        n_hvp=int(p.num_matvecs),
    )


PROBE = Probe("directional", "tuple[str, ...]", (), lambda v: spec_list("directional", v), tasks, run, metric="dHd")
