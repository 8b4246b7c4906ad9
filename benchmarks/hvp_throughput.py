"""HVP throughput: per-vector Hessian-vector-product time ÷ one gradient time (lower is better).

``python -m benchmarks.hvp_throughput [--quick] [--repeats N] [--json PATH]``

Models: randomly initialised HF GPT-NeoX (LayerNorm, GELU) and Llama (RMSNorm, SiLU) causal LMs
with eager attention in float32, ~1M parameters (hidden 128, 4 layers, vocab 512) and ~9M
parameters (hidden 256, 6 layers, vocab 8192); batches of 8 sequences × 128 tokens; loss
:func:`losslens.lm.core.next_token_loss.lm_loss`; curvature w.r.t. every parameter.

Methods (each timing is paired with a gradient of the same batches measured just before it, so
machine-load drift cancels; the reported ratio is the median over repeats of
``t_call / (k · t_gradient)``):

- ``ours-reverse-vec`` / ``ours-reverse-seq``: :class:`losslens.geometry.operators.hessian.HessianOperator`, reverse
  backend, ``vectorize=True`` / ``False``, one ``matmat`` of k vectors (graph build included);
- ``ours-forward``: forward backend (jvp of grad, vmapped), one ``matmat`` of k vectors;
- ``ours-difference``: gradient-difference backend (two ``loss.backward()`` per vector and batch,
  θ perturbed in place; its ``rel_err`` is against the reverse products); ``--backend`` picks which
  of our backends run (default reverse,forward,difference);
- ``pyhessian``: PyHessian 0.1. One batch: ``hessian(...)`` builds the gradient graph once, then
  ``hessian_vector_product`` is called k times on it — graph build charged, as ours is (the same
  work: k products from scratch). ``pyhessian-reuse`` charges only the k products, i.e. the
  per-vector cost when a graph is reused across many calls (PyHessian's power iteration does
  this; :class:`HessianOperator` rebuilds per ``matmat`` call). Several batches:
  ``dataloader_hv_product`` per vector (it rebuilds the graph per batch and vector);
- ``curvlinops-matvec`` / ``curvlinops-matmat``: curvlinops 3.x ``HessianLinearOperator @ v``
  (k = 1) and ``@ M`` with k columns (vmapped jvp of jacrev).

For each peer the relative error of its products against ours (``rel_err``, ‖peer − ours‖/‖ours‖
over the same vectors) is recorded; peer failures are caught and recorded in ``status``.
``--quick`` (used by the test suite's smoke test): 1M models only, batches 4×64, one repeat, a
reduced method set, 2 instead of 8 batches for the multi-batch rows. Runs single-threaded by
default (``--threads``) for stable ratios on a shared machine. Garbage is collected before every
timed gradient: a peer's leftover double-backward graph (PyHessian leaves one in ``.grad``) would
otherwise be freed inside our reference gradient and inflate it (measured: 3.6 → 8 ms).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from typing import Callable

import torch
from torch import nn

from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.operators.reverse import ReverseBackend
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.core.numerics import rel_error
from losslens.lm.core.threads import torch_threads

from benchmarks.hvp_models import BATCH, SEQ, SIZES, build_model
from benchmarks.hvp_peers import _curvlinops, _pyhessian

QUICK_SHAPE = (4, 64)  # --quick: smaller batches so the smoke test stays well under a minute


def _gradient(model: nn.Module, batches: list[torch.Tensor]) -> Callable[[], None]:
    params = [p for p in model.parameters() if p.requires_grad]

    def run() -> None:
        for b in batches:
            torch.autograd.grad(lm_loss(model, b), params)

    return run


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _methods(
    model: nn.Module,
    batches: list[torch.Tensor],
    quick: bool,
    backends: tuple[str, ...] = ("reverse", "forward", "difference"),
):
    """Yield ``(method, k, call)``; ``call(V [k, dim]) -> [k, dim]`` (or raises)."""
    multi = len(batches) > 1
    if multi:
        ks_rev = {False: (4,) if quick else (8,), True: ()}
    else:
        ks_rev = {v: (4,) if quick else (1, 4, 8, 16) for v in (False, True)}

    def reverse():
        for vec in (False, True):
            op = HessianOperator(model, lm_loss, batches, backend=ReverseBackend(vectorize=vec))
            for k in ks_rev[vec]:
                yield f"ours-reverse-{'vec' if vec else 'seq'}", k, op.matmat_flat

    def difference():
        op = HessianOperator(model, lm_loss, batches, backend="difference")
        for k in (4,) if quick else (8,):
            yield "ours-difference", k, op.matmat_flat

    def forward():
        if multi:
            return
        op = HessianOperator(model, lm_loss, batches, backend="forward")
        for k in (2,) if quick else (1, 4, 8):
            yield "ours-forward", k, op.matmat_flat

    runs = {"reverse": reverse, "difference": difference, "forward": forward}
    for name in sorted(set(backends), key=list(runs).index):  # reverse, difference, forward, as before
        yield from runs[name]()
    k_py = 1 if quick and multi else 2 if quick or multi else 8
    yield "pyhessian", k_py, _pyhessian(model, batches, charge_graph=True)
    if not multi:
        yield "pyhessian-reuse", k_py, _pyhessian(model, batches, charge_graph=False)
    if not multi and not quick:
        yield "curvlinops-matvec", 1, _curvlinops(model, batches)
    yield "curvlinops-matmat", (2 if quick else 8), _curvlinops(model, batches)


def bench_model(
    arch: str,
    size: str,
    n_batches: int,
    repeats: int,
    quick: bool,
    seed: int = 0,
    backends: tuple[str, ...] = ("reverse", "forward", "difference"),
) -> list[dict]:
    """Rows for one model and batch count (see module docstring for the columns)."""
    model = build_model(arch, size, seed)
    vocab = SIZES[size]["vocab"]
    g = torch.Generator().manual_seed(seed)
    shape = QUICK_SHAPE if quick else (BATCH, SEQ)
    batches = [torch.randint(0, vocab, shape, generator=g) for _ in range(n_batches)]
    n_params = sum(p.numel() for p in model.parameters())
    grad = _gradient(model, batches)
    grad()  # warm-up
    V = torch.randn(16, n_params, generator=g)
    reference: dict[int, torch.Tensor] = {}
    rows = []
    for method, k, call in _methods(model, batches, quick, backends):
        row = dict(
            arch=arch,
            size=size,
            params=n_params,
            batches=n_batches,
            tokens=shape[0] * shape[1] * n_batches,
            method=method,
            k=k,
            ratio=None,
            hvp_s=None,
            grad_s=None,
            rel_err=None,
            status="ok",
        )
        try:
            ratios, hvps, grads = [], [], []
            if method.startswith("ours"):
                call(V[:1])  # warm-up (first-call overhead of vmap / the autograd engine)
            for _ in range(repeats):
                gc.collect()
                tg, _ = _timed(grad)
                th, out = _timed(lambda: call(V[:k]))
                th = getattr(call, "charged", None) or th
                ratios.append(th / (k * tg))
                hvps.append(th / k)
                grads.append(tg)
            row.update(ratio=statistics.median(ratios), hvp_s=statistics.median(hvps), grad_s=statistics.median(grads))
            if method.startswith("ours-reverse") and k not in reference:
                reference[k] = out
            ref = reference.get(max(reference)) if reference else None
            if not method.startswith("ours") and ref is not None:
                row["rel_err"] = rel_error(out, ref[:k])
            elif method in ("ours-forward", "ours-difference") and ref is not None:
                row["rel_err"] = rel_error(out, ref[:k])
        except Exception as e:  # peers are expected to fail on some models: record, do not crash
            row["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        rows.append(row)
    return rows


def oracle_verdict(
    size: str = "1M", seed: int = 0, shape: tuple[int, int] = (BATCH, SEQ), threads: int | None = 1
) -> dict:
    """Who is right where ours and curvlinops disagree? One product of each on the NeoX model in
    float64, judged by :class:`losslens.lm.models.oracles.LossOracle` (loss values only, no autograd).

    u = (Hv_curvlinops − Hv_ours)/‖·‖ is the direction of the disagreement: uᵀHv from the oracle
    says which product is right along it (``*_along_gap``: (uᵀHv_x − oracle)/‖Hv_ours − Hv_curvlinops‖,
    0 = agrees with the oracle, ±1 = off by the whole gap). Also the product's own direction and a
    random one (errors relative to ‖Hv‖). Everything runs inside
    :func:`~losslens.lm.models.oracles.float64_everywhere` (the eager softmax's float32 upcast made
    exact) and, for comparison, the products once more without it (``plain_rel_gap``).
    Cost: 2 HVPs, ~45 float64 forwards.
    """
    from losslens.lm.models.oracles import LossOracle, float64_everywhere

    with torch_threads(threads):
        model = build_model("neox", size, seed).double()
        g = torch.Generator().manual_seed(seed)
        batches = [torch.randint(0, SIZES[size]["vocab"], shape, generator=g)]
        dim = sum(p.numel() for p in model.parameters())
        v = torch.randn(1, dim, generator=g, dtype=torch.float64)
        v = v / v.norm()
        ours_op = HessianOperator(model, lm_loss, batches)
        plain = (ours_op.matmat_flat(v)[0], _curvlinops(model, batches)(v)[0])
        with float64_everywhere():
            ours, theirs = ours_op.matmat_flat(v)[0], _curvlinops(model, batches)(v)[0]
        orc = LossOracle(model, lm_loss, batches, step=0.05, levels=2)
        gap = theirs - ours
        scale, gnorm = float(ours.norm()), float(gap.norm())
        row = dict(
            model=f"neox-{size}",
            dtype="float64",
            tokens=shape[0] * shape[1],
            hv_norm=scale,
            rel_gap=gnorm / scale,
            plain_rel_gap=float((plain[1] - plain[0]).norm() / plain[0].norm()),
        )
        r = torch.randn(dim, generator=g, dtype=torch.float64)
        for name, u in (("gap", gap / gnorm), ("self", ours / scale), ("random", r / r.norm())):
            ref = orc.bilinear(u, v[0])
            norm = gnorm if name == "gap" else scale
            row[f"ours_along_{name}"] = (float(u @ ours) - ref.value) / norm
            row[f"curvlinops_along_{name}"] = (float(u @ theirs) - ref.value) / norm
            row[f"oracle_error_{name}"] = ref.error / norm
        row["forwards"] = orc.num_losses
        share = {n: float(gap[s_].norm() ** 2) / gnorm**2 for n, s_ in ours_op.space.slices.items()}
        top = sorted(share, key=share.get, reverse=True)[:3]
        row["gap_in"] = {n: round(share[n], 3) for n in top}  # share of ‖gap‖² in the largest parameters
    return row


def fingerprint_cost(sizes: tuple[str, ...] = ("1M", "10M"), threads: int | None = 1, repeats: int = 5) -> list[dict]:
    """Seconds of the graph cache's model fingerprint
    (:func:`losslens.geometry.operators.fingerprint.model_fingerprint`,
    one read of every parameter and buffer, paid once per product call with ``cache_graphs``)
    ÷ one gradient of a batch of 8 × 128 tokens (best of ``repeats``)."""
    from losslens.geometry.operators.fingerprint import model_fingerprint

    rows = []
    with torch_threads(threads):
        for size in sizes:
            model = build_model("neox", size)
            n = sum(p.numel() for p in model.parameters())
            batches = [torch.randint(0, SIZES[size]["vocab"], (BATCH, SEQ), generator=torch.Generator().manual_seed(0))]
            grad = _gradient(model, batches)
            grad()
            fp = min(_timed(lambda: model_fingerprint(model))[0] for _ in range(repeats))
            tg = min(_timed(grad)[0] for _ in range(3))
            rows.append(
                dict(
                    model=f"neox-{size}",
                    params=n,
                    fingerprint_s=fp,
                    ms_per_million=1e3 * fp / (n / 1e6),
                    gradient_s=tg,
                    ratio=fp / tg,
                )
            )
    return rows


def run(
    quick: bool = False,
    repeats: int | None = None,
    sizes: tuple[str, ...] | None = None,
    threads: int | None = 1,
    backends: tuple[str, ...] = ("reverse", "forward", "difference"),
) -> list[dict]:
    """All benchmark rows (list of dicts, columns as in :func:`format_table`).

    ``quick``: 1M models, batches 4×64, one repeat, a reduced method set, 2-batch rows.
    ``threads``: torch intra-op threads for the run (1 by default: the most stable ratios on a
    shared machine; ``None`` leaves torch's default). Multi-batch rows are run for the 1M models.
    """
    repeats = repeats if repeats is not None else (1 if quick else 3)
    sizes = ("1M",) if quick else (sizes or ("1M", "10M"))
    rows: list[dict] = []
    with torch_threads(threads):
        for size in sizes:
            for arch in ("neox", "llama"):
                rows += bench_model(arch, size, 1, repeats, quick, backends=backends)
                if size == "1M":
                    rows += bench_model(arch, size, 2 if quick else 8, repeats, quick, backends=backends)
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'model':<12}{'batches':>8}  {'method':<20}{'k':>4}{'HVP/grad':>10}{'grad s':>9}{'rel err':>10}  status"
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        gs = f"{r['grad_s']:.3f}" if r["grad_s"] is not None else "-"
        err = f"{r['rel_err']:.1e}" if r["rel_err"] is not None else "-"
        model = f"{r['arch']}-{r['size']}"
        lines.append(
            f"{model:<12}{r['batches']:>8}  {r['method']:<20}{r['k']:>4}{ratio:>10}{gs:>9}{err:>10}  {r['status']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1M models, one repeat, reduced set (< 60 s)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--sizes", default="1M,10M", help="comma-separated model sizes (1M, 10M)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    parser.add_argument(
        "--backend",
        default="reverse,forward,difference",
        help="comma-separated backends of ours to run: reverse, forward, difference",
    )
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="only judge ours vs curvlinops against the loss-value oracle (NeoX, float64)",
    )
    parser.add_argument("--fingerprint", action="store_true", help="only time the graph cache's fingerprint")
    parser.add_argument("--seed", type=int, default=0, help="--oracle: seed of the model, batch and vector")
    args = parser.parse_args(argv)
    if args.fingerprint:
        rows = fingerprint_cost(tuple(args.sizes.split(",")), threads=args.threads or None)
        print(json.dumps(rows, indent=1))
        return rows
    if args.oracle:
        shape = QUICK_SHAPE if args.quick else (BATCH, SEQ)
        row = oracle_verdict(args.sizes.split(",")[0], seed=args.seed, shape=shape, threads=args.threads or None)
        print(json.dumps(row, indent=1))
        return [row]
    print(
        f"# torch {torch.__version__}, {platform.machine()} {platform.processor() or ''}, "
        f"{args.threads or torch.get_num_threads()} threads"
    )
    rows = run(
        quick=args.quick,
        repeats=args.repeats,
        sizes=tuple(args.sizes.split(",")),
        threads=args.threads or None,
        backends=tuple(args.backend.split(",")),
    )
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
