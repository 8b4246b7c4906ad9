"""Past the exact backend's reach: whole-model curvature by gradient differences (issue #25).

``python -m benchmarks.difference_reach [--shape pythia-410m] [--seq 2048] [--max-memory 11GB]
[--probes 2] [--steps 2] [--threads 2] [--json PATH]``

A random-init model of the shape (:func:`benchmarks.shapes.build`) in bfloat16 with HF activation
checkpointing on (``gradient_checkpointing_enable()``), one batch of 1 × ``seq`` tokens, every
parameter. Steps, each recorded:

1. the **exact plan**: the reverse backend's Hutchinson plan at the same length and budget
   (:func:`losslens.geometry.estimators.trace.estimate_memory`). Its double-backward graph at ``seq`` tokens is
   extrapolated (per sequence a·s + c·s², the attention's square term) from the graph measured at
   s/8 and s/4 tokens, because measuring it at ``seq`` would allocate it (≈ 13 GB for Pythia-410m
   at 2048); the row says whether that plan fits or is refused (its one-line message);
2. the **difference backend**'s plan and error check (:meth:`HessianOperator.checked`, against the
   exact product on a 1 × 64 slice), then Hutchinson with ``--probes`` Rademacher probes and
   Lanczos with ``--steps`` steps for λ_max, each in its own process-level peak window: the peak
   resident memory above the resident model (Linux ``VmHWM`` after ``clear_refs``) beside the plan.

Threads pinned to ``--threads`` for the run (``torch.set_num_threads`` here, not in library code).
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch

from benchmarks.scale import _reset_peak, _rss
from benchmarks.shapes import SHAPES, build


def _exact_plan(model, batch, budget: str, probes: int) -> dict:
    """The reverse backend's Hutchinson plan at ``batch``'s length, its graph extrapolated from s/8 and s/4."""
    from losslens.geometry import HessianOperator
    from losslens.geometry.estimators.trace import estimate_memory
    from losslens.geometry.memory.graphs import one_row
    from losslens.geometry.memory.budget import MemoryBudgetError
    from losslens.lm.core.next_token_loss import lm_loss

    s = batch.shape[1]
    short = {}
    for n in (s // 8, s // 4):
        op = HessianOperator(model, lm_loss, [batch[:, :n]])
        short[n] = op.graph_bytes(0) - op.dim * 2  # saved bytes (the gradient is added back below)
    s1, s2 = s // 8, s // 4
    c = (short[s2] - 2 * short[s1]) / (s2**2 - 2 * s1**2)
    a = (short[s1] - c * s1**2) / s1
    saved = a * s + c * s * s
    op = HessianOperator(model, lm_loss, [batch], max_memory=budget)
    _, _, key = one_row(batch)
    op.measured_passes[key] = int(saved)  # the extrapolated one-row graph (rows = 1)
    row = {
        "graph_GB_extrapolated": saved / 1e9,
        "graph_GB_measured": {n: v / 1e9 for n, v in short.items()},
        "pass_GB": op.pass_bytes(1, cached=False) / 1e9,
    }
    try:
        plan = estimate_memory(op, "hutchinson", probes, max_memory=budget)
        row.update(fits=True, predicted_GB=plan.total / 1e9)
    except MemoryBudgetError as exc:
        row.update(fits=False, refused=str(exc))
    return row


def run(shape: str, seq: int, budget: str, probes: int, steps: int) -> dict:
    from losslens.geometry import HessianOperator, hutchinson_trace, top_eigenvalues
    from losslens.geometry.operators.difference import DifferenceBackend
    from losslens.lm.core.next_token_loss import lm_loss

    t_start = time.perf_counter()
    model = build(shape, torch.bfloat16)
    model.requires_grad_(True)
    vocab = SHAPES[shape][4]
    batch = torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(0))
    out = {
        "shape": shape,
        "dtype": "bfloat16",
        "tokens": f"1×{seq}",
        "max_memory": budget,
        "threads": torch.get_num_threads(),
        "checkpointing": True,
    }
    out["exact"] = _exact_plan(model, batch, budget, probes)
    model.gradient_checkpointing_enable()
    op = HessianOperator(
        model, lm_loss, [batch], backend=DifferenceBackend(check_batches=[batch[:, :64]]), max_memory=budget
    )
    out["dim"] = op.dim
    t0 = time.perf_counter()
    out["hvp_check"] = op.checked()
    out["check_seconds"] = time.perf_counter() - t0
    out["difference_pass_GB"] = op.pass_bytes(1) / 1e9
    for name, call in (
        ("hutchinson", lambda: hutchinson_trace(op, num_matvecs=probes, seed=0)),
        ("lanczos", lambda: top_eigenvalues(op, k=1, method="lanczos", max_iter=steps, tol=1e-3, seed=0)),
    ):
        gc.collect()
        base, _ = _rss()
        _reset_peak()
        grads0 = op.num_gradients
        t0 = time.perf_counter()
        res = call()
        seconds = time.perf_counter() - t0
        _, peak = _rss()
        value = res.value if name == "hutchinson" else res.values[0]
        out[name] = {
            "value": value,
            "num_matvecs": res.num_matvecs,
            "gradients": op.num_gradients - grads0,
            "seconds": seconds,
            "s_per_gradient": seconds / max(1, op.num_gradients - grads0),
            "predicted_GB": res.memory["predicted_bytes"] / 1e9,
            "measured_GB": (peak - base) / 1e9,
            "measured/predicted": (peak - base) / res.memory["predicted_bytes"],
            "base_GB": base / 1e9,
            "peak_GB": peak / 1e9,
            **(
                {"stderr": res.stderr}
                if name == "hutchinson"
                else {"converged": res.converged[0], "residual": res.residuals[0]}
            ),
        }
        print(json.dumps({name: out[name]}), flush=True)
    out["seconds"] = time.perf_counter() - t_start
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="pythia-410m", choices=sorted(SHAPES))
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--max-memory", default="11GB")
    parser.add_argument("--probes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = run(args.shape, args.seq, args.max_memory, args.probes, args.steps)
    print(json.dumps(out, indent=1, default=str))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return out


if __name__ == "__main__":
    main()
