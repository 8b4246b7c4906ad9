"""Per-rank bytes of FSDP2-sharded curvature at 32B and 70B (issue #48), before and after the layout
of :mod:`losslens.geometry.operators.sharded_products` and off-device solver state
(:mod:`losslens.geometry.base.state_store`): formulas, each part named, not measurements
(``bench scale --project``, ``python -m benchmarks.sharded --project``). The formulas are the ones
the operator's and the estimators' plans use; tests/test_sharded_memory.py and
``python -m benchmarks.sharded_layouts`` (4 and 8 gloo ranks) hold the plans against measured peaks.

Per rank of N, P parameters, a bfloat16 checkpoint run in ``compute`` (w bytes: 4 for float32), float32
vectors (4 B), one sequence of ``seq`` tokens, activation checkpointing:

    θ shard                           w · P / N        (the FSDP2 parameters themselves)
    master (kept θ)                   2 · P / N        after: bfloat16 holds a bf16 checkpoint exactly
                                                       (0 on the device where it does not fit: then
                                                       in pinned host RAM, moved in per perturbation)
                                      w · P / N        before: in the shards' dtype
    .grad shards                      0                after: reduce-scattered into the output vector
                                      w · P / N        before
    pass: the larger of               (the cast is freed before the gradient pass starts:
                                                       ShardedHessianOperator.pass_bytes counts
                                                       max(cast, pass), so the two never add up)
      perturbation's cast             4 · V · h / N    (the largest local tensor, the embedding's shard)
      all-gathered units              3 · w · B        (current and prefetched block, one block's
                                                       reduce-scatter output; B = parameters per block)
      + activations                   L·s·h·w + s·(14h + 2ff)·w + 2·s·V·4
                                                       (block inputs, one block's recompute, float32
                                                       logits and their gradient)
    device vectors                    n_dev · 4 · P / N  (Hutchinson block 1: v and Hv; Lanczos and
                                                       Hutch++ with state on the host: the row in
                                                       and the product; before: the whole state)
    temporaries                       3 · 8 · 2²¹ B    (the chunked reductions of float32 vectors:
                                                       two float64 copies of a chunk and their
                                                       product; 1 chunk for float64 vectors,
                                                       losslens.geometry.memory.model.chunk_temporaries)
    host state                        m · 4 · P / N    (basis / sketch of m rows, pinned host RAM)

Transfer of host state at :data:`~losslens.geometry.base.state_store.HOST_LINK_BYTES_PER_S`: Lanczos
moves ``(1 + 4m)`` rows per step (the row in; two Gram-Schmidt passes reading the basis twice);
Hutch++-8 with ``r`` residual probes moves ``(2s + 4s·r)`` rows over the run. Time of one gradient:
6·P·seq FLOPs at ``mfu`` of ``peak_flops`` per rank (each rank runs its own sequence), a product 2
gradients with one recomputed forward (8/3 gradients).
"""

from __future__ import annotations

import torch

from losslens.geometry.base.state_store import HOST_LINK_BYTES_PER_S
from losslens.geometry.memory.model import temporaries_bytes

#: bytes per number of each compute dtype
COMPUTE = {"float32": 4, "bfloat16": 2}
#: (hidden, layers, heads, kv heads, intermediate, vocab) of the projected shapes
SHAPES = {
    "olmo-2-7b": (4096, 32, 32, 32, 11008, 100352),
    "olmo-2-32b": (5120, 64, 40, 8, 27648, 100352),  # OLMo-2-0325-32B (GQA 40:8)
    "llama-3-70b": (8192, 80, 64, 8, 28672, 128256),
}
#: estimator -> (rows on the device before, rows on the device after, rows kept on the host after)
ESTIMATORS = {
    "hutchinson (block 1)": (2, 2, 0),
    "lanczos (basis 8)": (9, 2, 8),
    "hutch++ (sketch 8)": (10, 2, 8),
}
#: the node layouts projected: (shape, GPUs)
LAYOUTS = (("olmo-2-7b", 8), ("olmo-2-32b", 8), ("llama-3-70b", 16))


def block_params(shape: str) -> int:
    """Parameters of one decoder block: q and o (h²), k and v (h · h·kv/heads), a SwiGLU MLP, 2 norms
    (OLMo-2 adds q/k norms: 2h more)."""
    h, _, heads, kv, ff, _ = SHAPES[shape]
    attn = 2 * h * h + 2 * h * (h * kv // heads)
    return int(attn + 3 * h * ff + (4 * h if shape.startswith("olmo") else 2 * h))


def param_count(shape: str) -> int:
    """All parameters: untied input and output embeddings, the blocks, the final norm."""
    h, layers, _, _, _, vocab = SHAPES[shape]
    return int(2 * vocab * h + layers * block_params(shape) + h)


def per_rank(
    shape: str, gpus: int, compute: str = "float32", seq: int = 2048, after: bool = True, master_on_host: bool = False
) -> dict[str, float]:
    """The fixed parts (device bytes per rank) of one sharded product, by name, before or after issue #48;
    ``master_on_host``: the master in pinned host RAM (``ShardedHessianOperator(master_device="cpu")``)."""
    h, layers, _, _, ff, vocab = SHAPES[shape]
    w, shard = COMPUTE[compute], param_count(shape) / gpus
    return {
        "theta shard": w * shard,
        "master": 0.0 if master_on_host else (2 if after else w) * shard,
        ".grad shards": 0.0 if after else w * shard,
        "perturbation cast": 4 * vocab * h / gpus,
        "gathered units": 3 * w * block_params(shape),
        "activations": layers * seq * h * w + seq * (14 * h + 2 * ff) * w + 2 * seq * vocab * 4,
    }


def device_bytes(parts: dict[str, float], vectors: float, temporaries: float) -> float:
    """Device bytes per rank of :func:`per_rank`'s parts with the estimator's vectors and the chunk
    temporaries: the perturbation's cast counts only where it exceeds the gradient pass (gathered
    units + activations), as :meth:`ShardedHessianOperator.pass_bytes` plans it."""
    fixed = sum(v for k, v in parts.items() if k not in ("perturbation cast", "gathered units", "activations"))
    gradient_pass = parts["gathered units"] + parts["activations"]
    return fixed + max(parts["perturbation cast"], gradient_pass) + vectors + temporaries


def project(
    gpu_bytes: float = 80e9,
    seq: int = 2048,
    computes: tuple[str, ...] = ("float32", "bfloat16"),
    mfu: float = 0.4,
    peak_flops: float = 989e12,
    node_gpus: int = 8,
) -> list[dict]:
    """Rows per (shape, GPUs, compute, estimator): each part in GB, the device total before and after,
    whether it fits ``gpu_bytes``, the host RAM per rank and per node, and the host transfer time."""
    rows = []
    for (shape, gpus), compute in ((lay, cd) for lay in LAYOUTS for cd in computes):
        P = param_count(shape)
        vec = 4 * P / gpus
        temps = temporaries_bytes(int(P / gpus), torch.float32)
        before = per_rank(shape, gpus, compute, seq, False)
        t_grad = 6 * P * seq / (mfu * peak_flops)
        for est, (n_before, n_after, n_host) in ESTIMATORS.items():
            need_before = device_bytes(before, n_before * vec, temps)
            for host_master in (False, True):  # the master goes to the host only where the device is short
                after = per_rank(shape, gpus, compute, seq, True, host_master)
                need_after = device_bytes(after, n_after * vec, temps)
                if need_after <= gpu_bytes:
                    break
            master_host = 2 * P / gpus if host_master else 0.0
            if est.startswith("lanczos"):
                moved, per = (1 + 4 * n_host) * vec, "step"
            else:  # Hutch++ with a budget of 3s + r = 24 + 8 HVPs, block 1
                moved, per = (2 * n_host + 4 * n_host * (32 - 2 * n_host)) * vec, "run"
            rows.append(
                {
                    "kind": "sharded projection",
                    "shape": shape,
                    "params": P,
                    "gpus": gpus,
                    "nodes": -(-gpus // node_gpus),
                    "compute": compute,
                    "tokens": f"1x{seq}",
                    "estimator": est,
                    **{f"{k}_GB": v / 1e9 for k, v in after.items()},
                    "device_vectors": n_after,
                    "vectors_GB": n_after * vec / 1e9,
                    "temporaries_GB": temps / 1e9,
                    "before_GB": need_before / 1e9,
                    "before_fits": bool(need_before <= gpu_bytes),
                    "after_GB": need_after / 1e9,
                    "fits": bool(need_after <= gpu_bytes),
                    "master_on_host": host_master,
                    "host_per_rank_GB": (n_host * vec + master_host) / 1e9,
                    "host_per_node_GB": (n_host * vec + master_host) * min(gpus, node_gpus) / 1e9,
                    "master_transfer_s_per_hvp": 2 * master_host / HOST_LINK_BYTES_PER_S,
                    f"host_transfer_s_per_{per}": moved / HOST_LINK_BYTES_PER_S if n_host else 0.0,
                    "s_per_hvp": 8 / 3 * t_grad,
                }
            )
    return rows


def table(rows: list[dict]) -> str:
    """The projection as a markdown table (benchmarks/README.md, issue #48)."""
    head = (
        "| shape | GPUs | compute | estimator | θ | master | .grad | units | activations | vectors | "
        "per rank (before → after) | host per rank / node | host transfer |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    out = []
    for r in rows:
        moved = r.get("host_transfer_s_per_step", r.get("host_transfer_s_per_run", 0.0))
        unit = "step" if "host_transfer_s_per_step" in r else "run"
        master = "host" if r["master_on_host"] else f"{r['master_GB']:.1f}"
        moves = ([f"{moved:.1f} s per {unit}"] if moved else []) + (
            [f"master {r['master_transfer_s_per_hvp']:.2f} s per HVP"] if r["master_on_host"] else []
        )
        out.append(
            f"| {r['shape']} | {r['gpus']} | {r['compute']} | {r['estimator']} | {r['theta shard_GB']:.1f} | "
            f"{master} | {r['.grad shards_GB']:.0f} | {r['gathered units_GB']:.1f} | "
            f"{r['activations_GB']:.1f} | {r['vectors_GB']:.1f} | {r['before_GB']:.1f} → **{r['after_GB']:.1f} GB**"
            f"{'' if r['fits'] else ' (does not fit)'} | "
            f"{r['host_per_rank_GB']:.0f} / {r['host_per_node_GB']:.0f} GB | {'; '.join(moves) or '–'} |"
        )
    return head + "\n".join(out)


if __name__ == "__main__":
    print(table(project()))
