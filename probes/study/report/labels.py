"""What the report calls things: the human name (with its unit) of each results column and metric,
in one place.

* :data:`COLUMN_LABELS` -- table headers: ``trace_per_param`` → "tr H / n", ``kappa_ci`` → "κ 95% CI".
  The report shows the label and keeps the raw name in the header's ``title=`` tooltip; CSV and
  JSON exports (the store, ``summary.json``) keep the raw names.
* :data:`PERCENT_METRICS` -- the fractions the report draws in % (×100), named as the printed demo
  summary names them: ``rel_loss_error`` is "ΔQ L" = L(θ̂)/L(θ) − 1, ``ppl_gap`` "ΔQ PPL".
"""

from __future__ import annotations

#: raw column name -> header shown (units in parentheses); columns not named here show as they are
COLUMN_LABELS: dict[str, str] = {
    # correlations (losslens.study.analysis.summary)
    "pair": "pair",
    "x": "x",
    "y": "y (ΔQ L under)",
    "method": "method",
    "controls": "controls",
    "covariates": "covariates",
    "r": "r",
    "r_within": "r within runs",
    "ci_low": "CI low (95%)",
    "ci_high": "CI high (95%)",
    "p": "p",
    "n": "n",
    "n_eff": "effective n",
    "n_runs": "runs",
    "n_unconverged": "not converged",
    "n_excluded": "excluded",
    "df": "t df",
    "inference": "inference",
    "note": "note",
    # explain tables (losslens.study.analysis.explain_shares)
    "run": "run",
    "spec": "quantizer",
    "start": "from",
    "end": "to",
    "total": "Δ log ΔQ (total)",
    "norm2": "Δ log ‖δ‖²",
    "norm2_ci": "‖δ‖² 95% CI",
    "trace_per_param": "Δ log tr H / n",
    "trace_per_param_ci": "tr H / n 95% CI",
    "kappa": "Δ log κ",
    "kappa_ci": "κ 95% CI",
    "non_quadratic": "Δ log non-quadratic",
    "non_quadratic_ci": "non-quadratic 95% CI",
    "fp_loss": "Δ log 1/L",
    "driver": "driver",
    "calibrated": "calibrated",
    "rtn": "RTN",
    "kappa_calibrated": "κ calibrated (median)",
    "kappa_rtn": "κ RTN (median)",
    "log_norm2_ratio": "log ‖δ‖² ratio",
    "log_norm2_ratio_ci": "‖δ‖² ratio 95% CI",
    "log_norm2_ratio_inference": "‖δ‖² ratio inference",
    "log_kappa_ratio": "log κ ratio",
    "log_kappa_ratio_ci": "κ ratio 95% CI",
    "log_kappa_ratio_inference": "κ ratio inference",
    "log_quadratic_ratio": "log ½δᵀHδ ratio",
    "log_quadratic_ratio_ci": "½δᵀHδ ratio 95% CI",
    "log_quadratic_ratio_inference": "½δᵀHδ ratio inference",
    "log_delta_ratio": "log ΔL ratio",
    "log_delta_ratio_ci": "ΔL ratio 95% CI",
    "log_delta_ratio_inference": "ΔL ratio inference",
    "n_delta": "n with a ΔL ratio",
    # checkpoints, flags, phases
    "checkpoint": "checkpoint",
    "step": "step",
    "lr": "learning rate",
    "probe": "probe",
    "metric": "metric",
    "rel_error": "product error (relative)",
    "tolerance": "tolerance",
    "cause": "cause",
    "fix": "fix",
    "phase": "phase",
    "found": "found",
    "loss": "loss (nats)",
}

#: metric -> (label, scale): drawn as label (%) with values × scale
PERCENT_METRICS: dict[str, tuple[str, float]] = {
    "rel_loss_error": ("ΔQ L", 100.0),
    "ppl_gap": ("ΔQ PPL", 100.0),
    "rel_delta": ("ΔQ", 100.0),
}


def column_label(name: str) -> str:
    """The header of results column ``name`` (``name`` itself when it has no label)."""
    return COLUMN_LABELS.get(str(name), str(name))


def metric_axis(metric: str) -> tuple[str, float, str]:
    """``(axis title, scale, hover unit)`` of a metric: ``("ΔQ L (%)", 100.0, "%")`` for
    ``rel_loss_error``; ``(metric, 1.0, "")`` for one not drawn in %."""
    if metric in PERCENT_METRICS:
        label, scale = PERCENT_METRICS[metric]
        return f"{label} (%)", scale, "%"
    return metric, 1.0, ""


__all__ = ["COLUMN_LABELS", "PERCENT_METRICS", "column_label", "metric_axis"]
