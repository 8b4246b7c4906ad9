"""Flags on figure points: values whose estimator did not converge, and values whose Hessian
products' measured error is over the tolerance.

A row of the tidy results with ``converged == False`` (power iteration or Lanczos stopped at
``max_iter`` before its tolerance, a Hutchinson trace above its tolerance) is drawn as an open red
marker, apart from the trajectory's line, with "not converged" in its legend entry and hover text;
the analysis leaves such values out of correlations by default (:func:`losslens.study.analysis.series`).

A row whose ``error_warning`` is set (its products' relative error, measured against an exact
reference, over the tolerance: :func:`losslens.lm.models.curvature.error_warning`) keeps its place on the
line and gets an open orange diamond around it, whose hover text gives the error, the cause and the
fix; :func:`product_error_table` lists them for the report.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = [
    "unconverged_mask",
    "add_unconverged_points",
    "unconverged_table",
    "UNCONVERGED_MARKER",
    "product_error_mask",
    "product_error_text",
    "add_product_error_points",
    "product_error_table",
    "PRODUCT_ERROR_MARKER",
]

UNCONVERGED_MARKER = dict(symbol="circle-open", size=11, color="#d62728", line=dict(width=2, color="#d62728"))
PRODUCT_ERROR_MARKER = dict(symbol="diamond-open", size=16, color="#ff7f0e", line=dict(width=2, color="#ff7f0e"))


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


def _warnings(rows) -> list[dict]:
    """The ``error_warning`` of each row as a dict ({} where the row is not flagged)."""
    if "error_warning" not in getattr(rows, "columns", ()):
        return [{}] * len(rows)
    out = []
    for v in rows["error_warning"].tolist():
        try:
            w = json.loads(v) if isinstance(v, str) and v else (v if isinstance(v, dict) else {})
        except ValueError:
            w = {"message": str(v)}
        out.append(w if isinstance(w, dict) else {})
    return out


def product_error_mask(rows) -> np.ndarray:
    """``[len(rows)]`` bool: True where the row's products' measured error is over the tolerance
    (``error_warning`` set; a missing column: no row flagged)."""
    return np.array([bool(w) for w in _warnings(rows)], dtype=bool)


def product_error_text(rows) -> list[str]:
    """Hover text per row: its measured error, cause and fix (HTML line breaks), "" where not flagged."""
    out = []
    for w in _warnings(rows):
        if not w:
            out.append("")
            continue
        err, tol = w.get("rel_error"), w.get("tolerance")
        head = (
            f"HVP rel. error {float(err):.2g} > {float(tol):g}"
            if isinstance(err, (int, float)) and isinstance(tol, (int, float))
            else str(w.get("message", "HVP error over the tolerance"))
        )
        out.append(f"{head}<br>cause: {w.get('cause', '?')}<br>fix: {w.get('fix', '?')}")
    return out


def add_product_error_points(fig, part, xs, label: str, add_kw: dict[str, Any], showlegend: bool = True) -> int:
    """Mark ``part`` (flagged rows) at ``xs`` with open orange diamonds over their points, hover
    text naming the measured error, cause and fix; returns the count."""
    import plotly.graph_objects as go

    if len(part) == 0:
        return 0
    fig.add_trace(
        go.Scatter(
            x=list(map(float, xs)),
            y=part["value"].astype(float).tolist(),
            mode="markers",
            marker=PRODUCT_ERROR_MARKER,
            name=f"{label} (product error > tolerance)",
            legendgroup=f"{label} (product error)",
            showlegend=showlegend,
            customdata=part["checkpoint"].astype(str).tolist(),
            text=product_error_text(part),
            hovertemplate=f"{label}<br>checkpoint %{{customdata}}<br>step %{{x}}<br>value %{{y:.6g}}"
            "<br><b>PRODUCT ERROR OVER THE TOLERANCE</b><br>%{text}<extra></extra>",
        ),
        **add_kw,
    )
    return len(part)


def product_error_table(df) -> list[dict]:
    """One record per flagged result row (run, checkpoint, step, probe, spec; its metrics share the
    products): rel_error, tolerance, cause, fix. Empty when no row is flagged."""
    if df is None or "error_warning" not in df.columns:
        return []
    sel = df[(df["status"] == "ok") & product_error_mask(df)] if "status" in df else df[product_error_mask(df)]
    key = [c for c in ("run", "checkpoint", "probe", "spec") if c in sel.columns]
    sel = sel.drop_duplicates(key)
    rows = []
    for (_, r), w in zip(sel.iterrows(), _warnings(sel)):
        rows.append(
            {
                **{c: _plain(r[c]) for c in ("run", "checkpoint", "step", "probe", "spec") if c in sel.columns},
                **{k: w.get(k) for k in ("rel_error", "tolerance", "cause", "fix")},
            }
        )
    return rows


def _plain(v):
    """A table cell: None for a missing value (NA, NaN), else the value."""
    import pandas as pd

    return None if v is None or (not isinstance(v, str) and pd.isna(v)) else v
