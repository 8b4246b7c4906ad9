"""The figure of a run's landscape (:class:`losslens.study.landscape.trajectory_landscape.Landscape`).

Drawn from the result only: the loss over the principal plane as a contour map (right) and a 3-D
surface (left); each run's path through its checkpoints in training order; checkpoints coloured by
step (derived ones, e.g. LAWA, as squares); quantized points as crosses joined to their checkpoint.
Every point's hover says its coordinates, its own loss, the loss at its place on the plane and its
distance from the plane relative to its distance from the centre; points more than
``off_plane`` (default 50%) off the plane are drawn hollow and named in the title.
"""

from __future__ import annotations

import math

import numpy as np

from losslens.study.landscape.trajectory_landscape import Landscape
from losslens.study.report.figure_parts import run_colour

__all__ = ["landscape_figure"]


def _fmt(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.5g}"


def landscape_figure(land: Landscape, title: str | None = None, off_plane: float = 0.5, height: int = 560):
    """Plotly figure of ``land`` (needs its surface:
    :func:`~losslens.study.landscape.trajectory_landscape.trajectory_landscape`
    with a grid). Returns a ``plotly.graph_objects.Figure``."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if land.surface is None:
        raise ValueError("this landscape has no surface: compute it with a grid (trajectory_landscape(grid=N))")
    s, pca, axes = land.surface, land.pca, land.axes
    xy = pca.plane_coords(axes)
    res, dist = pca.residuals(axes), pca.distances
    rel = {lab: (res[i] / dist[i] if dist[i] > 0 else 0.0) for i, lab in enumerate(pca.labels)}
    where = {lab: (float(xy[i, 0]), float(xy[i, 1])) for i, lab in enumerate(pca.labels)}
    z = np.where(np.isfinite(s.loss), s.loss, np.nan)
    zdata = [[None if not math.isfinite(v) else float(v) for v in row] for row in z]
    evr = pca.explained_variance_ratio
    xlab, ylab = (f"PC{a + 1} ({100 * evr[a]:.1f}% of variance)" for a in axes)
    fig = make_subplots(
        rows=1,
        cols=2,
        specs=[[{"type": "surface"}, {"type": "xy"}]],
        column_widths=[0.45, 0.55],
        subplot_titles=("surface", "contour with the runs' paths"),
    )
    hover = "x=%{x:.4g}<br>y=%{y:.4g}<br>loss=%{z:.6g}<extra></extra>"
    fig.add_trace(
        go.Surface(
            x=s.x,
            y=s.y,
            z=zdata,
            colorscale="Viridis",
            showscale=False,
            connectgaps=False,
            hovertemplate=hover,
            name="loss surface",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Contour(
            x=s.x,
            y=s.y,
            z=zdata,
            colorscale="Viridis",
            connectgaps=False,
            ncontours=25,
            hovertemplate=hover,
            name="loss",
            colorbar=dict(title="loss", x=1.02),
        ),
        row=1,
        col=2,
    )
    steps = [st for r in land.runs for st in r.steps if st is not None]
    smin, smax = (min(steps), max(steps)) if steps else (0, 1)
    flagged: list[str] = []

    def describe(lab: str) -> str:
        plane_loss = s.points.get(lab, (None, None, None))[2]
        return (
            f"{lab}<br>({where[lab][0]:.4g}, {where[lab][1]:.4g})<br>own loss {_fmt(land.own_loss.get(lab))}"
            f"<br>loss at its place on the plane {_fmt(plane_loss)}<br>off the plane: {100 * rel[lab]:.1f}% of "
            "its distance from the centre"
        )

    for r_i, run in enumerate(land.runs):
        colour = run_colour(run.name, [r.name for r in land.runs])  # the page's colour of this run
        labs = run.labels
        px, py = [where[lab][0] for lab in labs], [where[lab][1] for lab in labs]
        pz = [s.points.get(lab, (0, 0, None))[2] for lab in labs]
        texts = [describe(lab) for lab in labs]
        flagged += [lab for lab in labs if rel[lab] > off_plane]
        marker = dict(
            size=10,
            color=[(st if st is not None else smax) for st in run.steps],
            colorscale="Plasma",
            cmin=smin,
            cmax=smax,
            symbol=[
                ("square" if d else "circle") + ("-open" if rel[lab] > off_plane else "")
                for d, lab in zip(run.derived, labs)
            ],
            line=dict(width=2, color=colour),
            showscale=r_i == 0,
            colorbar=dict(title="step", x=1.12) if r_i == 0 else None,
        )
        fig.add_trace(
            go.Scatter(
                x=px,
                y=py,
                mode="lines+markers",
                name=run.name,
                line=dict(color=colour, width=2),
                marker=marker,
                customdata=texts,
                hovertemplate="%{customdata}<extra></extra>",
            ),
            row=1,
            col=2,
        )
        fig.add_trace(
            go.Scatter3d(
                x=px,
                y=py,
                z=pz,
                mode="lines+markers",
                name=f"{run.name} (3D)",
                line=dict(color=colour, width=4),
                marker=dict(size=4, color=colour),
                hovertext=texts,
                hovertemplate="%{hovertext}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    if land.quantized:
        qx, qy, qt, lx, ly = [], [], [], [], []
        for ck, p in land.quantized.items():
            a, b = axes
            qx.append(float(p.coords[a]))
            qy.append(float(p.coords[b]))
            plane_loss = s.points.get(p.label, (None, None, None))[2]
            qt.append(
                f"{p.label}<br>({qx[-1]:.4g}, {qy[-1]:.4g})<br>own loss {_fmt(land.own_loss.get(p.label))}"
                f"<br>loss at its place on the plane {_fmt(plane_loss)}<br>off the plane: "
                f"{100 * p.relative_residual:.1f}% of its distance from the centre"
            )
            if p.relative_residual > off_plane:
                flagged.append(p.label)
            lx += [where[ck][0], qx[-1], None]
            ly += [where[ck][1], qy[-1], None]
        fig.add_trace(
            go.Scatter(
                x=lx,
                y=ly,
                mode="lines",
                line=dict(color="red", width=1, dash="dot"),
                hoverinfo="skip",
                name=f"checkpoint → {land.spec}",
            ),
            row=1,
            col=2,
        )
        fig.add_trace(
            go.Scatter(
                x=qx,
                y=qy,
                mode="markers",
                name=f"quantized ({land.spec})",
                customdata=qt,
                hovertemplate="%{customdata}<extra></extra>",
                marker=dict(
                    size=11,
                    color="red",
                    symbol=["x-open" if p.relative_residual > off_plane else "x" for p in land.quantized.values()],
                ),
            ),
            row=1,
            col=2,
        )
    t = title or (
        f"landscape of {len(land.runs)} run(s), {len(pca.labels)} checkpoints: "
        f"PC{axes[0] + 1}+PC{axes[1] + 1} explain {100 * (evr[axes[0]] + evr[axes[1]]):.1f}% of the variance"
    )
    if flagged:
        t += (
            f"<br><sub>{len(flagged)} point(s) lie more than {100 * off_plane:.0f}% off the plane (hollow): their "
            "place on it is mostly a shadow</sub>"
        )
    fig.update_layout(  # the title (and subtitle) sits above the subplot titles; the legend below the axis titles
        title=dict(text=t, y=1 - 24 / (height + (30 if flagged else 0)), yref="container", yanchor="top"),
        height=height + (30 if flagged else 0),
        legend=dict(orientation="h", y=-0.16, yanchor="top"),
        scene=dict(
            xaxis_title=f"PC{axes[0] + 1}",  # short: the contour's axes say the variance
            yaxis_title=f"PC{axes[1] + 1}",
            zaxis_title="loss",
            aspectmode="cube",
            camera=dict(eye=dict(x=1.9, y=-1.9, z=1.3)),  # far enough that the axis titles fit in the scene
        ),
        margin=dict(l=30, r=10, t=120 if flagged else 90, b=30),
    )
    fig.update_xaxes(title_text=xlab, row=1, col=2)
    fig.update_yaxes(title_text=ylab, row=1, col=2)
    return fig
