"""Sweep throughput on the embedded trajectory: wall time per checkpoint by probe; Ray (2 workers) vs local.

``python -m benchmarks.sweep [--quick] [--checkpoints N] [--no-ray] [--cache DIR] [--json PATH]``

1. The embedded trajectory is trained once with :func:`losslens.lm.train.tiny.train_tiny` and cached
   (``--cache``, default ``$LOSSLENS_CACHE`` or ``~/.cache/losslens``): full mode the default
   ``TrainConfig`` (GPT-NeoX, hidden 128, 4 layers, 1.06M parameters, 600 steps, WSD) with 20
   checkpoints; ``--quick`` the ``TrainConfig.tiny`` preset (hidden 32, 2 layers) with 20
   checkpoints. Training time is reported, not counted.
2. The token sets are built once (:func:`losslens.study.sweep.build_data`) and passed to every sweep, so
   sweep times exclude tokenization.
3. Local sweep of the plan — FP loss, RTN 3/4-bit g128, GPTQ 3/4-bit g128, Hutch++ trace
   (100 HVPs; quick: 30), λ_max (Lanczos, tol 1e-3, ≤ 100 steps; quick ≤ 20), weight kurtosis;
   curvature on one batch of 16 × 128 tokens — into a fresh store, with 1 and with 2 local worker
   processes (1 thread each): wall time of the whole sweep and per checkpoint, broken down by probe
   (load, loss, each quantizer, trace, eigen, kurtosis), whether the 2-worker store is identical to
   the 1-worker one, and the speed-up. Goal (full mode): ≤ 10 min; 2 workers ≥ 1.7× one.
4. The same plan with the Ray executor on a local cluster of 2 CPUs (2 workers, one checkpoint
   per task) into another fresh store; the cluster is started before the timer. The ratio
   local ÷ ray wall time is the speed-up (goal ≥ 1.7×); ``ray_concurrency`` = summed probe time of
   all tasks ÷ Ray wall time (≈ 2 when both workers are busy all along: the executor's share of the
   speed-up; the rest depends on whether the 2 cores are really free). The two stores' values are
   compared (``max_rel_diff`` over loss, q_loss, trace, λ, kurtosis).

Local runs use 1 torch thread (the per-core baseline; ``--local-threads 1,0`` adds torch's default
thread count) and each Ray worker 1 thread (Ray sets OMP_NUM_THREADS=1), so 2 workers use the same 2
cores. On a machine shared with other jobs multi-threaded torch can be an order of magnitude
slower than single-threaded (oversubscription); ``load_avg_1m`` is reported with every total.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

QUICK_CHECKPOINTS = 20
FULL_CHECKPOINTS = 20


def _cache_dir(cache: str | None) -> Path:
    root = Path(cache or os.environ.get("LOSSLENS_CACHE") or Path.home() / ".cache" / "losslens")
    root.mkdir(parents=True, exist_ok=True)
    return root


def embedded_trajectory(quick: bool, checkpoints: int, cache: str | None = None):
    """(trajectory, training seconds; 0 when cached)."""
    from losslens.lm.train.config import TrainConfig
    from losslens.lm.train.tiny import train_tiny

    # full mode: the 1.06M-parameter model of the recorded benchmark (benchmarks/README.md), pinned
    # here so that a change of train-tiny's defaults does not silently change what is measured
    cfg = (
        TrainConfig.tiny(checkpoints=checkpoints)
        if quick
        else TrainConfig(
            checkpoints=checkpoints,
            steps=600,
            weight_decay=0.1,
            seq_len=128,
            hidden_size=128,
            num_layers=4,
            vocab_size=1024,
        )
    )
    out = _cache_dir(cache) / f"bench-sweep-{cfg.run_name}-{'tiny' if quick else 'default'}-c{checkpoints}"
    t = time.perf_counter()
    traj = train_tiny(cfg, out, progress=False)
    return traj, time.perf_counter() - t


def bench_plan(quick: bool):
    from losslens.study.sweep import DataSpec, EigenProbe, Plan, TraceProbe

    # the curvature set is one batch of 16 x 128 (the same 2,048 tokens as the earlier (2, 8, 128)),
    # λ_max by Lanczos, as Plan.default does since issue #14
    data = (
        DataSpec(eval=(4, 4, 32), calibration=(4, 4, 32), curvature=(1, 4, 32))
        if quick
        else DataSpec(eval=(8, 8, 128), calibration=(8, 8, 128), curvature=(1, 16, 128))
    )
    return Plan(
        loss=True,
        quant=("rtn:3:g128", "rtn:4:g128", "gptq:3:g128", "gptq:4:g128"),
        trace=TraceProbe("hutch++", 30 if quick else 100),
        eigen=EigenProbe(k=1, method="lanczos", tol=1e-3, max_iter=20 if quick else 100),
        kurtosis=True,
        data=data,
        name="bench-quick" if quick else "bench",
    )


def _breakdown(report) -> list[dict]:
    rows = []
    for ck, parts in report.probe_seconds.items():
        row = {"section": "per_checkpoint", "checkpoint": ck}
        row.update({f"{k}_s": round(v, 3) for k, v in parts.items()})
        row["total_s"] = round(sum(parts.values()), 3)
        rows.append(row)
    return rows


def run(
    quick: bool = False,
    checkpoints: int | None = None,
    ray_compare: bool = True,
    cache: str | None = None,
    local_threads: tuple[int, ...] = (1,),
    workers: tuple[int, ...] = (1, 2),
) -> list[dict]:
    """Rows: ``total`` per local variant (threads × worker processes), ``ray_vs_local`` per local
    variant, the mean per-probe breakdown and one ``per_checkpoint`` row per checkpoint.
    ``local_threads``: torch thread counts per process (0 = torch's default); ``workers``: local
    worker processes; the breakdown comes from the first (1 worker)."""
    import torch

    from losslens.study.sweep import Store, build_data, run_sweep
    from losslens.study.sweep.executor import with_plan_checkpoints

    n_ck = checkpoints or (QUICK_CHECKPOINTS if quick else FULL_CHECKPOINTS)
    traj, train_s = embedded_trajectory(quick, n_ck, cache)
    plan = bench_plan(quick)
    t = time.perf_counter()
    sets = build_data(plan, with_plan_checkpoints(traj, plan)[0])
    data_s = time.perf_counter() - t
    n_params = None
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        variants = [(t or None, w) for w in workers for t in local_threads]
        local_runs = {}
        for threads, w in variants:
            store = Path(tmp) / f"local-{threads or 'default'}-w{w}.sqlite"
            t = time.perf_counter()
            rep = run_sweep(traj, plan, out=store, token_sets=sets, progress=False, num_threads=threads, num_workers=w)
            local_runs[(threads, w)] = (rep, time.perf_counter() - t, store)
        local, local_s, local_store = local_runs[variants[0]]
        per = _breakdown(local)
        keys = sorted({k for r in per for k in r if k.endswith("_s") and k != "total_s"})
        mean = {
            "section": "mean_per_checkpoint",
            "checkpoint": f"mean of {len(per)} (local, threads={variants[0][0] or 'default'}, 1 worker)",
        }
        for k in keys:
            vals = [r.get(k, 0.0) for r in per]
            mean[k] = round(sum(vals) / len(vals), 3)
        mean["total_s"] = round(sum(r["total_s"] for r in per) / len(per), 3)
        with Store(local_store) as st:
            df = st.results()
        try:
            from losslens.lm.checkpoints import CheckpointLoader

            n_params = sum(p.numel() for p in CheckpointLoader(traj).load(traj[0]).parameters())
        except Exception:
            pass
        same = {}
        if len(local_runs) > 1:  # workers must not change a single value
            from losslens.study.sweep import Store as _Store

            cols = ["checkpoint", "probe", "spec", "metric"]
            base = _Store(local_store).results().sort_values(cols)["value"].fillna(-1.0).to_numpy()
            for key, (_, _, st_path) in local_runs.items():
                other = _Store(st_path).results().sort_values(cols)["value"].fillna(-1.0).to_numpy()
                same[key] = bool(len(other) == len(base) and (other == base).all())
        for (threads, w), (rep, secs, _) in local_runs.items():
            rows.append(
                {
                    "section": "total",
                    "executor": "local",
                    "workers": w,
                    "identical_to_1_worker": same.get((threads, w)),
                    "speedup_vs_1_worker": round(local_runs[(threads, 1)][1] / secs, 3)
                    if (threads, 1) in local_runs
                    else None,
                    "torch_threads": threads or torch.get_num_threads(),
                    "checkpoints": len(traj),
                    "rows_ok": rep.n_ok,
                    "rows_failed": rep.n_failed,
                    "wall_s": round(secs, 2),
                    "goal_s": 600.0,
                    "meets_goal": bool(secs <= 600.0),
                    "train_s": round(train_s, 1),
                    "data_s": round(data_s, 2),
                    "params": n_params,
                    "cpus": os.cpu_count(),
                    "quick": quick,
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                }
            )
        rows.append(mean)
        rows.extend(per)
        if ray_compare:
            try:
                import ray
            except ImportError:
                rows.append({"section": "ray_vs_local", "note": "ray is not installed"})
                return rows
            t = time.perf_counter()
            started = False
            if not ray.is_initialized():
                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
                started = True
            # warm the two workers (imports) outside the timer
            warm = ray.remote(num_cpus=1)(_warm)
            ray.get([warm.remote() for _ in range(2)])
            init_s = time.perf_counter() - t
            try:
                ray_store = Path(tmp) / "ray.sqlite"
                t = time.perf_counter()
                remote = run_sweep(traj, plan, out=ray_store, token_sets=sets, progress=False, executor="ray")
                ray_s = time.perf_counter() - t
            finally:
                if started:
                    ray.shutdown()
            with Store(ray_store) as st:
                df_ray = st.results()
            key = ["checkpoint", "probe", "spec", "metric"]
            m = df.merge(df_ray, on=key, suffixes=("_l", "_r"))
            m = m[m.metric.isin(["loss", "q_loss", "trace", "lambda_1", "pooled"])]
            rel = ((m.value_l - m.value_r).abs() / m.value_l.abs().clip(lower=1e-12)).max() if len(m) else float("nan")
            busy = sum(sum(v.values()) for v in remote.probe_seconds.values())
            for (threads, w), (rep, secs, _) in local_runs.items():
                if w != 1:
                    continue
                rows.append(
                    {
                        "section": "ray_vs_local",
                        "ray_concurrency": round(busy / ray_s, 2),
                        "workers": 2,
                        "local_threads": threads or torch.get_num_threads(),
                        "local_s": round(secs, 2),
                        "ray_s": round(ray_s, 2),
                        "speedup": round(secs / ray_s, 3),
                        "goal": 1.7,
                        "meets_goal": bool(secs / ray_s >= 1.7),
                        "ray_init_s": round(init_s, 2),
                        "rows_ok": remote.n_ok,
                        "rows_failed": remote.n_failed,
                        "max_rel_diff": float(rel),
                        "load_avg_1m": round(os.getloadavg()[0], 2),
                    }
                )
    return rows


def _warm():
    import losslens.study.sweep.runner  # noqa: F401

    return None


def format_table(rows: list[dict]) -> str:
    lines = []
    for sec in ("total", "ray_vs_local", "mean_per_checkpoint", "per_checkpoint"):
        part = [r for r in rows if r.get("section") == sec]
        if not part:
            continue
        cols: list[str] = []
        for r in part:
            cols += [c for c in r if c not in cols and c != "section"]
        lines.append(f"== {sec}")
        lines.append(" | ".join(cols))
        for r in part:
            lines.append(" | ".join(f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny preset trajectory, 30 HVPs (< 90 s on an idle 2-core machine)"
    )
    parser.add_argument("--checkpoints", type=int, default=None, help="checkpoints of the trajectory (default 20)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray comparison")
    parser.add_argument(
        "--local-threads", default="1", help="comma-separated torch thread counts of the local runs (0 = torch default)"
    )
    parser.add_argument("--cache", default=None, help="folder for the trained trajectory (default ~/.cache/losslens)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    threads = tuple(int(x) for x in args.local_threads.split(",") if x.strip())
    rows = run(
        quick=args.quick,
        checkpoints=args.checkpoints,
        ray_compare=not args.no_ray,
        cache=args.cache,
        local_threads=threads or (1,),
    )
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
