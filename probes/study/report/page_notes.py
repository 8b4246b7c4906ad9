"""Parts of a report page that say how to read it: the runs of the page and their one colour
(:func:`page_runs`, :func:`colour_legend`), and the live-monitor section with the evaluations the
monitor planned, took and skipped, and why (:func:`live_section`)."""

from __future__ import annotations

import html
from typing import Any, Mapping

from losslens.study.report.figure_parts import _run_col
from losslens.study.report.figures import trajectory_figures
from losslens.study.report.page_sections import figure_html


def page_runs(df, live: Mapping[str, Any] | None = None, landscape=None) -> list[str]:
    """Every run a page draws: the results' runs, the live monitor's and the landscape's (sorted)."""
    runs = set(_run_col(df))
    for value in (live or {}).values():
        ldf, _ = live_parts(value)
        runs |= set(_run_col(ldf))
    if landscape is not None:
        runs |= {str(r.name) for r in getattr(landscape, "runs", ())}
    return sorted(runs)


def colour_legend(colours: Mapping[str, str]) -> str:
    """A note with a swatch per run: each run keeps its colour in every figure of the page."""
    if not colours:
        return ""
    swatches = "".join(
        f'<span class="swatch" style="background:{html.escape(c)}"></span>{html.escape(r)}' for r, c in colours.items()
    )
    return (
        f'<p class="note" data-note="colours">One colour per run in every figure of this page:{swatches}. '
        "Within a figure, line dashes tell a run's series apart; stars are derived checkpoints (LAWA).</p>"
    )


def live_parts(value) -> tuple[Any, Mapping[str, Any] | None]:
    """``(results, monitor metadata or None)`` of one ``live`` entry: a results DataFrame, or
    ``{"results": DataFrame, "monitor": the store's "monitor:<run>" metadata}``."""
    if isinstance(value, Mapping):
        meta = value.get("monitor")
        return value["results"], meta if isinstance(meta, Mapping) else None
    return value, None


def _steps(values) -> str:
    return ", ".join(str(int(s)) for s in values)


def monitor_note(df, meta: Mapping[str, Any] | None) -> str:
    """Which evaluations the monitor took, which it skipped and why (from the metadata its
    :class:`~losslens.study.monitor.monitor.RobustnessMonitor` records; older stores record only a count)."""
    measured = sorted({int(s) for s in df["step"].dropna()}) if "step" in df else []
    parts = [f"Measured at step(s) {_steps(measured)}." if measured else "No step measured."]
    meta = meta or {}
    settings = meta.get("settings") or {}
    every, budget = settings.get("every"), settings.get("time_budget")
    skipped = [int(s) for s in meta.get("skipped_steps") or []]
    n_skipped = int(meta.get("skipped_for_time") or len(skipped))
    if every:
        parts.append(f"Planned every {int(every)} steps.")
    why = (
        f"the monitor keeps its measurements within {100 * float(budget):.0f}% of the training time (time_budget), "
        "and these would have gone over it"
        if budget
        else "they would have gone over the monitor's time budget"
    )
    if skipped:
        parts.append(f"Skipped step(s) {_steps(sorted(skipped))}: {why}.")
    elif n_skipped:
        parts.append(f"{n_skipped} planned evaluation(s) skipped: {why} (this store does not record which steps).")
    elif meta:
        parts.append("No planned evaluation was skipped.")
    return f'<p class="note" data-note="monitor">{html.escape(" ".join(parts))}</p>'


def live_section(label: str, value, j: int) -> tuple[str, str, str]:
    """(anchor, heading, html) of one run measured while training: the skipped-evaluations note
    and its trajectory figures (the scatters left out)."""
    ldf, meta = live_parts(value)
    parts = [monitor_note(ldf, meta)] + [
        f'<div class="figure" '
        f'data-figure="live:{html.escape(str(label))}:{name}">{figure_html(fig, f"live-{j}-{i}")}</div>'
        for i, (name, fig) in enumerate(trajectory_figures(ldf).items())
        if not name.startswith("scatter")
    ]
    return f"live-{j}", f"Live monitor: {label}", "".join(parts)


__all__ = ["page_runs", "colour_legend", "live_parts", "monitor_note", "live_section"]
