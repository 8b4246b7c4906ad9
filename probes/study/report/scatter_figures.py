"""The sharpness-vs-quantization scatter (:func:`sharpness_vs_quant_figure`): one point per checkpoint,
coloured by step (points of inexact products marked, :mod:`.flags`), with the correlation (r,
interval, p, n) in its title, and which correlation of a mapping or of the
:func:`losslens.study.analysis.summary` table goes with which scatter (for
:func:`losslens.study.report.figures.trajectory_figures`). Nothing is recomputed here.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from losslens.study.report.figure_parts import _empty, _run_col, metric_rows, run_colour, specs_of
from losslens.study.report.labels import metric_axis
from losslens.study.report.flags import PRODUCT_ERROR_MARKER, UNCONVERGED_MARKER, product_error_text, unconverged_mask
from losslens.measure.probes.eigen import PROBE as EIGEN
from losslens.measure.probes.quant import PROBE as QUANT
from losslens.measure.probes.trace import PROBE as TRACE


def _corr_text(correlation) -> str:
    if correlation is None:
        return ""
    c = correlation.to_dict() if hasattr(correlation, "to_dict") else dict(correlation)
    r = c.get("r", float("nan"))
    lo, hi = c.get("ci_low", float("nan")), c.get("ci_high", float("nan"))
    method = c.get("method", "r")
    p = c.get("p")
    n = c.get("n")
    ctrl = c.get("covariates") or c.get("controls")
    ctrl = ", ".join(ctrl) if isinstance(ctrl, (list, tuple)) else (ctrl or "")
    ok, rw = all(isinstance(v, float) and math.isfinite(v) for v in (lo, hi)), c.get("r_within", float("nan"))
    s = (
        f"{method}{' | ' + ctrl if ctrl else ''} r = {r:+.3f}"
        + (
            f" pooled, within runs {rw:+.3f}"
            if c.get("n_runs", 1) != 1 and isinstance(rw, float) and math.isfinite(rw)
            else ""
        )
        + (f" [95% CI {lo:+.3f}, {hi:+.3f}]" if ok else "")
    )
    has_p, how = p is not None and not (isinstance(p, float) and math.isnan(p)), c.get("inference") or ""
    s += (
        (f", p = {float(p):.3g}" + (f" ({how})" if how else ""))
        if has_p
        else (", descriptive" if how == "descriptive" else "")
    )
    n_eff = c.get("n_eff")
    if n is not None:
        s += f", n = {int(n)}" + (
            f" (effective {n_eff:.1f})" if isinstance(n_eff, float) and math.isfinite(n_eff) else ""
        )
    return s


def sharpness_vs_quant_figure(
    df,
    x: tuple[str, str | None, str] = (TRACE.name, None, TRACE.name),
    y: tuple[str, str | None, str] | str | None = None,
    correlation=None,
    log: bool = False,
):
    """Scatter of a sharpness series (default Hessian trace) against a quantization error (default
    the first quant spec's ``rel_loss_error``), one point per checkpoint coloured by step, derived
    checkpoints as stars; ``correlation`` (a :class:`losslens.study.analysis.Correlation` or a dict with
    r, ci_low, ci_high[, p, n, method]) goes into the title."""
    import plotly.graph_objects as go

    if y is None:
        specs = specs_of(df, QUANT.name)
        y = (QUANT.name, specs[0] if specs else None, "rel_loss_error")
    elif isinstance(y, str):
        y = (QUANT.name, y, "rel_loss_error")
    xr = metric_rows(df, x[0], x[2], x[1])
    yr = metric_rows(df, y[0], y[2], y[1])
    xr = xr.assign(value=metric_axis(x[2])[1] * xr["value"].astype(float))  # ΔQ in %, as everywhere
    yr = yr.assign(value=metric_axis(y[2])[1] * yr["value"].astype(float))
    key = ["run", "checkpoint"] if "run" in df else ["checkpoint"]
    xr = xr.assign(run=_run_col(xr)) if "run" in xr else xr
    yr = yr.assign(run=_run_col(yr)) if "run" in yr else yr
    xlab, ylab = _series_label(x), _series_label(y)
    xr = xr.assign(bad=unconverged_mask(xr), inexact=product_error_text(xr))
    yr = yr.assign(bad=unconverged_mask(yr), inexact=product_error_text(yr))
    merged = (
        xr[key + ["step", "derived", "value", "bad", "inexact"]]
        .drop_duplicates(key, keep="last")
        .merge(yr[key + ["value", "bad", "inexact"]].drop_duplicates(key, keep="last"), on=key, suffixes=("_x", "_y"))
    )
    fig = go.Figure()
    if merged.empty:
        _empty(fig, f"no checkpoint has both {xlab} and {ylab}")
    else:
        steps = merged["step"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
        derived = merged["derived"].astype(bool).to_numpy()
        bad = (merged["bad_x"] | merged["bad_y"]).to_numpy(bool)
        runs = list(dict.fromkeys(merged["run"])) if "run" in merged else ["run"]
        symbols = ("circle", "square", "diamond", "triangle-up", "cross", "x")
        cmin, cmax = (float(np.nanmin(steps)), float(np.nanmax(steps))) if np.isfinite(steps).any() else (0.0, 1.0)
        first = True
        for r_i, run in enumerate(runs):
            for is_d in (False, True):
                m = (
                    ((merged["run"] == run).to_numpy() if "run" in merged else np.ones(len(merged), bool))
                    & (derived == is_d)
                    & ~bad
                )
                if not m.any():
                    continue
                part = merged[m]
                fig.add_trace(
                    go.Scatter(
                        x=part["value_x"].astype(float).tolist(),
                        y=part["value_y"].astype(float).tolist(),
                        mode="markers",
                        name=f"{run}{' (derived/LAWA)' if is_d else ''}",
                        legendgroup=str(run),
                        marker=dict(
                            size=15 if is_d else 10,
                            symbol="star" if is_d else symbols[r_i % len(symbols)],
                            color=np.nan_to_num(steps[m], nan=cmin).tolist(),
                            colorscale="Viridis",
                            cmin=cmin,
                            cmax=cmax,
                            showscale=first,
                            colorbar=dict(title="step") if first else None,
                            line=dict(width=2, color=run_colour(str(run), runs)),
                        ),
                        customdata=list(zip(part["checkpoint"].astype(str), steps[m].tolist())),
                        hovertemplate="checkpoint %{customdata[0]}<br>step %{customdata[1]}<br>"
                        f"{xlab} %{{x:.6g}}<br>{ylab} %{{y:.6g}}<extra>{run}</extra>",
                    )
                )
                first = False
        if bad.any():
            fig.add_trace(
                go.Scatter(
                    x=merged["value_x"][bad].astype(float).tolist(),
                    y=merged["value_y"][bad].astype(float).tolist(),
                    mode="markers",
                    marker=UNCONVERGED_MARKER,
                    name="not converged (left out of r)",
                    customdata=merged["checkpoint"][bad].astype(str).tolist(),
                    hovertemplate="checkpoint %{customdata}<br>x %{x:.6g}<br>y %{y:.6g}<br><b>NOT CONVERGED</b>"
                    "<extra></extra>",
                )
            )
        _mark_inexact(fig, merged)
    ct = _corr_text(correlation)
    fig.update_layout(
        title=f"{xlab} vs {ylab}" + (f"<br><sup>{ct}</sup>" if ct else ""),
        xaxis_title=xlab,
        yaxis_title=ylab,
        height=460,
        legend=dict(orientation="h", y=-0.2),
    )
    if log:
        fig.update_xaxes(type="log")
        fig.update_yaxes(type="log")
    return fig


def _mark_inexact(fig, merged) -> None:
    """Open orange diamonds around the points whose x or y products' measured error is over the
    tolerance, with the error, cause and fix on hover (:mod:`.flags`)."""
    import plotly.graph_objects as go

    text = [" ".join(t for t in pair if t) for pair in zip(merged["inexact_x"], merged["inexact_y"])]
    hit = np.array([bool(t) for t in text], dtype=bool)
    if not hit.any():
        return
    fig.add_trace(
        go.Scatter(
            x=merged["value_x"][hit].astype(float).tolist(),
            y=merged["value_y"][hit].astype(float).tolist(),
            mode="markers",
            marker=PRODUCT_ERROR_MARKER,
            name="product error > tolerance",
            customdata=merged["checkpoint"][hit].astype(str).tolist(),
            text=[t for t, h in zip(text, hit) if h],
            hovertemplate="checkpoint %{customdata}<br>x %{x:.6g}<br>y %{y:.6g}<br><b>PRODUCT ERROR OVER THE "
            "TOLERANCE</b><br>%{text}<extra></extra>",
        )
    )


def _series_label(key: tuple[str, str | None, str]) -> str:
    probe, spec, metric = key
    if probe == QUANT.name:
        metric = metric_axis(metric)[0]
        return f"{metric} ({spec})" if spec else metric
    head = metric if metric == probe or probe == EIGEN.name else f"{probe} {metric}"
    return f"{head} ({spec})" if spec else head


def _pick_corr(correlations, spec: str, index: int, xname: str):
    if correlations is None:
        return None
    if hasattr(correlations, "columns") and {"x", "y", "r"} <= set(correlations.columns):
        t = correlations
        sel = (
            t[(t["y"].astype(str) == spec) & (t["controls"].fillna("") == "")] if "controls" in t else t[t["y"] == spec]
        )
        pref = sel[(sel["x"] == xname)] if (sel["x"] == xname).any() else sel
        pear = pref[pref["method"] == "pearson"] if "method" in pref else pref
        row = pear if len(pear) else pref
        if len(row) == 0:
            return None
        d = row.iloc[0].to_dict()
        d["covariates"] = ()
        return d
    if isinstance(correlations, Mapping) and spec in correlations:
        return correlations[spec]
    if isinstance(correlations, Mapping) and "r" in correlations:
        return correlations if index == 0 else None
    if hasattr(correlations, "r"):
        return correlations if index == 0 else None
    return None


__all__ = ["sharpness_vs_quant_figure"]
