"""`losslens demo`: the whole study, offline, on the embedded trajectories.

1. trains tiny GPT-NeoX trajectories on the embedded corpus under several LR schedules and peak
   LRs (:mod:`losslens.lm.train.tiny`; one shared tokenizer and token stream in ``DIR/data``);
2. adds a LAWA checkpoint (mean of the last k checkpoints) to each run;
3. sweeps every checkpoint (FP loss, RTN / INT8 / GPTQ error, Hutch++ trace, λ_max, kurtosis,
   directional curvature along RTN, and the ``explain`` probe: ΔL = gᵀδ + ½·‖δ‖²·(tr H/n)·κ +
   remainder per layer for RTN, GPTQ, AWQ and INT8) into one resumable store ``DIR/results.sqlite``;
4. computes correlations (sharpness vs ΔQ, plain and controlling for LR and FP loss), phases, and
   the explain analysis (``DIR/explain.md``: what drives ΔQ in the decay, GPTQ/AWQ vs RTN, LAWA);
5. draws the quantization plane (Θ_K, Θ_{K−1}, Θ̂_K) of the last checkpoint of every run, and all
   runs in one principal plane with their quantized points (``DIR/landscape``);
6. writes ``DIR/report.html`` and prints a short summary.

Every stage is resumable: finished runs are not retrained, finished store rows not recomputed,
finished surfaces (``DIR/surfaces/*.json``) not re-evaluated. The default settings were chosen so
that the seeds' effect is measurable at this scale (docs/science.md §8; see
:data:`~losslens.study.demo.demo_settings.DEFAULT`, and :mod:`losslens.study.demo.demo_settings` for every setting).

All cores: with ``workers`` > 1 (default: one per core) the runs train in parallel, each sweep
probes its checkpoints on the workers (:mod:`losslens.study.sweep.local_workers`; only this process writes the
store) and the planes are drawn in parallel, all on one :class:`~losslens.lm.core.workers.WorkerPool`
started once. Every worker uses ``threads`` torch threads; the numbers do not depend on the
number of workers.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from losslens.lm.core.workers import WorkerPool
from losslens.study.demo.demo_jobs import draw_landscape, draw_planes, train_all
from losslens.study.demo.demo_settings import DEFAULT, QUICK, DemoOptions, DemoSettings, has_lm_eval
from losslens.measure.probes.accuracy import PROBE as ACCURACY
from losslens.measure.probes.explain import PROBE as EXPLAIN
from losslens.measure.probes.loss import PROBE as LOSS
from losslens.measure.probes.quant import PROBE as QUANT
from losslens.measure.probes.trace import PROBE as TRACE


@dataclass
class DemoResult:
    """What the demo produced: paths, the tidy results, the statistics and the summary table."""

    out: Path
    report: Path
    store: Path
    results: pd.DataFrame
    final: pd.DataFrame
    correlations: pd.DataFrame
    phases: dict
    seconds: dict
    explain: str = ""
    accuracy: str = ""
    failures: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 when every probe row of every run is ``ok``; 1 when some failed (``failures``: run →
        failed rows). Analyses that could not be computed (``problems``) are flagged in the
        summary and the report, not in the exit status: the data, not the run, lacked something."""
        return 1 if self.failures else 0

    def failure_text(self) -> str:
        """The failed probe rows per run and where the report lists them (empty when none failed)."""
        if not self.failures:
            return ""
        failed = "; ".join(f"{n} probe row(s) failed in {r}" for r, n in self.failures.items())
        return f"{failed}; the rest of the study is done and the report lists the failed rows: {self.report}"

    def summary_text(self) -> str:
        lines = ["Final checkpoint of each run (ΔQ L = L(θ̂)/L(θ) − 1, in %):", self.final.to_string(index=False), ""]
        head = self.correlations
        if len(head):
            lines.append(
                "Sharpness vs quantization error across all checkpoints of all runs: r pooled over runs; "
                "r_within (within runs) with its 95% interval and p, runs the independent units "
                "(docs/science.md §6):"
            )
            for _, r in head.iterrows():
                lines.append(_correlation_line(r))
        if self.accuracy:
            lines += ["", "Loss vs task accuracy (embedded task, accuracy probe):", "  " + self.accuracy]
        if self.explain:
            lines += ["", "Why ΔQ changes (explain probe; natural-log shares, see explain.md):", self.explain]
        if self.failures:
            lines += ["", "FAILED (exit status 1):"]
            lines += [
                f"  {n} probe row(s) failed in {run}; see the report's failed rows or the store's error column"
                for run, n in self.failures.items()
            ]
        if self.problems:
            lines += ["", "NOT COMPUTED:"] + [f"  {p}" for p in self.problems]
        lines.append("")
        lines.append(f"report: {self.report}")
        lines.append(f"store:  {self.store}")
        return "\n".join(lines)


def final_table(df: pd.DataFrame, settings: DemoSettings) -> pd.DataFrame:
    """Per run: FP loss, ΔQ (%) per spec at the last real checkpoint, the LAWA checkpoint's ΔQ at
    the headline spec, and the Hutch++ trace of both."""
    rows = []
    for run in dict.fromkeys(df["run"]):
        sub = df[df["run"] == run]
        real = sub[~sub["derived"].astype(bool)]
        if real.empty:
            continue
        last = real.loc[real["step"].idxmax(), "checkpoint"]
        lawa = sub.loc[sub["derived"].astype(bool), "checkpoint"]

        def val(ckpt, probe, metric, spec=None):
            m = (sub["checkpoint"] == ckpt) & (sub["probe"] == probe) & (sub["metric"] == metric)
            if spec is not None:
                m &= sub["spec"] == spec
            v = sub.loc[m, "value"]
            return float(v.iloc[0]) if len(v) else math.nan

        row: dict[str, Any] = {"run": run, "fp_loss": round(val(last, LOSS.name, LOSS.metric), 4)}
        for spec in settings.quant:
            row[spec] = round(100 * val(last, QUANT.name, QUANT.metric, spec), 3)
        row["trace"] = round(val(last, TRACE.name, TRACE.metric), 1)
        if len(lawa):
            ck = lawa.iloc[0]
            row["lawa_fp_loss"] = round(val(ck, LOSS.name, LOSS.metric), 4)
            row[f"lawa_{settings.headline_spec}"] = round(
                100 * val(ck, QUANT.name, QUANT.metric, settings.headline_spec), 3
            )
            row["lawa_trace"] = round(val(ck, TRACE.name, TRACE.metric), 1)
        rows.append(row)
    return pd.DataFrame(rows)


def run_demo(options: DemoOptions = DemoOptions(), settings: DemoSettings | None = None, echo=print) -> DemoResult:
    """``losslens demo``: run the whole study into ``options.out`` (resumable) and return what it produced;
    ``settings``: the study (None: :data:`~losslens.study.demo.demo_settings.QUICK` with ``options.quick``,
    else :data:`~losslens.study.demo.demo_settings.DEFAULT`), ``echo``: the ``[demo]`` lines.
    :class:`DemoError` for bad options, before anything runs.

    ``options.threads``: torch intra-op threads of this process and of every worker (this process's is
    restored afterwards). The demo's models are tiny (hidden 64): one thread is faster than two on
    2 cores (measured 5× under load, from synchronisation on small matrices). ``None`` leaves
    torch's setting alone. ``options.workers``: worker processes for training, the local sweeps and the
    planes (default ``$LOSSLENS_WORKERS``, else one per core divided by ``threads``; 1: all in this
    process). Each worker holds one tiny model (a few MB).
    """
    from losslens.lm.core.threads import torch_threads
    from losslens.study.sweep.local_workers import resolve_workers

    o = options
    o.check()
    settings = settings or (QUICK if o.quick else DEFAULT)
    n, _ = resolve_workers(o.workers, max(len(settings.runs), settings.checkpoints + 1), None, o.threads)
    with torch_threads(o.threads), WorkerPool(n, o.threads) if n > 1 else contextlib.nullcontext(None) as pool:
        return _run_demo(o.out, settings, not o.quiet, o.executor, echo, pool)


def _run_demo(out, settings, progress, executor, echo, pool) -> DemoResult:
    from losslens.study.analysis import AnalysisError, detect_phases, summary
    from losslens.lm.data import default_token_sets
    from losslens.study.report.pages import build_report
    from losslens.study.sweep import Store, run_sweep

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(asdict(settings), indent=2, default=str))
    if settings.accuracy_limit and not has_lm_eval():
        echo("[demo] lm-eval is not installed (pip install 'losslens[eval]'): the accuracy panel is left out")
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    trajectories = train_all(settings, out, progress, echo, pool)
    seconds["train"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    first = next(iter(trajectories.values()))
    plan0 = settings.plan(settings.runs[0])
    sets = default_token_sets(
        first,
        shapes={
            "eval": settings.eval_shape,
            "calibration": settings.calibration_shape,
            "curvature": settings.curvature_shape,
        },
        seed=settings.seed,
    )
    store_path = out / "results.sqlite"
    failures: dict[str, int] = {}
    problems: list[str] = []
    for run in settings.runs:
        echo(f"[demo] sweeping {run.name}")
        local = executor == "local"
        report = run_sweep(
            trajectories[run.name],
            settings.plan(run),
            out=store_path,
            token_sets=sets,
            progress=progress,
            executor=executor,
            pool=pool if local else None,
            num_workers=1 if local and pool is None else None,
        )
        if report.n_failed_total:  # this call's failures and the ones kept from an earlier call
            failures[run.name] = report.n_failed_total
            echo(f"[demo] {report.n_failed_total} probe(s) failed in {run.name}; see the store's error column")
    seconds["sweep"] = time.perf_counter() - t0

    with Store(store_path) as store:
        df = store.results()
    ok = df[df["status"] == "ok"]
    correlations = summary(
        ok,
        x=[TRACE.name, "lambda_max"],
        y=[settings.headline_spec],
        controls=["lr", LOSS.name],
        methods=("spearman", "pearson"),
        seed=settings.seed,
    )
    phases = {}
    for run in settings.runs:
        try:
            phases[run.name] = detect_phases(ok[ok["run"] == run.name], gap=settings.headline_spec)
        except AnalysisError as exc:
            problems.append(f"phases of {run.name} not computed: {exc}")  # said once: under NOT COMPUTED

    t0 = time.perf_counter()
    surfaces = draw_planes(settings, trajectories, sets, out, progress, echo, pool)
    seconds["surfaces"] = time.perf_counter() - t0
    land = draw_landscape(settings, trajectories, sets, out, progress, echo, seconds)

    explanation, explain_text = None, ""
    if (ok["probe"] == EXPLAIN.name).any():
        from losslens.study.analysis.explain_shares import format_check, science_check

        try:
            explanation = science_check(ok)
            explain_text = format_check(explanation)
            (out / "explain.md").write_text(explain_text + "\n")
        except AnalysisError as exc:
            problems.append(f"explain analysis not computed: {exc}")
    accuracy_text = ""
    if (ok["probe"] == ACCURACY.name).any():
        from losslens.study.analysis.accuracy_verdict import accuracy_verdict

        try:
            accuracy_text = accuracy_verdict(ok, settings.headline_spec, seed=settings.seed)["text"]
        except AnalysisError as exc:
            accuracy_text = f"no verdict: {exc}"
            problems.append(f"accuracy verdict not computed: {exc}")
    final = final_table(ok, settings)
    bad_rows = [
        f"{row['x']} vs {row['y']} ({row['method']}{', | ' + row['controls'] if row['controls'] else ''}): "
        f"{row['note']}"
        for _, row in correlations.iterrows()
        if not math.isfinite(row["r"])
    ]
    problems += [f"correlation not computed: {b}" for b in bad_rows]
    notes = (
        "Embedded demo: tiny GPT-NeoX trajectories trained here on the package's corpus. "
        f"Headline quantizer {settings.headline_spec}; correlations pool every real checkpoint of every run, "
        "each run one time series (r pooled; intervals and p-values are within runs, with runs as the independent "
        "units)."
    )
    if failures:
        notes += (
            " FAILED: "
            + "; ".join(f"{n} probe row(s) failed in {r}" for r, n in failures.items())
            + " (listed below); the demo exits with status 1."
        )
    if problems:
        notes += " NOT COMPUTED: " + "; ".join(problems) + "."
    report_path = build_report(
        df,
        out / "report.html",
        correlations=correlations,
        phases=phases,
        surfaces={f"{k} ({settings.headline_spec})": v for k, v in surfaces.items()},
        plan=plan0,
        title="losslens demo: sharpness and quantization error along training",
        notes=notes,
        explanation=explanation,
        live=_live_curves(out, settings),
        landscape=land,
    )
    result = DemoResult(
        out=out,
        report=Path(report_path),
        store=store_path,
        results=df,
        final=final,
        correlations=correlations,
        phases={k: v.to_dict() for k, v in phases.items()},
        seconds=seconds,
        explain=_driver_lines(explanation),
        accuracy=accuracy_text,
        failures=failures,
        problems=problems,
    )
    (out / "summary.json").write_text(
        json.dumps(
            {
                "final": final.to_dict(orient="records"),
                "correlations": correlations.to_dict(orient="records"),
                "phases": result.phases,
                "seconds": seconds,
                "accuracy": accuracy_text,
                "failures": failures,
                "problems": problems,
                "exit_code": result.exit_code,
            },
            indent=2,
            default=str,
        )
    )
    return result


def _live_curves(out: Path, settings: DemoSettings) -> dict:
    """``{label: {"results", "monitor"}}`` of the run the monitor watched while it trained (``DIR/monitor.sqlite``):
    its rows and the metadata that says which evaluations it skipped."""
    from losslens.study.sweep import Store

    path = out / "monitor.sqlite"
    if settings.monitor_run is None or not path.is_file():
        return {}
    with Store(path) as st:
        df, alarm = st.results(), st.meta.get(f"monitor_alarm:{settings.monitor_run}")
        meta = st.meta.get(f"monitor:{settings.monitor_run}")  # its settings and the evaluations it skipped
    df = df[df["run"] == settings.monitor_run]
    if df.empty:
        return {}
    when = f"alarm at step {alarm['step']}" if alarm else "no alarm"
    label = f"{settings.monitor_run}, measured every {settings.monitor_every} steps while training ({when})"
    return {label: {"results": df, "monitor": meta}}


def _driver_lines(check: dict | None) -> str:
    """One line per run of the headline spec's decay decomposition, and one per calibrated/RTN pair."""
    if not check:
        return ""
    lines = []
    dec = check["decay"]
    if len(dec):
        head = dec["spec"].iloc[0]
        for _, r in dec[dec["spec"] == head].iterrows():
            lines.append(
                f"  {r['run']} {head} decay {r['start']} → {r['end']}: "
                f"Δlog ΔQ {r['total']:+.2f} = ‖δ‖² {r['norm2']:+.2f}"
                f" + tr H/n {r['trace_per_param']:+.2f} + κ {r['kappa']:+.2f} + non-quadratic {r['non_quadratic']:+.2f}"
                f" + 1/L {r['fp_loss']:+.2f} (driver: {r['driver']})"
            )
    for _, r in check["quantizers"].iterrows():
        lines.append(
            f"  {r['calibrated']} vs {r['rtn']}: log ‖δ‖² ratio {r['log_norm2_ratio']:+.2f}, log κ ratio "
            f"{r['log_kappa_ratio']:+.2f} (κ {r['kappa_calibrated']:.2f} vs {r['kappa_rtn']:.2f}, n = {r['n']})"
        )
    return "\n".join(lines)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _correlation_line(r) -> str:
    """One correlation row of the summary; a descriptive row (no interval, no p) says why instead of
    printing NaNs: ``descriptive: <reason>``."""
    ctrl = f" | {r['controls']}" if r["controls"] else ""
    head = f"  {r['method']:>8} r({r['x']}, ΔQ {r['y']}{ctrl}) = {r['r']:+.3f}, n={int(r['n'])}"
    within = f", within {r['r_within']:+.3f}" if _finite(r["r_within"]) else ""
    note = str(r["note"] or "")
    if _finite(r["p"]):
        return (
            f"{head}{within} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] p={r['p']:.2g} ({r['inference']}), "
            f"n_eff={r['n_eff']:.1f}" + (f" ({note})" if note else "")
        )
    reason = note.replace("descriptive: ", "") or "no interval and no p (too few independent pairs)"
    return f"{head}{within}; descriptive: {reason}"
