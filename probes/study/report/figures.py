"""Trajectory figures (Plotly) from the tidy results DataFrame of a sweep.

Every function takes results -- the DataFrame of :meth:`losslens.study.sweep.Store.results` (columns ``run,
checkpoint, step, tokens, lr, derived, probe, spec, metric, value, stderr, ci_low, ci_high, n_hvp,
seconds, status, error, seed, data_hash``), plus already-computed phases and correlations -- and
returns a ``plotly.graph_objects.Figure``. Nothing is recomputed here.

Conventions: x = ``step`` (checkpoint position when steps are unknown); one trace per run (the
``run`` column) and series; derived checkpoints (LAWA / soups, ``derived=True``) are drawn as
separate star markers, not joined to the trajectory line; error bars are ``stderr`` when present;
the LR schedule is a dotted grey line on a secondary y axis; phases (``[{"name", "step", "lr"}]``
or a :class:`losslens.study.analysis.Phases`) are shaded from their onset to the end of the trajectory with
a labelled vertical line. Figures display inline in Jupyter (``fig.show()`` or as the cell value).
"""

from __future__ import annotations

import math
import sys
from typing import Any, Iterable, Sequence

import numpy as np

from losslens.measure.probes.registry import REGISTRY
from losslens.study.sweep.store_schema import FIRST_COLUMNS

from losslens.study.report.figure_parts import (
    FigureError,
    _add_lr,
    _add_series,
    _base,
    _empty,
    _phase_list,
    _shade_phases,
    _x_max,
    metric_rows,
    specs_of,
)
from losslens.study.report.labels import metric_axis
from losslens.study.report.scatter_figures import _pick_corr, sharpness_vs_quant_figure
from losslens.measure.probes.eigen import PROBE as EIGEN
from losslens.measure.probes.loss import PROBE as LOSS
from losslens.measure.probes.quant import PROBE as QUANT
from losslens.measure.probes.trace import PROBE as TRACE


# --------------------------------------------------------------------------- figures
def loss_figure(df, phases=None, lr: bool = True, metric: str = LOSS.metric):
    """Full-precision loss (``loss`` probe, metric ``loss`` or ``ppl``) vs step, LR on a secondary axis."""
    fig = _base(lr, f"full-precision {metric} vs step", f"FP {metric} (nats)" if metric == LOSS.metric else metric)
    n = _add_series(fig, df, LOSS.name, metric, None, f"FP {metric}", 0, secondary_y=False if lr else None)
    if n == 0:
        _empty(fig, f"no {LOSS.name!r} probe in the results")
    if lr:
        _add_lr(fig, df)
    _shade_phases(fig, _phase_list(phases), _x_max(df))
    return fig


def series_figure(
    df,
    probe: str,
    metric: str,
    phases=None,
    lr: bool = True,
    title: str | None = None,
    ytitle: str | None = None,
    log_y: bool = False,
):
    """One probe's ``metric`` vs step, one line per spec and run (stderr bars when present), the LR on a
    secondary axis: the figure a probe declares when one series tells its story (``figure`` in
    :class:`losslens.measure.probes.probe.Probe`)."""
    fig = _base(lr, title or f"{probe} {metric} vs step", ytitle or metric, log_y)
    specs = specs_of(df, probe) or [None]
    n = sum(
        _add_series(
            fig,
            df,
            probe,
            metric,
            s if len(specs) > 1 else None,
            f"{metric} ({s})" if s else metric,
            i,
            secondary_y=False if lr else None,
        )
        for i, s in enumerate(specs)
    )
    if n == 0:
        _empty(fig, f"no {probe!r} probe in the results")
    if lr:
        _add_lr(fig, df)
    _shade_phases(fig, _phase_list(phases), _x_max(df))
    return fig


def quant_error_figure(
    df, phases=None, metric: str = "rel_loss_error", lr: bool = True, specs: Sequence[str] | None = None, cols: int = 2
):
    """Quantization error vs step as small multiples: one panel (log y) per spec, ``cols`` panels a
    row, one colour per run with one legend entry per run (clicking it hides the run everywhere),
    the LR on each panel's secondary axis. Non-positive values cannot be drawn on a log axis; they
    are left out and counted in the title."""
    from plotly.subplots import make_subplots

    specs = list(specs) if specs is not None else specs_of(df, QUANT.name)
    n = max(1, len(specs))
    cols = max(1, min(cols, n))
    nrows = math.ceil(n / cols)
    fig = make_subplots(
        rows=nrows,
        cols=cols,
        shared_xaxes=True,
        subplot_titles=[str(s) for s in specs] or None,
        specs=[[{"secondary_y": lr}] * cols for _ in range(nrows)],
        vertical_spacing=min(0.12, 0.3 / nrows),
        horizontal_spacing=0.1,
    )
    drawn, dropped = 0, 0
    ytitle, scale, unit = metric_axis(metric)  # ΔQ L in %, as the printed summary gives it
    for i, spec in enumerate(specs):
        r, c = i // cols + 1, i % cols + 1
        rows = metric_rows(df, QUANT.name, metric, spec)
        dropped += int((rows["value"].astype(float) <= 0).sum())
        drawn += _add_series(
            fig,
            df,
            QUANT.name,
            metric,
            spec,
            spec,
            0,
            secondary_y=False if lr else None,
            row=r,
            col=c,
            error_bars=False,
            positive_only=True,
            by_run=True,
            legend=i == 0,
            scale=scale,
            unit=unit,
        )
        fig.update_yaxes(
            type="log",
            title_text=ytitle if c == 1 else None,
            exponentformat="power",
            row=r,
            col=c,
            secondary_y=False,
        )
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
        _shade_phases(fig, _phase_list(phases), _x_max(df), row=r, col=c, annotate=i == 0)
    title = f"quantization error {ytitle} vs step, one panel per quantizer"
    if dropped:
        title = f"quantization error {ytitle} vs step — {dropped} value(s) ≤ 0 not shown on the log axis"
    fig.update_layout(title=title, hovermode="closest", height=140 + 260 * nrows, margin=dict(l=60, r=40, t=80, b=40))
    fig.update_xaxes(title_text="step", row=nrows)
    if drawn == 0:
        _empty(fig, "no positive quantization errors in the results")
    return fig


def curvature_figure(df, phases=None, lr: bool = True, trace_spec: str | None = None, eigen_metric: str = "lambda_1"):
    """Hessian trace (top) and λ_max (bottom) vs step, with stderr bars and the LR on secondary axes."""
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        specs=[[{"secondary_y": lr}], [{"secondary_y": lr}]],
        subplot_titles=("Hessian trace", f"λ_max ({eigen_metric})"),
    )
    tspecs = [trace_spec] if trace_spec else specs_of(df, TRACE.name)
    n1 = sum(
        _add_series(
            fig, df, TRACE.name, TRACE.name, s, f"trace ({s})", i, secondary_y=False if lr else None, row=1, col=1
        )
        for i, s in enumerate(tspecs)
    )
    n2 = _add_series(
        fig, df, EIGEN.name, eigen_metric, None, "λ_max", 0, secondary_y=False if lr else None, row=2, col=1
    )
    if lr:
        _add_lr(fig, df, row=1, col=1)
        _add_lr(fig, df, row=2, col=1, showlegend=False)
        fig.update_yaxes(
            title_text="learning rate",
            secondary_y=True,
            showgrid=False,
            rangemode="tozero",
            type="linear",
            tickmode="auto",
            nticks=6,
            tickformat=".2g",
        )
    phases = _phase_list(phases)
    xm = _x_max(df)
    _shade_phases(fig, phases, xm, row=1, col=1)
    _shade_phases(fig, phases, xm, row=2, col=1, annotate=False)
    fig.update_yaxes(title_text="tr H", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="λ_max", row=2, col=1, secondary_y=False)
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_layout(
        title="sharpness vs step",
        height=620,
        legend=dict(orientation="h", y=-0.12),
        margin=dict(l=60, r=60, t=80, b=40),
    )
    if n1 + n2 == 0:
        _empty(fig, f"no {TRACE.name!r} or {EIGEN.name!r} probe in the results")
    return fig


def trajectory_figures(df, phases=None, correlations=None, specs: Sequence[str] | None = None) -> dict[str, Any]:
    """Every trajectory figure the results support, in report order: ``{"loss", "quant",
    "sharpness", "scatter[:spec]"...}``. ``correlations`` may be a mapping ``{spec: Correlation|dict}``
    (for the scatters), a single Correlation/dict (for the first scatter), or the
    :func:`losslens.study.analysis.summary` DataFrame (the first Pearson row without controls per y)."""
    if df is None or len(df) == 0:
        raise FigureError("the results table is empty")
    figs: dict[str, Any] = {}
    probes = set(df["probe"].dropna())
    draw = sys.modules[__name__]  # the figures of this module, handed to each probe's figure declaration
    for p in REGISTRY:  # in execution order; a figure two probes declare (sharpness) is drawn once
        if p.figure is not None and p.name in probes:
            for key, fig in p.figure(draw, df, phases, specs).items():
                figs.setdefault(key, fig)
    qspecs = list(specs) if specs is not None else specs_of(df, QUANT.name)
    sharp = (
        (TRACE.name, None, TRACE.name)
        if TRACE.name in probes
        else ((EIGEN.name, None, "lambda_1") if EIGEN.name in probes else None)
    )
    if sharp is not None and sharp[0] == TRACE.name:
        tspecs = specs_of(df, TRACE.name)
        sharp = (TRACE.name, tspecs[0] if len(tspecs) > 1 else None, TRACE.name)
    if sharp is not None:
        for i, spec in enumerate(qspecs):
            figs[f"scatter:{spec}"] = sharpness_vs_quant_figure(
                df, x=sharp, y=spec, correlation=_pick_corr(correlations, spec, i, sharp[0])
            )
    return figs


def synthetic_results(
    n_checkpoints: int = 8,
    runs: Iterable[str] = ("wsd",),
    specs: Sequence[str] = ("rtn:4:g128", "int8"),
    lawa: bool = True,
    seed: int = 0,
):
    """A small, plausible tidy results DataFrame (for tests, docs and the report demo): loss
    falling, trace rising through an LR decay, quantization error tracking the trace."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    for r_i, run in enumerate(runs):
        peak = 1e-3 * (3**r_i)
        steps = np.linspace(100, 100 * n_checkpoints, n_checkpoints).astype(int)
        for k, step in enumerate(steps):
            decay = max(0.0, (k - 0.6 * n_checkpoints) / (0.4 * n_checkpoints))
            lr = peak * (1 - decay) if decay > 0 else peak
            loss = 3.0 + 2.5 * math.exp(-k / 2) - 0.2 * decay + rng.normal(0, 0.01)
            trace = (300 + 400 * decay) / (1 + r_i) * (1 + rng.normal(0, 0.03))
            rows += _rows(run, f"{run}-step{step}", int(step), float(lr), False, loss, trace, specs, rng)
        if lawa:
            rows += _rows(run, f"{run}-lawa", int(steps[-1]), None, True, 3.05, 500 / (1 + r_i), specs, rng)
    return pd.DataFrame(
        rows,
        columns=FIRST_COLUMNS,
    )


def _rows(run, ckpt, step, lr, derived, loss, trace, specs, rng):
    base = dict(
        run=run,
        checkpoint=ckpt,
        step=step,
        tokens=step * 4096,
        lr=lr,
        derived=derived,
        n_hvp=0,
        seconds=0.1,
        status="ok",
        error=None,
        seed=0,
        data_hash="synthetic",
    )
    nan = float("nan")
    out = [
        dict(base, probe=LOSS.name, spec="", metric=LOSS.metric, value=loss, stderr=nan, ci_low=nan, ci_high=nan),
        dict(base, probe=LOSS.name, spec="", metric="ppl", value=math.exp(loss), stderr=nan, ci_low=nan, ci_high=nan),
        dict(
            base,
            probe=TRACE.name,
            spec="hutch++",
            metric=TRACE.metric,
            value=trace,
            stderr=0.03 * trace,
            ci_low=0.94 * trace,
            ci_high=1.06 * trace,
            n_hvp=100,
        ),
        dict(
            base,
            probe=EIGEN.name,
            spec="lanczos",
            metric="lambda_1",
            value=trace / 12,
            stderr=nan,
            ci_low=nan,
            ci_high=nan,
            n_hvp=60,
        ),
    ]
    for i, spec in enumerate(specs):
        err = trace * 1e-5 * (10 ** (-i)) * (1 + rng.normal(0, 0.05))
        out.append(
            dict(
                base,
                probe=QUANT.name,
                spec=spec,
                metric="rel_loss_error",
                value=err,
                stderr=nan,
                ci_low=nan,
                ci_high=nan,
            )
        )
        out.append(
            dict(
                base,
                probe=QUANT.name,
                spec=spec,
                metric="ppl_gap",
                value=math.expm1(err * loss),
                stderr=nan,
                ci_low=nan,
                ci_high=nan,
            )
        )
    return out


__all__ = [
    "loss_figure",
    "series_figure",
    "quant_error_figure",
    "curvature_figure",
    "trajectory_figures",
    "synthetic_results",
]
