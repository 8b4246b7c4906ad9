"""The benchmark suite (``losslens bench``): which benchmarks there are (:data:`SUITE`, :data:`ALIASES`,
:data:`BY_NAME_ONLY`), how a run of them is set (:class:`BenchSettings`), and the run (:func:`run_bench`).

The benchmarks live in the source checkout (``benchmarks/`` beside ``probes/``), not in the installed
package; they are imported from there (editable installs, ``make bench``). Each is a module with
``run(quick=..., **options) -> list[dict]`` and optionally ``terminal_table(rows) -> str`` (a table that
fits the terminal) and ``markdown(rows) -> str`` (the full table, ``--markdown``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional

from losslens.geometry.base.errors import LosslensError
from losslens.lm.shared_settings import settings

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
"""The benchmarks ``all`` runs, in this order."""
ALIASES = {"hvp": "hvp_throughput"}
"""Short names a benchmark may be called by."""
BY_NAME_ONLY = ("real_model",)
"""Benchmarks run when named only, never part of ``all``: they need a file CI does not have (real_model: the
SmolLM2-135M GGUF, ``gguf``)."""
MARKDOWN = ("gpu", "real_model")
"""The benchmarks that write their full table as markdown (``markdown_out``)."""


class BenchError(LosslensError, ValueError):
    """A benchmark name or option the suite cannot use; the message says what to change."""


@settings
@dataclass(frozen=True)
class BenchSettings:
    """How ``losslens bench`` runs: small settings (``quick``; each benchmark < ~90 s), all rows also written
    as JSON to ``json_out``, the gpu benchmark's ``device`` (None: cuda) and ``budget`` (seconds for all its
    sections; None: 480), the full table as markdown (``markdown_out``; gpu, real_model) and real_model's
    ``gguf`` (the SmolLM2-135M file). The options a benchmark's ``run`` does not take are refused."""

    quick: bool = False
    json_out: Optional[Path] = None
    device: Optional[str] = None
    budget: Optional[float] = None
    markdown_out: Optional[Path] = None
    gguf: Optional[Path] = None

    def extra(self) -> dict:
        """The benchmark-specific options given (passed to the benchmarks' ``run``)."""
        given = (("device", self.device), ("budget", self.budget), ("gguf", self.gguf))
        return {k: v for k, v in given if v is not None}


@dataclass(frozen=True)
class BenchResult:
    """One benchmark's rows and, where the benchmark has one, its terminal table (else None: any table)."""

    name: str
    rows: list[dict]
    table: Optional[str] = None


def _check_names(names: tuple[str, ...]) -> None:
    """:class:`BenchError` naming the first of ``names`` that is no benchmark, and the valid names."""
    unknown = [n for n in names if n not in SUITE + BY_NAME_ONLY]
    if unknown:
        raise BenchError(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(SUITE + BY_NAME_ONLY)}, hvp or all")


def bench_names(name: str) -> tuple[str, ...]:
    """The benchmarks ``name`` stands for: the suite for ``all``, else the one named (an alias resolved);
    :class:`BenchError` for an unknown name."""
    names = SUITE if name == "all" else (ALIASES.get(name, name),)
    _check_names(names)
    return names


def benchmarks_root() -> Path:
    """The source checkout holding ``benchmarks/``; :class:`BenchError` when the package is not installed
    from one."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "__init__.py").is_file():
        raise BenchError(
            f"no benchmarks/ folder beside the installed package (looked in {root}); "
            "run from a source checkout installed with `pip install -e .` (see README)"
        )
    return root


def load_benchmark(name: str) -> ModuleType:
    """The module ``benchmarks.NAME`` of the source checkout."""
    root = benchmarks_root()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"benchmarks.{name}")


def check_bench(names: tuple[str, ...], s: BenchSettings) -> None:
    """:class:`BenchError` for options that do not apply to the benchmarks ``names`` (before any runs):
    ``markdown_out`` without gpu or real_model, ``device``/``budget``/``gguf`` for a benchmark whose ``run``
    does not take them."""
    _check_names(names)
    if s.markdown_out and not set(MARKDOWN) & set(names):
        raise BenchError("--markdown applies to the gpu and real_model benchmarks only")
    extra = s.extra()
    for n in names if extra else ():
        if not set(extra) <= set(inspect.signature(load_benchmark(n).run).parameters):
            raise BenchError(f"--device and --budget apply to the gpu benchmark only, --gguf to real_model, not {n!r}")


def run_bench(
    names: str | tuple[str, ...],
    s: BenchSettings = BenchSettings(),
    echo: Callable[[str], None] = print,
    show: Optional[Callable[[BenchResult], None]] = None,
) -> dict[str, list[dict]]:
    """Run the benchmarks ``names`` in order (a string: ``all``, an alias or a name, :func:`bench_names`);
    every one's rows, by name. Checks the names and options first (:func:`check_bench`: :class:`BenchError`,
    nothing run). ``echo`` gets a line as each benchmark starts and one per file written (``markdown_out``,
    ``json_out``); ``show`` gets each benchmark's :class:`BenchResult` as it finishes."""
    names = bench_names(names) if isinstance(names, str) else tuple(names)
    check_bench(names, s)
    everything = {}
    for n in names:
        echo(f"== benchmark {n}{' (quick)' if s.quick else ''}")
        module = load_benchmark(n)
        rows = module.run(quick=s.quick, **s.extra())
        everything[n] = rows
        if show is not None:
            table = module.terminal_table(rows) if hasattr(module, "terminal_table") else None
            show(BenchResult(n, rows, table))
        if s.markdown_out and hasattr(module, "markdown"):
            s.markdown_out.write_text(module.markdown(rows) + "\n")
            echo(f"wrote {s.markdown_out}")
    if s.json_out:
        s.json_out.write_text(json.dumps(everything, indent=2, default=str))
        echo(f"wrote {s.json_out}")
    return everything


__all__ = [
    "ALIASES",
    "BY_NAME_ONLY",
    "MARKDOWN",
    "SUITE",
    "BenchError",
    "BenchResult",
    "BenchSettings",
    "bench_names",
    "benchmarks_root",
    "check_bench",
    "load_benchmark",
    "run_bench",
]
