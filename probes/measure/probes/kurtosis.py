"""The ``kurtosis`` probe: the pooled weight excess kurtosis of the matrices a quantizer would quantize.

Plan: ``kurtosis = true``. One row per checkpoint, spec ``""``: metric ``pooled`` (extra:
``per_matrix``), on ``plan.quant_modules`` (default every Linear in the decoder blocks).
"""

from __future__ import annotations

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, metric
from losslens.measure.probes.tasks import make_task
from losslens.measure.probes.validation import flag


def tasks(plan) -> list:
    if not plan.kurtosis:
        return []
    return [make_task("kurtosis", "", {"quant_modules": list(plan.quant_modules) if plan.quant_modules else None})]


def run(st, task) -> ProbeRow:
    from losslens.lm.models.weights import weight_kurtosis

    k = weight_kurtosis(st.model, st.plan.quant_modules)
    return ProbeRow(
        st.label,
        "kurtosis",
        "",
        metrics=[metric("pooled", k.pooled)],
        extra={"per_matrix": {n: float(v) for n, v in dict(k.per_matrix).items()}},
    )


PROBE = Probe(
    "kurtosis",
    "bool",
    False,
    lambda v: flag("kurtosis", v),
    tasks,
    run,
    metric="pooled",
    aliases={"kurtosis": "pooled"},
)
