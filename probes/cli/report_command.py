"""`losslens report`: a sweep's results store as one self-contained HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer


def report(
    store: Annotated[Path, typer.Argument(help="Results store of a sweep (SQLite, from `losslens sweep`).")],
    *,
    out: Annotated[Path, typer.Option("--out", "-o", help="Self-contained HTML report to write.")] = Path(
        "report.html"
    ),
    surfaces: Annotated[
        Optional[List[Path]],
        typer.Option("--surface", help="Surface JSON(s) from `losslens surface --json` to include."),
    ] = None,
    title: Annotated[Optional[str], typer.Option("--title", help="Report title.")] = None,
    n_boot: Annotated[int, typer.Option("--n-boot", help="Bootstrap resamples for the correlation intervals.")] = 2000,
    include_unconverged: Annotated[
        bool,
        typer.Option(
            "--include-unconverged",
            help="Correlate values whose estimator did not converge too (default: left out, counted and flagged).",
        ),
    ] = False,
    allow_mixed: Annotated[
        bool, typer.Option("--allow-mixed", help="Pool rows computed with different settings or data.")
    ] = False,
) -> None:
    """Turn a sweep's results store into one self-contained HTML report (works offline)."""
    from losslens.geometry.surfaces.surface import Surface
    from losslens.study.analysis import AnalysisError, analyse
    from losslens.study.analysis.inputs import check_n_boot
    from losslens.study.report.pages import ReportError, build_report, load_store
    from losslens.study.sweep import StoreError

    if not store.is_file():
        typer.echo(f"error: no results store at {store}", err=True)
        raise typer.Exit(2)
    try:
        check_n_boot(n_boot)
        df, plan, vers = load_store(store)
    except (AnalysisError, StoreError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    if df is None or len(df) == 0:
        typer.echo(f"error: {store} holds no results yet; run `losslens sweep` first", err=True)
        raise typer.Exit(2)
    correlations, phases, notes = analyse(
        df, n_boot=n_boot, include_unconverged=include_unconverged, allow_mixed=allow_mixed
    )
    surf = {}
    for p in surfaces or []:
        try:
            surf[p.stem] = Surface.load(p)
        except (OSError, ValueError, KeyError) as exc:
            typer.echo(f"error: cannot read surface {p}: {exc}", err=True)
            raise typer.Exit(2)
    try:
        path = build_report(
            df,
            out,
            correlations=correlations,
            phases=phases,
            surfaces=surf or None,
            plan=plan,
            versions=vers,
            title=title or f"losslens report: {store.name}",
            notes="; ".join(notes) if notes else None,
        )
    except ReportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    typer.echo(f"wrote {path} ({df['checkpoint'].nunique()} checkpoints, {len(df)} result rows)")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(report)
