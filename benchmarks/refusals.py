"""Refusals: the peak memory of a run that is refused, against its budget (issue #36 item 1).

``python -m benchmarks.refusals [--shapes pythia-14m,pythia-70m,pythia-160m] [--dtype float32,bfloat16]
[--budgets 60MB] [--commands sharpness,explain,surface] [--json PATH]``

Each case runs in a fresh subprocess: the model (:func:`benchmarks.shapes.build`) and its data
(``BATCHES`` batches of ``BATCH`` × ``SEQ`` random tokens) are built, the kernel's peak resident
memory is reset (Linux ``VmHWM`` through ``/proc/self/clear_refs``; the command's modules imported
before), then the command's path from
the loaded model runs with ``max_memory=budget`` until it is refused (``MemoryBudgetError`` or the
command's own error wrapping it). The row reports the peak above the resident memory after the
model was built, in MB, and whether it stayed within the budget + 64 MB (the issue's bound).

- ``sharpness``: :func:`losslens.lm.models.curvature.lm_hessian`, then the trace (Hutch++, 100 HVPs)
  and eigen (Lanczos, k=1) plans, as ``losslens sharpness`` runs them after loading;
- ``explain``: :func:`losslens.measure.explain.explanation.explain_specs` with ``rtn:4:g128`` (trace planned);
- ``surface``: :func:`losslens.geometry.surfaces.surface.evaluate_surface` on a random plane around the
  model (the plane built before the reset: it is an input, like the model), a 5 × 5 grid.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SLACK = 64 * 10**6

CHILD = r"""
import gc, json, sys, torch
torch.set_num_threads(1)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
shape, dtype, command, budget = sys.argv[1], getattr(torch, sys.argv[2]), sys.argv[3], sys.argv[4]
from benchmarks.shapes import BATCH, BATCHES, SEQ, SHAPES, build
model = build(shape, dtype).eval()
vocab = SHAPES[shape][4]
batches = [torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(i)) for i in range(BATCHES)]
plane = None
if command == "surface":
    from losslens.geometry.surfaces.random_planes import random_plane
    plane = random_plane({n: p.detach().clone() for n, p in model.named_parameters()}, seed=0)
from losslens.geometry.estimators.eigen import estimate_memory as eigen_memory  # the library is loaded with the model
from losslens.geometry.estimators.trace import estimate_memory as trace_memory
from losslens.geometry.surfaces.surface import evaluate_surface
from losslens.lm.core.next_token_loss import lm_loss
from losslens.measure.explain.explanation import explain_specs
from losslens.lm.models.curvature import lm_hessian
gc.collect()
base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
error = None
try:
    if command == "sharpness":
        op = lm_hessian(model, batches, max_memory=budget)
        trace_memory(op, "hutch++", 100)
        eigen_memory(op, 1, "lanczos", 100)
    elif command == "explain":
        explain_specs(model, ["rtn:4:g128"], batches, max_memory=budget)
    else:
        with torch.no_grad():
            evaluate_surface(model, lm_loss, batches, plane, 5, max_memory=budget)
except Exception as exc:  # the refusal (its one line is reported)
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"peak_above_model": status("VmHWM") - base, "refused": error is not None,
                  "error": (error or "")[:300], "params": sum(p.numel() for p in model.parameters())}))
"""


def measure(shape: str, dtype: str, command: str, budget: str) -> dict:
    """One case in a fresh subprocess (one thread, glibc's defaults)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, shape, dtype, command, budget],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{shape} {dtype} {command}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> list[dict]:
    from losslens.geometry.memory.budget import parse_size

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="pythia-14m,pythia-70m,pythia-160m")
    ap.add_argument("--dtype", default="float32,bfloat16")
    ap.add_argument("--budgets", default="60MB")
    ap.add_argument("--commands", default="sharpness,explain,surface")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    for shape in args.shapes.split(","):
        for dtype in args.dtype.split(","):
            for budget in args.budgets.split(","):
                for command in args.commands.split(","):
                    r = measure(shape, dtype, command, budget)
                    limit = parse_size(budget) + SLACK
                    row = {
                        "shape": shape,
                        "dtype": dtype,
                        "command": command,
                        "budget": budget,
                        **r,
                        "within": r["peak_above_model"] <= limit,
                    }
                    rows.append(row)
                    peak = r["peak_above_model"] / 1e6
                    print(
                        f"{shape:12s} {dtype:9s} {command:10s} {budget:>7s} peak {peak:8.1f} MB "
                        f"refused={r['refused']} within={row['within']}  {r['error'][:110]}",
                        flush=True,
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
