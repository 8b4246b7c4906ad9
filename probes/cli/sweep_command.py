"""`losslens sweep`, `losslens sharpness`, `losslens correlate`: trajectory sweeps and their statistics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, List

import typer

from losslens.cli.console import print_table, wide_console
from losslens.cli.option_parsing import cli, flags, long_help
from losslens.geometry.operators.names import BACKEND_NAMES
from losslens.cli.option_groups import (
    TRAJECTORY_HELP,
    ComputeOptions,
    LoadOptions,
    MemoryOptions,
    TrajectoryOptions,
    quiet_option,
    threads_help,
    device_help,
)
from losslens.cli.sharpness_command import sharpness
from losslens.measure.probes.loss import PROBE as LOSS
from losslens.measure.probes.quant import PROBE as QUANT
from losslens.measure.probes.trace import PROBE as TRACE
from losslens.study.trajectory_sweep import SweepSettings


def correlation_summary(df, x=None, y=None, controls=None, methods=("pearson", "spearman"), n_boot: int = 2000):
    """The summary table printed at the end of a sweep (x: curvature series, y: quantizer specs;
    a partial correlation on LR when there are enough checkpoints). Why there is no LR control,
    when there is none, is in ``table.attrs["notes"]`` (printed under the table)."""
    import losslens.study.analysis as analysis

    notes: list[str] = []
    if controls is None:
        controls = []
        try:
            lr = analysis.series(df, "lr")
        except analysis.AnalysisError as exc:
            notes.append(f"no partial correlation on lr: {exc}")
        else:
            known = int(lr.notna().sum())
            if known < 5:
                notes.append(
                    f"no partial correlation on lr: only {known} checkpoint(s) record their LR (needs 5; "
                    "give --schedule or a trajectory.json)"
                )
            elif lr.nunique() <= 1:
                notes.append(
                    f"no partial correlation on lr: it is constant ({lr.dropna().iloc[0]:g}) over the checkpoints"
                )
            else:
                controls = ["lr"]
    tab = analysis.summary(df, x=x, y=y, controls=controls, methods=methods, n_boot=n_boot)
    tab.attrs["notes"] = notes
    return tab


def print_phases(df, console=None, gap: str | None = None) -> None:
    """Print the FP-convergence onset and the divergence onset of a quantization gap (SCIENCE §6), for
    each run of the store (forks of one base share their steps: each is its own series)."""
    con = console or wide_console()
    qs = list(dict.fromkeys(df.loc[(df["probe"] == QUANT.name) & (df["status"] == "ok"), "spec"]))
    if gap is None and qs:
        gap = next((q for q in qs if q.startswith("rtn:4")), qs[0])
    runs = list(dict.fromkeys(df["run"])) if "run" in df and len(df) else []
    if len(runs) <= 1:
        _print_run_phases(df, con, gap, "")
        return
    for run in runs:
        _print_run_phases(df[df["run"] == run], con, gap, f"{run}: ")


def _print_run_phases(df, con, gap: str | None, prefix: str) -> None:
    from losslens.study.analysis import AnalysisError, convergence_onset, divergence_onset, series_frame

    try:
        frame = series_frame(df, ["step", "lr", LOSS.name])
        c = convergence_onset(frame["step"], frame[LOSS.name], frame["lr"])
        tail = "" if c.found else " (the loss still improves at the last checkpoint)"
        con.print(f"{prefix}FP-convergence onset: step {c.step:g}, lr {c.lr}{tail}")
    except (AnalysisError, KeyError) as exc:
        con.print(f"{prefix}FP-convergence onset: not computed ({exc})")
    if gap is None:
        return
    try:
        frame = series_frame(df, ["step", "lr", gap])
        d = divergence_onset(frame["step"], frame[gap], frame["lr"])
        excl = f"; {d.n_excluded} non-positive/NaN gaps excluded" if d.n_excluded else ""
        con.print(
            f"{prefix}divergence onset of the {gap} gap: step {d.step:g}, lr {d.lr} (log-gap slope "
            f"{d.details['slope_before']:.3g} -> {d.details['slope_after']:.3g} per step{excl})"
        )
    except (AnalysisError, KeyError) as exc:
        con.print(f"{prefix}divergence onset of the {gap} gap: not computed ({exc})")


def _waiting(holder: dict) -> None:
    typer.echo(f"waiting for the sweep writing this store (PID {holder.get('pid', '?')}) to finish ...", err=True)


def _exit_with_failures(report) -> None:
    """Print the failures by error type and exit 1 (some rows failed) or 3 (all failed); return when none failed."""
    code = report.exit_code
    if code == 0:
        return
    summary = report.failure_summary()
    typer.echo(
        f"error: {report.n_failed_total} of {report.n_tasks} rows failed "
        f"({'all' if code == 3 else 'some'}; {len(report.kept_failures)} kept from earlier runs): "
        + "; ".join(
            f"{t} x{e['rows']} ({', '.join(e['checkpoints'][:3])}{'...' if len(e['checkpoints']) > 3 else ''})"
            for t, e in summary.items()
        ),
        err=True,
    )
    for t, e in summary.items():
        typer.echo(f"  {t}: {e['example'][:500]}", err=True)
    typer.echo("  the failed rows are stored with their errors; fix the cause and rerun with --retry-failed", err=True)
    raise typer.Exit(code)


SWEEP_HELP = {  # the sweep's own wording: what overrides the plan, what is per worker, which modes it has
    "device": long_help(device_help("cuda if present"), "Device to load checkpoints on (default: cuda if present)."),
    "dtype": long_help(
        "Weights dtype (default: float32).",
        "Load the weights as float32 (default), bfloat16, float16 or float64; curvature algebra stays float32 "
        "at least.",
    ),
    "max_memory": long_help(
        "Memory per estimator, e.g. 8GB (over the plan's).",
        "Memory each curvature estimator may use beyond the model, e.g. 8GB (overrides the plan's max_memory).",
    ),
    "backend": long_help(
        "HVP backend (overrides the plan's).",
        f"HVP backend of the curvature probes (overrides the plan's backend): {' | '.join(BACKEND_NAMES)}",
    ),
    "compute_dtype": long_help(
        "dtype of the products (overrides the plan's).",
        "dtype the curvature probes' products run in (overrides the plan's compute_dtype): float32 | bfloat16 | "
        "float16 | float64 (default: float32 for bfloat16/float16 weights)",
    ),
    "threads": long_help(
        threads_help("auto"),
        "torch threads per process/task (default: the cores shared out between workers; torch's with one process; "
        "1 is best for tiny models).",
    ),
    "parallel": long_help(
        "none | data (under torchrun).",
        "none | data: under torchrun, split each checkpoint's curvature batches over the ranks (rank 0 writes the "
        "store and prints).",
    ),
}
"""Help texts of ``losslens sweep`` for fields of the shared option groups."""


flags(
    SweepSettings,
    out=typer.Option("--out", "-o", help="SQLite results store (created or resumed)."),
    plan=typer.Option(
        "--plan",
        help=long_help(
            "Plan file (default: the built-in plan).", "Plan file (.toml/.yaml/.json); default: the built-in plan."
        ),
    ),
    quick=typer.Option("--quick", help="Smaller default plan (fewer HVPs, less data)."),
    executor=typer.Option("--executor", help="local | ray"),
    address=typer.Option(
        "--address",
        help=long_help(
            "Ray address (default: a local cluster).", "Ray cluster address (default: start a local cluster)."
        ),
    ),
    num_workers=typer.Option(
        "--workers",
        "--num-workers",
        min=1,
        help=long_help(
            "Worker processes (default: the cores).",
            "local: worker processes, each probing whole checkpoints with its own model (N workers need N x the "
            "memory of one) [default: the cores, $LOSSLENS_WORKERS; 1 on CUDA]; ray: CPUs of the local cluster.",
        ),
    ),
    retry_failed=typer.Option("--retry-failed", help="Rerun rows stored as failed."),
    allow_mixed=typer.Option("--allow-mixed", help="Add to a store written by another plan."),
    wait=typer.Option(
        "--wait",
        help=long_help(
            "Wait for another sweep writing --out.",
            "If another sweep is writing to --out, wait for it instead of stopping.",
        ),
    ),
    export=typer.Option("--export", help="Also write the results to .csv/.parquet."),
    quiet=quiet_option(),
    run=typer.Option(
        "--run",
        help=long_help(
            "This trajectory's name in the store (default: the plan's).",
            "This trajectory's name in the store (default: the plan's name): one name per trajectory lets "
            "several (forks of one base) share one store, its correlations and its report.",
        ),
    ),
)


def sweep(
    trajectory: Annotated[str, typer.Argument(help=TRAJECTORY_HELP)],
    *,
    source: TrajectoryOptions = TrajectoryOptions(),
    settings: SweepSettings = SweepSettings(),
    load: LoadOptions = LoadOptions(),
    memory: MemoryOptions = MemoryOptions(),
    compute: ComputeOptions = ComputeOptions(backend=None),
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help=long_help(
                "Print the summary as JSON.", "Print the sweep's summary (counts, failures, notes) as one JSON object."
            ),
        ),
    ] = False,
) -> None:
    """Run every probe of a plan on every checkpoint of a trajectory; resumable (kill and rerun).

    LR and tokens per checkpoint: --schedule / --tokens-per-step, else a trajectory.json with
    "schedule" / "tokens_per_step" in the trajectory folder or in --out's folder, else what the
    checkpoints record. They are stored with the checkpoints (correlate --control lr, phases).

    Exit status: 0 all rows ok; 1 some rows failed; 3 every row failed (the failed rows are in the
    store: fix the cause and rerun with --retry-failed); 2 bad input (nothing was run)."""
    from losslens.lm.core.distributed import DistributedError, is_main_rank
    from losslens.lm.shared_settings import SettingsError
    from losslens.study.sweep import PlanError, StoreError, SweepError
    from losslens.study.trajectory_sweep import SweepSettingsError
    from losslens.study.sweep import Store
    from losslens.study.trajectory_sweep import run_trajectory_sweep, sweep_summary

    flagged: list = []  # rows whose products' measured error is over the tolerance (printed after the sweep)
    try:
        report = run_trajectory_sweep(
            trajectory,
            settings,
            source=source,
            load=load,
            memory=memory,
            compute=compute,
            on_row=lambda row: flagged.append(row) if (row.extra or {}).get("error_warning") else None,
            on_wait=_waiting,
            on_note=lambda line: typer.echo(line, err=True),
        )
    except (PlanError, StoreError, SweepError, SweepSettingsError, SettingsError, DistributedError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    if not is_main_rank():  # rank 0 reports; the others exit with its status when they failed alone
        raise typer.Exit(1 if report.n_failed else 0)
    for line in error_warning_lines(flagged):
        typer.echo(line, err=True)
    if as_json:
        typer.echo(json.dumps(sweep_summary(report), indent=2))
        raise typer.Exit(report.exit_code)
    con = wide_console()
    con.print(str(report))
    for note in report.notes:
        con.print(f"  note: {note}")
    for ck, probe, spec, err in report.failures[:20]:
        con.print(f"  [red]failed[/red] {ck} {probe} {spec}: {err}")
    if settings.export is not None:
        con.print(f"tidy results -> {settings.export}")
    with Store(settings.out) as st:
        df = st.results()
    tab = correlation_summary(df)
    if len(tab):
        print_table(tab, "correlations across checkpoints", con)
    for note in tab.attrs.get("notes", []):
        con.print(f"  note: {note}")
    print_phases(df, con)
    _exit_with_failures(report)


def correlate(
    results: Annotated[Path, typer.Argument(help="SQLite store written by `losslens sweep`.")],
    *,
    x: Annotated[
        List[str], typer.Option("--x", help="x series (repeatable): trace, lambda_max, kurtosis, loss, lr, ...")
    ] = [TRACE.name],
    y: Annotated[
        List[str],
        typer.Option(
            "--y",
            help="y series (repeatable), e.g. gptq:3:g128 (its rel_loss_error) or delta_acc:gptq:3:g128 (Δacc, "
            "accuracy probe); default every quant spec.",
        ),
    ] = [],
    control: Annotated[
        List[str],
        typer.Option("--control", help="Covariates for a partial correlation (repeatable): lr, loss, tokens."),
    ] = [],
    method: Annotated[List[str], typer.Option("--method", help="pearson | spearman | kendall (repeatable).")] = [
        "pearson",
        "spearman",
        "kendall",
    ],
    n_boot: Annotated[
        int, typer.Option("--n-boot", help="0 leaves the 95% intervals out (the inference is closed-form).")
    ] = 2000,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    include_derived: Annotated[
        bool, typer.Option("--include-derived", help="Include LAWA/derived checkpoints.")
    ] = False,
    include_unconverged: Annotated[
        bool,
        typer.Option(
            "--include-unconverged",
            help="Keep values whose estimator did not converge (default: left out and counted in n_unconverged).",
        ),
    ] = False,
    allow_mixed: Annotated[
        bool, typer.Option("--allow-mixed", help="Pool rows computed with different settings or data.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON records.")] = False,
) -> None:
    """Correlate two per-checkpoint series of a sweep (pooled r; within-run r with a 95% CI and p, runs the
    independent units; partial on controls; docs/science.md §6)."""
    from losslens.study.analysis import AnalysisError, summary
    from losslens.study.analysis.inputs import check_method, check_n_boot
    from losslens.study.sweep import Store, StoreError

    try:
        for m in method:
            check_method(m)
        check_n_boot(n_boot)
    except AnalysisError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)

    if not results.is_file():
        typer.echo(f"error: no results store at {results}", err=True)
        raise typer.Exit(2)
    try:
        with Store(results) as st:
            df = st.results()
    except StoreError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    if df.empty:
        typer.echo(f"error: {results} holds no results yet", err=True)
        raise typer.Exit(2)
    try:
        from losslens.study.analysis import series_frame

        opts = dict(include_derived=include_derived, include_unconverged=include_unconverged, allow_mixed=allow_mixed)
        series_frame(df, [*x, *(y or []), *control], **opts)  # validate names (and mixing) early
        tab = summary(df, x=x, y=y or None, controls=control or None, methods=method, n_boot=n_boot, seed=seed, **opts)
    except AnalysisError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    if as_json:
        typer.echo(tab.to_json(orient="records", indent=2))
    else:
        print_table(tab, f"correlations ({results.name})")
    bad = tab[tab["r"].isna()]  # a note alone (descriptive, pooled runs) is information, not a failure
    if len(bad) == len(tab) and len(tab):
        typer.echo(f"error: {bad['note'].iloc[0]}", err=True)
        raise typer.Exit(1)


def error_warning_lines(rows) -> list[str]:
    """One ``warning:`` line per cause among sweep rows whose products' measured relative error is over
    the tolerance (their ``extra["error_warning"]``, :func:`losslens.lm.models.curvature.error_warning`):
    how many rows, which, the range of their errors, the cause and the fix."""
    by_cause: dict[tuple, list] = {}
    for row in rows:
        w = row.extra["error_warning"]
        by_cause.setdefault((w["cause"], w["fix"], w["tolerance"]), []).append((f"{row.checkpoint}/{row.probe}", w))
    lines = []
    for (cause, fix, tol), hits in by_cause.items():
        where = [h[0] for h in hits]
        errs = [h[1]["rel_error"] for h in hits]
        lines.append(
            f"warning: {len(hits)} row(s) ({', '.join(where[:4])}{', …' if len(where) > 4 else ''}) have Hessian "
            f"products whose measured relative error is {min(errs):.2g}–{max(errs):.2g} (> {tol:g}): cause: {cause}; "
            f"fix: {fix}"
        )
    return lines


def register(app: typer.Typer) -> None:
    """Add `sweep`, `sharpness` (:mod:`losslens.cli.sharpness_command`) and `correlate` to the `losslens` app."""
    app.command()(cli(sweep, help=SWEEP_HELP))
    app.command()(cli(sharpness))  # registered here, after sweep, so that `losslens --help` keeps its order
    app.command()(correlate)
