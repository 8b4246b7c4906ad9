"""The `losslens` command line: every module in :mod:`probes.commands` registers its commands."""
from __future__ import annotations

import importlib
import pkgutil

import typer

from . import commands

app = typer.Typer(
    help="losslens: loss geometry (curvature, quantization error, loss surfaces) of LM training trajectories.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.command()
def version() -> None:
    """Print the installed losslens version."""
    from importlib.metadata import version as _version

    typer.echo(_version("losslens"))


for _info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
    importlib.import_module(f"{commands.__name__}.{_info.name}").register(app)


def main() -> None:  # pragma: no cover - console entry
    app()
