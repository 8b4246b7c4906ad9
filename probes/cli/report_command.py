"""`losslens report`: a sweep's results store as one self-contained HTML report
(:func:`losslens.study.report.store_report.write_report`; ``losslens.report`` from Python)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from losslens.cli.option_parsing import cli, flags
from losslens.study.report.store_report import ReportSettings

flags(
    ReportSettings,
    out=typer.Option("--out", "-o", help="Self-contained HTML report to write."),
    surfaces=typer.Option("--surface", help="Surface JSON(s) from `losslens surface --json` to include."),
    title=typer.Option("--title", help="Report title."),
    n_boot=typer.Option("--n-boot", help="Bootstrap resamples for the correlation intervals."),
    include_unconverged=typer.Option(
        "--include-unconverged",
        help="Correlate values whose estimator did not converge too (default: left out, counted and flagged).",
    ),
    allow_mixed=typer.Option("--allow-mixed", help="Pool rows computed with different settings or data."),
)


def report(
    store: Annotated[Path, typer.Argument(help="Results store of a sweep (SQLite, from `losslens sweep`).")],
    *,
    settings: ReportSettings = ReportSettings(),
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the page written and what it shows as one JSON object.")
    ] = False,
) -> None:
    """Turn a sweep's results store into one self-contained HTML report (works offline)."""
    from losslens.study.analysis import AnalysisError
    from losslens.study.report import store_report
    from losslens.study.report.pages import ReportError
    from losslens.study.sweep import StoreError

    try:
        res = store_report.report(store, settings=settings)
    except (store_report.ReportInputError, AnalysisError, StoreError, ReportError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps(res, indent=2))
    else:
        typer.echo(f"wrote {res['path']} ({res['checkpoints']} checkpoints, {res['rows']} result rows)")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(cli(report))
