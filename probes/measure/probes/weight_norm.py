"""The ``weight_norm`` probe: the size of the weights a quantizer would quantize.

Plan: ``weight_norm = true``. One row per checkpoint, spec ``""``: metrics ``frobenius`` (‖W‖_F over
every selected matrix together, √Σ w²) and ``rms`` (√(Σ w² / n), the root-mean-square weight: the scale
a per-group RTN step is proportional to), extra ``per_matrix`` (each matrix's ‖W‖_F), on
``plan.quant_modules`` (default every Linear in the decoder blocks). Sums run in float64 whatever the
weights' dtype. Cost: one pass over those weights; no forward, no extra memory beyond one matrix's
float64 copy.
"""

from __future__ import annotations

import math

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, metric
from losslens.measure.probes.tasks import make_task
from losslens.measure.probes.validation import flag


def tasks(plan) -> list:
    if not plan.weight_norm:
        return []
    return [make_task("weight_norm", "", {"quant_modules": list(plan.quant_modules) if plan.quant_modules else None})]


def run(st, task) -> ProbeRow:
    import torch

    from losslens.lm.core.modules import select_linears

    per_matrix, total, count = {}, 0.0, 0
    with torch.no_grad():
        for name, linear in select_linears(st.model, st.plan.quant_modules).items():
            sq = float(linear.weight.detach().double().pow(2).sum())
            per_matrix[name] = math.sqrt(sq)
            total, count = total + sq, count + linear.weight.numel()
    return ProbeRow(
        st.label,
        "weight_norm",
        "",
        metrics=[metric("frobenius", math.sqrt(total)), metric("rms", math.sqrt(total / count))],
        extra={"per_matrix": per_matrix},
    )


PROBE = Probe(
    "weight_norm",
    "bool",
    False,
    lambda v: flag("weight_norm", v),
    tasks,
    run,
    metric="rms",
    aliases={"weight_norm": "rms"},
)
