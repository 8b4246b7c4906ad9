"""Figures of the ``explain`` probe (issue 15): why quantization error changes along training.

* :func:`explain_factors_figure` — ΔQ and its factors vs step, one panel each (ΔQ, ‖δ‖², tr H/n
  with its interval, κ with its interval, gᵀδ, the remainder), one colour per run, LAWA as stars,
  the LR on each panel's secondary axis;
* :func:`explain_heatmap_figure` — block × step heatmap of ½ δ_bᵀ(Hδ)_b (each block's part of
  the quadratic term, nats), one panel per run;
* :func:`explain_shares_figure` — the shares of the change of log ΔQ over the LR decay and from the
  final checkpoint to LAWA (:func:`losslens.study.analysis.explain_shares.science_check`), with the trace's interval.

Inputs are the tidy results table and already computed analysis tables; nothing is recomputed.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

import numpy as np

from losslens.measure.probes.explain import PROBE as EXPLAIN
from losslens.measure.probes.loss import PROBE as LOSS
from losslens.measure.probes.trace import PROBE as TRACE
from losslens.study.report.figure_parts import (
    _add_lr,
    _add_series,
    _empty,
    _phase_list,
    _run_col,
    _shade_phases,
    _x,
    _x_max,
    metric_rows,
    specs_of,
)
from losslens.study.report.labels import metric_axis

_PANELS = (
    ("rel_delta", "ΔQ = ΔL/L (%, curvature set)", True),
    ("norm2", "‖δ‖²", True),
    ("trace_per_param", "tr H / n (95% CI)", True),
    ("kappa", "κ (95% CI)", True),
    ("gTd", "gᵀδ (nats)", False),
    ("remainder", "remainder ΔL − (gᵀδ + ½δᵀHδ) (nats)", False),
)
_TERM_LABELS = {
    "norm2": "‖δ‖²",
    "trace_per_param": "tr H/n",
    "kappa": "κ",
    "non_quadratic": "non-quadratic (gᵀδ + rest)",
    "fp_loss": "1/L (FP loss)",
}
_TERM_COLOURS = {
    "norm2": "#1f77b4",
    "trace_per_param": "#ff7f0e",
    "kappa": "#2ca02c",
    "non_quadratic": "#9467bd",
    "fp_loss": "#8c564b",
}


def explain_factors_figure(df, spec: str | None = None, phases=None, lr: bool = True):
    """ΔQ and its factors vs step for ``spec`` (default: the first explain spec): six panels, one
    colour per run, derived checkpoints as stars, error bars = stderr (trace, κ), LR dotted."""
    from plotly.subplots import make_subplots

    spec = spec or (specs_of(df, EXPLAIN.name) or [None])[0]
    fig = make_subplots(
        rows=3,
        cols=2,
        shared_xaxes=True,
        subplot_titles=[p[1] for p in _PANELS],
        specs=[[{"secondary_y": lr}] * 2 for _ in range(3)],
        vertical_spacing=0.09,
        horizontal_spacing=0.1,
    )
    drawn = 0
    for i, (metric, _, log) in enumerate(_PANELS):
        r, c = i // 2 + 1, i % 2 + 1
        drawn += _add_series(
            fig,
            df,
            EXPLAIN.name,
            metric,
            spec,
            metric,
            0,
            secondary_y=False if lr else None,
            row=r,
            col=c,
            error_bars=metric in ("trace_per_param", "kappa"),
            positive_only=log,
            by_run=True,
            legend=i == 0,
            scale=metric_axis(metric)[1],
            unit=metric_axis(metric)[2],
        )
        fig.update_yaxes(type="log" if log else "linear", exponentformat="power", row=r, col=c, secondary_y=False)
        if lr:
            _add_lr(fig, df, row=r, col=c, showlegend=i == 0)
            fig.update_yaxes(
                showgrid=False,
                rangemode="tozero",
                type="linear",
                tickmode="auto",
                tickformat=".2g",
                nticks=4,
                row=r,
                col=c,
                secondary_y=True,
            )
        _shade_phases(fig, _phase_list(phases), _x_max(df), row=r, col=c, annotate=False)
    fig.update_xaxes(title_text="step", row=3)
    fig.update_layout(
        title=f"why ΔQ changes ({spec}): ½δᵀHδ = ½·‖δ‖²·(tr H/n)·κ; ΔL = gᵀδ + ½δᵀHδ + remainder",
        height=820,
        hovermode="closest",
        margin=dict(l=60, r=40, t=90, b=40),
    )
    if drawn == 0:
        _empty(fig, f"no {EXPLAIN.name!r} rows{f' for {spec}' if spec else ''} in the results")
    return fig


def _blocks(df, spec: str, partition: str) -> list[str]:
    pat = re.compile(rf"^dHd\[{re.escape(partition)}:(.+)\]$")
    sel = df[(df["probe"] == EXPLAIN.name) & (df["spec"] == spec)]
    return [m.group(1) for m in (pat.match(str(x)) for x in dict.fromkeys(sel["metric"])) if m]


def explain_heatmap_figure(df, spec: str | None = None, partition: str = "layer"):
    """Heatmap of ½ δ_bᵀ(Hδ)_b (nats) per block of ``partition`` (y) and step (x), one panel per run
    (real checkpoints), one shared colour scale; the hover adds the block's share of ½δᵀHδ."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    spec = spec or (specs_of(df, EXPLAIN.name) or [None])[0]
    blocks = _blocks(df, spec, partition) if spec else []
    if not blocks:
        fig = go.Figure()
        _empty(fig, f"no per-block explain rows for partition {partition!r}")
        return fig
    real = df[~df["derived"].astype(bool)] if "derived" in df else df
    runs = list(dict.fromkeys(_run_col(real[real["probe"] == EXPLAIN.name])))
    fig = make_subplots(
        rows=len(runs), cols=1, shared_xaxes=True, subplot_titles=runs, vertical_spacing=min(0.12, 0.3 / len(runs))
    )
    total = metric_rows(real, EXPLAIN.name, "quadratic", spec)
    for i, run in enumerate(runs):
        rows = real[_run_col(real) == run]
        tot = total[_run_col(total) == run]
        steps = _x(tot.sort_values("step"))
        labels = list(tot.sort_values("step")["checkpoint"].astype(str))
        z = np.full((len(blocks), len(labels)), np.nan)
        for j, b in enumerate(blocks):
            part = metric_rows(rows, EXPLAIN.name, f"dHd[{partition}:{b}]", spec).set_index("checkpoint")["value"]
            z[j] = 0.5 * part.reindex(labels).to_numpy(float)
        share = z / tot.sort_values("step")["value"].to_numpy(float)[None, :]
        fig.add_trace(
            go.Heatmap(
                x=steps.tolist(),
                y=blocks,
                z=z.tolist(),
                coloraxis="coloraxis",
                customdata=np.dstack([share, np.broadcast_to(np.array(labels, dtype=object), z.shape)]).tolist(),
                hovertemplate="%{y}<br>step %{x} (%{customdata[1]})<br>½ δ_bᵀ(Hδ)_b = %{z:.4g} nats"
                "<br>share of ½δᵀHδ %{customdata[0]:.1%}<extra>" + run + "</extra>",
                name=run,
            ),
            row=i + 1,
            col=1,
        )
        fig.update_yaxes(autorange="reversed", row=i + 1, col=1)
    fig.update_layout(
        title=f"where the quadratic term sits ({spec}, by {partition}): ½ δ_bᵀ(Hδ)_b per block",
        coloraxis=dict(colorscale="Viridis", colorbar=dict(title="nats")),
        height=120 + max(160, 22 * len(blocks)) * len(runs),
        margin=dict(l=110, r=40, t=80, b=40),
    )
    fig.update_xaxes(title_text="step", row=len(runs))
    return fig


def explain_shares_figure(check: dict | None, spec: str | None = None):
    """Grouped bars of the shares of the change of log ΔQ (natural log) per run: over the LR decay
    (top) and from the final checkpoint to LAWA (bottom), for ``spec`` (default: the first spec of
    the decay table); error bars on the tr H/n and κ shares (95%, from the trace estimates)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    parts = [
        (k, t)
        for k, t in (("LR decay", (check or {}).get("decay")), ("final → LAWA", (check or {}).get("lawa")))
        if t is not None and len(t)
    ]
    if not parts:
        fig = go.Figure()
        _empty(fig, "no decomposition available (needs explain rows with ΔL > 0 at both ends)")
        return fig
    spec = spec or parts[0][1]["spec"].iloc[0]
    fig = make_subplots(
        rows=len(parts),
        cols=1,
        subplot_titles=[f"{k}: shares of Δ log ΔQ ({spec})" for k, _ in parts],
        vertical_spacing=0.18,
    )
    for i, (_, t) in enumerate(parts):
        t = t[t["spec"] == spec]
        xs = [f"{r} ({a} → {b})" for r, a, b in zip(t["run"], t["start"], t["end"])]
        for term, label in _TERM_LABELS.items():
            if term not in t:
                continue
            y = t[term].astype(float).tolist()
            err = None
            if f"{term}_ci" in t:
                ci = np.array(
                    [list(v) if isinstance(v, (tuple, list)) else [math.nan, math.nan] for v in t[f"{term}_ci"]]
                )
                err = dict(
                    type="data",
                    symmetric=False,
                    array=np.nan_to_num(ci[:, 1] - np.array(y), posinf=0).tolist(),
                    arrayminus=np.nan_to_num(np.array(y) - ci[:, 0], posinf=0).tolist(),
                    thickness=1,
                )
            fig.add_trace(
                go.Bar(
                    x=xs,
                    y=y,
                    name=label,
                    marker_color=_TERM_COLOURS[term],
                    error_y=err,
                    legendgroup=term,
                    showlegend=i == 0,
                    hovertemplate=f"{label}: %{{y:+.3f}}<extra>%{{x}}</extra>",
                ),
                row=i + 1,
                col=1,
            )
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=t["total"].astype(float).tolist(),
                mode="markers",
                name="total Δ log ΔQ",
                marker=dict(symbol="diamond", size=11, color="black"),
                legendgroup="total",
                showlegend=i == 0,
            ),
            row=i + 1,
            col=1,
        )
        fig.update_yaxes(title_text="Δ log (end/start)", row=i + 1, col=1)
        fig.update_xaxes(automargin=True, row=i + 1, col=1)
    fig.update_layout(
        barmode="group",
        title="which factor moves ΔQ (log-scale shares sum to the total)",
        height=260 + 300 * len(parts),
        legend=dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top"),
        margin=dict(l=60, r=40, t=80, b=40),
    )
    return fig


def explain_figures(df, check: dict | None = None, phases=None, partition: str = "layer") -> dict[str, Any]:
    """The explain figures the results support: ``{"explain:factors", "explain:blocks", "explain:shares"}``
    (empty when there is no ``explain`` row; the shares only with ``check``)."""
    specs = specs_of(df, EXPLAIN.name)
    if not specs:
        return {}
    figs = {
        "explain:factors": explain_factors_figure(df, specs[0], phases=phases),
        "explain:blocks": explain_heatmap_figure(df, specs[0], partition),
    }
    if check is not None:
        figs["explain:shares"] = explain_shares_figure(check, specs[0])
    return figs


def synthetic_explain(df, specs: Sequence[str] = ("rtn:4:g128", "gptq:4:g128"), layers: int = 2, seed: int = 0):
    """``df`` (e.g. :func:`~losslens.study.report.figures.synthetic_results`) with plausible ``explain`` rows
    per checkpoint: ‖δ‖² and tr H/n growing with the trace, κ ≈ 1 for RTN and lower for the others,
    a small remainder, per-layer parts (for tests and docs)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    base_cols = [
        "run",
        "checkpoint",
        "step",
        "tokens",
        "lr",
        "derived",
        "n_hvp",
        "seconds",
        "status",
        "error",
        "seed",
        "data_hash",
    ]
    ck = df[df["probe"] == TRACE.name].drop_duplicates(["run", "checkpoint"])
    fp = df[(df["probe"] == LOSS.name) & (df["metric"] == LOSS.name)].set_index(["run", "checkpoint"])["value"]
    rows, nan, n = [], math.nan, 10_000
    for _, c in ck.iterrows():
        t = float(c["value"])
        loss = float(fp.get((c["run"], c["checkpoint"]), 3.2))
        for k, spec in enumerate(specs):
            norm2, kappa = (
                5.0 * (1 + 0.3 * k) * (1 + rng.normal(0, 0.02)),
                (1.0 if k == 0 else 0.3) * (1 + rng.normal(0, 0.03)),
            )
            tpp = t / n
            quad = 0.5 * norm2 * tpp * kappa
            gtd = 0.05 * quad
            rem = 0.03 * quad * rng.normal()
            dl = gtd + quad + rem
            base = {col: c[col] for col in base_cols} | {"probe": EXPLAIN.name, "spec": spec, "status": "ok"}
            se = 0.03 * t
            vals = {
                "actual_delta": dl,
                "rel_delta": dl / loss,
                "gTd": gtd,
                "quadratic": quad,
                "pred_delta": gtd + quad,
                "remainder": rem,
                "norm2": norm2,
                "rayleigh": kappa * tpp,
                "loss": loss,
                "q_loss": loss + dl,
            }
            for m, v in vals.items():
                rows.append(base | dict(metric=m, value=v, stderr=nan, ci_low=nan, ci_high=nan))
            rows.append(base | dict(metric="trace", value=t, stderr=se, ci_low=t - 2 * se, ci_high=t + 2 * se))
            rows.append(
                base
                | dict(
                    metric="trace_per_param",
                    value=tpp,
                    stderr=se / n,
                    ci_low=(t - 2 * se) / n,
                    ci_high=(t + 2 * se) / n,
                )
            )
            rows.append(
                base
                | dict(
                    metric="kappa",
                    value=kappa,
                    stderr=kappa * se / t,
                    ci_low=kappa * t / (t + 2 * se),
                    ci_high=kappa * t / (t - 2 * se),
                )
            )
            w = rng.dirichlet(np.ones(layers))
            for j in range(layers):
                for q, v in (("dHd", 2 * quad * w[j]), ("gTd", gtd / layers), ("norm2", norm2 / layers)):
                    rows.append(
                        base | dict(metric=f"{q}[layer:layer{j}]", value=v, stderr=nan, ci_low=nan, ci_high=nan)
                    )
    return pd.concat([df, pd.DataFrame(rows, columns=df.columns)], ignore_index=True)


__all__ = [
    "explain_factors_figure",
    "explain_heatmap_figure",
    "explain_shares_figure",
    "explain_figures",
    "synthetic_explain",
]
