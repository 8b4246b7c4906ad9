"""The HTML of a run's landscape (:class:`losslens.study.landscape.trajectory_landscape.Landscape`): its figure with two
tables (explained variance; points and how far off the plane they lie), as a report section
(:func:`landscape_section`, used by :func:`losslens.study.report.pages.build_report`) or a page of its own
(:func:`landscape_page`, written by ``losslens landscape``). Built from the result; nothing is
recomputed."""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any, Mapping

from losslens.study.landscape.trajectory_landscape import Landscape, residual_flags

from losslens.study.report.landscape_figures import landscape_figure
from losslens.study.report.page_sections import _CSS, _table, figure_html

__all__ = ["landscape_page", "landscape_section", "point_rows", "variance_rows"]

OFF_PLANE = 0.5
"""A point whose distance from the plane exceeds this fraction of its distance from the centre is
called off the plane (drawn hollow; listed in the report)."""


def variance_rows(land: Landscape) -> list[dict[str, Any]]:
    """One row per principal axis: its explained variance ratio (%), singular value, whether drawn."""
    pca = land.pca
    return [
        {
            "axis": f"PC{j + 1}",
            "explained variance %": round(100 * float(r), 3),
            "singular value": float(pca.singular_values[j]),
            "drawn": "yes" if j in land.axes else "",
        }
        for j, r in enumerate(pca.explained_variance_ratio)
    ]


def point_rows(land: Landscape) -> list[dict[str, Any]]:
    """One row per checkpoint and quantized point: plane coordinates, distance from the plane as %
    of the distance from the centre, own loss and loss at its place on the plane."""
    pca, s = land.pca, land.surface
    xy, res, dist = pca.plane_coords(land.axes), pca.residuals(land.axes), pca.distances
    run_of = {lab: r.name for r in land.runs for lab in r.labels}

    def plane_loss(label):
        return None if s is None or label not in s.points else float(s.points[label][2])

    rows = [
        {
            "point": lab,
            "run": run_of.get(lab, ""),
            "x": float(xy[i, 0]),
            "y": float(xy[i, 1]),
            "off plane %": round(100 * float(res[i] / dist[i]), 2) if dist[i] > 0 else 0.0,
            "own loss": land.own_loss.get(lab),
            "loss on plane": plane_loss(lab),
        }
        for i, lab in enumerate(pca.labels)
    ]
    a, b = land.axes
    for ck, p in land.quantized.items():
        rows.append(
            {
                "point": p.label,
                "run": run_of.get(ck, ""),
                "x": float(p.coords[a]),
                "y": float(p.coords[b]),
                "off plane %": round(100 * p.relative_residual, 2),
                "own loss": land.own_loss.get(p.label),
                "loss on plane": plane_loss(p.label),
            }
        )
    return rows


_COLUMNS = ["point", "run", "x", "y", "off plane %", "own loss", "loss on plane"]


def _note(land: Landscape, n_off: int) -> str:
    n = len(land.pca.labels)
    q = f" and their {len(land.quantized)} quantized point(s) ({html.escape(str(land.spec))})" if land.quantized else ""
    return (
        f'<p class="note">Principal plane (PC{land.axes[0] + 1}, PC{land.axes[1] + 1}) of {n} checkpoint(s) of '
        f"{len(land.runs)} run(s){q}. A point's place on the plane means something only when it lies near it: "
        f'"off plane %" is its distance from the plane as a share of its distance from the centre; {n_off} '
        f"point(s) lie more than {100 * OFF_PLANE:.0f}% off (drawn hollow).</p>"
    )


def landscape_section(land: Landscape, div_id: str = "landscape-0", full_table: bool = False) -> str:
    """The figure, the explained variance table and the off-plane points (``full_table``: every
    point) as HTML, without plotly.js (the page embeds it once)."""
    flags = residual_flags(land, OFF_PLANE)
    rows = point_rows(land)
    shown = rows if full_table else [r for r in rows if flags.get(r["point"])]
    fig = landscape_figure(land, off_plane=OFF_PLANE)
    parts = [
        _note(land, sum(flags.values())),
        f'<div class="figure" data-figure="landscape">{figure_html(fig, div_id)}</div>',
        "<h3>Explained variance</h3>",
        _table(variance_rows(land), left=("axis", "drawn")),
        "<h3>" + ("Points" if full_table else "Points off the plane") + "</h3>",
        _table(shown, _COLUMNS, left=("point", "run")),
    ]
    return "".join(parts)


def landscape_page(
    land: Landscape,
    out_path: str | os.PathLike,
    title: str = "losslens landscape",
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """A self-contained HTML page (plotly.js inline) of ``land``: :func:`landscape_section` with every
    point, and ``extra`` (inputs, settings) as a table. Returns its path."""
    import plotly
    from plotly.offline import get_plotlyjs

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    info = [{"item": k, "value": v} for k, v in (extra or {}).items()]
    if land.surface is not None:
        info += [
            {"item": "grid", "value": f"{len(land.surface.x)}×{len(land.surface.y)}"},
            {"item": "non-finite grid points", "value": land.surface.n_nonfinite},
            {"item": "seconds (grid)", "value": round(land.surface.seconds, 2)},
        ]
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">/* plotly.js {plotly.__version__} embedded */{get_plotlyjs()}</script>'
        f"</head><body><h1>{html.escape(title)}</h1>"
        + landscape_section(land, "fig-0", full_table=True)
        + "<h2>Inputs</h2>"
        + _table(info, left=("item", "value"))
        + "</body></html>\n"
    )
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out_path)
    return out_path
