"""Flags on figure points: values whose estimator did not converge.

A row of the tidy results with ``converged == False`` (power iteration or Lanczos stopped at
``max_iter`` before its tolerance, a Hutchinson trace above its tolerance) is drawn as an open red
marker, apart from the trajectory's line, with "not converged" in its legend entry and hover text;
the analysis leaves such values out of correlations by default (:func:`probes.analysis.series`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["unconverged_mask", "add_unconverged_points", "unconverged_table", "UNCONVERGED_MARKER"]

UNCONVERGED_MARKER = dict(symbol="circle-open", size=11, color="#d62728", line=dict(width=2, color="#d62728"))


def unconverged_mask(rows) -> np.ndarray:
    """``[len(rows)]`` bool: True where the row's ``converged`` flag is False (missing flag: False)."""
    if "converged" not in getattr(rows, "columns", ()):
        return np.zeros(len(rows), dtype=bool)
    return rows["converged"].astype("boolean").eq(False).fillna(False).to_numpy(bool)


def add_unconverged_points(fig, part, xs, label: str, add_kw: dict[str, Any], showlegend: bool = True) -> int:
    """Draw ``part`` (rows that did not converge) at ``xs`` as open red markers; returns the count."""
    import plotly.graph_objects as go

    if len(part) == 0:
        return 0
    fig.add_trace(
        go.Scatter(
            x=list(map(float, xs)),
            y=part["value"].astype(float).tolist(),
            mode="markers",
            marker=UNCONVERGED_MARKER,
            name=f"{label} (not converged)",
            legendgroup=f"{label} (not converged)",
            showlegend=showlegend,
            customdata=part["checkpoint"].astype(str).tolist(),
            hovertemplate=f"{label}<br>checkpoint %{{customdata}}<br>step %{{x}}<br>value %{{y:.6g}}"
            "<br><b>NOT CONVERGED</b> (left out of correlations)<extra></extra>",
        ),
        **add_kw,
    )
    return len(part)


def unconverged_table(df) -> list[dict]:
    """One record per value that did not converge: run, checkpoint, step, probe, spec, metric, value."""
    if df is None or "converged" not in df.columns:
        return []
    sel = df[(df["status"] == "ok") & unconverged_mask(df)]
    cols = [c for c in ("run", "checkpoint", "step", "probe", "spec", "metric", "value") if c in sel.columns]
    return sel[cols].to_dict("records")
