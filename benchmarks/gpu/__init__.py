"""The GPU check: every backend, kernel and probe checked and timed on CUDA in one command.

``losslens bench gpu [--budget 480] [--json PATH] [--markdown PATH]`` (also ``make gpu-check`` and
``python -m benchmarks.gpu``); ``--device cpu --quick`` runs every section at toy size on the CPU
(the test suite does, so the script cannot rot between GPU runs: it then asserts agreement and
structure, never times).

Sections, in order, each recording rows even when it fails (a failure is a ``failed`` row with the
error; the next section still runs) and each skipped with a row when the budget is spent:

1. ``agreement``: device vs CPU, float64, the six seed families: products of every backend
   (reverse vmapped and sequential, forward, difference) and Hutch++, Lanczos, SLQ and
   directional curvature; and the float32 compute policy for bfloat16 checkpoints.
2. ``attention``: the difference backend with the default SDPA kernels against the reverse
   backend under MATH, same batches; which kernel ran (read from the profiler) is recorded.
3. ``throughput``: seconds and gradients per HVP for reverse (k = 8), difference and PyHessian
   on the Pythia-160m and OLMo-2-1B shapes at 8 × 512 and 1 × 2,048 tokens, float32 and bfloat16
   storage (quick: a 14M shape, 1 × 64).
4. ``memory``: Hutch++ and Lanczos peak memory (allocated and the caching allocator's reserve)
   against their plans.
5. ``quant``: GPTQ and AWQ on one layer stack of the 1B shape: seconds, ΔQ equal to the CPU's.
6. ``accuracy``: the accuracy probe on the embedded task, equal to the CPU's.
7. ``sweep``: a three-checkpoint sweep of a tiny trained run and its report, end to end.
8. ``fsdp``: FSDP2 at world size 1 (NCCL on CUDA, gloo on the CPU), equal to the unsharded
   difference backend.

A section that needs an absent optional package (``lm_eval`` for ``accuracy``, see :data:`NEEDS`)
records a ``skipped`` row with the reason and the install line (``pip install 'losslens[eval]'``);
any other exception, an ``ImportError`` from losslens itself included, is ``failed``.

Output: one JSON row per line (``--json``: all rows in a file), then the rows as a plain-text
table that fits the terminal (80 columns in a pipe; :func:`.table.terminal_table`: the few
columns that matter), and with ``--markdown FILE`` the full table (:func:`markdown`) for
benchmarks/README.md. Exit status (``python -m``): 0 when every row is ``ok``/``info``/``skipped``,
1 when a check mismatched or a section failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

import torch

from benchmarks import emit

from ._common import Context, absent_optional, is_absent, one_line, skipped_for_missing
from .table import terminal_table

#: (name, share of the budget, module, function): sections in the order they run.
SECTIONS: tuple[tuple[str, float, str, str], ...] = (
    ("agreement", 0.10, "agreement", "agreement"),
    ("attention", 0.05, "agreement", "attention"),
    ("throughput", 0.35, "throughput", "throughput"),
    ("memory", 0.15, "throughput", "memory"),
    ("quant", 0.10, "workloads", "quant"),
    ("accuracy", 0.05, "workloads", "accuracy"),
    ("sweep", 0.10, "workloads", "sweep"),
    ("fsdp", 0.10, "fsdp", "fsdp"),
)
DEFAULT_BUDGET_S = 480.0
#: Optional packages a section cannot run without (checked before it starts: a ``skipped`` row with
#: the install line instead of a failure). A section that meets another absent optional package
#: (``ModuleNotFoundError`` naming it) is skipped the same way; every other exception is ``failed``.
NEEDS: dict[str, tuple[str, ...]] = {"accuracy": ("lm_eval",)}


def _section(module: str, function: str) -> Callable[[Context], list[dict]]:
    import importlib

    return getattr(importlib.import_module(f"benchmarks.gpu.{module}"), function)


def run(
    quick: bool = False,
    device: str | None = None,
    budget: float = DEFAULT_BUDGET_S,
    sections: tuple[str, ...] | None = None,
    shapes: tuple[str, ...] = ("pythia-160m", "olmo-2-1b"),
    progress: Callable[[str], None] | None = print,
) -> list[dict]:
    """Run the sections on ``device`` (default: CUDA; without CUDA and no ``device``: one ``skipped``
    row saying so) within ``budget`` seconds. Returns every row."""
    if device is None:
        if not torch.cuda.is_available():
            return [
                {
                    "section": "all",
                    "what": "no CUDA device here: nothing was measured (run it on a GPU "
                    "machine, or --device cpu --quick for the smoke run)",
                    "status": "skipped",
                }
            ]
        device = "cuda"
    dev = torch.device(device)
    start = time.monotonic()
    ctx = Context(dev, quick, start + float(budget), tuple(shapes))
    rows: list[dict] = [
        {
            "section": "all",
            "what": "device",
            "status": "info",
            "device": _device_name(dev),
            "torch": torch.__version__,
            "budget_s": float(budget),
            "quick": quick,
        }
    ]
    chosen = [s for s in SECTIONS if sections is None or s[0] in sections]
    for i, (name, share, module, function) in enumerate(chosen):
        left = ctx.seconds_left()
        if left <= 0:
            rows.append({"section": name, "what": "budget spent before this section", "status": "skipped"})
            continue
        # a section may use its share plus whatever the earlier ones left unused
        rest = sum(s[1] for s in chosen[i:])
        ctx.notes["section_deadline"] = time.monotonic() + left * share / rest
        if progress:
            progress(f"== gpu check: {name} ({left:.0f} s of the budget left)")
        t0 = time.monotonic()
        missing = [p for p in NEEDS.get(name, ()) if is_absent(p)]
        try:
            out = [skipped_for_missing(name, p) for p in missing] or _section(module, function)(ctx)
        except Exception as exc:  # a failure must not hide the other sections
            package = absent_optional(exc)
            if package:
                out = [skipped_for_missing(name, package)]
            else:
                out = [{"section": name, "what": "section failed", "status": "failed", "error": one_line(exc)}]
        for r in out:
            r.setdefault("section", name)
        out.append({"section": name, "what": "section seconds", "status": "info", "seconds": time.monotonic() - t0})
        rows += out
    return rows


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        return f"{p.name} ({p.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def failures(rows: list[dict]) -> list[dict]:
    """The rows that fail the check: ``mismatch`` or ``failed``."""
    return [r for r in rows if r.get("status") in ("mismatch", "failed")]


def markdown(rows: list[dict]) -> str:
    """The rows as one markdown table (section, what, status, value / tolerance, the rest)."""
    head = "| section | what | status | value | tolerance | details |\n| --- | --- | --- | --- | --- | --- |"
    out = [head]
    skip = {"section", "what", "status", "value", "tolerance"}
    for r in rows:
        details = ", ".join(f"{k}={_fmt(v)}" for k, v in r.items() if k not in skip)
        out.append(
            f"| {r.get('section', '')} | {r.get('what', '')} | {r.get('status', '')} | "
            f"{_fmt(r.get('value', ''))} | {_fmt(r.get('tolerance', ''))} | {details.replace('|', '/')} |"
        )
    return "\n".join(out)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda (default) or cpu (with --quick: the smoke run)")
    parser.add_argument("--quick", action="store_true", help="toy sizes")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for all sections")
    parser.add_argument("--sections", default=None, help=f"comma-separated subset of {[s[0] for s in SECTIONS]}")
    parser.add_argument("--shapes", default="pythia-160m,olmo-2-1b")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None, help="write the markdown table to this file")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    rows = run(
        args.quick,
        args.device,
        args.budget,
        tuple(args.sections.split(",")) if args.sections else None,
        tuple(args.shapes.split(",")),
    )
    emit(rows, args.json)
    print(terminal_table(rows))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows) + "\n")
    if failures(rows) and argv is None:
        sys.exit(1)
    return rows
