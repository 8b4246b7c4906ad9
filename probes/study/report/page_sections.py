"""The parts of a report page: the page's CSS, HTML tables and figure ``<div>`` s, and the sections
built from results (correlations, phases, the plan, surfaces, the explain section, the accuracy
verdict, the values of inexact products). :mod:`.pages` puts them together."""

from __future__ import annotations

import html
import json
import math
from typing import Any, Mapping, Sequence

from losslens.geometry.surfaces.surface import Surface

from losslens.study.report.explain_figures import explain_figures
from losslens.study.report.flags import product_error_table
from losslens.study.report.labels import column_label
from losslens.measure.probes.explain import PROBE as EXPLAIN

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0 auto;max-width:1200px;\
padding:16px 24px;color:#222}
h1{font-size:1.6em;margin-bottom:0}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
.sub{color:#666;margin-top:4px}.figure{margin:12px 0 24px 0;border:1px solid #eee;border-radius:4px}
table{border-collapse:collapse;font-size:.9em;margin:8px 0}th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f5f5f5}td.l,th.l{text-align:left}pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:.85em}
nav a{margin-right:12px}.note{color:#666;font-size:.9em}.failed{color:#b00020;font-weight:bold}
.table-wrap{max-width:100%;overflow-x:auto}td.wrap{min-width:18em;max-width:36em;overflow-wrap:anywhere}
p,li,h1,h2,h3{overflow-wrap:anywhere}.swatch{display:inline-block;width:1.6em;height:.55em;margin:0 4px 0 10px;\
border-radius:2px;vertical-align:middle}
"""

#: table cells of free text: wrapped in a cell of bounded width instead of stretching the row
WRAPPED = ("note", "error", "cause", "fix", "notes")


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:.4g}"
    return html.escape(str(v))


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, left: Sequence[str] = ()) -> str:
    """An HTML table in its own horizontally scrolling box (a wide table never widens the page).
    Headers are the human names of :data:`~losslens.study.report.labels.COLUMN_LABELS` with the
    raw column name in their ``title`` tooltip; free-text columns (:data:`WRAPPED`) wrap."""
    if not rows:
        return '<p class="note">none</p>'
    columns = list(columns or rows[0].keys())

    def cls(c) -> str:
        return " ".join(k for k, on in (("l", c in left or c in WRAPPED), ("wrap", c in WRAPPED)) if on)

    head = "".join(
        f'<th class="{cls(c)}" title="{html.escape(str(c))}">{html.escape(column_label(c))}</th>' for c in columns
    )
    body = "".join(
        "<tr>" + "".join(f'<td class="{cls(c)}">{_fmt(r.get(c))}</td>' for c in columns) + "</tr>" for r in rows
    )
    return f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _correlation_rows(correlations) -> list[dict]:
    if correlations is None:
        return []
    if hasattr(correlations, "to_dict") and hasattr(correlations, "columns"):
        return correlations.to_dict("records")
    if isinstance(correlations, Mapping):
        rows = []
        for name, c in correlations.items():
            d = c.to_dict() if hasattr(c, "to_dict") else dict(c)
            cov = d.get("covariates")
            if isinstance(cov, (list, tuple)):
                d["covariates"] = ", ".join(cov)
            rows.append({"pair": name, **d})
        return rows
    return [c.to_dict() if hasattr(c, "to_dict") else dict(c) for c in correlations]


def _flagged(notes: str) -> bool:
    """Notes that say something failed or was not computed are shown in red (class "failed")."""
    return any(w in notes.lower() for w in ("failed", "not computed"))


def _descriptive(row: dict) -> dict:
    """A row whose p-value is NaN because no honest one exists shows 'descriptive' in its place."""
    p = row.get("p")
    if row.get("inference") == "descriptive" and isinstance(p, float) and math.isnan(p):
        return {**row, "p": "descriptive"}
    return row


def _phase_rows(phases) -> list[dict]:
    if phases is None:
        return []
    items = phases.items() if isinstance(phases, Mapping) and not {"name", "step"} <= set(phases) else [("", phases)]
    rows = []
    for run, ph in items:
        if hasattr(ph, "convergence"):
            for o in (ph.convergence, ph.divergence):
                rows.append({"run": run, "phase": o.kind, "found": o.found, "step": o.step, "lr": o.lr, "n": o.n})
        elif isinstance(ph, Mapping) and ("convergence" in ph or "divergence" in ph):
            for key in ("convergence", "divergence"):
                o = ph.get(key) or {}
                rows.append(
                    {
                        "run": run,
                        "phase": o.get("kind", key),
                        "found": o.get("found"),
                        "step": o.get("step"),
                        "lr": o.get("lr"),
                        "n": o.get("n"),
                    }
                )
        else:
            for p in ph if isinstance(ph, (list, tuple)) else [ph]:
                rows.append(
                    {
                        "run": run,
                        "phase": p.get("name"),
                        "found": p.get("found", True),
                        "step": p.get("step"),
                        "lr": p.get("lr"),
                        "n": p.get("n"),
                    }
                )
    return rows


def _phases_for_figures(phases):
    """Phases in the form losslens.study.report.figures takes (a list of dicts, or a Phases object)."""
    if phases is None:
        return None
    if (
        isinstance(phases, Mapping)
        and not ({"name", "step"} <= set(phases))
        and not ("convergence" in phases or "divergence" in phases)
    ):
        out = []  # {run: Phases} -> one list with the run in the name
        for run, ph in phases.items():
            for row in _phase_rows({run: ph}):
                if row.get("found") and row.get("step") is not None:
                    out.append(
                        {
                            "name": f"{row['phase']} ({run})" if run else row["phase"],
                            "step": row["step"],
                            "lr": row["lr"],
                        }
                    )
        return out
    return phases


def _plan_json(plan) -> str | None:
    if plan is None:
        return None
    if hasattr(plan, "to_dict"):
        plan = plan.to_dict()
    try:
        return json.dumps(plan, indent=2, sort_keys=True, default=str)
    except TypeError:
        return str(plan)


def _surfaces(surfaces) -> list[tuple[str, Any]]:
    if surfaces is None:
        return []
    if isinstance(surfaces, Mapping):
        return list(surfaces.items())
    if isinstance(surfaces, Surface):
        return [("surface", surfaces)]
    return [(f"surface {i + 1}", s) for i, s in enumerate(surfaces)]


def _explain_section(df, check, phases) -> str:
    """Figures and tables of the explain probe ('' when the results hold none)."""
    if not (df["probe"] == EXPLAIN.name).any():
        return ""
    note = ""
    if check is None:
        from losslens.study.analysis import AnalysisError
        from losslens.study.analysis.explain_shares import science_check

        try:
            check = science_check(df)
        except AnalysisError as exc:
            note = f'<p class="note">decomposition unavailable: {html.escape(str(exc))}</p>'
    figs = explain_figures(df, check, phases=phases)
    parts = [
        '<p class="note">On the curvature set: ΔL = L(θ̂) − L(θ) = gᵀδ + ½δᵀHδ + remainder, and '
        "½δᵀHδ = ½·‖δ‖²·(tr H/n)·κ over the quantized matrices (n = their size; κ = 1 is a random "
        "direction's curvature). Shares are natural-log changes that sum to the change of log ΔQ; "
        "intervals carry the trace estimate's 95% interval.</p>",
        note,
    ]
    parts += [
        f'<div class="figure" data-figure="{html.escape(k)}">{figure_html(f, f"ex-{i}")}</div>'
        for i, (k, f) in enumerate(figs.items())
    ]
    for key, head in (
        ("decay", "Over the LR decay"),
        ("quantizers", "Calibrated quantizers vs RTN at equal bits"),
        ("lawa", "Final checkpoint → LAWA"),
    ):
        t = (check or {}).get(key)
        if t is not None and len(t):
            rows = [
                {k: (f"[{v[0]:+.3f}, {v[1]:+.3f}]" if isinstance(v, tuple) else v) for k, v in r.items()}
                for r in t.to_dict("records")
            ]
            parts.append(
                f"<h3>{html.escape(head)}</h3>"
                + _table(rows, left=("run", "spec", "start", "end", "driver", "calibrated", "rtn"))
            )
    if check and check.get("notes"):
        parts.append(f'<p class="note">not computed: {html.escape("; ".join(check["notes"]))}</p>')
    return "".join(parts)


def _product_error_section(df) -> tuple[str, str] | None:
    """(heading, html) of the section listing result rows whose Hessian products' measured error is
    over the tolerance (:func:`losslens.study.report.flags.product_error_table`); None when no row is flagged."""
    rows = product_error_table(df)
    if not rows:
        return None
    note = (
        '<p class="note" data-note="product-error">These values come from Hessian-vector products whose relative '
        "error, measured against an exact reference on a check slice, is over the tolerance (e.g. half-precision "
        "compute or gradient differences). The figures mark them with open orange diamonds (hover: error, cause, "
        "fix); they stay in the lines and in the correlations. Rerun them as the fix column says.</p>"
    )
    cols = ["run", "checkpoint", "step", "probe", "spec", "rel_error", "tolerance", "cause", "fix"]
    return f"Product error over the tolerance ({len(rows)})", note + _table(
        rows, cols, left=("run", "checkpoint", "probe", "spec", "cause", "fix")
    )


def _accuracy_line(df) -> str:
    """The accuracy verdict sentence (:func:`losslens.study.analysis.accuracy_verdict.accuracy_verdict`), or ''."""
    from losslens.study.analysis import AnalysisError
    from losslens.study.analysis.accuracy_verdict import accuracy_verdict

    try:
        return accuracy_verdict(df[df["status"] == "ok"] if "status" in df else df)["text"]
    except AnalysisError as exc:
        return f"no verdict: {exc}"


def figure_html(fig, div_id: str) -> str:
    """A figure as a ``<div>`` + script, without plotly.js (embedded once by the page)."""
    return fig.to_html(
        full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False, "responsive": True}
    )
