"""GPU validation: the whole CUDA path of the curvature engine, checked and timed on one device.

``python -m benchmarks.gpu [--shapes pythia-160m,olmo-2-1b] [--json PATH]`` (also ``losslens bench gpu``).
Without CUDA it prints that nothing was measured and returns no rows (it never fails a CPU run).

1. **Agreement**: on every seed family (tiny, float64) the CUDA products equal the CPU ones —
   reverse (vmapped and sequential second backwards) and forward backends — and Hutch++, Lanczos,
   SLQ and the directional curvature give the CPU numbers for the same seeds (rows ``check``).
2. **Throughput and memory** on the seed shapes (random init, bfloat16 and float32, 2 × 4 × 64
   tokens, every batch's graph kept): seconds per gradient, per graph build and per HVP
   (sequential and vmapped k = 8), and each estimator's peak GPU memory
   (``torch.cuda.max_memory_allocated`` above what was allocated before the call) beside its
   memory plan (rows ``timing`` and ``memory``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from benchmarks import emit

from benchmarks.shapes import SHAPES, build


def _sync():
    torch.cuda.synchronize()


def _timed(fn, n=3):
    ts = []
    for _ in range(n):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def agreement() -> list[dict]:
    """CUDA vs CPU on every tiny family in float64: products and estimators, relative differences."""
    from geometry import HessianOperator, directional_curvature, hutchpp_trace, spectral_density, top_eigenvalues
    from probes.core.lm import lm_loss
    from probes.models.families import FAMILIES, tiny_model

    rows = []
    for fam in FAMILIES:
        cpu = tiny_model(fam, seed=0, dtype=torch.float64)
        gpu = tiny_model(fam, seed=0, dtype=torch.float64).cuda()
        g = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, 96, (2, 16), generator=g) for _ in range(2)]
        ops = {"cpu": HessianOperator(cpu, lm_loss, batches)}
        V = torch.randn(3, ops["cpu"].dim, dtype=torch.float64, generator=g)
        ref = ops["cpu"].matmat(V)
        for name, kw in (("reverse-vmap", {"vectorize": True}), ("reverse-seq", {"vectorize": False}),
                         ("forward", {"backend": "forward"})):
            out = HessianOperator(gpu, lm_loss, batches, **kw).matmat(V.cuda()).cpu()
            rows.append({"kind": "check", "family": fam, "what": f"hvp {name}", "rel_diff": float((out - ref).norm() / ref.norm())})
        op_g = HessianOperator(gpu, lm_loss, batches)
        for what, fn in (("hutch++", lambda op: hutchpp_trace(op, num_matvecs=30, seed=1).value),
                         ("lanczos", lambda op: top_eigenvalues(op, k=2, max_iter=30, seed=1).values[0]),
                         ("slq moment 2", lambda op: spectral_density(op, num_runs=2, num_steps=8, seed=1).moment(2)),
                         ("directional", lambda op: directional_curvature(op, torch.ones(op.dim, dtype=op.dtype)).dHd)):
            a, b = fn(ops["cpu"]), fn(op_g)
            rows.append({"kind": "check", "family": fam, "what": what, "rel_diff": abs(a - b) / max(abs(a), 1e-30)})
    return rows


def throughput(shape: str, dtype: torch.dtype) -> list[dict]:
    """Timing and peak-memory rows of one seed shape on the GPU."""
    from geometry import HessianOperator, hutchpp_trace, top_eigenvalues
    from probes.core.lm import lm_loss

    model = build(shape, dtype).cuda()
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, SHAPES[shape][4], (4, 64), generator=g) for _ in range(2)]
    rows = []
    for vec in (False, True):
        op = HessianOperator(model, lm_loss, batches, vectorize=vec)
        V = torch.ones(8, op.dim, dtype=op.dtype, device="cuda")
        t_grad = _timed(op.gradient)
        with op.configured(cache_graphs=True):
            def build_and_one():
                op.release_graphs()
                op.matmat_flat(V[:1])
            t_b1 = _timed(build_and_one, n=2)
            op.matmat_flat(V[:1])                      # graphs kept: only second backwards below
            t_8 = _timed(lambda: op.matmat_flat(V), n=2)
        t_hvp = t_8 / 8
        rows.append({"kind": "timing", "shape": shape, "dtype": str(dtype), "vectorize": vec, "s_per_gradient": t_grad,
                     "s_per_hvp": t_hvp, "hvp/gradient": t_hvp / t_grad, "s_per_graph_build": t_b1 - t_hvp,
                     "build/gradient": (t_b1 - t_hvp) / t_grad})
        del V, op
        torch.cuda.empty_cache()
    op = HessianOperator(model, lm_loss, batches)
    for what, fn in (("hutch++ m=30", lambda: hutchpp_trace(op, num_matvecs=30)),
                     ("lanczos 20 steps", lambda: top_eigenvalues(op, max_iter=20, tol=1e-6))):
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        res = fn()
        _sync()
        peak = torch.cuda.max_memory_allocated() - before
        pred = res.memory["predicted_bytes"]
        rows.append({"kind": "memory", "shape": shape, "dtype": str(dtype), "what": what, "predicted_GB": pred / 1e9,
                     "measured_GB": peak / 1e9, "measured/predicted": peak / max(pred, 1), "seconds": time.perf_counter() - t0,
                     "settings": res.memory["settings"]})
    return rows


def run(quick: bool = False, shapes: tuple[str, ...] = ("pythia-160m", "olmo-2-1b")) -> list[dict]:
    if not torch.cuda.is_available():
        print("benchmarks.gpu: no CUDA device here; nothing was measured (run it on a GPU machine)")
        return []
    rows = agreement()
    for shape in (shapes[:1] if quick else shapes):
        for dt in (torch.bfloat16, torch.float32):
            rows += throughput(shape, dt)
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="pythia-160m,olmo-2-1b")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    rows = run(quick=args.quick, shapes=tuple(args.shapes.split(",")))
    return emit(rows, args.json)


if __name__ == "__main__":
    main()
