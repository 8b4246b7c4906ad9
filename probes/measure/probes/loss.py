"""The ``loss`` probe: the FP loss (nats) and perplexity on the eval set.

Plan: ``loss = true`` (the default). One row per checkpoint, spec ``""``: metrics ``loss``, ``ppl``
(extra: ``n_tokens``, ``eval_seconds``; for an eval set framed as its tokenizer frames a document,
``framing`` and ``framing_rel_change``, the relative change of the loss without the framing prefix:
:func:`losslens.lm.data.framing.framing_effect`, which warns above 5%). The FP evaluation is shared
with the ``quant`` probe.
"""

from __future__ import annotations

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, metric
from losslens.measure.probes.tasks import make_task
from losslens.measure.probes.validation import flag


def tasks(plan) -> list:
    return [make_task("loss", "", {"eval": list(plan.data.eval)})] if plan.loss else []


def run(st, task) -> ProbeRow:
    from losslens.lm.data.framing import framing_effect

    r = st.fp_loss()
    extra = {"n_tokens": r.n_tokens, "eval_seconds": r.seconds}
    effect = framing_effect(st.model, st.data("eval"))  # a FramingWarning when the framing moves the loss > 5%
    if effect is not None:
        extra.update(framing=effect["framing"], framing_rel_change=effect["rel_change"])
    return ProbeRow(
        st.label,
        "loss",
        "",
        metrics=[metric("loss", r.loss), metric("ppl", r.ppl)],
        extra=extra,
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
