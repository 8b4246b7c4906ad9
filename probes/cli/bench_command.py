"""`losslens bench NAME|all`: run the benchmark suite in benchmarks/ and print ratio tables.

The benchmarks live in the source checkout (``benchmarks/`` beside ``probes/``), not in the
installed package; this command finds them there (editable installs, `make bench`).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from pathlib import Path

from typing import Annotated

import typer

SUITE = (
    "hvp_throughput",
    "solvers",
    "estimators",
    "quantize",
    "surface",
    "sweep",
    "scale",
    "data_parallel",
    "sharded",
    "difference",
    "gpu",
    "statistics",
)
ALIASES = {"hvp": "hvp_throughput"}


def _benchmarks_root() -> Path:
    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "__init__.py").is_file():
        raise typer.BadParameter(
            f"no benchmarks/ folder beside the installed package (looked in {root}); "
            "run from a source checkout installed with `pip install -e .` (see README)"
        )
    return root


def _load(name: str):
    root = _benchmarks_root()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"benchmarks.{name}")


def _print_rows(name: str, rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    if not rows:
        return
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    table = Table(title=name)
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(*[f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols])
    Console().print(table)


def bench(
    name: Annotated[str, typer.Argument(help=f"one of {', '.join(SUITE)} (or 'hvp'), or 'all'")] = "all",
    *,
    quick: Annotated[bool, typer.Option("--quick", help="small settings (each benchmark < ~90 s)")] = False,
    json_out: Annotated[Path, typer.Option("--json", help="also write all rows to this JSON file")] = None,
    device: Annotated[
        str, typer.Option("--device", help="gpu: the device to check (default cuda; cpu with --quick is the smoke run)")
    ] = None,
    budget: Annotated[float, typer.Option("--budget", help="gpu: seconds for all its sections [480]")] = None,
    markdown_out: Annotated[
        Path, typer.Option("--markdown", help="gpu: also write its full table as markdown (for benchmarks/README.md)")
    ] = None,
) -> None:
    """Run benchmarks (HVP throughput, estimator accuracy, GPTQ, surface, sweep against peers; difference: the
    gradient-difference backend against the exact products; scale: memory model against measured peaks on
    Pythia shapes; gpu: every backend, kernel and probe on CUDA, checked and timed in minutes; `--device cpu
    --quick` is its CPU smoke run)."""
    names = SUITE if name == "all" else (ALIASES.get(name, name),)
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        raise typer.BadParameter(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(SUITE)}, hvp or all")
    if markdown_out and "gpu" not in names:
        raise typer.BadParameter("--markdown applies to the gpu benchmark only")
    everything = {}
    for n in names:
        typer.echo(f"== benchmark {n}{' (quick)' if quick else ''}")
        module = _load(n)
        extra = {k: v for k, v in (("device", device), ("budget", budget)) if v is not None}
        if extra and not set(extra) <= set(inspect.signature(module.run).parameters):
            raise typer.BadParameter(f"--device and --budget apply to the gpu benchmark only, not {n!r}")
        rows = module.run(quick=quick, **extra)
        everything[n] = rows
        if hasattr(module, "terminal_table"):  # a table that fits the terminal (80 columns in a pipe)
            typer.echo(module.terminal_table(rows))
        else:
            _print_rows(n, rows)
        if markdown_out and hasattr(module, "markdown"):
            markdown_out.write_text(module.markdown(rows) + "\n")
            typer.echo(f"wrote {markdown_out}")
    if json_out:
        json_out.write_text(json.dumps(everything, indent=2, default=str))
        typer.echo(f"wrote {json_out}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(bench)
