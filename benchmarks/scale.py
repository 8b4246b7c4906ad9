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

``--probes hutchinson+tracked`` (any probe + ``+tracked``) also tracks every tensor allocation of
the run (geometry.memory.graphs.peak_new_bytes: ``tracked_GB``, the live tensors' peak, beside the
RSS); ``LOSSLENS_BENCH_ALLOCATOR=cli`` (or ``cli:BYTES``) runs the children with
geometry.memory.model.return_freed_memory (default: glibc's defaults, as losslens runs). ``--factors`` measures one product of one vector (peak RSS) on small GPT-NeoX, Llama and OLMo-2
shapes with both backends: the second-backward and forward-backend factors of the memory model
(geometry.memory.graphs). ``--project`` measures, on 1- and 2-layer slices of the 1B and 7B shapes (bfloat16, one sequence
of 128 and 256 tokens), the bytes autograd saves per token, and projects what Hutchinson, Hutch++
and Lanczos need on one 80 GB GPU (memory from the memory model; time from FLOP counts at an
assumed fraction of the GPU's bf16 peak, with the HVP/gradient ratio measured here), for the
exact reverse backend and, for the whole model, for the gradient-difference backend with
activation checkpointing (``backend="difference"``: the kept θ, one first-order
gradient pass, 2 gradients per HVP; :func:`difference_need`). Threads are
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

#: name -> (hidden, layers, heads, intermediate, vocab); published configs (EleutherAI/pythia-*,
#: allenai/OLMo-2-0425-1B, allenai/OLMo-2-1124-7B).
SHAPES = {
    "pythia-14m": (128, 6, 4, 512, 50304), "pythia-70m": (512, 6, 8, 2048, 50304),
    "pythia-160m": (768, 12, 12, 3072, 50304), "pythia-410m": (1024, 24, 16, 4096, 50304),
    "pythia-1b": (2048, 16, 8, 8192, 50304), "olmo-2-1b": (2048, 16, 16, 8192, 100352),
    "pythia-6.9b": (4096, 32, 32, 16384, 50432), "olmo-2-7b": (4096, 32, 32, 11008, 100352),
    # small shapes of each family for the pass factors (--factors): hidden × layers, Pythia's vocabulary
    "pythia-128x6": (128, 6, 4, 512, 50304), "pythia-512x2": (512, 2, 8, 2048, 50304),
    "olmo-2-128x6": (128, 6, 4, 512, 50304), "olmo-2-512x2": (512, 2, 8, 2048, 50304),
    "llama-128x6": (128, 6, 4, 512, 50304), "llama-512x2": (512, 2, 8, 2048, 50304),
}
#: the --factors grid: one product of one vector per family shape and backend
FACTOR_SHAPES = ("pythia-128x6", "pythia-512x2", "olmo-2-128x6", "olmo-2-512x2", "llama-128x6", "llama-512x2")
PROBES = ("hutch++", "hutchinson", "lanczos", "power", "slq", "directional", "blocks", "surface")
BATCHES, BATCH, SEQ = 2, 4, 64


def build(shape: str, dtype: torch.dtype, layers: int | None = None, seed: int = 0) -> torch.nn.Module:
    """Random-init model with the shape's sizes (GPT-NeoX for pythia-*, OLMo-2 for olmo-2-*)."""
    import transformers

    h, L, heads, ff, vocab = SHAPES[shape]
    L = layers or L
    torch.manual_seed(seed)
    if shape.startswith("llama"):
        cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=h, num_hidden_layers=L, num_attention_heads=heads,
                                       intermediate_size=ff, max_position_embeddings=4096, use_cache=False,
                                       tie_word_embeddings=False)
        cls = transformers.LlamaForCausalLM
    elif shape.startswith("olmo"):
        cfg = transformers.Olmo2Config(vocab_size=vocab, hidden_size=h, num_hidden_layers=L, num_attention_heads=heads,
                                       intermediate_size=ff, max_position_embeddings=4096, use_cache=False)
        cls = transformers.Olmo2ForCausalLM
    else:
        cfg = transformers.GPTNeoXConfig(vocab_size=vocab, hidden_size=h, num_hidden_layers=L, num_attention_heads=heads,
                                         intermediate_size=ff, rotary_pct=0.25, max_position_embeddings=2048,
                                         tie_word_embeddings=False, use_cache=False)
        cls = transformers.GPTNeoXForCausalLM
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype if dtype.is_floating_point and dtype != torch.float16 else old)
    try:                                                     # built in its dtype: no float32 copy first
        return cls(cfg).to(dtype).eval()
    finally:
        torch.set_default_dtype(old)


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

    from geometry import (directional_curvature, evaluate_surface, hutchinson_trace, hutchpp_trace,
                          random_plane, spectral_density, top_eigenvalues)
    from geometry.surfaces.grid import GridSpec
    from geometry.surfaces.moving import estimate_memory as surface_memory
    from geometry.surfaces.moving import planned_forward_bytes
    from geometry.estimators.trace import block_traces
    from geometry.memory.graphs import peak_new_bytes
    from geometry.memory.model import trim
    from probes.core.lm import lm_loss
    from probes.models.curvature import lm_hessian

    track = probe.endswith("+tracked") or os.environ.get("LOSSLENS_BENCH_TRACK") == "1"   # also track allocations
    probe = probe.removesuffix("+tracked")
    dt = getattr(torch, dtype)
    model = build(shape, dt)
    vocab = SHAPES[shape][4]
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, vocab, (BATCH, SEQ), generator=g) for _ in range(BATCHES)]
    backend = probe.split("-", 1)[1] if probe.startswith("pass-") else "reverse"
    op = lm_hessian(model, batches[:1] if probe.startswith("pass-") else batches, backend=backend,  # as sharpness does
                    max_memory=int(max_memory) if max_memory.isdigit() else max_memory)  # digits: bytes, uncapped
    row = {"shape": shape, "dtype": dtype, "probe": probe, "dim": op.dim, "max_memory": max_memory}
    if probe == "timing":
        return {**row, **_timing(op)}
    if probe.startswith("pass-"):
        return {**row, **_one_pass(op)}
    graphs = [op.graph_bytes(i) for i in range(len(batches))]        # measured once, before the baseline
    extra_setup = 0
    if probe == "surface":
        center = {n: p.detach() for n, p in model.named_parameters()}
        plane = random_plane(center, seed=0, max_memory=max_memory)
        extra_setup = 2 * sum(t.numel() * t.element_size() for t in center.values())  # e1, e2 (origin: a copy)
    gc.collect()
    trim()                        # free heap kept from building the model would hide the run's growth
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
        elif probe in ("lanczos", "power"):
            res = top_eigenvalues(op, k=1, method=probe, max_iter=8, tol=1e-3)
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
            plan = surface_memory(model, plane, max_memory=max_memory, forward=planned_forward_bytes(model, lm_loss, batches[:1]))
            surf = evaluate_surface(model, lm_loss, batches[:1], plane, GridSpec(resolution=2, x_range=(-1.0, 1.0), y_range=(-1.0, 1.0)),
                                    max_memory=max_memory)
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
    return {**row, **out, "graph_bytes_per_batch": graphs[0], "predicted_GB": predicted / 1e9,
            "measured_GB": measured / 1e9, "measured/predicted": measured / max(predicted, 1),
            "base_GB": base / 1e9, "peak_GB": peak / 1e9, "plane_GB": extra_setup / 1e9, "seconds": seconds,
            "num_matvecs": getattr(res, "num_matvecs", 0), "settings": memory.get("settings", {}),
            "file_pages_GB": (_rss_file() - file_base) / 1e9,
            **({"tracked_GB": tracked / 1e9, "tracked/predicted": tracked / max(predicted, 1)} if track else {})}


def _one_pass(op) -> dict:
    """Peak RSS of one product of one vector (graph rebuilt) against the pass the memory model
    plans, and the factor it implies (geometry.memory.graphs: SECOND_BACKWARD_FACTOR for the
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
    measured = _rss()[1] - base - out_bytes                      # the product's output is not the pass
    saved = G - grad
    conv = grad if op.dtype != op.param_dtype else 0
    rest = measured - (3 * grad if op.backend == "forward" else G + grad + conv) - op.loss_transient_bytes
    return {"saved_GB": saved / 1e9, "gradient_GB": grad / 1e9, "head_transient_GB": op.loss_transient_bytes / 1e9,
            "predicted_GB": plan / 1e9, "measured_GB": measured / 1e9, "measured/predicted": measured / plan,
            "implied_factor": rest / saved}


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
    return {"s_per_gradient": t_grad, "s_per_graph_build": t_build, "s_per_hvp": t_hvp,
            "hvp/gradient": t_hvp / t_grad, "build/gradient": t_build / t_grad}


def _run_child(shape: str, probe: str, dtype: str, max_memory: str, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "LOSSLENS_BENCH_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "benchmarks.scale", "--child", shape, probe, dtype, max_memory]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(cmd, cwd=root, env={**env, "PYTHONPATH": root + os.pathsep + env.get("PYTHONPATH", "")},
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {"shape": shape, "dtype": dtype, "probe": probe, "status": "failed", "error": tail[0][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def saved_bytes_per_sequence(shape: str, seq: int, layers: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes autograd saves (forward + ``create_graph`` backward) for one sequence of ``seq`` tokens
    on a ``layers``-layer slice of ``shape`` (geometry.memory.graphs.saved_graph_bytes), through the
    loss the curvature probes use (the lean LM head, :func:`probes.core.lm_head.lm_loss_lean`)."""
    from geometry.operators.attention import second_order_attention
    from geometry.memory.graphs import saved_graph_bytes
    from probes.core.lm_head import lm_loss_lean as lm_loss

    model = build(shape, dtype, layers=layers)
    ids = torch.randint(0, SHAPES[shape][4], (1, seq))
    params = [p for p in model.parameters()]

    def run():
        with torch.enable_grad(), second_order_attention():
            torch.autograd.grad(lm_loss(model, ids), params, create_graph=True)

    out = saved_graph_bytes(model, run)
    del model
    import gc

    gc.collect()
    return out


#: (label, selection, batch, seq) of the projected configurations
CONFIGS = (("all parameters, 8×512 tokens", "all", 8, 512), ("all parameters, 1×512 tokens", "all", 1, 512),
           ("last 2 blocks, 8×512 tokens", "last2", 8, 512))
#: estimator -> full-dim float32 vectors it holds (k = 1; see geometry.estimators.trace / geometry.estimators.eigen)
VECTORS = {"hutchinson (block 1)": 2, "power": 2, "lanczos (basis 8)": 9, "hutch++ (sketch 8)": 10}


def graph_measurements(shape: str) -> dict:
    """Saved bytes per sequence, per layer and outside the layers, at 128 and 256 tokens (bfloat16,
    the lean LM head), from 1- and 2-layer slices of ``shape``."""
    out = {"shape": shape}
    for seq in (128, 256):
        one, two = saved_bytes_per_sequence(shape, seq, 1), saved_bytes_per_sequence(shape, seq, 2)
        out[f"per_layer_{seq}"], out[f"outside_{seq}"] = two - one, 2 * one - two
    return out


def project(shapes=("olmo-2-1b", "olmo-2-7b", "pythia-1b", "pythia-6.9b"), gpu_bytes: float = 80e9, mfu: float = 0.4,
            peak_flops: float = 989e12, hvp_ratio: float = 2.3, measured: dict | None = None) -> list[dict]:
    """On-paper requirements of each shape in bfloat16 on one GPU of ``gpu_bytes`` for the
    :data:`CONFIGS`: memory from the memory model (geometry.memory.graphs) with the graph measured on
    1- and 2-layer slices (:func:`graph_measurements`; per layer a·s + c·s² per sequence, outside
    the layers linear in s), the model resident in bf16, bf16 gradients, float32 estimator
    vectors; the largest Hutch++ sketch that fits; time from 6·N·T FLOPs per gradient at ``mfu``
    of ``peak_flops`` and ``hvp_ratio`` gradients per HVP (measured on CPU here)."""
    from geometry.memory.graphs import pass_bytes
    from geometry.operators.linear_ce import transient_bytes
    from geometry.memory.model import temporaries_bytes

    rows = []
    for shape in shapes:
        h, L, heads, ff, vocab = SHAPES[shape]
        m = (measured or {}).get(shape) or graph_measurements(shape)
        l1, l2, o1 = m["per_layer_128"], m["per_layer_256"], m["outside_128"]
        c = (l2 - 2 * l1) / (256**2 - 2 * 128**2)
        a = (l1 - c * 128**2) / 128
        dim_all = _param_count(shape)
        dim_layer = (dim_all - _param_count_outside(shape)) // L
        rows.append({"kind": "graph", **m})
        for label, sel, b, s in CONFIGS:
            layer_s = a * s + c * s * s
            n_layers, dim = (L, dim_all) if sel == "all" else (2, 2 * dim_layer)
            saved = b * (n_layers * layer_s + o1 * s / 128)
            grads, vec, model_b = 2 * dim, 4 * dim, 2 * dim_all
            pass_b = pass_bytes([int(saved + grads)], grads, "reverse", False, 1, 1, False,
                                transient_bytes(b * s, vocab, torch.bfloat16))
            need = {name: model_b + n * vec + pass_b + temporaries_bytes(dim, 5) for name, n in VECTORS.items()}
            room = gpu_bytes - model_b - pass_b - 2 * vec
            t_grad = 6 * dim_all * b * s / (mfu * peak_flops)
            if sel == "all":
                rows.append(difference_need(shape, label, b, s, dim_all, layer_s, o1, gpu_bytes, t_grad))
            rows.append({"kind": "projection", "shape": shape, "config": label, "params": dim_all, "selected": dim,
                         "model_GB": model_b / 1e9, "graph_GB": (saved + grads) / 1e9, "pass_GB": pass_b / 1e9,
                         "vector_GB": vec / 1e9, **{f"{k}_GB": v / 1e9 for k, v in need.items()},
                         **{f"{k}_fits": bool(v <= gpu_bytes) for k, v in need.items()},
                         "max_hutchpp_sketch": int(max(0, room // vec)),
                         "s_per_gradient": t_grad if sel == "all" else None,
                         "s_per_hvp": hvp_ratio * t_grad if sel == "all" else None})
    return rows


def difference_need(shape: str, label: str, b: int, s: int, dim: int, layer_s: float, outside_128: float,
                    gpu_bytes: float, t_grad: float) -> dict:
    """The gradient-difference backend's projection for the whole model in bfloat16 with activation
    checkpointing (:func:`geometry.operators.difference.pass_bytes`): the kept θ (its float32
    master, stored exactly in bf16: 2·dim), the bf16 ``.grad`` (2·dim), the checkpointed layer inputs (b·L·s·h bf16), one layer's
    recompute (bounded by the measured double-backward graph of one layer, ``layer_s`` per
    sequence), what is outside the layers (the measured ``outside_128`` scaled to s: embeddings,
    final norm, logits and the loss), one embedding matrix in float32 (the perturbation's cast);
    the estimators' float32 vectors on top; 2 gradients per HVP, each with a recomputed forward (4/3 of a
    gradient without checkpointing)."""
    from geometry.memory.model import temporaries_bytes

    h, L, heads, ff, vocab = SHAPES[shape]
    vec, model_b = 4 * dim, 2 * dim
    pass_b = 2 * dim + 2 * dim + b * L * s * h * 2 + b * layer_s + b * outside_128 * s / 128 + 4 * vocab * h
    need = {name: model_b + n * vec + pass_b + temporaries_bytes(dim, 5) for name, n in VECTORS.items()}
    room = gpu_bytes - model_b - pass_b - 2 * vec
    return {"kind": "projection", "shape": shape, "config": label + ", difference + checkpointing", "params": dim,
            "selected": dim, "model_GB": model_b / 1e9, "graph_GB": None, "pass_GB": pass_b / 1e9, "vector_GB": vec / 1e9,
            **{f"{k}_GB": v / 1e9 for k, v in need.items()}, **{f"{k}_fits": bool(v <= gpu_bytes) for k, v in need.items()},
            "max_hutchpp_sketch": int(max(0, room // vec)), "s_per_gradient": 4 / 3 * t_grad, "s_per_hvp": 8 / 3 * t_grad}


def _param_count_outside(shape: str) -> int:
    """Parameters outside the decoder layers (embeddings, head, final norm)."""
    h, L, heads, ff, vocab = SHAPES[shape]
    return int(2 * vocab * h + (h if shape.startswith("olmo") else 2 * h))


def _param_count(shape: str) -> int:
    h, L, heads, ff, vocab = SHAPES[shape]
    if shape.startswith("olmo"):                             # q,k,v,o + SwiGLU (3 matrices) + 2 norms + qk-norm
        per_layer = 4 * h * h + 3 * h * ff + 4 * h
        return int(2 * vocab * h + L * per_layer + h)
    per_layer = 4 * h * h + 4 * h + 2 * h * ff + ff + h + 4 * h  # qkv+dense (with biases), MLP, 2 LayerNorms
    return int(2 * vocab * h + L * per_layer + 2 * h)


def factors(dtypes: tuple[str, ...] = ("float32",), threads: int = 2) -> list[dict]:
    """The pass factors per family (``--factors``): one product on 4 × 64 tokens per shape of
    :data:`FACTOR_SHAPES` and backend, each in a fresh subprocess."""
    return [_run_child(s, f"pass-{b}", d, str(64 * 10**9), threads) for s in FACTOR_SHAPES for d in dtypes
            for b in ("reverse", "forward")]


#: OLMo-2-0325-32B's published shape: (hidden, layers, heads, intermediate, vocab)
SHAPE_32B = (5120, 64, 40, 27648, 100352)


def sharded_project(gpus: int = 8, gpu_bytes: float = 80e9, seq: int = 2048, vectors: dict | None = None) -> list[dict]:
    """Per-rank bytes of sharded curvature over ``gpus`` GPUs (bfloat16 model, float32 vectors):

    θ shard (2 B / param / N) + master shard in the parameters' dtype (2 B / N; a bfloat16 number
    converts to float32 exactly) + one float32 cast of the largest local tensor (the embedding's
    shard, ``vocab · h · 4 B / N``) + ``.grad`` shard (2 B / N) + the estimator's float32 vectors
    (4 B / N each) + two all-gathered decoder blocks (current and
    prefetched, 2 B / block param each) + the reduce-scatter of one block's gradient (2 B / block
    param) + activations of one sequence with checkpointing (the blocks' inputs, ``L · s · h · 2 B``,
    plus one block's recompute, ≈ ``s · (14 h + 2 ff) · 2 B``) + the loss's float32 logits
    (``s · vocab · 4 B`` twice: logits and their gradient). Parameter counts as ``benchmarks.scale``.
    """
    vectors = vectors or {"hutchinson (block 1)": 2, "lanczos (basis 8)": 9, "hutch++ (sketch 8)": 10}
    rows = []
    for name, (h, L, heads, ff, vocab) in (("olmo-2-7b", SHAPES["olmo-2-7b"]), ("olmo-2-32b", SHAPE_32B)):
        per_layer = 4 * h * h + 3 * h * ff + 4 * h
        dim = _param_count("olmo-2-7b") if name == "olmo-2-7b" else int(2 * vocab * h + L * per_layer + h)
        shard = dim / gpus
        fixed = shard * (2 + 2 + 2) + vocab * h * 4 / gpus + 2 * 2 * per_layer + 2 * per_layer
        acts = L * seq * h * 2 + seq * (14 * h + 2 * ff) * 2 + 2 * seq * vocab * 4
        row = {"kind": "sharded projection", "shape": name, "params": dim, "gpus": gpus, "tokens": f"1x{seq}",
               "checkpointing": True, "fixed_GB": fixed / 1e9, "activations_GB": acts / 1e9,
               "vector_shard_GB": 4 * shard / 1e9}
        for est, n in vectors.items():
            need = fixed + acts + n * 4 * shard
            row[f"{est}_GB"] = need / 1e9
            row[f"{est}_fits"] = bool(need <= gpu_bytes)
        rows.append(row)
    return rows

def run(quick: bool = False, shapes: tuple[str, ...] | None = None, dtypes: tuple[str, ...] = ("float32",),
        probes: tuple[str, ...] | None = None, max_memory: str = "8GB", threads: int = 2,
        with_projection: bool = False) -> list[dict]:
    """Rows of the scale table (``--quick``: the 14m shape, three probes, no projection)."""
    shapes = shapes or (("pythia-14m",) if quick else ("pythia-14m", "pythia-70m", "pythia-160m"))
    probes = probes or (("timing", "hutch++", "lanczos") if quick else ("timing",) + PROBES)
    rows = [_run_child(s, p, d, max_memory, threads) for s in shapes for d in dtypes for p in probes]
    if with_projection and not quick:
        from probes.core.threads import torch_threads

        with torch_threads(threads):
            rows += project()
        rows += sharded_project()  # OLMo-2-7B and a 32B shape over 8 x 80 GB, FSDP2-sharded (issue #27)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        torch.set_num_threads(int(os.environ.get("LOSSLENS_BENCH_THREADS", "1")))
        alloc = os.environ.get("LOSSLENS_BENCH_ALLOCATOR", "glibc")    # "glibc" (as losslens runs), "cli", "cli:BYTES"
        if alloc.startswith("cli"):                                     # return_freed_memory's settings
            from geometry.memory.model import MMAP_THRESHOLD, return_freed_memory

            return_freed_memory(int(alloc[4:]) if alloc.startswith("cli:") else MMAP_THRESHOLD)
        print(json.dumps(child(*argv[1:5]), default=str))
        return []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=None, help="comma list (default: pythia-14m,pythia-70m,pythia-160m; --quick: pythia-14m)")
    parser.add_argument("--dtype", default="float32", help="comma list: float32, bfloat16")
    parser.add_argument("--probes", default=None, help=f"comma list of timing, {', '.join(PROBES)}")
    parser.add_argument("--max-memory", default="8GB")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--project", action="store_true", help="also the 1B/7B projection (slow: builds 1-2 layer slices)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--factors", action="store_true", help="only the pass factors per family (GPT-NeoX, Llama, OLMo-2)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.factors:
        return emit(factors(tuple(args.dtype.split(",")), args.threads), args.json)
    rows = run(quick=args.quick, shapes=tuple(args.shapes.split(",")) if args.shapes else None, dtypes=tuple(args.dtype.split(",")),
               probes=tuple(args.probes.split(",")) if args.probes else None, max_memory=args.max_memory,
               threads=args.threads, with_projection=args.project)
    return emit(rows, args.json)


if __name__ == "__main__":
    main()
