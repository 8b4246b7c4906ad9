"""Explain quantization damage (issue 15): second-order attribution by factor, block and quantizer.

    from losslens.measure.explain import explain_specs, explanations_frame
    exps = explain_specs(model, ["rtn:3:row", "gptq:3:row"], sets["curvature"], calibration=sets["calibration"])
    explanations_frame(exps)        # ΔL = gᵀδ + ½·‖δ‖²·(tr H/n)·κ + remainder, per quantizer
    exps[0].frame()                 # δᵀHδ, gᵀδ, ‖δ‖² per layer (they sum to the totals exactly)

Modules: :mod:`.blocks` (layers and module kinds of an LM's parameters), :mod:`.measure` (δ = θ̂ − θ
of one quantizer measured once: one gradient, one HVP, the loss of θ̂; the trace of its space),
:mod:`.explanation` (:class:`Explanation`, :func:`explain`, :func:`explain_specs`, the sweep row),
:mod:`.checkpoint` (:func:`explain_checkpoint`, what ``losslens explain`` runs). The model-agnostic
math is :mod:`losslens.geometry.estimators.attribution`; the trajectory analysis is
:mod:`losslens.study.analysis.explain_shares`.
"""

from losslens.measure.explain.explanation import (
    BLOCK_QUANTITIES,
    FACTOR_METRICS,
    Explanation,
    build_explanation,
    explain,
    explain_specs,
    explanations_frame,
    row_metrics,
)
from losslens.measure.explain.blocks import PARTITIONS, BlockError, block_members, module_kind
from losslens.measure.explain.checkpoint import explain_checkpoint
from losslens.measure.explain.direction import DirectionMeasure, ExplainError, direction_trace, measure_direction

__all__ = [
    "Explanation",
    "explain",
    "explain_specs",
    "explanations_frame",
    "build_explanation",
    "row_metrics",
    "FACTOR_METRICS",
    "BLOCK_QUANTITIES",
    "PARTITIONS",
    "BlockError",
    "block_members",
    "module_kind",
    "DirectionMeasure",
    "ExplainError",
    "direction_trace",
    "measure_direction",
    "explain_checkpoint",
]
