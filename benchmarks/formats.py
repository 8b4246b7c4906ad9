"""ΔQ of the deployment formats (issue 40) on the demo's trajectories, with the explain factorisation.

    flock /tmp/losslens-bench.lock python -m benchmarks.formats OUT [--quick]

Runs ``losslens demo`` (``losslens.study.demo.demo_settings.DEFAULT``, or ``QUICK`` with ``--quick``) with every new
format, a few RTN/GPTQ/INT8 baselines and two ``had+`` variants as both the quant and the explain
specs (accuracy panel off, 3×3 planes), then prints, per run and spec: ΔQ at the final real
checkpoint and at LAWA(3), the explain factors there (‖δ‖², tr H/n, κ, non-quadratic factor), the
shares of the change of log ΔQ over the LR decay (WSD runs) and final → LAWA, and the rank
correlation of each spec's ΔQ with the trace over all real checkpoints. Writes OUT/formats.json.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

BASELINES = ("rtn:2:g32", "rtn:3:row", "gptq:3:row", "int8")
NEW = (
    "fp8",
    "fp8:tensor",
    "fp8:e5m2",
    "mxfp4",
    "mxfp8",
    "nvfp4",
    "gguf:Q4_0",
    "gguf:Q4_1",
    "gguf:Q5_0",
    "gguf:Q5_1",
    "gguf:Q8_0",
    "gguf:Q4_K",
    "had+rtn:3:row",
    "had+mxfp4",
)


def _value(ok, run, ckpt, probe, metric, spec=None):
    m = (ok["run"] == run) & (ok["checkpoint"] == ckpt) & (ok["probe"] == probe) & (ok["metric"] == metric)
    if spec is not None:
        m &= ok["spec"] == spec
    v = ok.loc[m, "value"]
    return float(v.iloc[0]) if len(v) else float("nan")


def measure(out: Path, quick: bool) -> dict:
    import time

    from scipy.stats import spearmanr

    from losslens.study.analysis.explain_shares import decay_window, decompose_change, factor_table
    from losslens.study.demo.demo_study import run_demo
    from losslens.study.demo.demo_settings import DEFAULT, QUICK, DemoOptions

    specs = BASELINES + NEW
    settings = replace(QUICK if quick else DEFAULT, quant=specs, explain=specs, accuracy_limit=0, grid=3)
    t0 = time.perf_counter()
    res = run_demo(DemoOptions(out=out, quiet=True, workers=2), settings=settings)
    seconds = time.perf_counter() - t0
    df = res.results
    ok = df[df["status"] == "ok"]
    rows, shares = [], []
    for run in settings.runs:
        sub = ok[(ok["run"] == run.name)]
        real = sub[~sub["derived"].astype(bool)].sort_values("step")["checkpoint"].unique()
        lawa = [c for c in sub[sub["derived"].astype(bool)]["checkpoint"].unique() if str(c).startswith("lawa")]
        final = real[-1]
        trace = _value(ok, run.name, final, "trace", "trace")
        for spec in specs:
            row = {
                "run": run.name,
                "spec": spec,
                "final": final,
                "trace": trace,
                "dq_final_pct": 100 * _value(ok, run.name, final, "quant", "rel_loss_error", spec),
                "dq_lawa_pct": 100 * _value(ok, run.name, lawa[0], "quant", "rel_loss_error", spec) if lawa else None,
            }
            for f in ("norm2", "trace_per_param", "kappa"):
                row[f] = _value(ok, run.name, final, "explain", f, spec)
            row["non_quadratic"] = _value(ok, run.name, final, "explain", "actual_delta", spec) / _value(
                ok, run.name, final, "explain", "quadratic", spec
            )
            xs = [_value(ok, run.name, c, "trace", "trace") for c in real]
            ys = [_value(ok, run.name, c, "quant", "rel_loss_error", spec) for c in real]
            row["spearman_trace_dq"] = float(spearmanr(xs, ys).statistic) if len(real) > 2 else None
            rows.append(row)
            try:
                table = factor_table(ok[ok["run"] == run.name], spec)
                windows = []
                if run.schedule == "wsd":
                    windows.append(("decay",) + tuple(decay_window(table, run.name)))
                if lawa:
                    windows.append(("final->lawa", final, lawa[0]))
                for what, a, b in windows:
                    dec = decompose_change(table, a, b, run=run.name)
                    tr = dec[dec["term"] == "trace_per_param"].iloc[0]
                    shares.append(
                        {
                            "run": run.name,
                            "spec": spec,
                            "change": what,
                            "from": a,
                            "to": b,
                            **{t: round(float(v), 3) for t, v in zip(dec["term"], dec["log_change"])},
                            "trace_ci": [round(float(tr["ci_low"]), 3), round(float(tr["ci_high"]), 3)],
                        }
                    )
            except Exception as exc:  # ΔL ≤ 0 (within noise) or missing rows: say so
                shares.append({"run": run.name, "spec": spec, "change": "n/a", "error": str(exc)[:160]})
    report = {"settings": "QUICK" if quick else "DEFAULT", "seconds": seconds, "rows": rows, "shares": shares}
    (out / "formats.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def _fmt(x, d=3):
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{d}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    rep = measure(a.out, a.quick)
    print(f"settings {rep['settings']}, {rep['seconds']:.0f} s")
    print("| run | spec | ΔQ final % | ΔQ LAWA % | ‖δ‖² | tr H/n | κ | non-quad | r_s(trace, ΔQ) |")
    for r in rep["rows"]:
        print(
            f"| {r['run']} | {r['spec']} | {_fmt(r['dq_final_pct'])} | {_fmt(r['dq_lawa_pct'])} | "
            f"{_fmt(r['norm2'], 4)} | {_fmt(r['trace_per_param'], 4)} | {_fmt(r['kappa'], 2)} | "
            f"{_fmt(r['non_quadratic'], 2)} | {_fmt(r['spearman_trace_dq'], 2)} |"
        )
    for s in rep["shares"]:
        print(json.dumps(s, default=str))


if __name__ == "__main__":
    main()
