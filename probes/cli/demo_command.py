"""`losslens demo`: the whole study on the embedded trajectories. The work is
:func:`losslens.study.demo.demo_study.run_demo` (options: :class:`~losslens.study.demo.demo_settings.DemoOptions`)."""

from __future__ import annotations

import typer

from losslens.cli.option_groups import quiet_option, threads_option
from losslens.cli.option_parsing import cli, flags
from losslens.study.demo.demo_settings import DemoOptions
from losslens.study.demo.demo_study import run_demo

flags(
    DemoOptions,
    out=typer.Option("--out", help="folder for runs, results.sqlite and report.html"),
    quick=typer.Option("--quick", help="toy-size study (≤ 2 min; what the tests run)"),
    executor=typer.Option("--executor", help="sweep executor: local or ray"),
    quiet=quiet_option(),
    threads=threads_option("1, the fastest for the demo's tiny models"),
    workers=typer.Option(
        "--workers",
        min=1,
        help="worker processes for training, sweeps and planes [default: the cores, $LOSSLENS_WORKERS]",
    ),
)


def demo(*, options: DemoOptions = DemoOptions()) -> None:
    """Train the embedded trajectories, sweep them, correlate, draw planes, write a report. Resumable."""
    result = run_demo(options, echo=typer.echo)
    typer.echo("")
    typer.echo(result.summary_text())
    typer.echo("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in result.seconds.items()))
    if result.exit_code:
        typer.echo(f"error: {result.failure_text()}", err=True)
        raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(cli(demo))
