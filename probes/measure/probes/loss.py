"""The ``loss`` probe: the FP loss (nats) and perplexity on the eval set.

Plan: ``loss = true`` (the default). One row per checkpoint, spec ``""``: metrics ``loss``, ``ppl``
(extra: ``n_tokens``, ``eval_seconds``). The FP evaluation is shared with the ``quant`` probe.
"""

from __future__ import annotations

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, metric
from losslens.measure.probes.tasks import make_task
from losslens.measure.probes.validation import flag


def tasks(plan) -> list:
    return [make_task("loss", "", {"eval": list(plan.data.eval)})] if plan.loss else []


def run(st, task) -> ProbeRow:
    r = st.fp_loss()
    return ProbeRow(
        st.label,
        "loss",
        "",
        metrics=[metric("loss", r.loss), metric("ppl", r.ppl)],
        extra={"n_tokens": r.n_tokens, "eval_seconds": r.seconds},
    )


def figure(draw, df, phases, specs) -> dict:
    return {"loss": draw.loss_figure(df, phases)}


PROBE = Probe(
    "loss",
    "bool",
    True,
    lambda v: flag("loss", v),
    tasks,
    run,
    metric="loss",
    aliases={"ppl": "ppl", "fp_loss": "loss", "loss": "loss"},
    figure=figure,
)
