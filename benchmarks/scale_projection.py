"""On-paper requirements of curvature at 1B-32B (``python -m benchmarks.scale --project``): the bytes
autograd saves per token measured on 1- and 2-layer slices (:func:`graph_measurements`), projected
through the memory model to one 80 GB GPU for the reverse and gradient-difference backends
(:func:`project`, :func:`difference_need`), and per rank of a sharded run (:func:`sharded_project`).

Compute precision (issue #35, :mod:`losslens.geometry.operators.precision`): each configuration is projected
for the default **float32 compute** of a bfloat16 checkpoint and for explicit bfloat16 compute
(``compute`` column). Float32 compute holds, beyond the resident bfloat16 model (2 B / param), its
float32 copy (4 B / param; on the sharded path the shards themselves are float32), float32
gradients, master copy and reduce-scatter buffers, and activations twice the bfloat16 ones (the
graph is measured in bfloat16 and scaled by 2: an estimate, not a measurement)."""

from __future__ import annotations

import torch

from benchmarks.shapes import SHAPES, build

#: bytes per number of each compute dtype
COMPUTE = {"float32": 4, "bfloat16": 2}


def saved_bytes_per_sequence(shape: str, seq: int, layers: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes autograd saves (forward + ``create_graph`` backward) for one sequence of ``seq`` tokens
    on a ``layers``-layer slice of ``shape`` (losslens.geometry.memory.graphs.saved_graph_bytes), through the
    loss the curvature probes use (the lean LM head, :func:`losslens.lm.core.lm_head.lm_loss_lean`)."""
    from losslens.geometry.operators.attention import second_order_attention
    from losslens.geometry.memory.graphs import saved_graph_bytes
    from losslens.lm.core.lm_head import lm_loss_lean as lm_loss

    model = build(shape, dtype, layers=layers)
    ids = torch.randint(0, SHAPES[shape][4], (1, seq))
    params = [p for p in model.parameters()]

    def run(model=model):
        with torch.enable_grad(), second_order_attention():
            torch.autograd.grad(lm_loss(model, ids), params, create_graph=True)

    out = saved_graph_bytes(model, run)
    del model, run  # run holds model as a default argument
    import gc

    gc.collect()
    return out


#: (label, selection, batch, seq) of the projected configurations
CONFIGS = (
    ("all parameters, 8×512 tokens", "all", 8, 512),
    ("all parameters, 1×512 tokens", "all", 1, 512),
    ("last 2 blocks, 8×512 tokens", "last2", 8, 512),
)
#: estimator -> full-dim float32 vectors it holds (k = 1; see losslens.geometry.estimators.trace /
# losslens.geometry.estimators.eigen)
VECTORS = {"hutchinson (block 1)": 2, "power": 2, "lanczos (basis 8)": 9, "hutch++ (sketch 8)": 10}


def graph_measurements(shape: str) -> dict:
    """Saved bytes per sequence, per layer and outside the layers, at 128 and 256 tokens (bfloat16,
    the lean LM head), from 1- and 2-layer slices of ``shape``."""
    out = {"shape": shape}
    for seq in (128, 256):
        one, two = saved_bytes_per_sequence(shape, seq, 1), saved_bytes_per_sequence(shape, seq, 2)
        out[f"per_layer_{seq}"], out[f"outside_{seq}"] = two - one, 2 * one - two
    return out


def project(
    shapes=("olmo-2-1b", "olmo-2-7b", "pythia-1b", "pythia-6.9b"),
    gpu_bytes: float = 80e9,
    mfu: float = 0.4,
    peak_flops: float = 989e12,
    hvp_ratio: float = 2.3,
    measured: dict | None = None,
    computes: tuple[str, ...] = ("float32", "bfloat16"),
) -> list[dict]:
    """On-paper requirements of each shape (a bfloat16 checkpoint) on one GPU of ``gpu_bytes`` for
    the :data:`CONFIGS` and each compute dtype of ``computes``: memory from the memory model
    (losslens.geometry.memory.graphs) with the graph measured on 1- and 2-layer slices in bfloat16
    (:func:`graph_measurements`; per layer a·s + c·s² per sequence, outside the layers linear in s;
    × 2 for float32 compute), the model resident in bf16 plus, for float32 compute, its float32
    copy, gradients in the compute dtype, float32 estimator vectors; the largest Hutch++ sketch that
    fits; time from 6·N·T FLOPs per gradient at ``mfu`` of ``peak_flops`` and ``hvp_ratio``
    gradients per HVP (measured on CPU here)."""
    from losslens.geometry.memory.graphs import pass_bytes
    from losslens.geometry.operators.linear_ce import transient_bytes
    from losslens.geometry.memory.model import temporaries_bytes

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
        for (label, sel, b, s), compute in ((cfg, cd) for cfg in CONFIGS for cd in computes):
            w = COMPUTE[compute]
            layer_s = (a * s + c * s * s) * w / 2
            n_layers, dim = (L, dim_all) if sel == "all" else (2, 2 * dim_layer)
            saved = b * (n_layers * layer_s + o1 * w / 2 * s / 128)
            grads, vec, model_b = w * dim, 4 * dim, 2 * dim_all + (4 * dim_all if w == 4 else 0)
            pass_b = pass_bytes(
                [int(saved + grads)],
                grads,
                False,
                1,
                1,
                False,
                transient_bytes(b * s, vocab, torch.float32 if w == 4 else torch.bfloat16),
            )
            need = {name: model_b + n * vec + pass_b + temporaries_bytes(dim, count=5) for name, n in VECTORS.items()}
            room = gpu_bytes - model_b - pass_b - 2 * vec
            t_grad = 6 * dim_all * b * s / (mfu * peak_flops)
            if sel == "all":
                rows.append(
                    difference_need(shape, label, b, s, dim_all, layer_s, o1 * w / 2, gpu_bytes, t_grad, compute)
                )
            rows.append(
                {
                    "kind": "projection",
                    "shape": shape,
                    "config": label,
                    "compute": compute,
                    "gpus": 1,
                    "params": dim_all,
                    "selected": dim,
                    "model_GB": model_b / 1e9,
                    "graph_GB": (saved + grads) / 1e9,
                    "pass_GB": pass_b / 1e9,
                    "vector_GB": vec / 1e9,
                    **{f"{k}_GB": v / 1e9 for k, v in need.items()},
                    **{f"{k}_fits": bool(v <= gpu_bytes) for k, v in need.items()},
                    "max_hutchpp_sketch": int(max(0, room // vec)),
                    "s_per_gradient": t_grad if sel == "all" else None,
                    "s_per_hvp": hvp_ratio * t_grad if sel == "all" else None,
                }
            )
    return rows


def difference_need(
    shape: str,
    label: str,
    b: int,
    s: int,
    dim: int,
    layer_s: float,
    outside_128: float,
    gpu_bytes: float,
    t_grad: float,
    compute: str = "float32",
) -> dict:
    """The gradient-difference backend's projection for the whole model (a bfloat16 checkpoint)
    with activation checkpointing (:func:`losslens.geometry.operators.difference.pass_bytes`), numbers in the
    ``compute`` dtype (w bytes): the model resident in bf16 (2·dim) plus, for float32 compute, its
    float32 copy (4·dim), the kept θ (w·dim), the ``.grad`` (w·dim), the checkpointed layer inputs (b·L·s·h·w), one
    layer's recompute (bounded by the measured double-backward graph of one layer, ``layer_s`` per
    sequence), what is outside the layers (the measured ``outside_128`` scaled to s: embeddings,
    final norm, logits and the loss), one embedding matrix in float32 (the perturbation's cast);
    the estimators' float32 vectors on top; 2 gradients per HVP, each with a recomputed forward (4/3 of a
    gradient without checkpointing)."""
    from losslens.geometry.memory.model import temporaries_bytes

    h, L, heads, ff, vocab = SHAPES[shape]
    w = COMPUTE[compute]
    vec, model_b = 4 * dim, 2 * dim + (4 * dim if w == 4 else 0)
    pass_b = w * dim + w * dim + b * L * s * h * w + b * layer_s + b * outside_128 * s / 128 + 4 * vocab * h
    need = {name: model_b + n * vec + pass_b + temporaries_bytes(dim, count=5) for name, n in VECTORS.items()}
    room = gpu_bytes - model_b - pass_b - 2 * vec
    return {
        "kind": "projection",
        "shape": shape,
        "config": label + ", difference + checkpointing",
        "compute": compute,
        "gpus": 1,
        "params": dim,
        "selected": dim,
        "model_GB": model_b / 1e9,
        "graph_GB": None,
        "pass_GB": pass_b / 1e9,
        "vector_GB": vec / 1e9,
        **{f"{k}_GB": v / 1e9 for k, v in need.items()},
        **{f"{k}_fits": bool(v <= gpu_bytes) for k, v in need.items()},
        "max_hutchpp_sketch": int(max(0, room // vec)),
        "s_per_gradient": 4 / 3 * t_grad,
        "s_per_hvp": 8 / 3 * t_grad,
    }


def _param_count_outside(shape: str) -> int:
    """Parameters outside the decoder layers (embeddings, head, final norm)."""
    h, L, heads, ff, vocab = SHAPES[shape]
    return int(2 * vocab * h + (h if shape.startswith("olmo") else 2 * h))


def _param_count(shape: str) -> int:
    h, L, heads, ff, vocab = SHAPES[shape]
    if shape.startswith("olmo"):  # q,k,v,o + SwiGLU (3 matrices) + 2 norms + qk-norm
        per_layer = 4 * h * h + 3 * h * ff + 4 * h
        return int(2 * vocab * h + L * per_layer + h)
    per_layer = 4 * h * h + 4 * h + 2 * h * ff + ff + h + 4 * h  # qkv+dense (with biases), MLP, 2 LayerNorms
    return int(2 * vocab * h + L * per_layer + 2 * h)


def sharded_project(gpu_bytes: float = 80e9, seq: int = 2048, computes: tuple[str, ...] = ("float32", "bfloat16")):
    """Per-rank bytes of sharded curvature: OLMo-2-7B and OLMo-2-32B on 8 × 80 GB, a Llama-3-70B shape
    on 16 × 80 GB, before and after issue #48's layout, each part named
    (:func:`benchmarks.sharded_projection.project`)."""
    from benchmarks.sharded_projection import project as sharded

    return sharded(gpu_bytes=gpu_bytes, seq=seq, computes=computes)
