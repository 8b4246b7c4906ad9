"""Sections 3 and 4 of the GPU check: HVP throughput against PyHessian, and peak memory against plans.

Throughput (random-init models of the shapes, one batch layout at a time): seconds per gradient,
per HVP of the reverse backend (k = 8 vectors over one kept graph: the graph's build is charged to
the first product, as a solver pays it), of the difference backend (2 gradients each) and of
PyHessian 0.1 (``hessian_vector_product`` over its own graph), each as gradients per HVP
(seconds per HVP ÷ seconds per gradient) — the unit that transfers between devices. Both
PyHessian and the reverse backend are charged their graph's build over the k products. Storage
float32, and bfloat16 with float32 compute where this build has the compute policy.

Memory: Hutch++ (30 products) and Lanczos (20 steps) on the first shape; peak above the start
(``max_memory_allocated``, and ``max_memory_reserved``: the caching allocator's pool, which the
plan does not model — it counts live tensors; reserved ÷ allocated says how much the pool adds)
beside the plan each result records (``memory["predicted_bytes"]``).
"""

from __future__ import annotations

import inspect
import time

import torch

from ._common import OPTIONAL_INSTALL, Context, PeakMemory, absent_optional, info, timed

#: (batch rows, sequence length) layouts; quick: one toy layout.
LAYOUTS, QUICK_LAYOUTS = ((8, 512), (1, 2048)), ((1, 64),)


def _model(shape: str, dtype: torch.dtype, device: torch.device):
    from benchmarks.shapes import build

    return build(shape, dtype).to(device)


def _operator(model, batches, dtype: torch.dtype, **kw):
    from losslens.geometry import HessianOperator
    from losslens.lm.core.next_token_loss import lm_loss

    if dtype != torch.float32 and "compute_dtype" in inspect.signature(HessianOperator).parameters:
        kw["compute_dtype"] = torch.float32
    return HessianOperator(model, lm_loss, batches, **kw)


def _pyhessian_seconds(model, batch, device, k: int) -> float:
    """Seconds per product of PyHessian on one batch (its graph built once, then k products)."""
    from pyhessian import hessian
    from pyhessian.utils import hessian_vector_product

    from benchmarks.hvp_peers import _Logits, _shifted_ce

    from losslens.geometry.operators.attention import second_order_attention

    vs = [[torch.randn_like(p) for p in model.parameters() if p.requires_grad] for _ in range(k)]

    def products():  # its graph built once and charged, as ours is
        with second_order_attention():  # fused SDPA has no double backward, for PyHessian too
            H = hessian(_Logits(model), _shifted_ce, data=(batch, batch), cuda=device.type == "cuda")
        for v in vs:
            hessian_vector_product(H.gradsH, H.params, v)

    try:
        return timed(products, device, n=1) / k
    finally:
        model.zero_grad(set_to_none=True)


def throughput(ctx: Context) -> list[dict]:
    """Seconds and gradients per HVP for reverse (k = 8), difference and PyHessian."""
    from benchmarks.shapes import SHAPES

    rows: list[dict] = []
    shapes = ("pythia-14m",) if ctx.quick else ctx.shapes
    k = 2 if ctx.quick else 8
    for shape in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            for rows_, seq in QUICK_LAYOUTS if ctx.quick else LAYOUTS:
                label = dict(shape=shape, dtype=str(dtype).split(".")[-1], tokens=f"{rows_}x{seq}")
                if time.monotonic() > ctx.notes["section_deadline"]:
                    rows.append(
                        {
                            "section": "throughput",
                            "what": "not measured: the section's budget is spent",
                            "status": "skipped",
                            **label,
                        }
                    )
                    continue
                model = _model(shape, dtype, ctx.device)
                g = torch.Generator().manual_seed(0)
                batch = torch.randint(0, SHAPES[shape][4], (rows_, seq), generator=g).to(ctx.device)
                rev = _operator(model, [batch], dtype)
                V = torch.randn(k, rev.dim, generator=g).to(ctx.device, torch.float32)
                t_grad = timed(rev.gradient, ctx.device, n=2)
                with rev.configured(cache_graphs=True):
                    rev.release_graphs()
                    t_rev = timed(lambda rev=rev, V=V: rev.matmat_flat(V), ctx.device, n=1) / k
                    rev.release_graphs()
                diff = _operator(model, [batch], dtype, backend="difference")
                t_diff = timed(lambda diff=diff, V=V: diff.matmat_flat(V[:2]), ctx.device, n=1) / 2
                row = info(
                    "throughput",
                    "seconds per HVP",
                    **label,
                    s_per_gradient=t_grad,
                    reverse_s=t_rev,
                    reverse_grads=t_rev / t_grad,
                    difference_s=t_diff,
                    difference_grads=t_diff / t_grad,
                    compute=str(getattr(rev, "compute_dtype", dtype)).split(".")[-1],
                )
                try:
                    t_py = _pyhessian_seconds(model, batch, ctx.device, k)
                    row.update(pyhessian_s=t_py, pyhessian_grads=t_py / t_grad, reverse_vs_pyhessian=t_py / t_rev)
                except Exception as exc:  # PyHessian absent or failing is recorded, not fatal
                    if absent_optional(exc) == "pyhessian":
                        row.update(pyhessian="not installed", install=OPTIONAL_INSTALL["pyhessian"])
                    else:
                        row.update(pyhessian=f"failed: {type(exc).__name__}: {str(exc)[:120]}")
                rows.append(row)
                del model, rev, diff, V
                if ctx.cuda:
                    torch.cuda.empty_cache()
    return rows


def memory(ctx: Context) -> list[dict]:
    """Hutch++ and Lanczos peak memory against their plans on the first shape."""
    from benchmarks.shapes import SHAPES
    from losslens.geometry import hutchpp_trace, top_eigenvalues

    shape = "pythia-14m" if ctx.quick else ctx.shapes[0]
    rows_, seq = (1, 64) if ctx.quick else (8, 512)
    rows: list[dict] = []
    for dtype in (torch.float32, torch.bfloat16):
        model = _model(shape, dtype, ctx.device)
        g = torch.Generator().manual_seed(1)
        batches = [torch.randint(0, SHAPES[shape][4], (rows_, seq), generator=g).to(ctx.device)]
        op = _operator(model, batches, dtype)
        n_pp, n_lz = (6, 4) if ctx.quick else (30, 20)
        for what, fn in (
            (f"hutch++ {n_pp} products", lambda op=op: hutchpp_trace(op, num_matvecs=n_pp, seed=0)),
            (f"lanczos {n_lz} steps", lambda op=op: top_eigenvalues(op, max_iter=n_lz, tol=1e-6, seed=0)),
        ):
            if time.monotonic() > ctx.notes["section_deadline"]:
                rows.append(
                    {
                        "section": "memory",
                        "what": f"{what}: the section's budget is spent",
                        "status": "skipped",
                        "shape": shape,
                        "dtype": str(dtype).split(".")[-1],
                    }
                )
                continue
            with PeakMemory(ctx.device) as peak:
                res = fn()
            plan = res.memory["predicted_bytes"]
            row = info(
                "memory",
                what,
                shape=shape,
                dtype=str(dtype).split(".")[-1],
                tokens=f"{rows_}x{seq}",
                plan_GB=plan / 1e9,
                allocated_GB=peak.allocated / 1e9,
                allocated_over_plan=peak.allocated / max(plan, 1),
            )
            if peak.reserved is not None:
                row.update(reserved_GB=peak.reserved / 1e9, reserved_over_plan=peak.reserved / max(plan, 1))
            rows.append(row)
        del model, op, fn  # fn holds op as a default argument
        if ctx.cuda:
            torch.cuda.empty_cache()
    return rows
