"""Sections 5–7 of the GPU check: quantizers, task accuracy and a whole sweep on the device.

- ``quant``: GPTQ (4-bit, g128) and AWQ (4-bit, g128) of one decoder layer of the 1B shape (quick:
  the 14M shape), on the device and on the CPU from the same weights and calibration: seconds on
  each, and ΔQ (L(θ̂)/L(θ) − 1 on held-out random tokens) within 2% (relative) of the CPU's — the
  two sides differ by float32 reduction order, which can flip a rounding decision at a tie.
- ``accuracy``: the accuracy probe (FP and rtn:2:g32) on the embedded task of a tiny trained run:
  the same accuracy as on the CPU, and the mean log-likelihoods within 1e-4.
- ``sweep``: a three-checkpoint sweep of the tiny trained run (loss, rtn:4, Hutchinson, λ_max) on
  the device, then its HTML report: every row ok, the report written.
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path

import torch

from ._common import Context, check, info, rel_diff

QUANT_TOL, LOGLIK_TOL = 0.02, 1e-4


def _tiny_run(ctx: Context) -> Path:
    """A tiny trained trajectory (``losslens train-tiny --tiny``), trained once per check on the CPU."""
    if "tiny_run" not in ctx.notes:
        from losslens.lm.train.config import TrainConfig
        from losslens.lm.train.tiny import train_tiny

        out = Path(tempfile.mkdtemp(prefix="losslens-gpu-check-"))
        train_tiny(TrainConfig.tiny(), out / "run", progress=False, data_dir=out / "data")
        ctx.notes["tiny_run"] = out / "run"
    return ctx.notes["tiny_run"]


def quant(ctx: Context) -> list[dict]:
    """GPTQ and AWQ of one layer stack: device vs CPU seconds and ΔQ."""
    from benchmarks.shapes import SHAPES, build
    from losslens.lm.quant import quantization_error

    shape = "pythia-14m" if ctx.quick else "olmo-2-1b"
    seq = 64 if ctx.quick else 512
    cpu = build(shape, torch.float32, layers=1)
    dev = copy.deepcopy(cpu).to(ctx.device)
    g = torch.Generator().manual_seed(0)
    h, _, _, ff, vocab = SHAPES[shape]
    n_seq = -(-max(h, ff) // seq) + 1  # GPTQ needs at least in-features token rows for a full-rank H
    calib = [torch.randint(0, vocab, (n_seq, seq), generator=g)]
    evals = [torch.randint(0, vocab, (4, seq), generator=g) for _ in range(2)]
    out = []
    for spec in ("gptq:4:g128", "awq:4:g128"):
        res = {}
        for side, model in (("cpu", cpu), ("device", dev)):
            d = next(model.parameters()).device
            t0 = time.perf_counter()
            qe = quantization_error(model, spec, [e.to(d) for e in evals], calibration=[c.to(d) for c in calib])
            res[side] = (qe, time.perf_counter() - t0)
        a, b = res["device"][0].rel_loss_error, res["cpu"][0].rel_loss_error
        out.append(
            check(
                "quant",
                f"{spec} ΔQ device vs CPU ({shape}, 1 layer)",
                abs(a - b) / max(abs(b), 1e-4),
                QUANT_TOL,
                delta_q_device=a,
                delta_q_cpu=b,
                device_s=res["device"][1],
                cpu_s=res["cpu"][1],
            )
        )
    return out


def accuracy(ctx: Context) -> list[dict]:
    """The accuracy probe on the embedded task: device vs CPU."""
    from losslens.measure.accuracy import task_accuracy
    from losslens.lm.checkpoints import CheckpointLoader, Trajectory, tokenizer_folder
    from transformers import AutoTokenizer

    traj = Trajectory.from_folder(_tiny_run(ctx))
    tok = AutoTokenizer.from_pretrained(str(tokenizer_folder(traj)))
    model = CheckpointLoader(traj).load(traj[-1])
    limit = 20 if ctx.quick else 200
    reps = {}
    for side, m in (("cpu", model), ("device", copy.deepcopy(model).to(ctx.device))):
        reps[side] = task_accuracy(m, tok, "embedded", specs=("rtn:2:g32",), limit=limit, n_boot=200, keep_samples=True)
    rows = []
    for variant in ("fp", "rtn:2:g32"):
        acc = {s: reps[s].means[variant][0] for s in reps}
        rows.append(
            check(
                "accuracy",
                f"{variant} accuracy device vs CPU ({limit} items)",
                abs(acc["device"] - acc["cpu"]),
                0.0,
                acc_device=acc["device"],
                acc_cpu=acc["cpu"],
            )
        )
        ll = {s: _logliks(reps[s], variant) for s in reps}
        if ll["cpu"] is not None and ll["device"] is not None:
            rows.append(
                check(
                    "accuracy",
                    f"{variant} log-likelihoods device vs CPU",
                    rel_diff(ll["device"], ll["cpu"]),
                    LOGLIK_TOL,
                )
            )
    return rows


def _logliks(report, variant: str):
    """Every kept per-choice log-likelihood of ``variant`` as one float64 vector (None if none kept)."""
    vals = []
    for score in report.scores.get(variant, {}).values():
        for item in getattr(score, "loglik", None) or ():
            vals.extend(float(x) for x in item)
    return torch.tensor(vals, dtype=torch.float64) if vals else None


def sweep(ctx: Context) -> list[dict]:
    """A three-checkpoint sweep on the device and its report."""
    from losslens.study.report.pages import build_report
    from losslens.study.sweep import Store, run_sweep

    run_dir = _tiny_run(ctx)
    out = run_dir.parent / f"sweep-{ctx.device.type}.sqlite"
    plan = {
        "probes": {
            "loss": True,
            "quant": ["rtn:4"],
            "trace": {"method": "hutchinson", "num_matvecs": 4 if ctx.quick else 16},
            "eigen": {"k": 1, "method": "lanczos", "max_iter": 8 if ctx.quick else 30},
        },
        "data": {"eval": [2, 4, 32], "calibration": [2, 4, 32], "curvature": [1, 4, 32]},
    }
    t0 = time.perf_counter()
    rep = run_sweep(str(run_dir), plan, out=str(out), progress=False, device=str(ctx.device), num_workers=1)
    seconds = time.perf_counter() - t0
    df = Store(str(out)).results()
    page = build_report(df, run_dir.parent / f"report-{ctx.device.type}.html", title="gpu check sweep")
    ok = rep.n_failed == 0 and df.checkpoint.nunique() == 3 and Path(page).stat().st_size > 0
    return [
        info(
            "sweep",
            "three checkpoints, loss + rtn:4 + Hutchinson + λ_max, then the report",
            seconds=seconds,
            rows=len(df),
            checkpoints=int(df.checkpoint.nunique()),
            failed=rep.n_failed,
            report_bytes=Path(page).stat().st_size,
        ),
        check("sweep", "every probe ok and the report written", 0.0 if ok else 1.0, 0.0),
    ]
