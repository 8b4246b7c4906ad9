"""Sections 1 and 2 of the GPU check: the device agrees with the CPU, and fused attention with MATH.

Each backend on the device is compared with the same backend on the CPU (float64 tiny models,
HF's float32 islands kept in float64 by :func:`losslens.lm.models.fidelity.with_float64_fidelity`, so
the tolerances bound rounding only): relative ‖device − CPU‖ / ‖CPU‖ ≤ 1e-9 for the exact
backends, 1e-6 for the difference backend (a step of ~1e-5 relative amplifies gradient rounding);
estimators 1e-7 (the same seeds and the same products up to rounding); bf16 checkpoints with
float32 compute 1e-4 (float32 rounding on either side). The attention section compares products of a float32 model,
whose difference backend is measured within 1e-3 of the exact ones; the tolerance there is 1e-2.
"""

from __future__ import annotations

import inspect

import torch

from ._common import Context, check, info, rel_diff

EXACT_TOL, DIFFERENCE_TOL, ESTIMATOR_TOL, COMPUTE_POLICY_TOL, ATTENTION_TOL = 1e-9, 1e-6, 1e-7, 1e-4, 1e-2


def _batches(vocab: int, rows: int, seq: int, n: int = 2, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (rows, seq), generator=g) for _ in range(n)]


def _supports(param: str) -> bool:
    from losslens.geometry import HessianOperator

    return param in inspect.signature(HessianOperator).parameters


def agreement(ctx: Context) -> list[dict]:
    """Device vs CPU products and estimators on the six seed families (float64, tiny)."""
    from losslens.geometry import (
        HessianOperator,
        directional_curvature,
        hutchpp_trace,
        spectral_density,
        top_eigenvalues,
    )
    from losslens.geometry.operators.reverse import ReverseBackend
    from losslens.lm.core.next_token_loss import lm_loss
    from losslens.lm.models.families import FAMILIES, tiny_model
    from losslens.lm.models.fidelity import with_float64_fidelity

    rows: list[dict] = []
    backends = (
        ("reverse-vmap", {"backend": ReverseBackend(vectorize=True)}, EXACT_TOL),
        ("reverse-seq", {"backend": ReverseBackend(vectorize=False)}, EXACT_TOL),
        ("forward", {"backend": "forward"}, EXACT_TOL),
        ("difference", {"backend": "difference"}, DIFFERENCE_TOL),
    )
    m = 4 if ctx.quick else 12
    estimators = (
        ("hutch++", lambda op: hutchpp_trace(op, num_matvecs=m, seed=1).value),
        ("lanczos", lambda op: top_eigenvalues(op, k=1, max_iter=m, seed=1).values[0]),
        ("slq moment 2", lambda op: spectral_density(op, num_runs=1, num_steps=m // 2, seed=1).moment(2)),
        ("directional", lambda op: directional_curvature(op, torch.ones(op.dim, dtype=op.dtype, device=op.device)).dHd),
    )
    for fam in FAMILIES:
        cpu = tiny_model(fam, seed=0, dtype=torch.float64)
        dev = tiny_model(fam, seed=0, dtype=torch.float64).to(ctx.device)
        batches = _batches(96, 2, 8 if ctx.quick else 16)
        ref_op = HessianOperator(cpu, lm_loss, batches)
        V = torch.randn(2, ref_op.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        for name, kw, tol in backends:  # the same backend on both sides: device effects only
            ref = HessianOperator(cpu, with_float64_fidelity(lm_loss, cpu), batches, **kw).matmat(V)
            out = HessianOperator(
                dev, with_float64_fidelity(lm_loss, dev), [b.to(ctx.device) for b in batches], **kw
            ).matmat(V.to(ctx.device))
            rows.append(check("agreement", f"{fam} products {name}", rel_diff(out.cpu(), ref), tol))
        dev_op = HessianOperator(dev, lm_loss, [b.to(ctx.device) for b in batches])
        for what, fn in estimators:
            rows.append(check("agreement", f"{fam} {what}", rel_diff(fn(dev_op), fn(ref_op)), ESTIMATOR_TOL))
    rows += _compute_policy(ctx)
    return rows


def _compute_policy(ctx: Context) -> list[dict]:
    """A bfloat16 checkpoint's products with float32 arithmetic: device vs CPU, both backends."""
    from losslens.geometry import HessianOperator
    from losslens.lm.core.next_token_loss import lm_loss
    from losslens.lm.models.families import tiny_model

    if not _supports("compute_dtype"):
        return [
            {
                "section": "agreement",
                "what": "bf16 checkpoint, float32 compute",
                "status": "skipped",
                "reason": "this build's HessianOperator has no compute_dtype",
            }
        ]
    rows = []
    for fam in ("llama", "olmo2"):
        cpu = tiny_model(fam, seed=2, dtype=torch.bfloat16)
        dev = tiny_model(fam, seed=2, dtype=torch.bfloat16).to(ctx.device)
        batches = _batches(96, 2, 16, seed=3)
        for backend in ("reverse", "difference"):
            a = HessianOperator(cpu, lm_loss, batches, backend=backend, compute_dtype=torch.float32)
            b = HessianOperator(
                dev, lm_loss, [x.to(ctx.device) for x in batches], backend=backend, compute_dtype=torch.float32
            )
            V = torch.randn(2, a.dim, dtype=torch.float32, generator=torch.Generator().manual_seed(4))
            rows.append(
                check(
                    "agreement",
                    f"{fam} bf16 checkpoint, float32 compute, {backend}",
                    rel_diff(b.matmat(V.to(ctx.device)).cpu(), a.matmat(V)),
                    COMPUTE_POLICY_TOL,
                )
            )
    return rows


def _kernel_names(model, batch) -> list[str]:
    """The attention kernels the profiler saw in one forward of ``model`` (default SDPA choice)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if batch.device.type == "cuda" else [])
    with torch.no_grad(), profile(activities=acts) as prof:
        model(batch)
    names = {e.name for e in prof.events()}
    return sorted(
        n
        for n in names
        if "attention" in n.lower()
        and ("flash" in n or "efficient" in n or "cudnn" in n or "math" in n or "scaled_dot_product" in n)
    )


def attention(ctx: Context) -> list[dict]:
    """Difference backend with default (fused) SDPA vs reverse backend under MATH, same batches."""
    from losslens.geometry import HessianOperator
    from losslens.lm.core.next_token_loss import lm_loss
    from losslens.lm.models.families import tiny_model

    seq = 64 if ctx.quick else 1024
    dtype = torch.float32
    model = tiny_model(
        "llama",
        seed=0,
        dtype=dtype,
        max_position_embeddings=max(seq, 64),
        **({} if ctx.quick else {"hidden_size": 128, "num_attention_heads": 4, "intermediate_size": 256}),
    ).to(ctx.device)
    batches = [b.to(ctx.device) for b in _batches(96, 2, seq, n=1, seed=5)]
    kernels = _kernel_names(model, batches[0])
    exact = HessianOperator(model, lm_loss, batches)  # MATH inside (second_order_attention)
    diff = HessianOperator(model, lm_loss, batches, backend="difference")
    V = torch.randn(2, exact.dim, dtype=dtype, generator=torch.Generator().manual_seed(6)).to(ctx.device)
    rows = [
        info(
            "attention",
            "kernels in a default forward",
            kernels=", ".join(kernels) or "none seen",
            seq=seq,
            dtype=str(dtype).split(".")[-1],
        )
    ]
    rows.append(
        check(
            "attention",
            f"difference (default SDPA) vs reverse (MATH), seq {seq}",
            rel_diff(diff.matmat(V).cpu(), exact.matmat(V).cpu()),
            ATTENTION_TOL,
            fused=any(k for k in kernels if "flash" in k or "efficient" in k or "cudnn" in k),
        )
    )
    return rows
