"""The ``quant`` probe: the loss change of each quantizer spec on the eval set.

Plan: ``quant = ["rtn:3", "gptq:4"]`` (quantizer specs; GPTQ/AWQ calibrated on the calibration
set). One row per spec: metrics ``q_loss``, ``rel_loss_error``, ``ppl_gap`` (extra: ``fp_loss``,
``q_ppl``, ``fp_ppl``, ``layer_errors``, the kurtosis of θ̂, ``quant_seconds``, ``notes``).
"""

from __future__ import annotations

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, metric
from losslens.measure.probes.tasks import make_task, quant_options
from losslens.measure.probes.validation import spec_list


def tasks(plan) -> list:
    return [make_task("quant", s, quant_options(plan)) for s in plan.quant]


def run(st, task) -> ProbeRow:
    from losslens.lm.quant import QuantSpec, quantization_error

    settings = QuantSpec.parse(task.spec).row_settings  # the GPTQ variant: joins the row's `chosen` column
    fp = st.fp_loss()
    e = quantization_error(
        st.model,
        task.spec,
        st.data("eval"),
        calibration=st.token_sets.get("calibration"),
        modules=st.plan.quant_modules,
        fp_loss=fp.loss,
    )
    return ProbeRow(
        st.label,
        "quant",
        task.spec,
        metrics=[metric("q_loss", e.q_loss), metric("rel_loss_error", e.rel_loss_error), metric("ppl_gap", e.ppl_gap)],
        extra={
            "fp_loss": e.fp_loss,
            "q_ppl": e.q_ppl,
            "fp_ppl": e.fp_ppl,
            "layer_errors": dict(e.layer_errors),
            "kurtosis_quantized": e.kurtosis,
            "quant_seconds": e.quant_seconds,
            "settings": settings,
            "notes": [f"gptq variant: {v}" for v in settings.values()] + list(e.notes),
        },
    )


def figure(draw, df, phases, specs) -> dict:
    return {"quant": draw.quant_error_figure(df, phases, specs=specs)}


PROBE = Probe(
    "quant",
    "tuple[str, ...]",
    (),
    lambda v: spec_list("quant", v),
    tasks,
    run,
    metric="rel_loss_error",
    bare_spec=True,
    figure=figure,
)
