"""Solver steps and the lean LM head: gradients per solver step, and logits memory at vocab 50k.

``python -m benchmarks.solvers [--quick] [--threads 1] [--json PATH]`` (also ``losslens bench solvers``).

1. **Solver steps** (1M GPT-NeoX of ``benchmarks.hvp_throughput``, 8 × 128 tokens, one or eight
   batches): seconds per power-iteration / Lanczos / SLQ step ÷ one gradient of the same data,
   with every batch's graph kept between steps (``cache_graphs``, what the estimators choose when
   it fits) and rebuilt per step (the previous behaviour). Each step is one HVP.
2. **Lean LM head** (a 2-layer GPT-NeoX with Pythia's vocabulary of 50,304, hidden 128, and the
   Pythia-160m shape): bytes of one batch's double-backward graph and seconds per HVP, through
   autograd's cross-entropy (:func:`losslens.lm.core.next_token_loss.lm_loss`) and through the closed-form chunked
   head (:func:`losslens.lm.core.lm_head.lm_loss_lean`), with the products' relative difference.
3. **torch.compile of the forward backend** on CPU: whether it compiles, and its per-vector time
   against the uncompiled forward backend and the reverse backend.

Threads are pinned for the run (``--threads``, default 1) and restored afterwards.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch

from benchmarks import emit

from benchmarks.hvp_models import build_model
from losslens.geometry import HessianOperator, spectral_density, top_eigenvalues
from losslens.geometry.memory.graphs import peak_new_bytes
from losslens.geometry.operators.reverse import ReverseBackend
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.core.lm_head import lm_loss_lean
from losslens.lm.core.threads import torch_threads


def _timed(fn, n=3):
    ts = []
    for _ in range(n):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def solver_rows(n_batches: int, steps: int, quick: bool) -> list[dict]:
    """Seconds per solver step ÷ one gradient: a bare product on a kept graph and on a rebuilt one
    (what a power-iteration step costs either way), and Lanczos / SLQ steps as the estimators run
    them (they keep the graphs when the budget allows, as here)."""
    model = build_model("neox", "1M")
    g = torch.Generator().manual_seed(0)
    shape = (4, 64) if quick else (8, 128)
    batches = [torch.randint(0, 512, shape, generator=g) for _ in range(n_batches)]
    rows = []
    for cache in (True, False):
        op = HessianOperator(model, lm_loss, batches, backend=ReverseBackend(cache_graphs=cache))
        t_grad = _timed(op.gradient)
        v = torch.randn(op.dim, generator=g)
        runs = {"power step (one product)": lambda: [op.matvec_flat(v) for _ in range(steps)]}
        if cache:
            runs["lanczos step"] = lambda: top_eigenvalues(op, max_iter=steps, tol=1e-12, max_memory=64 * 10**9)
            runs["slq step (2 runs)"] = lambda: spectral_density(op, num_runs=2, num_steps=steps, max_memory=64 * 10**9)
        for name, run in runs.items():
            n0 = op.num_matvecs
            t = _timed(run, n=2)
            hvps = (op.num_matvecs - n0) / 2
            rows.append(
                {
                    "kind": "solver",
                    "solver": name,
                    "batches": n_batches,
                    "graphs_kept": cache,
                    "s_per_hvp": t / hvps,
                    "gradients_per_hvp": t / hvps / t_grad,
                }
            )
        op.release_graphs()
    return rows


def lean_head_rows(shapes=("vocab50k-small", "pythia-160m"), quick: bool = False) -> list[dict]:
    from benchmarks.shapes import build
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    rows = []
    for shape in shapes[:1] if quick else shapes:
        if shape == "vocab50k-small":
            torch.manual_seed(0)
            model = GPTNeoXForCausalLM(
                GPTNeoXConfig(
                    vocab_size=50304,
                    hidden_size=128,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    intermediate_size=512,
                    rotary_pct=0.25,
                    tie_word_embeddings=False,
                    use_cache=False,
                )
            ).eval()
        else:
            model = build(shape, torch.float32)
        g = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, 50304, (4, 64), generator=g)]
        V = torch.randn(2, sum(p.numel() for p in model.parameters()), generator=g)
        out = {}
        for name, loss in (("autograd", lm_loss), ("lean", lm_loss_lean)):
            op = HessianOperator(model, loss, batches, backend=ReverseBackend(cache_graphs=True))
            graph = op.graph_bytes(0) - op.dim * 4
            _, peak = peak_new_bytes(lambda: op.matmat_flat(V[:1]))  # build + one product, every allocation
            t = _timed(lambda: op.matmat_flat(V), n=2) / 2
            out[name] = (graph, t, op.matmat_flat(V[:1]), peak)
            op.release_graphs()
        diff = float((out["lean"][2] - out["autograd"][2]).norm() / out["autograd"][2].norm())
        rows.append(
            {
                "kind": "lean_head",
                "model": shape,
                "vocab": 50304,
                "tokens": 256,
                "saved_graph_MB_autograd": out["autograd"][0] / 1e6,
                "saved_graph_MB_lean": out["lean"][0] / 1e6,
                "s_per_hvp_autograd": out["autograd"][1],
                "s_per_hvp_lean": out["lean"][1],
                "hvp_peak_MB_autograd": out["autograd"][3] / 1e6,
                "hvp_peak_MB_lean": out["lean"][3] / 1e6,
                "memory_ratio": out["autograd"][0] / out["lean"][0],
                "speed_ratio": out["autograd"][1] / out["lean"][1],
                "rel_diff": diff,
            }
        )
    return rows


def compile_rows(quick: bool = False) -> list[dict]:
    """torch.compile of the forward backend's per-batch HVP on CPU, against eager and reverse."""
    model = build_model("neox", "1M")
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 512, (4, 64) if quick else (8, 128), generator=g)]
    V = torch.randn(8, sum(p.numel() for p in model.parameters()), generator=g)
    rev = HessianOperator(model, lm_loss, batches)
    fwd = HessianOperator(model, lm_loss, batches, backend="forward")
    t_grad = _timed(rev.gradient)
    row = {
        "kind": "compile",
        "k": 8,
        "reverse_gradients_per_hvp": _timed(lambda: rev.matmat_flat(V), 2) / 8 / t_grad,
        "forward_gradients_per_hvp": _timed(lambda: fwd.matmat_flat(V), 2) / 8 / t_grad,
    }
    try:
        import losslens.geometry.operators.forward as fw

        eager = fw.forward_over_reverse
        compiled = torch.compile(eager, dynamic=False)
        fw.forward_over_reverse = compiled
        t0 = time.perf_counter()
        fwd.matmat_flat(V)  # compile
        row["compile_seconds"] = time.perf_counter() - t0
        row["compiled_gradients_per_hvp"] = _timed(lambda: fwd.matmat_flat(V), 2) / 8 / t_grad
        row["compiled_status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - recorded: whether it compiles is the measurement
        row["compiled_status"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
    finally:
        fw.forward_over_reverse = eager
    return [row]


def run(quick: bool = False, threads: int | None = 1) -> list[dict]:
    with torch_threads(threads):
        rows = solver_rows(1, 6 if quick else 20, quick)
        if not quick:
            rows += solver_rows(8, 10, quick)
        rows += lean_head_rows(quick=quick)
        if not quick:
            rows += compile_rows(quick)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    rows = run(quick=args.quick, threads=args.threads or None)
    return emit(rows, args.json)


if __name__ == "__main__":
    main()
