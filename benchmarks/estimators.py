"""Trace-estimator accuracy per HVP budget: Hutchinson vs Hutch++ (relative error, lower is better).

``python -m benchmarks.estimators [--quick] [--seeds N] [--neox 1M|micro|none] [--device cpu|cuda] [--json PATH]``

Two problems, every estimator through :mod:`losslens.geometry.estimators.trace`:

- ``mlp-exact``: a small MLP (10-24-12-4, tanh, 616 parameters, float64) trained briefly on a
  synthetic 4-class task, cross-entropy over 128 examples; its exact Hessian is built with
  :func:`losslens.geometry.operators.dense.exact_hessian` and wrapped in a
  :class:`~losslens.geometry.operators.dense.DenseOperator`;
  the reference is the exact trace.
- ``neox-1M``: a randomly initialised HF GPT-NeoX causal LM (hidden 128, 4 layers, 4 heads, MLP 512,
  vocab 1024, untied embeddings: 1,055,488 parameters, float32, eager attention), one batch of
  2 × 32 random tokens, :func:`losslens.lm.core.next_token_loss.lm_loss`, through
  :class:`losslens.geometry.operators.hessian.HessianOperator`; the reference is a long Hutchinson run (2,000 HVPs,
  seed 10,000, its own relative standard error is reported as ``ref_rel_se``: errors below it are
  not resolved). ``--quick`` skips it (the MLP part alone runs in well under a minute on 2 cores);
  ``--neox micro`` replaces it by a micro NeoX (hidden 32, 2 layers, vocab 128, 25,344 parameters)
  with a 500-HVP reference and budgets up to 100. Cost of the 1M part: 2,000 + seeds · 740 HVPs
  (≈ 4,200 with 3 seeds); on a 2-core CPU shared with other jobs (load ≈ 10) it did not finish in
  35 minutes, so run it on a quiet machine or with ``--device cuda``.

For each budget m in 10/30/100/300 and seeds 0..S−1 the benchmark records the mean over seeds of
``|estimate − reference| / |reference|`` for ``hutchinson_trace(op, m, seed)`` and
``hutchpp_trace(op, m, seed)`` and the ratio Hutchinson error ÷ Hutch++ error (> 1: Hutch++ is
more accurate at equal cost). For the NeoX model the Hutchinson estimates at the smaller budgets
are the prefixes of one 300-probe run per seed — identical numbers to separate calls, since the
probe stream of a seed does not depend on the budget — which saves HVPs.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from losslens.geometry.operators.dense import DenseOperator, exact_hessian
from losslens.geometry.estimators.trace import _hutchinson_samples, hutchinson_trace, hutchpp_trace
from losslens.lm.core.numerics import rel_error

BUDGETS = (10, 30, 100, 300)


def _mlp_problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 24), nn.Tanh(), nn.Linear(24, 12), nn.Tanh(), nn.Linear(12, 4)).double()
    x = torch.randn(128, 10, generator=g, dtype=torch.float64)
    w = torch.randn(10, 4, generator=g, dtype=torch.float64)
    y = (x @ w + 0.5 * torch.randn(128, 4, generator=g, dtype=torch.float64)).argmax(1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(200):  # a briefly trained net: a few large Hessian eigenvalues, a long tail
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    model.zero_grad(set_to_none=True)
    H, space = exact_hessian(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), [(x, y)])
    return H, space


def _neox_problem(micro: bool, device: str = "cpu"):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from losslens.geometry.operators.hessian import HessianOperator
    from losslens.lm.core.next_token_loss import lm_loss

    if micro:
        cfg = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
        tokens = (1, 16)
    else:
        cfg = dict(vocab_size=1024, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512)
        tokens = (2, 32)
    torch.manual_seed(0)
    config = GPTNeoXConfig(max_position_embeddings=128, attn_implementation="eager", **cfg)
    model = GPTNeoXForCausalLM(config).eval().to(device)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, cfg["vocab_size"], tokens, generator=g).to(device)]
    return HessianOperator(model, lm_loss, batches), sum(p.numel() for p in model.parameters())


def _rows(problem: str, dim: int, ref: float, ref_rel_se: float, budgets, errs_h, errs_pp, secs) -> list[dict]:
    rows = []
    for m in budgets:
        eh, ep = float(np.mean(errs_h[m])), float(np.mean(errs_pp[m]))
        rows.append(
            dict(
                problem=problem,
                dim=dim,
                budget=m,
                seeds=len(errs_h[m]),
                reference=ref,
                ref_rel_se=ref_rel_se,
                hutchinson_rel_err=eh,
                hutchpp_rel_err=ep,
                ratio=eh / ep if ep > 0 else math.inf,
                seconds=secs,
                machine=platform.machine(),
                threads=torch.get_num_threads(),
            )
        )
    return rows


def bench_mlp(seeds: int) -> list[dict]:
    t0 = time.perf_counter()
    H, space = _mlp_problem()
    exact = float(torch.trace(H))
    errs_h = {m: [] for m in BUDGETS}
    errs_pp = {m: [] for m in BUDGETS}
    for m in BUDGETS:
        for s in range(seeds):
            errs_h[m].append(rel_error(hutchinson_trace(DenseOperator(H), m, seed=s).value, exact))
            errs_pp[m].append(rel_error(hutchpp_trace(DenseOperator(H), m, seed=s).value, exact))
    return _rows("mlp-exact", space.dim, exact, 0.0, BUDGETS, errs_h, errs_pp, time.perf_counter() - t0)


def _log(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)


def bench_neox(seeds: int, micro: bool = False, device: str = "cpu") -> list[dict]:
    t0 = time.perf_counter()
    op, dim = _neox_problem(micro, device)
    budgets = BUDGETS[:3] if micro else BUDGETS
    ref_est = hutchinson_trace(op, 500 if micro else 2000, seed=10_000)
    ref = ref_est.value
    _log(f"reference {ref:.6g} ± {ref_est.stderr:.3g} ({ref_est.num_matvecs} HVPs, {ref_est.seconds:.0f} s)")
    errs_h = {m: [] for m in budgets}
    errs_pp = {m: [] for m in budgets}
    for s in range(seeds):
        samples, _, _ = _hutchinson_samples(op, max(budgets), s, 16, None)
        for m in budgets:
            errs_h[m].append(rel_error(float(samples[:m].mean()), ref))
            errs_pp[m].append(rel_error(hutchpp_trace(op, m, seed=s).value, ref))
        _log(
            f"seed {s} ({time.perf_counter() - t0:.0f} s): "
            + ", ".join(f"m={m} hutchinson {errs_h[m][-1]:.4f} hutch++ {errs_pp[m][-1]:.4f}" for m in budgets)
        )
    name = "neox-micro" if micro else "neox-1M"
    return _rows(name, dim, ref, ref_est.rel_stderr, budgets, errs_h, errs_pp, time.perf_counter() - t0)


def run(quick: bool = False, seeds: int | None = None, neox: str | None = None, device: str = "cpu") -> list[dict]:
    """All rows: one per (problem, budget).

    ``quick``: 5 seeds, MLP only (< 60 s). ``neox``: ``"1M"`` (default when not quick), ``"micro"``
    or ``"none"`` (default when quick). Cost of the 1M part: 2,000 + seeds · (300 + 440) HVPs.
    """
    neox = neox or ("none" if quick else "1M")
    if neox not in ("1M", "micro", "none"):
        raise ValueError(f"neox must be '1M', 'micro' or 'none', got {neox!r}")
    rows = bench_mlp(seeds or (5 if quick else 10))
    if neox != "none":
        rows += bench_neox(seeds or (2 if quick or neox == "micro" else 3), micro=neox == "micro", device=device)
    return rows


def format_table(rows: list[dict]) -> str:
    head = (
        f"{'problem':<12}{'dim':>9}{'budget':>8}{'seeds':>6}"
        f"{'hutchinson':>12}{'hutch++':>10}{'ratio':>8}{'ref_rel_se':>12}"
    )
    lines = ["relative trace error (mean over seeds); ratio = Hutchinson error / Hutch++ error", head]
    for r in rows:
        lines.append(
            f"{r['problem']:<12}{r['dim']:>9}{r['budget']:>8}{r['seeds']:>6}{r['hutchinson_rel_err']:>12.4f}"
            f"{r['hutchpp_rel_err']:>10.4f}{r['ratio']:>8.2f}{r['ref_rel_se']:>12.4f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small settings (< 60 s)")
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds per budget (default 10 MLP / 3 NeoX; quick 5 / 2)"
    )
    parser.add_argument(
        "--neox",
        choices=["1M", "micro", "none"],
        default=None,
        help="the LM part: 1M (default), micro, or none (default with --quick)",
    )
    parser.add_argument("--device", default="cpu", help="device of the NeoX model (cpu, cuda)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    rows = run(quick=args.quick, seeds=args.seeds, neox=args.neox, device=args.device)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
