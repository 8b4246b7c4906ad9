"""Task accuracy along an embedded trajectory: does the embedded task measure anything, and what does it cost?

``python -m benchmarks.accuracy [--quick] [--json PATH] [--threads N]``

Trains (or reuses, cached) the embedded trajectory at the demo's size (:class:`TrainConfig`
defaults: 0.17M-parameter GPT-NeoX, WSD, peak LR 3e-3, 800 steps, 8 checkpoints; quick:
``TrainConfig.tiny()``), then scores every checkpoint on the embedded task ``losslens_pydoc_mc``
(every item, or ``--limit`` N of them, seeded; quick: 200) under FP and the demo's headline quantizer
``rtn:2:g32``, through :func:`losslens.measure.accuracy.task_accuracy`. Rows:

- ``baseline``: the length-only rules (always the longest / shortest choice) and chance;
- one row per checkpoint: step, FP loss (validation), acc ± stderr and acc_norm (FP), Δacc with its
  paired 95% interval, and the cost: **seconds per 100 items** of one model's scoring (FP), the
  quantized model's (quantizer included), and the one-off task preparation.

The check of issue #28: a trained model scores above chance and its accuracy climbs with
training (``climbs``: Spearman ρ of acc against step; ``above_chance``: acc − 1.96·stderr > 0.25 at
the last checkpoint). Threads pinned (``--threads``, default 1) and restored afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

SPEC = "rtn:2:g32"


def _cache_dir(cache: str | None) -> Path:
    root = Path(cache or os.environ.get("LOSSLENS_CACHE") or Path.home() / ".cache" / "losslens")
    root.mkdir(parents=True, exist_ok=True)
    return root


def trajectory(quick: bool, cache: str | None = None):
    from losslens.lm.train.config import TrainConfig
    from losslens.lm.train.tiny import train_tiny

    cfg = TrainConfig.tiny(steps=120, checkpoints=4) if quick else TrainConfig()
    out = _cache_dir(cache) / f"bench-accuracy-{cfg.run_name}-{'tiny' if quick else 'demo'}"
    return train_tiny(cfg, out, progress=False)


def run(quick: bool = False, threads: int = 1, cache: str | None = None, limit: int | None = None) -> list[dict]:
    import torch
    from scipy.stats import spearmanr

    from losslens.measure.accuracy import TASK_NAME, embedded_items, length_baselines, prepare_tasks, select_tasks
    from losslens.measure.accuracy.variants import evaluate_variants
    from losslens.lm.checkpoints import CheckpointLoader
    from losslens.lm.core.threads import torch_threads
    from losslens.lm.data import load_tokenizer

    limit = limit if limit is not None else 200 if quick else None
    rows: list[dict] = [{"row": "baseline", **length_baselines(embedded_items())}]
    with torch_threads(threads):
        traj = trajectory(quick, cache)
        tok = load_tokenizer(traj[0])
        t0 = time.perf_counter()
        sel = select_tasks("embedded")
        prepared = prepare_tasks(sel, limit=limit, seed=0)
        prep_s = time.perf_counter() - t0
        loader = CheckpointLoader(traj)
        for ref in traj.real:
            model = loader.load(ref).eval()
            t1 = time.perf_counter()
            fp = evaluate_variants(model, tok, sel, (), limit=limit, seed=0, prepared=prepared, n_boot=0)
            fp_s = time.perf_counter() - t1
            t2 = time.perf_counter()
            rep = evaluate_variants(
                model, tok, sel, (SPEC,), limit=limit, seed=0, prepared=prepared, fp_scores=fp.scores["fp"], n_boot=2000
            )
            q_s = time.perf_counter() - t2
            s = rep.scores["fp"][TASK_NAME]
            d = rep.deltas[SPEC][TASK_NAME]
            rows.append(
                {
                    "row": str(ref.label),
                    "step": ref.step,
                    "val_loss": (ref.meta or {}).get("val_loss"),
                    "n": s.n,
                    "acc": s.acc,
                    "acc_stderr": s.acc_stderr,
                    "acc_norm": s.acc_norm,
                    f"acc[{SPEC}]": rep.scores[SPEC][TASK_NAME].acc,
                    "delta_acc": d.delta,
                    "delta_ci": [d.ci_low, d.ci_high],
                    "p_mcnemar": d.p,
                    "s_per_100_items_fp": 100 * fp_s / s.n,
                    "s_per_100_items_quant": 100 * q_s / s.n,
                    "prepare_s": prep_s,
                    "threads": torch.get_num_threads(),
                }
            )
    ck = [r for r in rows if "step" in r]
    rho = float(spearmanr([r["step"] for r in ck], [r["acc"] for r in ck])[0]) if len(ck) > 2 else float("nan")
    last = ck[-1]
    rows.append(
        {
            "row": "verdict",
            "climbs_spearman": rho,
            "above_chance": bool(last["acc"] - 1.96 * last["acc_stderr"] > 0.25),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "torch": torch.__version__,
        }
    )
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--limit", type=int, default=None, help="a seeded subsample of N items (default: all; quick: 200)")
    a = p.parse_args(argv)
    rows = run(a.quick, a.threads, a.cache, a.limit)
    for r in rows:
        print(json.dumps(r, default=str))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2, default=str))
    return rows


if __name__ == "__main__":
    main()
