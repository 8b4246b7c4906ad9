"""Rich output of the commands: a console that keeps its width in logs, and small tables."""

from __future__ import annotations

import math


def wide_console(stderr: bool = False):
    """A rich console; 160 columns wide when the output is not a terminal (logs, pipes)."""
    from rich.console import Console

    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=160)


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3g}" if abs(v) < 1e-2 and v != 0 else f"{v:.3f}"
    return str(v)


def print_table(df, title: str, console=None) -> None:
    """Print a small DataFrame as a rich table."""
    from rich.table import Table

    console = console or wide_console()
    if "note" in df.columns and (df["note"] == "").all():
        df = df.drop(columns=["note"])
    if "n_unconverged" in df.columns and (df["n_unconverged"] == 0).all():
        df = df.drop(columns=["n_unconverged"])
    t = Table(title=title)
    for c in df.columns:
        t.add_column(str(c))
    for _, row in df.iterrows():
        t.add_row(*[_fmt(v) for v in row])
    console.print(t)
