"""`losslens demo`: the whole study on the embedded trajectories (see :mod:`losslens.cli.demo_study`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def demo(
    *,
    out: Annotated[Path, typer.Option("--out", help="folder for runs, results.sqlite and report.html")] = Path(
        "demo-out"
    ),
    quick: Annotated[bool, typer.Option("--quick", help="toy-size study (≤ 2 min; what the tests run)")] = False,
    executor: Annotated[str, typer.Option("--executor", help="sweep executor: local or ray")] = "local",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bars")] = False,
    threads: Annotated[
        int, typer.Option("--threads", help="torch threads per process (1 is fastest for the demo's tiny models)")
    ] = 1,
    workers: Annotated[
        Optional[int],
        typer.Option(
            "--workers",
            min=1,
            help="worker processes for training, sweeps and planes [default: the cores, $LOSSLENS_WORKERS]",
        ),
    ] = None,
) -> None:
    """Train the embedded trajectories, sweep them, correlate, draw planes, write a report. Resumable."""
    from losslens.cli.demo_study import run_demo
    from losslens.study.sweep import EXECUTORS

    if executor not in EXECUTORS:  # before minutes of training, not after
        typer.echo(f"error: unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}", err=True)
        raise typer.Exit(2)
    result = run_demo(
        out, quick=quick, progress=not quiet, executor=executor, echo=typer.echo, threads=threads, workers=workers
    )
    typer.echo("")
    typer.echo(result.summary_text())
    typer.echo("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in result.seconds.items()))
    if result.exit_code:
        failed = "; ".join(f"{n} probe row(s) failed in {r}" for r, n in result.failures.items())
        typer.echo(
            f"error: {failed}; the rest of the study is done and the report lists the failed rows: {result.report}",
            err=True,
        )
        raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(demo)
