"""Scale: every curvature probe on the seed models' real shapes, peak memory against the memory model.

``python -m benchmarks.scale [--shapes pythia-14m,pythia-70m,pythia-160m] [--dtype float32,bfloat16]
[--max-memory 8GB] [--probes hutch++,lanczos,...] [--threads 2] [--project] [--json PATH]``
(also ``losslens bench scale``).

Models are random-init GPT-NeoX with Pythia's published shapes (hidden, layers, heads, MLP,
vocabulary 50,304, rotary_pct 0.25); curvature data: 2 batches of 4 × 64 random tokens (the
``--quick`` curvature set of ``losslens sharpness``). Each probe runs in a fresh subprocess, so
its peak resident memory (Linux ``VmHWM``) is its own; the row reports the peak above the
subprocess's resident memory after the model and data were built, beside the memory plan the
estimator predicted (``memory["predicted_bytes"]``) and their ratio. A timing row per shape gives
seconds per gradient, per graph build (``create_graph``) and per HVP (sequential second backward
on a kept graph), and their ratios to the gradient.

``PROBE@BACKEND`` runs a probe on another product backend (``lanczos@difference``; ``power-k3``: three
deflated eigenvalues, whose final block of refined products an inexact operator plans beside them).
``--probes hutchinson+tracked`` (any probe + ``+tracked``) also tracks every tensor allocation of
the run (losslens.geometry.memory.graphs.peak_new_bytes: ``tracked_GB``, the live tensors' peak, beside the
RSS); ``LOSSLENS_BENCH_ALLOCATOR=cli`` (or ``cli:BYTES``) runs the children with
losslens.geometry.memory.allocator.return_freed_memory (default: glibc's defaults, as losslens runs). ``--factors``
measures one
product of one vector (peak RSS) on small GPT-NeoX, Llama and OLMo-2
shapes with both backends: the second-backward and forward-backend factors of the memory model
(losslens.geometry.memory.graphs). ``--project`` measures, on 1- and 2-layer slices of the 1B and 7B shapes (bfloat16,
one
sequence of 128 and 256 tokens), the bytes autograd saves per token, and projects what Hutchinson, Hutch++
and Lanczos need on one 80 GB GPU (memory from the memory model; time from FLOP counts at an
assumed fraction of the GPU's bf16 peak, with the HVP/gradient ratio measured here), for the
exact reverse backend and, for the whole model, for the gradient-difference backend with
activation checkpointing (``backend="difference"``: the kept θ, one first-order
gradient pass, 2 gradients per HVP; :func:`benchmarks.scale_projection.difference_need`). Threads are
pinned for the whole run (``--threads``, default 2) and restored afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from benchmarks import emit
from benchmarks.shapes import BATCH, BATCHES, SEQ, SHAPES, build

#: the --factors grid: one product of one vector per family shape and backend
FACTOR_SHAPES = ("pythia-128x6", "pythia-512x2", "olmo-2-128x6", "olmo-2-512x2", "llama-128x6", "llama-512x2")
PROBES = ("hutch++", "hutchinson", "lanczos", "power", "slq", "directional", "blocks", "surface")


def _rss_file() -> int:
    """Resident file-backed bytes of this process (code pages of the libraries it has run)."""
    with open("/proc/self/status") as f:
        d = dict(line.split(":", 1) for line in f)
    return int(d.get("RssFile", "0 kB").split()[0]) * 1024


def _rss() -> tuple[int, int]:
    """(resident, peak resident) bytes of this process."""
    with open("/proc/self/status") as f:
        d = dict(line.split(":", 1) for line in f)
    return int(d["VmRSS"].split()[0]) * 1024, int(d["VmHWM"].split()[0]) * 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def child(shape: str, probe: str, dtype: str, max_memory: str) -> dict:
    """One probe in this (fresh) process; returns the measured row."""
    import gc

    from losslens.geometry import (
        directional_curvature,
        evaluate_surface,
        hutchinson_trace,
        hutchpp_trace,
        random_plane,
        spectral_density,
        top_eigenvalues,
    )
    from losslens.geometry.surfaces.grid import GridSpec
    from losslens.geometry.surfaces.moving import estimate_memory as surface_memory
    from losslens.geometry.surfaces.moving import planned_forward_bytes
    from losslens.geometry.estimators.blocks import block_traces
    from losslens.geometry.memory.graphs import peak_new_bytes
    from losslens.geometry.memory.allocator import trim
    from losslens.lm.core.next_token_loss import lm_loss
    from losslens.lm.models.curvature import lm_hessian

    track = probe.endswith("+tracked") or os.environ.get("LOSSLENS_BENCH_TRACK") == "1"  # also track allocations
    probe, _, chosen = probe.removesuffix("+tracked").partition("@")  # PROBE@BACKEND (default reverse)
    dt = getattr(torch, dtype)
    model = build(shape, dt)
    vocab = SHAPES[shape][4]
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, vocab, (BATCH, SEQ), generator=g) for _ in range(BATCHES)]
    backend = probe.split("-", 1)[1] if probe.startswith("pass-") else chosen or "reverse"
    op = lm_hessian(
        model,
        batches[:1] if probe.startswith("pass-") else batches,
        backend=backend,  # as sharpness does
        max_memory=int(max_memory) if max_memory.isdigit() else max_memory,
    )  # digits: bytes, uncapped
    row = {"shape": shape, "dtype": dtype, "probe": probe, "backend": backend, "dim": op.dim, "max_memory": max_memory}
    if probe == "timing":
        return {**row, **_timing(op)}
    if probe.startswith("pass-"):
        return {**row, **_one_pass(op)}
    graphs = [op.graph_bytes(i) for i in range(len(batches))]  # measured once, before the baseline
    extra_setup = 0
    if probe == "surface":
        center = {n: p.detach() for n, p in model.named_parameters()}
        plane = random_plane(center, seed=0, max_memory=max_memory)
        extra_setup = 2 * sum(t.numel() * t.element_size() for t in center.values())  # e1, e2 (origin: a copy)
    gc.collect()
    trim()  # free heap kept from building the model would hide the run's growth
    base, _ = _rss()
    file_base = _rss_file()
    _reset_peak()

    def work():
        plan = None
        if probe == "hutch++":
            res = hutchpp_trace(op, num_matvecs=30)
            out = {"value": res.value, "stderr": res.stderr}
        elif probe == "hutchinson":
            res = hutchinson_trace(op, num_matvecs=8)
            out = {"value": res.value, "stderr": res.stderr}
        elif probe in ("lanczos", "power", "power-k3"):  # power-k3: three deflated eigenvalues
            method, k = ("lanczos", 1) if probe == "lanczos" else ("power", 3 if probe == "power-k3" else 1)
            res = top_eigenvalues(op, k=k, method=method, max_iter=8, tol=1e-3)
            out = {"value": res.values[0], "converged": res.converged[0], "iterations": res.iterations}
        elif probe == "slq":
            res = spectral_density(op, num_runs=2, num_steps=4)
            out = {"steps": list(res.steps)}
        elif probe == "directional":
            d = torch.randn(op.dim, generator=g, dtype=torch.float32) * 1e-3
            res = directional_curvature(op, d)
            del d
            out = {"dHd": res.dHd}
        elif probe == "blocks":
            res = block_traces(op, "module", num_matvecs=4)
            out = {"value": res.total.value}
        elif probe == "surface":
            plan = surface_memory(
                model, plane, max_memory=max_memory, forward=planned_forward_bytes(model, lm_loss, batches[:1])
            )
            surf = evaluate_surface(
                model,
                lm_loss,
                batches[:1],
                plane,
                GridSpec(resolution=2, x_range=(-1.0, 1.0), y_range=(-1.0, 1.0)),
                max_memory=max_memory,
            )
            res = None
            out = {"loss_center": float(surf.loss[0, 0])}
        else:
            raise SystemExit(f"unknown probe {probe!r}; choose from {', '.join(PROBES)} or timing")
        return res, out, plan

    t0 = time.perf_counter()
    (res, out, plan), tracked = peak_new_bytes(work) if track else (work(), None)
    seconds = time.perf_counter() - t0
    _, peak = _rss()
    if probe == "blocks":
        memory = res.total.memory
    else:
        memory = res.memory if res is not None and hasattr(res, "memory") else plan.to_dict()
    predicted = memory["predicted_bytes"]
    measured = peak - base
    return {
        **row,
        **out,
        "graph_bytes_per_batch": graphs[0],
        "predicted_GB": predicted / 1e9,
        "measured_GB": measured / 1e9,
        "measured/predicted": measured / max(predicted, 1),
        "base_GB": base / 1e9,
        "peak_GB": peak / 1e9,
        "plane_GB": extra_setup / 1e9,
        "seconds": seconds,
        "num_matvecs": getattr(res, "num_matvecs", 0),
        "settings": memory.get("settings", {}),
        "file_pages_GB": (_rss_file() - file_base) / 1e9,
        **({"tracked_GB": tracked / 1e9, "tracked/predicted": tracked / max(predicted, 1)} if track else {}),
    }


def _one_pass(op) -> dict:
    """Peak RSS of one product of one vector (graph rebuilt) against the pass the memory model
    plans, and the factor it implies (losslens.geometry.memory.graphs: SECOND_BACKWARD_FACTOR for the
    reverse backend, FORWARD_FACTOR for the forward one)."""
    import gc

    grad = op.dim * torch.empty((), dtype=op.param_dtype).element_size()
    G = op.graph_bytes(0)
    plan = op.pass_bytes(1, cached=False)
    V = torch.randn(1, op.dim, dtype=op.dtype)
    out_bytes = V.numel() * V.element_size()
    gc.collect()
    base, _ = _rss()
    _reset_peak()
    op.matmat_flat(V)
    measured = _rss()[1] - base - out_bytes  # the product's output is not the pass
    saved = G - grad
    conv = grad if op.dtype != op.param_dtype else 0
    from losslens.geometry.operators.forward import ForwardBackend

    forward = isinstance(op.product_backend, ForwardBackend)
    rest = measured - (3 * grad if forward else G + grad + conv) - op.loss_transient_bytes
    return {
        "saved_GB": saved / 1e9,
        "gradient_GB": grad / 1e9,
        "head_transient_GB": op.loss_transient_bytes / 1e9,
        "predicted_GB": plan / 1e9,
        "measured_GB": measured / 1e9,
        "measured/predicted": measured / plan,
        "implied_factor": rest / saved,
    }


def _timing(op) -> dict:
    """Seconds per gradient, per graph build and per HVP (sequential, graph kept), medians of 3."""
    import statistics

    def timed(fn, n=3):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    t_grad = timed(op.gradient)
    V = torch.ones(4, op.dim, dtype=op.dtype)
    with op.configured(cache_graphs=True):
        t_build_and_4 = timed(lambda: (op.release_graphs(), op.matmat_flat(V)), n=2)
        t_4 = timed(lambda: op.matmat_flat(V), n=2)
    t_hvp = t_4 / 4
    t_build = t_build_and_4 - t_4
    return {
        "s_per_gradient": t_grad,
        "s_per_graph_build": t_build,
        "s_per_hvp": t_hvp,
        "hvp/gradient": t_hvp / t_grad,
        "build/gradient": t_build / t_grad,
    }


def _run_child(shape: str, probe: str, dtype: str, max_memory: str, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "LOSSLENS_BENCH_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "benchmarks.scale", "--child", shape, probe, dtype, max_memory]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        cmd,
        cwd=root,
        env={**env, "PYTHONPATH": root + os.pathsep + env.get("PYTHONPATH", "")},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {"shape": shape, "dtype": dtype, "probe": probe, "status": "failed", "error": tail[0][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def factors(dtypes: tuple[str, ...] = ("float32",), threads: int = 2) -> list[dict]:
    """The pass factors per family (``--factors``): one product on 4 × 64 tokens per shape of
    :data:`FACTOR_SHAPES` and backend, each in a fresh subprocess."""
    return [
        _run_child(s, f"pass-{b}", d, str(64 * 10**9), threads)
        for s in FACTOR_SHAPES
        for d in dtypes
        for b in ("reverse", "forward")
    ]


def run(
    quick: bool = False,
    shapes: tuple[str, ...] | None = None,
    dtypes: tuple[str, ...] = ("float32",),
    probes: tuple[str, ...] | None = None,
    max_memory: str = "8GB",
    threads: int = 2,
    with_projection: bool = False,
) -> list[dict]:
    """Rows of the scale table (``--quick``: the 14m shape, three probes, no projection)."""
    shapes = shapes or (("pythia-14m",) if quick else ("pythia-14m", "pythia-70m", "pythia-160m"))
    probes = probes or (("timing", "hutch++", "lanczos") if quick else ("timing",) + PROBES)
    rows = [_run_child(s, p, d, max_memory, threads) for s in shapes for d in dtypes for p in probes]
    if with_projection and not quick:
        from benchmarks.scale_projection import project, sharded_project
        from losslens.lm.core.threads import torch_threads

        with torch_threads(threads):
            rows += project()
        rows += sharded_project()  # OLMo-2 7B/32B on 8 x 80 GB, Llama-3-70B on 16, FSDP2-sharded (#27, #48)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        torch.set_num_threads(int(os.environ.get("LOSSLENS_BENCH_THREADS", "1")))
        alloc = os.environ.get("LOSSLENS_BENCH_ALLOCATOR", "glibc")  # "glibc" (as losslens runs), "cli", "cli:BYTES"
        if alloc.startswith("cli"):  # return_freed_memory's settings
            from losslens.geometry.memory.allocator import MMAP_THRESHOLD, return_freed_memory

            return_freed_memory(int(alloc[4:]) if alloc.startswith("cli:") else MMAP_THRESHOLD)
        print(json.dumps(child(*argv[1:5]), default=str))
        return []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", default=None, help="comma list (default: pythia-14m,pythia-70m,pythia-160m; --quick: pythia-14m)"
    )
    parser.add_argument("--dtype", default="float32", help="comma list: float32, bfloat16")
    parser.add_argument("--probes", default=None, help=f"comma list of timing, {', '.join(PROBES)}")
    parser.add_argument("--max-memory", default="8GB")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--project", action="store_true", help="also the 1B/7B projection (slow: builds 1-2 layer slices)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--factors", action="store_true", help="only the pass factors per family (GPT-NeoX, Llama, OLMo-2)"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.factors:
        return emit(factors(tuple(args.dtype.split(",")), args.threads), args.json)
    rows = run(
        quick=args.quick,
        shapes=tuple(args.shapes.split(",")) if args.shapes else None,
        dtypes=tuple(args.dtype.split(",")),
        probes=tuple(args.probes.split(",")) if args.probes else None,
        max_memory=args.max_memory,
        threads=args.threads,
        with_projection=args.project,
    )
    return emit(rows, args.json)


if __name__ == "__main__":
    main()
