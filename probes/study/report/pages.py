"""Self-contained HTML pages: the report of a sweep, and the page of one loss surface.

:func:`build_report` writes ONE HTML file: plotly.js is embedded once (inline, no CDN, works
offline), followed by the trajectory figures of :mod:`losslens.study.report.figures` (with a note that
AWQ can lose to RTN on held-out data when AWQ specs are present), the correlation table, the values
whose estimator did not converge and those whose Hessian products' measured error is over the
tolerance (:mod:`losslens.study.report.flags`), the detected phases, quantization
planes (:mod:`losslens.study.report.surface_figures`), the runs' landscape
(:mod:`losslens.study.report.landscape_section`), failed probes, the plan and the software versions.
Figures are built from results; nothing is recomputed.

``losslens report results.sqlite --out report.html`` (``probes/cli/report_command.py``) reads the
store with :func:`load_store` and computes correlations and phases with
:func:`losslens.study.analysis.analyse`.
"""

from __future__ import annotations

import datetime as _dt
import html
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from losslens.geometry.base.errors import LosslensError
from losslens.study.sweep.store import Store

from losslens.lm.quant.awq import HELD_OUT_NOTE

from losslens.study.report.accuracy_figures import accuracy_figures, accuracy_note
from losslens.study.report.figure_parts import page_colours, specs_of
from losslens.study.report.figures import trajectory_figures
from losslens.study.analysis.summary import COLUMNS as SUMMARY_COLUMNS
from losslens.study.report.flags import unconverged_table
from losslens.study.report.page_sections import (
    _CSS,
    _accuracy_line,
    _correlation_rows,
    _descriptive,
    _explain_section,
    _flagged,
    _phase_rows,
    _phases_for_figures,
    _plan_json,
    _product_error_section,
    _surfaces,
    _table,
    figure_html,
)
from losslens.study.report.page_notes import colour_legend, live_section, page_runs
from losslens.study.report.surface_figures import surface_figure, surface_profile_figure
from losslens.measure.probes.accuracy import PROBE as ACCURACY
from losslens.measure.probes.explain import PROBE as EXPLAIN
from losslens.measure.probes.quant import PROBE as QUANT


class ReportError(LosslensError, ValueError):
    """The report cannot be built (empty results, unwritable path)."""


def versions() -> dict[str, str]:
    """python, torch, transformers, plotly, losslens versions (those installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for pkg in ("losslens", "torch", "transformers", "plotly", "numpy", "pandas"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def build_report(
    df,
    out_path: str | os.PathLike,
    correlations=None,
    phases=None,
    surfaces=None,
    plan=None,
    versions: Mapping[str, str] | None = None,
    title: str = "losslens report",
    notes: str | None = None,
    explanation: Mapping[str, Any] | None = None,
    live: Mapping[str, Any] | None = None,
    landscape=None,
) -> Path:
    """Write a self-contained HTML report; returns its path. Every figure draws a run in one colour,
    the same on the whole page (:func:`~losslens.study.report.figure_parts.page_colours` of all the
    page's runs, sorted).

    Parameters
    ----------
    df : tidy results DataFrame (:meth:`losslens.study.sweep.Store.results` schema).
    out_path : the ``.html`` file to write (parent folders are created).
    correlations : the :func:`losslens.study.analysis.summary` DataFrame, or ``{name: Correlation|dict}``.
    phases : a :class:`losslens.study.analysis.Phases`, ``{run: Phases}``, or ``[{"name", "step", "lr"}]``.
    surfaces : ``{label: Surface}`` or a list of :class:`losslens.geometry.surfaces.surface.Surface`.
    plan : the sweep plan (a ``Plan`` or a dict), shown as JSON.
    versions : software versions to print; default :func:`versions` of this process.
    explanation : :func:`losslens.study.analysis.explain_shares.science_check` of ``df``; computed here when ``df``
        holds ``explain`` rows and it is not given (section "Why quantization error changes").
    live : ``{label: results DataFrame}`` of runs measured while training (:mod:`losslens.study.monitor`
        stores), drawn in a section "Live monitor" (loss, ΔQ, curvature against the step); a value may be
        ``{"results": DataFrame, "monitor": the store's "monitor:<run>" metadata}``, and the section then
        says which planned evaluations were skipped and why.
    landscape : a :class:`losslens.study.landscape.trajectory_landscape.Landscape` with its surface (the runs in one
        principal plane), drawn in a section "Landscape" with its explained variance and the points
        off the plane (:func:`losslens.study.report.landscape_section.landscape_section`).
    """
    if df is None or len(df) == 0:
        raise ReportError("the results table is empty: nothing to report (did the sweep write any row?)")
    args = {k: v for k, v in locals().items() if k != "versions"}
    with page_colours(page_runs(df, live, landscape)) as colours:
        return _build(**args, software=versions, colours=colours)


def _build(
    df, out_path, correlations, phases, surfaces, plan, software, title, notes, explanation, live, landscape, colours
) -> Path:
    """:func:`build_report` inside its page's colours."""
    import plotly
    from plotly.offline import get_plotlyjs

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    figs = trajectory_figures(df, phases=_phases_for_figures(phases), correlations=correlations)
    sections: list[tuple[str, str, str]] = []  # (anchor, heading, html)

    fig_html = [colour_legend(colours)]
    for i, (name, fig) in enumerate(figs.items()):
        fig_html.append(f'<div class="figure" data-figure="{html.escape(name)}">{figure_html(fig, f"fig-{i}")}</div>')
    awq = [s for s in specs_of(df, QUANT.name) if s.split(":")[0] == "awq"]
    if awq:
        fig_html.append(
            f'<p class="note" data-note="awq">{html.escape(", ".join(map(str, awq)))}: {html.escape(HELD_OUT_NOTE)}</p>'
        )
    sections.append(("trajectory", "Trajectory", "".join(fig_html)))

    for j, (label, value) in enumerate((live or {}).items()):
        sections.append(live_section(label, value, j))

    ex = _explain_section(df, explanation, _phases_for_figures(phases))
    if ex:
        sections.append((EXPLAIN.name, "Why quantization error changes", ex))

    acc_figs = accuracy_figures(df)
    if acc_figs:
        sections.append(
            (
                ACCURACY.name,
                "Loss vs task accuracy",
                accuracy_note(df, _accuracy_line(df))
                + "".join(
                    f'<div class="figure" data-figure="{k}">{figure_html(f, f"acc-{i}")}</div>'
                    for i, (k, f) in enumerate(acc_figs.items())
                ),
            )
        )

    crows = [_descriptive(r) for r in _correlation_rows(correlations)]
    if crows:
        head = SUMMARY_COLUMNS.index("r")  # the pair and its covariates before the statistics
        shown = ("pair", *SUMMARY_COLUMNS[:head], "covariates", *SUMMARY_COLUMNS[head:])
        cols = [c for c in shown if any(c in r for r in crows)]
        sections.append(
            (
                "correlations",
                "Correlations",
                '<p class="note">r across checkpoints (derived checkpoints excluded), pooled over runs: with runs at '
                "different levels it is mostly between-run variation. r_within is the correlation within runs, and "
                "[ci_low, ci_high] (95%) and p are about it. Checkpoints of one run are a time series, not "
                'independent draws, so runs are the independent units: "run-level t" (3 or more runs: a t-interval '
                'over the runs\' own correlations, df = runs − 1) or "effective-n t (AR(1))" (one or two runs); '
                'n_eff is the effective number of independent pairs. "descriptive": no interval or p-value is '
                "honest here, see the note (docs/science.md §6).</p>"
                + _table(crows, cols, left=("pair", "x", "y", "method", "controls", "covariates", "inference", "note")),
            )
        )
    urows = unconverged_table(df)
    if urows:
        sections.append(
            (
                "unconverged",
                f"Not converged ({len(urows)})",
                '<p class="note">These values come from an estimator that stopped before its tolerance (e.g. power '
                "iteration at max_iter). The figures draw them as open red circles, off the lines; correlations "
                "leave them out (column n_unconverged) unless asked to keep them (--include-unconverged). Raise "
                "the estimator's max_iter to measure them.</p>"
                + _table(urows, left=("run", "checkpoint", "probe", "spec", "metric")),
            )
        )
    inexact = _product_error_section(df)
    if inexact:
        sections.append(("product-error", *inexact))
    prows = _phase_rows(phases)
    if prows:
        sections.append(
            ("phases", "Phases", _table(prows, ["run", "phase", "found", "step", "lr", "n"], left=("run", "phase")))
        )

    surf = _surfaces(surfaces)
    if surf:
        parts = []
        for j, (label, s) in enumerate(surf):
            fig = surface_figure(s, title=f"{label}")
            pts = [{"point": k, "x": v[0], "y": v[1], "loss": v[2]} for k, v in s.points.items()]
            norms = [{"quantity": k, "value": v} for k, v in (s.plane.get("norms") or {}).items()]
            parts.append(
                f"<h3>{html.escape(str(label))}</h3>"
                f'<div class="figure" '
                f'data-figure="surface:{html.escape(str(label))}">{figure_html(fig, f"surf-{j}")}</div>'
                + _table(pts, ["point", "x", "y", "loss"], left=("point",))
                + _table(norms, left=("quantity",))
                + (
                    f'<p class="note">{s.n_nonfinite} grid point(s) had a non-finite loss (holes).</p>'
                    if s.n_nonfinite
                    else ""
                )
            )
        sections.append(("planes", "Quantization planes", "".join(parts)))
    if landscape is not None:
        from losslens.study.report.landscape_section import landscape_section

        sections.append(("landscape", "Landscape of the runs", landscape_section(landscape, "landscape-0")))

    if "status" in df:
        failed = df[df["status"] == "failed"]
        if len(failed):
            frows = failed.drop_duplicates(["checkpoint", "probe", "spec"])[
                ["checkpoint", "probe", "spec", "error"]
            ].to_dict("records")
            sections.append(
                (
                    "failed",
                    f"Failed probes ({len(frows)})",
                    _table(frows, left=("checkpoint", "probe", "spec", "error")),
                )
            )

    counts = {
        "checkpoints": count_checkpoints(df),
        "runs": int(df["run"].fillna("run").nunique()) if "run" in df else 1,
        "result rows": int(len(df)),
    }
    plan_text = _plan_json(plan)
    meta = _table([{"item": k, "value": v} for k, v in counts.items()], left=("item",))
    if plan_text:
        meta += f"<h3>Plan</h3><pre>{html.escape(plan_text)}</pre>"
    vers = dict(software) if software is not None else versions()
    meta += "<h3>Versions</h3>" + _table(
        [{"package": k, "version": v} for k, v in vers.items()], left=("package", "version")
    )
    if "data_hash" in df:
        hashes = sorted({str(h) for h in df["data_hash"].dropna()})
        if hashes:
            meta += f'<p class="note">data hash(es): {html.escape(", ".join(hashes))}</p>'
    sections.append(("plan", "Plan and versions", meta))

    nav = " ".join(f'<a href="#{a}">{html.escape(h)}</a>' for a, h, _ in sections)
    body = "".join(f'<section id="{a}"><h2>{html.escape(h)}</h2>{content}</section>' for a, h, content in sections)
    created = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">/* plotly.js {plotly.__version__} embedded */{get_plotlyjs()}</script>'
        "</head><body>"
        f'<h1>{html.escape(title)}</h1><p class="sub">generated {created} by losslens</p>'
        + (
            (
                f'<p class="failed" data-note="failed">{html.escape(notes)}</p>'
                if _flagged(notes)
                else f"<p>{html.escape(notes)}</p>"
            )
            if notes
            else ""
        )
        + f"<nav>{nav}</nav>{body}</body></html>\n"
    )
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out_path)
    return out_path


def surface_page(
    surface,
    out_path: str | os.PathLike,
    title: str = "losslens surface",
    log: bool = False,
    extra: Mapping[str, Any] | None = None,
    profiles: bool = True,
) -> Path:
    """A self-contained HTML page for one :class:`losslens.geometry.surfaces.surface.Surface`: the 3D surface +
    contour, 1-D profiles along e₁ (through A and B) and e₂, the marked points and the plane's norms."""
    import plotly
    from plotly.offline import get_plotlyjs

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    figs = [("surface", surface_figure(surface, log=log, title=title))]
    if profiles:
        figs.append(("profile-x", surface_profile_figure(surface, "x", 0.0, log=log)))
        figs.append(("profile-y", surface_profile_figure(surface, "y", 0.0, log=log)))
    parts = [
        f'<div class="figure" data-figure="{n}">{figure_html(f, f"fig-{i}")}</div>' for i, (n, f) in enumerate(figs)
    ]
    pts = [{"point": k, "x": v[0], "y": v[1], "loss": v[2]} for k, v in surface.points.items()]
    norms = [{"quantity": k, "value": v} for k, v in (surface.plane.get("norms") or {}).items()]
    info = [{"item": k, "value": v} for k, v in (extra or {}).items()]
    info += [
        {"item": "grid", "value": f"{len(surface.x)}×{len(surface.y)}"},
        {"item": "non-finite grid points", "value": surface.n_nonfinite},
        {"item": "seconds", "value": round(surface.seconds, 2)},
    ]
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">/* plotly.js {plotly.__version__} embedded */{get_plotlyjs()}</script>'
        f"</head><body><h1>{html.escape(title)}</h1>"
        + "".join(parts)
        + "<h2>Points</h2>"
        + _table(pts, ["point", "x", "y", "loss"], left=("point",))
        + "<h2>Plane</h2>"
        + _table(norms, left=("quantity",))
        + _table(info, left=("item", "value"))
        + "</body></html>\n"
    )
    out_path.write_text(page, encoding="utf-8")
    return out_path


def export_png(fig, path: str | os.PathLike, **kwargs) -> bool:
    """Write ``fig`` as a static PNG through kaleido (≥ 1.0, dev extras) and the system Chromium
    (kaleido finds ``chromium`` on the PATH, or ``$BROWSER_PATH``; it downloads nothing).

    Returns True on success, False (with a warning) when kaleido or its browser is missing -- PNG
    export is optional; the HTML report never needs it.
    """
    import warnings

    try:
        import kaleido  # noqa: F401
    except ImportError:
        warnings.warn(
            "static PNG export needs `pip install kaleido` (and a Chromium); skipped", RuntimeWarning, stacklevel=2
        )
        return False
    try:
        fig.write_image(str(path), **kwargs)
        return True
    except Exception as exc:  # kaleido present but no browser, or another runtime failure
        warnings.warn(f"static PNG export failed ({type(exc).__name__}: {exc}); skipped", RuntimeWarning, stacklevel=2)
        return False


def load_store(path: str | os.PathLike):
    """(results DataFrame, plan or None, versions dict) of a sweep store (losslens.study.sweep)."""
    with Store(path) as st:
        df = st.results()
        try:
            plan = st.plan
        except Exception:
            plan = st.meta.get("plan_json")
        stored = st.meta.get("versions") or {}
    vers = {f"{k} (sweep)": v for k, v in (stored.items() if isinstance(stored, dict) else [])}
    vers.update({f"{k} (report)": v for k, v in versions().items()})
    return df, plan, vers


__all__ = ["ReportError", "build_report", "surface_page", "export_png", "versions", "figure_html", "load_store"]


def count_checkpoints(df) -> int:
    """Checkpoints in the results ``df``: distinct (run, checkpoint) pairs (forks of one base share labels
    such as ``step-000000``)."""
    if "run" not in df:
        return int(df["checkpoint"].nunique())
    return int(df[["run", "checkpoint"]].fillna("").drop_duplicates().shape[0])
