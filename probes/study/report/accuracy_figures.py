"""The "loss vs task accuracy" panel: ΔQ against Δacc per checkpoint and quantizer (the seeds' slide).

From the tidy results (nothing recomputed): for every quantizer spec with both a ``quant`` row
(ΔQ L = L(θ̂)/L(θ) − 1, %) and an ``accuracy`` row (Δacc = acc_q − acc_fp of the mean over the
accuracy tasks, points, with its paired bootstrap 95% interval as error bars) at the same
checkpoint, one marker per checkpoint (colour: spec, symbol: run; LAWA checkpoints as stars). The
figure uses ``acc`` (``acc_norm`` only for a task without ``acc``) and Δacc in points, not the relative
drop (also stored, ``rel_drop``). A second figure draws FP and quantized accuracy along training.
"""

from __future__ import annotations

import html

import numpy as np

from losslens.study.report.figure_parts import RUN_COLOURS, _runs, metric_rows, specs_of
from losslens.measure.probes.accuracy import PROBE as ACCURACY
from losslens.measure.probes.quant import PROBE as QUANT

__all__ = [
    "accuracy_pairs",
    "loss_vs_accuracy_figure",
    "accuracy_trajectory_figure",
    "accuracy_figures",
    "accuracy_note",
]

_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "cross")


def accuracy_pairs(df):
    """DataFrame with one row per (run, checkpoint, spec): step, derived, dq (ΔQ L), delta_acc, its CI."""
    import pandas as pd

    acc = metric_rows(df, ACCURACY.name, "delta_acc")
    acc = acc[~acc["spec"].astype(str).str.contains("@")]
    q = metric_rows(df, QUANT.name, "rel_loss_error")
    keys = [c for c in ("run", "checkpoint") if c in df]
    if acc.empty or q.empty:
        return pd.DataFrame(columns=[*keys, "spec", "step", "derived", "dq", "delta_acc", "ci_low", "ci_high"])
    a = acc[[*keys, "spec", "step", "derived", "value", "ci_low", "ci_high"]].rename(columns={"value": "delta_acc"})
    b = q[[*keys, "spec", "value"]].rename(columns={"value": "dq"})
    return a.merge(b, on=[*keys, "spec"], how="inner")


def loss_vs_accuracy_figure(df):
    """ΔQ L (%, x) against Δacc (points, y, paired 95% CI) per checkpoint and quantizer."""
    import plotly.graph_objects as go

    pairs = accuracy_pairs(df)
    fig = go.Figure()
    specs = list(dict.fromkeys(pairs["spec"])) if len(pairs) else []
    runs = _runs(df)
    for i, spec in enumerate(specs):
        for j, run in enumerate(runs):
            sub = pairs[
                (pairs["spec"] == spec) & ((pairs["run"].fillna("run").astype(str) == run) if "run" in pairs else True)
            ]
            for derived in (False, True):
                s = sub[sub["derived"].astype(bool) == derived]
                if s.empty:
                    continue
                y = 100 * s["delta_acc"].astype(float).to_numpy()
                lo = 100 * s["ci_low"].astype(float).to_numpy()
                hi = 100 * s["ci_high"].astype(float).to_numpy()
                fig.add_trace(
                    go.Scatter(
                        x=100 * s["dq"].astype(float).to_numpy(),
                        y=y,
                        mode="markers",
                        name=f"{spec} · {run}" + (" (LAWA)" if derived else ""),
                        marker=dict(
                            color=RUN_COLOURS[i % len(RUN_COLOURS)],
                            size=11 if derived else 8,
                            symbol="star" if derived else _SYMBOLS[j % len(_SYMBOLS)],
                        ),
                        error_y=dict(
                            type="data",
                            symmetric=False,
                            array=np.nan_to_num(hi - y),
                            arrayminus=np.nan_to_num(y - lo),
                            thickness=1,
                        ),
                        text=[f"{c} (step {st})" for c, st in zip(s["checkpoint"], s["step"])],
                        hovertemplate="%{text}<br>ΔQ L %{x:.2f}%<br>Δacc %{y:+.1f} pts<extra></extra>",
                    )
                )
    fig.add_hline(y=0, line=dict(color="grey", dash="dot", width=1))
    fig.update_layout(
        title="Loss vs task accuracy: ΔQ L against Δacc (mean over tasks, acc; paired 95% CI)",
        xaxis_title="ΔQ L = L(θ̂)/L(θ) − 1 (%)",
        yaxis_title="Δacc = acc_q − acc_fp (points)",
        template="plotly_white",
        legend_title="quantizer · run",
    )
    if not specs:
        fig.add_annotation(
            text="no checkpoint has both a quant and an accuracy row of the same spec",
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
        )
    return fig


def accuracy_trajectory_figure(df):
    """Mean accuracy (acc, ± stderr) along training for FP and every quantizer spec."""
    import plotly.graph_objects as go

    fig = go.Figure()
    variants = [s for s in specs_of(df, ACCURACY.name) if "@" not in s]
    for i, v in enumerate(variants):
        rows = metric_rows(df, ACCURACY.name, "acc", v)
        for j, run in enumerate(_runs(rows) if len(rows) else []):
            s = (
                rows[(rows["run"].fillna("run").astype(str) == run) & ~rows["derived"].astype(bool)]
                if "run" in rows
                else rows
            )
            if s.empty:
                continue
            s = s.sort_values("step")
            fig.add_trace(
                go.Scatter(
                    x=s["step"],
                    y=100 * s["value"].astype(float),
                    mode="lines+markers",
                    name=f"{v} · {run}",
                    line=dict(color=RUN_COLOURS[i % len(RUN_COLOURS)], dash="solid" if v == "fp" else "dash"),
                    marker=dict(symbol=_SYMBOLS[j % len(_SYMBOLS)]),
                    error_y=dict(type="data", array=100 * s["stderr"].astype(float).fillna(0), thickness=1),
                )
            )
    fig.update_layout(
        title="Task accuracy along training (mean over tasks, acc ± stderr)",
        xaxis_title="step",
        yaxis_title="accuracy (%)",
        template="plotly_white",
    )
    return fig


def accuracy_figures(df) -> dict:
    """``{"loss_vs_accuracy": …, "accuracy": …}``, or {} when the results hold no accuracy rows."""
    if not (df["probe"] == ACCURACY.name).any():
        return {}
    return {"loss_vs_accuracy": loss_vs_accuracy_figure(df), ACCURACY.name: accuracy_trajectory_figure(df)}


def accuracy_note(df, summary_line: str = "") -> str:
    """The section's explanatory HTML paragraph(s)."""
    tasks = sorted({s.split("@", 1)[1] for s in specs_of(df, ACCURACY.name) if "@" in s})
    note = (
        f'<p class="note">Tasks: {html.escape(", ".join(tasks))}. Δacc = acc_q − acc_fp of the mean over tasks '
        "(each task weighs the same), with a paired bootstrap 95% interval over items; the relative drop "
        "(acc_fp − acc_q)/acc_fp is stored as rel_drop. The figure uses acc "
        "(acc_norm only where a task has no acc).</p>"
    )
    if summary_line:
        note += f'<p class="note" data-note="accuracy-summary">{html.escape(summary_line)}</p>'
    return note
