"""The building blocks of the trajectory figures: reading series out of the tidy results table
(:func:`metric_rows`, :func:`specs_of`, runs, x = step), and drawing them (one line per run with
derived checkpoints as stars, unconverged values apart and values of inexact products marked
(:mod:`.flags`), the LR on a secondary axis, shaded phases, an empty figure's message).
:mod:`.figures`, :mod:`.explain_figures` and :mod:`.accuracy_figures` draw with them."""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Iterable, Iterator, Mapping

import numpy as np

from losslens.study.report.flags import (
    add_product_error_points,
    add_unconverged_points,
    product_error_mask,
    unconverged_mask,
)

from losslens.geometry.base.errors import LosslensError

PHASE_COLOURS = ("rgba(31,119,180,0.10)", "rgba(214,39,40,0.10)", "rgba(44,160,44,0.10)", "rgba(148,103,189,0.10)")
PHASE_LINES = ("rgb(31,119,180)", "rgb(214,39,40)", "rgb(44,160,44)", "rgb(148,103,189)")
#: The colours runs take in turn on a page (one per run, the same in every figure).
RUN_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
RUN_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
_PAGE_COLOURS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("run_colours", default=None)


class FigureError(LosslensError, ValueError):
    """The results table lacks what a figure needs."""


# --------------------------------------------------------------------------- one colour per run
def run_colour_map(runs: Iterable[str]) -> dict[str, str]:
    """``{run: colour}``: the sorted distinct run names take :data:`RUN_COLOURS` in turn (cycling
    after 10), so a run's colour depends only on the set of runs, never on a figure's order."""
    names = sorted({str(r) for r in runs})
    return {r: RUN_COLOURS[i % len(RUN_COLOURS)] for i, r in enumerate(names)}


@contextlib.contextmanager
def page_colours(runs: Iterable[str]) -> Iterator[dict[str, str]]:
    """Within the block every figure draws run ``r`` in ``run_colour_map(runs)[r]`` (a report page
    computes the map once from all its runs and draws all its figures inside)."""
    token = _PAGE_COLOURS.set(run_colour_map(runs))
    try:
        yield _PAGE_COLOURS.get() or {}
    finally:
        _PAGE_COLOURS.reset(token)


def run_colour(run: str, runs_here: Iterable[str] = ()) -> str:
    """The colour of ``run``: from the page's map (:func:`page_colours`) when one is set and names
    it, else from :func:`run_colour_map` of ``runs_here`` (the figure's own runs)."""
    page = _PAGE_COLOURS.get()
    if page and str(run) in page:
        return page[str(run)]
    return run_colour_map([*runs_here, run])[str(run)]


# --------------------------------------------------------------------------- data access
def _runs(df) -> list[str]:
    runs = df["run"].fillna("run").astype(str) if "run" in df else None
    return list(dict.fromkeys(runs)) if runs is not None else ["run"]


def _run_col(df):
    return df["run"].fillna("run").astype(str) if "run" in df else np.array(["run"] * len(df))


def _x(sub) -> np.ndarray:
    step = sub["step"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    if np.isnan(step).all():  # no steps known: use trajectory order
        return np.arange(len(sub), dtype=float)
    return step


def metric_rows(df, probe: str, metric: str, spec: str | None = None):
    """Rows of one measured series (status ok, finite value), ordered as in the table."""
    sel = df[(df["probe"] == probe) & (df["metric"] == metric) & (df["status"] == "ok")]
    if spec is not None:
        sel = sel[sel["spec"] == spec]
    return sel[np.isfinite(sel["value"].astype(float))]


def specs_of(df, probe: str) -> list[str]:
    """The specs of ``probe`` in the table, in first-seen order."""
    return [s for s in dict.fromkeys(df.loc[df["probe"] == probe, "spec"]) if isinstance(s, str)]


def _checkpoints(df):
    cols = [c for c in ("run", "checkpoint", "step", "lr", "derived") if c in df]
    d = df[cols].drop_duplicates(subset=[c for c in ("run", "checkpoint") if c in cols])
    return d


def _phase_list(phases) -> list[dict]:
    if phases is None:
        return []
    if hasattr(phases, "convergence") and hasattr(phases, "divergence"):
        out = []
        for name, onset in (("FP convergence", phases.convergence), ("quantization divergence", phases.divergence)):
            if getattr(onset, "found", False) and onset.step is not None:
                out.append({"name": name, "step": onset.step, "lr": onset.lr})
        return out
    if isinstance(phases, Mapping):
        if "convergence" in phases or "divergence" in phases:
            out = []
            for key, name in (("convergence", "FP convergence"), ("divergence", "quantization divergence")):
                o = phases.get(key)
                if o and o.get("found", True) and o.get("step") is not None:
                    out.append({"name": name, "step": o["step"], "lr": o.get("lr")})
            return out
        phases = [phases]
    out = []
    for p in phases:
        if p is None or p.get("step") is None:
            continue
        if isinstance(p.get("step"), float) and math.isnan(p["step"]):
            continue
        out.append({"name": str(p.get("name", "phase")), "step": float(p["step"]), "lr": p.get("lr")})
    return out


def _fmt_lr(lr) -> str:
    try:
        return f"{float(lr):.3g}" if lr is not None and math.isfinite(float(lr)) else "?"
    except (TypeError, ValueError):
        return "?"


# --------------------------------------------------------------------------- building blocks
def _add_series(
    fig,
    df,
    probe: str,
    metric: str,
    spec: str | None,
    name: str,
    colour_index: int,
    secondary_y: bool | None = None,
    row: int | None = None,
    col: int | None = None,
    error_bars: bool = True,
    positive_only: bool = False,
    by_run: bool = False,
    legend: bool = True,
    scale: float = 1.0,
    unit: str = "",
) -> int:
    """One line per run (+ star markers for derived checkpoints). Returns the number of points drawn.
    A run's colour is :func:`run_colour` (one per run on a page); ``colour_index`` tells the series
    of one figure apart by dash (:data:`RUN_DASHES`). ``by_run``: legend entries named and grouped by
    run (for small multiples, one panel per ``name``, which goes into the hover and ``meta``);
    ``legend``: show legend entries; ``scale``: values and stderr are drawn × scale (100 for a
    fraction in %), ``unit`` follows the value on hover."""
    import plotly.graph_objects as go

    rows = metric_rows(df, probe, metric, spec)
    if positive_only:
        rows = rows[rows["value"].astype(float) > 0]
    if rows.empty:
        return 0
    if scale != 1.0:  # e.g. a fraction drawn in %: flagged points and hover use the same numbers
        scaled = {c: scale * rows[c].astype(float) for c in ("value", "stderr", "ci_low", "ci_high") if c in rows}
        rows = rows.assign(**scaled)
    runs = _run_col(rows)
    n = 0
    multi = len(dict.fromkeys(runs)) > 1
    for run in dict.fromkeys(runs):
        sub = rows[runs == run]
        colour = run_colour(run, runs)
        dash = RUN_DASHES[colour_index % len(RUN_DASHES)]
        label = f"{name} · {run}" if multi else name
        place = {
            **({"row": row, "col": col or 1} if row is not None else {}),
            **({"secondary_y": secondary_y} if secondary_y is not None else {}),
        }
        inexact = product_error_mask(sub)  # marked where they are: open orange diamonds, error/cause/fix on hover
        if inexact.any():
            add_product_error_points(fig, sub[inexact], _x(sub)[inexact], label, place, showlegend=legend)
        flag = unconverged_mask(sub)  # drawn apart as open red markers, off the line
        if flag.any():
            n += add_unconverged_points(fig, sub[flag], _x(sub)[flag], label, place)
            sub = sub[~flag]
        entry, group = (str(run), str(run)) if by_run else (label, label)
        derived = sub["derived"].astype(bool).to_numpy() if "derived" in sub else np.zeros(len(sub), bool)
        for is_derived in (False, True):
            part = sub[derived == is_derived]
            if part.empty:
                continue
            xs = _x(part)
            order = np.argsort(xs, kind="stable")
            part = part.iloc[order]
            xs = xs[order]
            err = part["stderr"].astype(float).to_numpy() if "stderr" in part else None
            err_arg = None
            if error_bars and err is not None and np.isfinite(err).any():
                err_arg = dict(
                    type="data", array=np.where(np.isfinite(err), err, 0.0).tolist(), visible=True, thickness=1
                )
            custom = list(zip(part["checkpoint"].astype(str), [_fmt_lr(v) for v in part.get("lr", [None] * len(part))]))
            kw = dict(
                x=xs.tolist(),
                y=part["value"].astype(float).tolist(),
                error_y=err_arg,
                customdata=custom,
                hovertemplate=f"{label}<br>checkpoint %{{customdata[0]}}<br>step %{{x}}<br>value %{{y:.6g}}{unit}"
                f"<br>lr %{{customdata[1]}}<extra></extra>",
            )
            if is_derived:
                trace = go.Scatter(
                    name=f"{entry} (derived/LAWA)",
                    mode="markers",
                    marker=dict(symbol="star", size=13, color=colour, line=dict(width=1, color="black")),
                    legendgroup=group,
                    showlegend=legend,
                    meta=name,
                    **kw,
                )
            else:
                trace = go.Scatter(
                    name=entry,
                    mode="lines+markers",
                    line=dict(color=colour, dash=dash),
                    marker=dict(size=6, color=colour),
                    legendgroup=group,
                    showlegend=legend,
                    meta=name,
                    **kw,
                )
            add_kw = {}
            if row is not None:
                add_kw.update(row=row, col=col or 1)
            if secondary_y is not None:
                add_kw["secondary_y"] = secondary_y
            fig.add_trace(trace, **add_kw)
            n += len(part)
    return n


def _add_lr(fig, df, row: int | None = None, col: int | None = None, showlegend: bool = True) -> bool:
    """The LR schedule (per run) as a dotted line on the secondary y axis."""
    import plotly.graph_objects as go

    ck = _checkpoints(df)
    if "lr" not in ck or not np.isfinite(ck["lr"].astype(float)).any():
        return False
    ck = ck[~ck["derived"].astype(bool)] if "derived" in ck else ck
    runs = _run_col(ck)
    multi = len(dict.fromkeys(runs)) > 1
    for run in dict.fromkeys(runs):
        sub = ck[runs == run]
        xs = _x(sub)
        lr = sub["lr"].astype(float).to_numpy()
        keep = np.isfinite(xs) & np.isfinite(lr)
        order = np.argsort(xs[keep], kind="stable")
        kw = dict(secondary_y=True)
        if row is not None:
            kw.update(row=row, col=col or 1)
        fig.add_trace(
            go.Scatter(
                x=xs[keep][order].tolist(),
                y=lr[keep][order].tolist(),
                mode="lines",
                name=f"LR · {run}" if multi else "LR",
                line=dict(color="grey", dash="dot", width=1.5),
                showlegend=showlegend,
                legendgroup=f"LR · {run}",
                hovertemplate="step %{x}<br>lr %{y:.3g}<extra></extra>",
            ),
            **kw,
        )
    return True


def _shade_phases(
    fig, phases: list[dict], x_max: float | None, row: int | None = None, col: int | None = None, annotate: bool = True
) -> None:
    for i, p in enumerate(phases):
        x0 = float(p["step"])
        x1 = x_max if x_max is not None and x_max > x0 else x0
        kw = {} if row is None else dict(row=row, col=col or 1)
        label = f"{p['name']} (step {x0:g}, lr {_fmt_lr(p.get('lr'))})"
        if x1 > x0:
            fig.add_vrect(
                x0=x0, x1=x1, fillcolor=PHASE_COLOURS[i % len(PHASE_COLOURS)], line_width=0, layer="below", **kw
            )
        ann = (
            dict(
                annotation_text=label,
                annotation_position="top left" if i % 2 == 0 else "bottom left",
                annotation_font_size=10,
            )
            if annotate
            else {}
        )
        fig.add_vline(x=x0, line=dict(color=PHASE_LINES[i % len(PHASE_LINES)], dash="dash", width=1.5), **ann, **kw)


def _x_max(df) -> float | None:
    ck = _checkpoints(df)
    xs = _x(ck)
    return float(np.nanmax(xs)) if np.isfinite(xs).any() else None


def _base(secondary: bool, title: str, ytitle: str, log_y: bool = False):
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": secondary}]])
    fig.update_layout(
        title=title,
        hovermode="closest",
        height=430,
        legend=dict(orientation="h", y=-0.2),
        margin=dict(l=60, r=60, t=70, b=40),
    )
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text=ytitle, type="log" if log_y else "linear", secondary_y=False)
    if secondary:
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
    return fig


def _empty(fig, message: str) -> None:
    fig.add_annotation(
        text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5, font=dict(size=14, color="grey")
    )


__all__ = ["FigureError", "RUN_COLOURS", "metric_rows", "specs_of", "page_colours", "run_colour", "run_colour_map"]
