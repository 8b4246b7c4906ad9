"""The ``kurtosis`` probe: the pooled weight excess kurtosis of the matrices a quantizer would quantize.

Plan: ``kurtosis = true``. One row per checkpoint, spec ``""``: metric ``pooled`` (extra:
``per_matrix``), on ``plan.quant_modules`` (default every Linear in the decoder blocks).
"""

from __future__ import annotations

from .probe import Probe
from .rows import ProbeRow, metric
from .tasks import make_task
from .validation import flag


def tasks(plan) -> list:
    if not plan.kurtosis:
        return []
    return [make_task("kurtosis", "", {"quant_modules": list(plan.quant_modules) if plan.quant_modules else None})]


def run(st, task) -> ProbeRow:
    from probes.models.weights import weight_kurtosis

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
