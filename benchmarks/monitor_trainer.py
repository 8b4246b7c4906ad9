"""The robustness monitor on a real ``transformers.Trainer`` run (issue #29's "done when").

A tiny GPT-NeoX on the embedded corpus (the run's config below: `MODEL`), ``--steps`` optimizer
steps, evaluation every ``--eval-every`` steps on a held-out validation set, trained ``--reps``
times without and with :class:`losslens.study.monitor.RobustnessCallback` at its default settings
(alternating, so machine load hits both alike). Prints per pair: wall time of ``trainer.train()``
without / with, the extra cost in %, whether the final weights and every logged loss are
bit-identical, the store rows per evaluation, and the precision floor (trace relative CI
half-width, λ_max converged) at every measurement. Threads: 1 (set here). Writes the store of the
last monitored run to ``OUT/monitor.sqlite`` (``losslens report OUT/monitor.sqlite``).

    flock /tmp/losslens-heavy.lock python -m benchmarks.monitor_trainer --out /tmp/monitor-trainer
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

#: the §8 model of docs/science.md (1.06M parameters) at sequence length 128
MODEL = dict(
    hidden_size=128,
    num_layers=4,
    num_heads=4,
    seq_len=128,
    batch_size=32,
    vocab_size=1024,
    peak_lr=3e-3,
    weight_decay=0.1,
)


class _Windows:
    """Non-overlapping [seq] windows of a token stream as Trainer examples."""

    def __init__(self, tokens):
        self.t = tokens

    def __len__(self):
        return len(self.t)

    def __getitem__(self, i):
        return {"input_ids": self.t[i], "labels": self.t[i]}


def setup(out: Path):
    import torch
    from safetensors.torch import load_file

    from losslens.lm.data import token_sets_from_stream
    from losslens.lm.train.config import TrainConfig
    from losslens.lm.train.tiny_data import prepare_data

    cfg = TrainConfig(**MODEL)
    tok, train, _ = prepare_data(cfg, out / "prep", out / "data")
    held = load_file(str(out / "data" / "streams.safetensors"))["heldout"]
    s = cfg.seq_len
    sets = token_sets_from_stream(held, {"validation": (4, 32, s), "eval": (4, 8, s), "curvature": (1, 2, s)}, seed=0)
    n = len(train) // s
    windows = train[: n * s].reshape(n, s)
    return cfg, tok, _Windows(windows), _Windows(sets["validation"].tokens.reshape(-1, s)), sets, torch


def one_run(cfg, tok, train_ds, val_ds, out: Path, steps: int, eval_every: int, callback=None):
    from transformers import Trainer, TrainingArguments

    from losslens.lm.train.tiny import build_model

    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=32,
        eval_strategy="steps",
        eval_steps=eval_every,
        logging_steps=eval_every,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        learning_rate=cfg.peak_lr,
        lr_scheduler_type="cosine",
        warmup_steps=steps // 20,
        weight_decay=cfg.weight_decay,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        disable_tqdm=True,
        dataloader_num_workers=0,
        include_num_input_tokens_seen="all",
    )
    model = build_model(cfg, tok)
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=val_ds)
    if callback is not None:
        callback.attach(trainer)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    logs = [
        (h["step"], h.get("loss"), h.get("eval_loss"))
        for h in trainer.state.log_history
        if "loss" in h or "eval_loss" in h
    ]
    return wall, weights, logs


def main(argv=None) -> None:
    import torch

    from losslens.study.monitor import RobustnessCallback
    from losslens.study.sweep import Store

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/losslens-monitor-trainer")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg, tok, train_ds, val_ds, sets, _ = setup(out)
    evals = list(range(a.eval_every, a.steps + 1, a.eval_every))
    rows = []
    for rep in range(a.reps):
        base_wall, base_w, base_logs = one_run(cfg, tok, train_ds, val_ds, out / "base", a.steps, a.eval_every)
        store = out / "monitor.sqlite"
        for p in (store, Path(str(store) + "-wal"), Path(str(store) + "-shm")):
            p.unlink(missing_ok=True)
        cb = RobustnessCallback(
            store, sets["eval"], sets["curvature"], run="trainer", tokens_per_step=cfg.batch_size * cfg.seq_len
        )
        mon_wall, mon_w, mon_logs = one_run(cfg, tok, train_ds, val_ds, out / "mon", a.steps, a.eval_every, cb)
        same = base_w.keys() == mon_w.keys() and all(torch.equal(base_w[k], mon_w[k]) for k in base_w)
        with Store(store) as st:
            df = st.results()
            raw = st.raw()
        floor = []
        for _, r in raw.iterrows():
            ex = json.loads(r["extra"])
            if r["probe"] == "trace":
                floor.append(("trace", r["checkpoint"], round(ex["rel_ci_half_width"], 3), not ex["below_floor"]))
            if r["probe"] == "eigen":
                floor.append(("lambda", r["checkpoint"], round(ex["rel_residual"], 4), not ex["below_floor"]))
        steps = sorted(int(s) for s in df["step"].dropna().unique())
        s = cb.monitor.summary()
        row = {
            "rep": rep,
            "base_s": round(base_wall, 1),
            "monitor_s": round(mon_wall, 1),
            "extra_pct": round(100 * (mon_wall / base_wall - 1), 1),
            "monitor_own_s": round(s["monitor_seconds"], 2),
            "prepare_s": round(s["prepare_seconds"], 2),
            "skipped": s["skipped_for_time"],
            "weights_identical": same,
            "losses_identical": base_logs == mon_logs,
            "rows_at_evals": steps == evals,
            "steps": steps,
            "n_rows": int(len(raw)),
            "floor_met": all(f[3] for f in floor),
            "floor": floor,
            "per_measurement_s": [round(m.seconds, 2) for m in cb.measurements],
        }
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "floor"}))
        print("  floor:", floor)
    (out / "monitor_trainer.json").write_text(json.dumps(rows, indent=1))
    shutil.rmtree(out / "base", ignore_errors=True)
    shutil.rmtree(out / "mon", ignore_errors=True)
    print(
        "extra wall time, median over reps: "
        f"{sorted(r['extra_pct'] for r in rows)[len(rows) // 2]:.1f}%; "
        f"monitor's own time / baseline: "
        f"{100 * sum(r['monitor_own_s'] for r in rows) / sum(r['base_s'] for r in rows):.1f}%"
    )
    assert math.isfinite(rows[0]["extra_pct"])


if __name__ == "__main__":
    main()
