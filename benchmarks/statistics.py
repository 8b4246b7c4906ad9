"""Calibration of the correlation inference along trajectories (issue 37, docs/science.md §6).

``python -m benchmarks.statistics [--reps N] [--quick] [--check-reps N] [--confirm N] [--json PATH]``

Simulated trajectories: R runs × m checkpoints; x and y are stationary AR(1) series with the same
φ whose innovations have correlation ρ, so the within-run correlation of x and y is exactly ρ (the
truth every interval should cover). Variants:

- ``plain``;
- ``offsets``: every run gets its own level for x and for y, independent N(0, 2²) in units of the
  series' standard deviation (a pooled r is then mostly between-run variation);
- ``lr``: a shared, trend-free cyclic LR, cos(2π · 3t/m), added to x (× 1.5 sd) and to y (× −1.0
  sd), controlled by the partial correlation (the row's truth is still ρ).

For each cell, ``reps`` replicates go through :func:`losslens.study.analysis.inference.infer_within` —
the function every table row of :func:`losslens.study.analysis.summary` calls — vectorised over the
replicates. Reported per cell: the share of replicates whose row is descriptive; among the others
the coverage of the 95% interval (ρ inside), the rejection rate of p < 0.05 (the size at ρ = 0,
the power at ρ ≠ 0), and the median interval width. ``--check-reps`` replicates of one cell (4 runs
× 30, φ = 0.9, LR control) also go through the public ``summary`` API as tidy rows, and their
intervals and p-values are compared with the vectorised ones (they must agree to 1e-9).

Cost: the default grid (φ 0.5/0.8/0.9/0.95 × runs 2/4/8 × m 10/30/100/150 × 3 variants × ρ 0/0.5,
2,000 replicates) runs in a few minutes on one core; memory ≈ reps · R · m · 8 bytes × a few.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time

import numpy as np

from losslens.study.analysis import inference as inf

PHIS = (0.5, 0.8, 0.9, 0.95)
RUNS = (2, 4, 8)
LENGTHS = (10, 30, 100, 150)
VARIANTS = ("plain", "offsets", "lr")


def simulate(rng: np.random.Generator, reps: int, runs: int, m: int, phi: float, rho: float, variant: str):
    """(x [reps, runs, m], y [reps, runs, m], lr [m] or None): the model in the module docstring."""
    shape = (reps, runs, m)
    e1 = rng.standard_normal(shape)
    e2 = rho * e1 + math.sqrt(1 - rho * rho) * rng.standard_normal(shape)
    x, y = np.empty(shape), np.empty(shape)
    x[..., 0], y[..., 0] = e1[..., 0], e2[..., 0]  # stationary start: unit variance
    s = math.sqrt(1 - phi * phi)
    for t in range(1, m):
        x[..., t] = phi * x[..., t - 1] + s * e1[..., t]
        y[..., t] = phi * y[..., t - 1] + s * e2[..., t]
    lr = None
    if variant == "offsets":
        x += 2.0 * rng.standard_normal((reps, runs, 1))
        y += 2.0 * rng.standard_normal((reps, runs, 1))
    elif variant == "lr":
        lr = np.cos(2 * np.pi * 3 * np.arange(m) / m)
        x += 1.5 * lr
        y -= 1.0 * lr
    return x, y, lr


def cell(rng, reps: int, runs: int, m: int, phi: float, rho: float, variant: str) -> dict:
    x, y, lr = simulate(rng, reps, runs, m, phi, rho, variant)
    xs, ys = [x[:, i] for i in range(runs)], [y[:, i] for i in range(runs)]
    zs = None if lr is None else [np.broadcast_to(lr[:, None], (m, 1))] * runs
    res = inf.infer_within(xs, ys, zs, "pearson")
    ok = res["status"] != 2
    n_ok = int(ok.sum())
    cover = (res["ci_low"] <= rho) & (rho <= res["ci_high"])
    reject = res["p"] < 0.05
    width = res["ci_high"] - res["ci_low"]
    return {
        "phi": phi,
        "runs": runs,
        "m": m,
        "variant": variant,
        "rho": rho,
        "reps": reps,
        "method": "/".join(sorted({inf.STATUS[s] for s in np.unique(res["status"])})),
        "descriptive": 1 - n_ok / reps,
        "coverage": float(cover[ok].mean()) if n_ok else math.nan,
        "reject": float(reject[ok].mean()) if n_ok else math.nan,
        "width": float(np.median(width[ok])) if n_ok else math.nan,
        "n_eff": float(np.nanmedian(res["n_eff"])),
    }


def check_through_summary(reps: int, seed: int = 1) -> dict:
    """``reps`` replicates of 4 runs × 30, φ = 0.9, LR control, ρ = 0, through ``summary`` (tidy rows)
    and through :func:`infer_within` on the same data: the largest difference of their intervals and
    p-values, and the coverage/rejection of the summary rows."""
    import pandas as pd

    from losslens.study.analysis import summary

    runs, m, phi = 4, 30, 0.9
    x, y, lr = simulate(np.random.default_rng(seed), reps, runs, m, phi, 0.0, "lr")
    xs, ys = [x[:, i] for i in range(runs)], [y[:, i] for i in range(runs)]
    vec = inf.infer_within(xs, ys, [np.broadcast_to(lr[:, None], (m, 1))] * runs, "pearson")
    diff, cover, reject = 0.0, 0, 0
    for i in range(reps):
        rows = []
        for j in range(runs):
            for t in range(m):
                base = {
                    "run": f"r{j}",
                    "checkpoint": f"step-{t:04d}",
                    "step": t,
                    "tokens": t,
                    "lr": lr[t],
                    "status": "ok",
                    "derived": False,
                    "spec": None,
                    "settings": "s",
                    "data": "d",
                    "converged": True,
                }
                rows += [
                    {**base, "probe": "trace", "metric": "trace", "value": x[i, j, t]},
                    {**base, "probe": "quant", "metric": "rel_loss_error", "spec": "rtn:4", "value": y[i, j, t]},
                ]
        tab = summary(pd.DataFrame(rows), x="trace", y="rtn:4", controls=["lr"], methods=("pearson",))
        row = tab[tab["controls"] == "lr"].iloc[0]
        for key in ("ci_low", "ci_high", "p"):
            diff = max(diff, abs(float(row[key]) - float(vec[key][i])))
        cover += row["ci_low"] <= 0 <= row["ci_high"]
        reject += row["p"] < 0.05
    return {
        "reps": reps,
        "max_abs_diff": diff,
        "coverage": cover / reps,
        "reject": reject / reps,
        "method": str(row["inference"]),
    }


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="only the issue's cells: 4 runs × 30 and 8 runs × 100")
    ap.add_argument("--check-reps", type=int, default=200, help="replicates of the check cell through summary()")
    ap.add_argument(
        "--confirm",
        type=int,
        default=0,
        help="replicates for a second pass over the issue's cells (4 runs × 30, φ 0.8/0.9/0.95, ρ = 0)",
    )
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    grid = [(r, m) for r in RUNS for m in LENGTHS] if not args.quick else [(4, 30), (8, 100)]
    t0 = time.perf_counter()
    rows = []
    print("| φ | runs × m | variant | ρ | method | descriptive | coverage | rejects p<0.05 | width | n_eff |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for phi in PHIS:
        for runs, m in grid:
            for variant in VARIANTS:
                for rho in (0.0, 0.5):
                    c = cell(rng, args.reps, runs, m, phi, rho, variant)
                    rows.append(c)
                    print(
                        f"| {phi} | {runs} × {m} | {variant} | {rho} | {c['method']} | "
                        f"{100 * c['descriptive']:.0f}% | {100 * c['coverage']:.1f}% | {100 * c['reject']:.1f}% | "
                        f"{c['width']:.2f} | {c['n_eff']:.1f} |",
                        flush=True,
                    )
    seconds, n_grid = time.perf_counter() - t0, len(rows)
    if args.confirm:
        crng = np.random.default_rng(args.seed + 1)
        for phi in (0.8, 0.9, 0.95):
            for variant in VARIANTS:
                c = cell(crng, args.confirm, 4, 30, phi, 0.0, variant)
                rows.append({**c, "confirm": True})
                print(
                    f"confirm {args.confirm} replicates: φ {phi} 4 × 30 {variant}: "
                    f"coverage {100 * c['coverage']:.2f}%, "
                    f"size {100 * c['reject']:.2f}%",
                    flush=True,
                )
    check = check_through_summary(args.check_reps) if args.check_reps else None
    if check:
        print(f"check cell through summary(): {check}")
        assert check["max_abs_diff"] < 1e-9, check
    print(
        f"{n_grid} cells × {args.reps} replicates in {seconds:.0f} s on "
        f"{platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, numpy {np.__version__}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cells": rows, "check": check, "seconds": seconds, "reps": args.reps}, f, indent=1)
    return rows


def run(quick: bool = False) -> list[dict]:
    """``losslens bench statistics``: the full grid, or (``quick``) the issue's cells at 500 replicates."""
    return main(["--quick", "--reps", "500", "--check-reps", "20"] if quick else [])


if __name__ == "__main__":
    main()
