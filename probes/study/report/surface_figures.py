"""Figures of loss surfaces and lines (:class:`losslens.geometry.surfaces.surface.Surface`,
:class:`~losslens.geometry.surfaces.surface.Profile`).

Drawn from the results only (nothing is re-evaluated): :func:`surface_figure` is the 3-D surface
next to its contour map with the marked points (A, B, C ...); :func:`surface_profile_figure` one
row or column of a surface; :func:`profile_figure` a :class:`~losslens.geometry.surfaces.surface.Profile` (a line).
Non-finite losses are holes, never interpolated.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from losslens.geometry.surfaces.surface import Profile, Surface, SurfaceError

__all__ = ["surface_figure", "surface_profile_figure", "profile_figure"]


def surface_figure(surface: Surface, log: bool = False, title: str | None = None, height: int = 520):
    """Plotly figure: 3D surface (left) and contour (right) with the marked points.

    ``log=True`` draws log10(loss) (non-positive losses become holes); hover always shows the
    coordinates and the loss itself. Non-finite grid losses are holes (``connectgaps=False``).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    s = surface
    z = np.where(np.isfinite(s.loss), s.loss, np.nan)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(z > 0, np.log10(z), np.nan)
    zlabel = "log10 loss" if log else "loss"
    zdata = [[None if not math.isfinite(v) else float(v) for v in row] for row in z]
    custom = [[None if not math.isfinite(v) else float(v) for v in row] for row in s.loss]
    fig = make_subplots(
        rows=1,
        cols=2,
        specs=[[{"type": "surface"}, {"type": "xy"}]],
        column_widths=[0.55, 0.45],
        subplot_titles=("surface", "contour"),
    )
    hover = "x=%{x:.4g}<br>y=%{y:.4g}<br>loss=%{customdata:.6g}<extra></extra>"
    fig.add_trace(
        go.Surface(
            x=s.x,
            y=s.y,
            z=zdata,
            customdata=custom,
            colorscale="Viridis",
            hovertemplate=hover,
            name="loss surface",
            showscale=False,
            connectgaps=False,
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Contour(
            x=s.x,
            y=s.y,
            z=zdata,
            customdata=custom,
            colorscale="Viridis",
            connectgaps=False,
            hovertemplate=hover,
            name="loss contour",
            colorbar=dict(title=zlabel),
            ncontours=25,
        ),
        row=1,
        col=2,
    )
    if s.points:
        labels = list(s.points)
        px = [s.points[k][0] for k in labels]
        py = [s.points[k][1] for k in labels]
        pl = [s.points[k][2] for k in labels]
        pz = [
            (math.log10(v) if (log and v > 0) else (v if not log else None)) if math.isfinite(v) else None for v in pl
        ]
        text = [f"{k}: ({x:.4g}, {y:.4g}) loss {v:.6g}" for k, x, y, v in zip(labels, px, py, pl)]
        fig.add_trace(
            go.Scatter3d(
                x=px,
                y=py,
                z=pz,
                mode="markers+text",
                text=labels,
                hovertext=text,
                hovertemplate="%{hovertext}<extra></extra>",
                name="points (3D)",
                marker=dict(size=5, color="red", symbol="diamond"),
                textfont=dict(color="red"),
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=px,
                y=py,
                mode="markers+text",
                text=labels,
                textposition="top center",
                customdata=text,
                hovertemplate="%{customdata}<extra></extra>",
                name="points",
                marker=dict(size=10, color="red", symbol="x", line=dict(width=1, color="white")),
                textfont=dict(color="red", size=14),
            ),
            row=1,
            col=2,
        )
    kind = s.plane.get("kind", "plane")
    t = title or f"loss on the {kind} plane ({len(s.x)}×{len(s.y)} grid)"
    if s.n_nonfinite:
        t += f" — {s.n_nonfinite} non-finite point(s) shown as holes"
    fig.update_layout(  # the title above the subplot titles; the 3-D scene zoomed out so its axis titles fit
        title=dict(text=t, y=1 - 14 / height, yref="container", yanchor="top"),
        height=height,
        showlegend=False,
        scene=dict(
            xaxis_title="x (e1)",
            yaxis_title="y (e2)",
            zaxis_title=zlabel,
            aspectmode="cube",
            camera=dict(eye=dict(x=1.8, y=-1.9, z=1.2)),
        ),
        margin=dict(l=30, r=10, t=90, b=20),
    )
    fig.update_xaxes(title_text="x (e1)", row=1, col=2)
    fig.update_yaxes(title_text="y (e2)", row=1, col=2)
    return fig


def surface_profile_figure(
    surface: Surface, along: str = "x", at: float = 0.0, log: bool = False, title: str | None = None
):
    """1-D Plotly profile of the grid: loss along x at the row nearest y=``at`` (or along y).

    Marked points lying on that row/column (within half a grid step) are drawn as markers.
    Raises :class:`~losslens.geometry.surfaces.surface.SurfaceError` for an ``along`` other than "x" or "y".
    """
    s = surface
    if along not in ("x", "y"):
        raise SurfaceError(f"along must be 'x' or 'y', got {along!r}")
    if along == "x":
        j = int(np.argmin(np.abs(s.y - at)))
        coord, vals, fixed = s.x, s.loss[j], float(s.y[j])
        step = float(np.min(np.diff(s.y))) if len(s.y) > 1 else np.inf
    else:
        i = int(np.argmin(np.abs(s.x - at)))
        coord, vals, fixed = s.y, s.loss[:, i], float(s.x[i])
        step = float(np.min(np.diff(s.x))) if len(s.x) > 1 else np.inf
    other = "y" if along == "x" else "x"
    pts = {k: v for k, v in s.points.items() if abs((v[1] if along == "x" else v[0]) - fixed) <= step / 2}
    return _line_figure(
        coord,
        vals,
        {k: ((v[0] if along == "x" else v[1]), v[2]) for k, v in pts.items()},
        xlabel=f"{along} (e{1 if along == 'x' else 2})",
        log=log,
        title=title or f"loss along {along} at {other} = {fixed:.4g}",
    )


def profile_figure(profile: Profile, log: bool = False, title: str | None = None):
    """Plotly figure of a :class:`~losslens.geometry.surfaces.surface.Profile`: loss along the line with its marked
    points."""
    return _line_figure(profile.x, profile.loss, profile.points, "x (e1)", log, title or "loss along the line")


def _line_figure(x, loss, points: Mapping[str, tuple[float, float]], xlabel: str, log: bool, title: str):
    import plotly.graph_objects as go

    y = [None if not math.isfinite(v) else float(v) for v in np.asarray(loss, float)]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=list(map(float, x)),
            y=y,
            mode="lines+markers",
            name="loss",
            connectgaps=False,
            hovertemplate=f"{xlabel.split()[0]}=%{{x:.4g}}<br>loss=%{{y:.6g}}<extra></extra>",
        )
    )
    if points:
        labels = list(points)
        fig.add_trace(
            go.Scatter(
                x=[points[k][0] for k in labels],
                y=[points[k][1] for k in labels],
                mode="markers+text",
                text=labels,
                textposition="top center",
                name="points",
                marker=dict(size=11, color="red", symbol="x"),
            )
        )
    fig.update_layout(title=title, xaxis_title=xlabel, yaxis_title="loss", height=380, showlegend=False)
    if log:
        fig.update_yaxes(type="log")
    return fig
