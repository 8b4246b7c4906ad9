"""The robustness monitor's alarm on the demo's configuration (issue #29).

Trains the demo's four runs (WSD and cosine, peak LR 3e-3 and 1e-2; ``probes/study/demo/demo_settings.py: DEFAULT``)
for each seed given, with a :class:`losslens.study.monitor.RobustnessMonitor` measuring ΔQ (RTN INT3,
INT2-g32) and the FP loss every ``--every`` steps on a held-out set of the embedded corpus
(curvature off: the alarm reads ΔQ and loss only), one store per run. Prints, per run, the step at
which the alarm fires and the LR phase of that step. Threads: 1 per process (set here).

    flock /tmp/losslens-heavy.lock python -m benchmarks.monitor_alarm --seeds 1,2 --out /tmp/alarm
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def phase(step: int, cfg) -> str:
    warm, decay = round(cfg.warmup * cfg.steps), round(cfg.decay * cfg.steps)
    if cfg.schedule == "wsd":
        return "warmup" if step <= warm else ("stable" if step <= cfg.steps - decay else "decay")
    return "warmup" if step <= warm else "decay"


def run_one(run, seed: int, out: Path, every: int, eval_shape, settings_kw: dict) -> dict:
    import torch
    from safetensors.torch import load_file

    from losslens.lm.data import token_sets_from_stream
    from losslens.study.demo.demo_settings import DEFAULT
    from losslens.study.monitor import RobustnessMonitor
    from losslens.lm.train.tiny import train_tiny
    from losslens.lm.train.tiny_data import prepare_data

    torch.set_num_threads(1)
    from dataclasses import replace

    cfg = replace(DEFAULT.train_config(run), seed=seed, name=f"{run.name}-s{seed}")
    data = out / "data"
    prepare_data(cfg, out / "runs" / cfg.name, data)
    held = load_file(str(data / "streams.safetensors"))["heldout"]
    sets = token_sets_from_stream(held, {"eval": eval_shape, "curvature": (1, 4, 64)}, seed=0)
    store = out / f"{cfg.name}.sqlite"
    mon = RobustnessMonitor(
        store,
        sets["eval"],
        sets["curvature"],
        run=cfg.name,
        every=every,
        curvature=False,
        time_budget=1e9,
        tokens_per_step=cfg.tokens_per_step,
        **settings_kw,
    )
    t0 = time.perf_counter()
    train_tiny(cfg, out / "runs" / cfg.name, progress=False, data_dir=data, on_step=mon.step, overwrite=True)
    wall = time.perf_counter() - t0
    fired = mon.alarm.fired
    res = {
        "run": cfg.name,
        "schedule": cfg.schedule,
        "peak_lr": cfg.peak_lr,
        "seed": seed,
        "wall_s": round(wall, 1),
        "monitor_s": round(mon.monitor_seconds, 1),
        "history": mon.alarm.history,
        "alarm_step": None if fired is None else fired.step,
        "alarm_phase": None if fired is None else phase(fired.step, cfg),
        "decay_starts_after": cfg.steps - round(cfg.decay * cfg.steps) if cfg.schedule == "wsd" else None,
    }
    mon.close()
    (out / f"{cfg.name}.json").write_text(json.dumps(res, indent=1))  # each run as soon as it is done
    return res


def replay(path: Path, settings=None) -> list[dict]:
    """The alarm of :class:`~losslens.study.monitor.MonitorSettings` (default: today's defaults) replayed
    on the stored (step, loss, ΔQ) histories of a results file (or a folder of per-run files): the same :class:`Alarm`
    the monitor updates live, fed the same measurements in order. Returns per run the step it fires at."""
    from losslens.study.demo.demo_settings import DEFAULT
    from losslens.study.monitor import Alarm, MonitorSettings

    s = settings or MonitorSettings()
    out = []
    path = Path(path)
    runs = (
        [json.loads(f.read_text()) for f in sorted(path.glob("*-s[0-9]*.json"))]
        if path.is_dir()
        else json.loads(path.read_text())
    )
    for r in runs:
        alarm = Alarm(s.alarm_spec, s.alarm_threshold, s.alarm_window, s.alarm_min_improvement, s.alarm_lr_drop)
        rates = []
        run = next(x for x in DEFAULT.runs if x.schedule == r["schedule"] and x.peak_lr == r["peak_lr"])
        from dataclasses import replace

        from losslens.lm.train.config import lr_at

        cfg = replace(DEFAULT.train_config(run), seed=r["seed"])
        for step, loss, dq in r["history"]:
            rate, _ = alarm.update(step, loss, dq, lr_at(step, cfg))
            rates.append((step, rate))
        step = alarm.fired.step if alarm.fired else None
        out.append(
            {
                "run": r["run"],
                "seed": r["seed"],
                "alarm_step": step,
                "phase": None if step is None else phase(step, cfg),
                "rate": None if alarm.fired is None else round(alarm.fired.rate, 4),
                "max_stable_rate": max(
                    (x for st, x in rates if x is not None and phase(st, cfg) == "stable"), default=None
                ),
            }
        )
    return out


def main(argv=None) -> None:
    from concurrent.futures import ProcessPoolExecutor

    from losslens.study.demo.demo_settings import DEFAULT

    ap = argparse.ArgumentParser()
    ap.add_argument("--replay", default=None, help="a results JSON of an earlier run: the alarm with today's settings")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--out", default="/tmp/losslens-monitor-alarm")
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--schedules", default="wsd,cosine")
    a = ap.parse_args(argv)
    if a.replay:
        for r in replay(Path(a.replay)):
            print(json.dumps(r))
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in a.seeds.split(",")]
    runs = [r for r in DEFAULT.runs if r.schedule in a.schedules.split(",")]
    jobs = sorted(((r, s) for s in seeds for r in runs), key=lambda j: (j[0].schedule != "wsd", j[1]))  # WSD first
    with ProcessPoolExecutor(a.procs) as ex:
        futs = [ex.submit(run_one, r, s, out, a.every, (4, 16, 64), {}) for r, s in jobs]
        results = [f.result() for f in futs]
    for r in results:
        print(
            f"{r['run']}: alarm at step {r['alarm_step']} ({r['alarm_phase']}); wall {r['wall_s']} s, monitor "
            f"{r['monitor_s']} s"
        )
    (out / f"alarm-seeds{a.seeds.replace(',', '')}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
