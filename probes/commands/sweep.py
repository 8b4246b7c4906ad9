"""`losslens sweep`, `losslens sharpness`, `losslens correlate`: trajectory sweeps and their statistics."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List, Optional

import typer

from ._shared import (CHECKPOINT_HELP, TRAJECTORY_HELP, apply_strict_memory, backend_option, cache_dir_option, compute_dtype_option,
                      label_option,
                      schedule_option, strict_memory_option, tokens_option)


def _torch_dtype(name: str | None):
    """A ``--dtype`` name as a torch dtype (None keeps the loader's default, float32)."""
    if name is None:
        return None
    import torch

    return getattr(torch, name)


def _console(stderr: bool = False):
    from rich.console import Console

    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=160)


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3g}" if abs(v) < 1e-2 and v != 0 else f"{v:.3f}"
    return str(v)


def print_table(df, title: str, console=None) -> None:
    """Print a small DataFrame as a rich table."""
    from rich.table import Table

    console = console or _console()
    if "note" in df.columns and (df["note"] == "").all():
        df = df.drop(columns=["note"])
    if "n_unconverged" in df.columns and (df["n_unconverged"] == 0).all():
        df = df.drop(columns=["n_unconverged"])
    t = Table(title=title)
    for c in df.columns:
        t.add_column(str(c))
    for _, row in df.iterrows():
        t.add_row(*[_fmt(v) for v in row])
    console.print(t)


def correlation_summary(df, x=None, y=None, controls=None, methods=("pearson", "spearman"), n_boot: int = 2000):
    """The summary table printed at the end of a sweep (x: curvature series, y: quantizer specs;
    a partial correlation on LR when there are enough checkpoints). Why there is no LR control,
    when there is none, is in ``table.attrs["notes"]`` (printed under the table)."""
    import probes.analysis as analysis

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
                notes.append(f"no partial correlation on lr: only {known} checkpoint(s) record their LR (needs 5; "
                             "give --schedule or a trajectory.json)")
            elif lr.nunique() <= 1:
                notes.append(f"no partial correlation on lr: it is constant ({lr.dropna().iloc[0]:g}) over the checkpoints")
            else:
                controls = ["lr"]
    tab = analysis.summary(df, x=x, y=y, controls=controls, methods=methods, n_boot=n_boot)
    tab.attrs["notes"] = notes
    return tab


def print_phases(df, console=None, gap: str | None = None) -> None:
    """Print the FP-convergence onset and the divergence onset of a quantization gap (SCIENCE §6)."""
    from probes.analysis import AnalysisError, convergence_onset, divergence_onset, series_frame

    con = console or _console()
    qs = list(dict.fromkeys(df.loc[(df["probe"] == "quant") & (df["status"] == "ok"), "spec"]))
    if gap is None and qs:
        gap = next((q for q in qs if q.startswith("rtn:4")), qs[0])
    try:
        frame = series_frame(df, ["step", "lr", "loss"])
        c = convergence_onset(frame["step"], frame["loss"], frame["lr"])
        tail = "" if c.found else " (the loss still improves at the last checkpoint)"
        con.print(f"FP-convergence onset: step {c.step:g}, lr {c.lr}{tail}")
    except (AnalysisError, KeyError) as exc:
        con.print(f"FP-convergence onset: not computed ({exc})")
    if gap is None:
        return
    try:
        frame = series_frame(df, ["step", "lr", gap])
        d = divergence_onset(frame["step"], frame[gap], frame["lr"])
        excl = f"; {d.n_excluded} non-positive/NaN gaps excluded" if d.n_excluded else ""
        con.print(f"divergence onset of the {gap} gap: step {d.step:g}, lr {d.lr} (log-gap slope "
                  f"{d.details['slope_before']:.3g} -> {d.details['slope_after']:.3g} per step{excl})")
    except (AnalysisError, KeyError) as exc:
        con.print(f"divergence onset of the {gap} gap: not computed ({exc})")


def _check_quick(quick: bool, plan) -> None:
    if quick and plan is not None:
        typer.echo("error: --quick shrinks the built-in plan and cannot change a --plan file; drop --quick, or set "
                   "smaller sizes in the plan ([data] shapes, trace.num_matvecs, eigen.max_iter)", err=True)
        raise typer.Exit(2)


def _waiting(holder: dict) -> None:
    typer.echo(f"waiting for the sweep writing this store (PID {holder.get('pid', '?')}) to finish ...", err=True)


def _exit_with_failures(report) -> None:
    """Print the failures by error type and exit 1 (some rows failed) or 3 (all failed); return when none failed."""
    code = report.exit_code
    if code == 0:
        return
    summary = report.failure_summary()
    typer.echo(f"error: {report.n_failed_total} of {report.n_tasks} rows failed "
               f"({'all' if code == 3 else 'some'}; {len(report.kept_failures)} kept from earlier runs): "
               + "; ".join(f"{t} x{e['rows']} ({', '.join(e['checkpoints'][:3])}{'...' if len(e['checkpoints']) > 3 else ''})"
                           for t, e in summary.items()), err=True)
    for t, e in summary.items():
        typer.echo(f"  {t}: {e['example'][:500]}", err=True)
    typer.echo("  the failed rows are stored with their errors; fix the cause and rerun with --retry-failed", err=True)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    @app.command()
    def sweep(
        trajectory: str = typer.Argument(..., help=TRAJECTORY_HELP),
        out: Path = typer.Option(Path("results.sqlite"), "--out", "-o", help="SQLite results store (created or resumed)."),
        plan: Optional[Path] = typer.Option(None, "--plan", help="Plan file (.toml/.yaml/.json); default: the built-in plan."),
        executor: str = typer.Option("local", "--executor", help="local | ray"),
        address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: start a local cluster)."),
        num_workers: Optional[int] = typer.Option(None, "--workers", "--num-workers", min=1, help="local: worker processes, "
                                                  "each probing whole checkpoints with its own model (N workers need N x "
                                                  "the memory of one) [default: the cores, $LOSSLENS_WORKERS; 1 on CUDA]; "
                                                  "ray: CPUs of the local cluster."),
        retry_failed: bool = typer.Option(False, "--retry-failed", help="Rerun rows stored as failed."),
        allow_mixed: bool = typer.Option(False, "--allow-mixed", help="Add to a store written by another plan."),
        quick: bool = typer.Option(False, "--quick", help="Smaller default plan (fewer HVPs, smaller data)."),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="Load the weights as float32 (default), bfloat16, float16 or float64; curvature algebra stays float32 at least."),
        device: Optional[str] = typer.Option(None, "--device", help="Device to load checkpoints on (default: cuda if present)."),
        threads: Optional[int] = typer.Option(None, "--threads", help="torch threads per process/task (default: the cores shared out between workers; torch's with one process; 1 is best for tiny models)."),
        export: Optional[Path] = typer.Option(None, "--export", help="Also write the tidy results to .csv or .parquet."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display (for logs)."),
        max_memory: Optional[str] = typer.Option(None, "--max-memory", help="Memory each curvature estimator may use beyond the model, e.g. 8GB (overrides the plan's max_memory)."),
        strict_memory: Optional[bool] = strict_memory_option(),
        backend: Optional[str] = typer.Option(None, "--backend", help="HVP backend of the curvature probes (overrides the "
                                              "plan's backend): reverse | forward | difference | auto"),
        compute_dtype: Optional[str] = compute_dtype_option(),
        wait: bool = typer.Option(False, "--wait", help="If another sweep is writing to --out, wait for it instead of stopping."),
        allow_pickle: bool = typer.Option(False, "--allow-pickle", help="Load .bin/.pt checkpoints that need full pickle "
                                          "(can run arbitrary code: only for files you trust)."),
        cache_dir: Optional[Path] = cache_dir_option(),
        schedule: Optional[str] = schedule_option(),
        tokens_per_step: Optional[int] = tokens_option(),
        parallel: str = typer.Option("none", "--parallel", help="none | data: under torchrun, split each checkpoint's "
                                     "curvature batches over the ranks (rank 0 writes the store and prints)."),
    ) -> None:
        """Run every probe of a plan on every checkpoint of a trajectory; resumable (kill and rerun).

        LR and tokens per checkpoint: --schedule / --tokens-per-step, else a trajectory.json with
        "schedule" / "tokens_per_step" in the trajectory folder or in --out's folder, else what the
        checkpoints record. They are stored with the checkpoints (correlate --control lr, phases).

        Exit status: 0 all rows ok; 1 some rows failed; 3 every row failed (the failed rows are in the
        store: fix the cause and rerun with --retry-failed); 2 bad input (nothing was run)."""
        from probes.core.distributed import DistributedError, init_data_parallel, is_main_rank
        from probes.sweep import PlanError, Plan, Store, StoreError, SweepError, load_plan, resolve_trajectory, run_sweep

        _check_quick(quick, plan)
        apply_strict_memory(strict_memory, max_memory)
        if parallel == "data":
            try:
                device = init_data_parallel(device=device)[2]
            except DistributedError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2)
        dtypes = {"float32", "bfloat16", "float16", "float64"}
        if dtype is not None and dtype not in dtypes:
            typer.echo(f"error: --dtype {dtype!r} is unknown; valid: {', '.join(sorted(dtypes))}", err=True)
            raise typer.Exit(2)
        traj = resolve_trajectory(trajectory, cache_dir=cache_dir, schedule=schedule, tokens_per_step=tokens_per_step,
                                  sidecars=[out.parent / "trajectory.json"])
        sched, tps = traj.meta.get("schedule"), traj.meta.get("tokens_per_step")
        if (sched or tps) and is_main_rank():
            said = [f"LR from the schedule {sched}"] if sched else []
            said += [f"tokens = step × {tps}"] if tps else []
            typer.echo(f"{traj.name}: {'; '.join(said)}", err=True)
        try:
            p = Plan.default(quick=quick) if plan is None else load_plan(plan)
            if max_memory is not None:
                p = p.replace(max_memory=max_memory)
            if backend is not None:
                p = p.replace(backend=backend)
            if compute_dtype is not None:
                p = p.replace(compute_dtype=compute_dtype)
            report = run_sweep(traj, p, out=out, executor=executor, address=address, retry_failed=retry_failed,
                               allow_mixed=allow_mixed, progress=not quiet, device=device, num_workers=num_workers,
                               num_threads=threads, wait=wait, on_wait=_waiting, allow_pickle=allow_pickle,
                               dtype=_torch_dtype(dtype), parallel=parallel)
        except (PlanError, StoreError, SweepError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2)
        if not is_main_rank():  # rank 0 reports; the others exit with its status when they failed alone
            raise typer.Exit(1 if report.n_failed else 0)
        con = _console()
        con.print(str(report))
        for note in report.notes:
            con.print(f"  note: {note}")
        for ck, probe, spec, err in report.failures[:20]:
            con.print(f"  [red]failed[/red] {ck} {probe} {spec}: {err}")
        with Store(out) as st:
            df = st.results()
            if export is not None:
                st.export(export)
                con.print(f"tidy results -> {export}")
        tab = correlation_summary(df)
        if len(tab):
            print_table(tab, "correlations across checkpoints", con)
        for note in tab.attrs.get("notes", []):
            con.print(f"  note: {note}")
        print_phases(df, con)
        _exit_with_failures(report)

    @app.command()
    def sharpness(
        checkpoint: str = typer.Argument(..., help=CHECKPOINT_HELP),
        label: Optional[str] = label_option(),
        num_matvecs: int = typer.Option(100, "--num-matvecs", help="HVP budget of the trace estimate."),
        method: str = typer.Option("hutch++", "--method", help="hutch++ | hutchinson"),
        k: int = typer.Option(1, "--k", help="Top-k eigenvalues."),
        params: Optional[List[str]] = typer.Option(None, "--params", help="Parameter globs (repeatable; default all)."),
        seed: int = typer.Option(0, "--seed"),
        quick: bool = typer.Option(False, "--quick", help="Quick (small) curvature set."),
        device: Optional[str] = typer.Option(None, "--device"),
        data: Optional[Path] = typer.Option(None, "--data", help="Saved TokenSet file for the curvature set (default: built)."),
        threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (default: torch's)."),
        max_memory: Optional[str] = typer.Option(None, "--max-memory", help="Memory each estimator may use beyond the model, e.g. 8GB (default: a third of the total RAM / 80% of the GPU memory not held by the model; what each estimator chose is in the output)."),
        strict_memory: Optional[bool] = strict_memory_option(),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="Load the weights as float32 (default), bfloat16, float16 or float64."),
        max_iter: int = typer.Option(100, "--max-iter", help="Eigen solver iterations (power) or Lanczos steps."),
        tol: float = typer.Option(1e-3, "--tol", help="Eigen solver tolerance: converged means ‖Hv − λv‖ ≤ tol·|λ|."),
        eigen_method: str = typer.Option("lanczos", "--eigen-method", help="lanczos (default) | power; converged means ‖Hv − λv‖ ≤ tol·|λ| for both"),
        backend: str = backend_option(),
        compute_dtype: Optional[str] = compute_dtype_option(),
        error_tolerance: float = typer.Option(1e-2, "--error-tolerance", help="Relative error of the HVP products (as "
                                              "measured against an exact reference) above which a warning is printed "
                                              "and the result flagged (error_warning)."),
        strict: bool = typer.Option(False, "--strict", help="Exit with status 1 when the result is flagged "
                                    "(measured product error over --error-tolerance); default: warn and exit 0."),
        allow_pickle: bool = typer.Option(False, "--allow-pickle", help="Load a .bin/.pt checkpoint that needs full pickle "
                                          "(can run arbitrary code: only for files you trust)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        cache_dir: Optional[Path] = cache_dir_option(),
        schedule: Optional[str] = schedule_option(),
        tokens_per_step: Optional[int] = tokens_option(),
        parallel: str = typer.Option("none", "--parallel", help="none | data | fsdp, under torchrun: data splits the "
                                     "curvature batches over the ranks; fsdp also shards the model, every vector and the "
                                     "estimators' state (FSDP2, gradient differences). Only rank 0 prints."),
    ) -> None:
        """Sharpness of one checkpoint: Hessian trace (95% CI), top eigenvalue(s), HVPs, timing, memory plan."""
        from probes.core.distributed import is_main_rank
        from probes.sweep.sharpness import SharpnessError, sharpness as _sharpness

        apply_strict_memory(strict_memory, max_memory)
        try:
            res = _sharpness(checkpoint, label=label, num_matvecs=num_matvecs, method=method, k=k, params=params, seed=seed,
                             quick=quick, device=device, data=data, num_threads=threads, max_memory=max_memory,
                             dtype=dtype, max_iter=max_iter, tol=tol, eigen_method=eigen_method, allow_pickle=allow_pickle,
                             cache_dir=cache_dir, schedule=schedule, tokens_per_step=tokens_per_step, parallel=parallel,
                             backend=backend, compute_dtype=compute_dtype, error_tolerance=error_tolerance)
        except SharpnessError as exc:
            typer.echo(f"error: {exc}", err=True)  # every rank: a one-line error each
            raise typer.Exit(2)
        if not is_main_rank():
            return
        choice = res["backend_choice"] or {}
        if "requested" in choice:  # a backend replaced by another: said out loud, recorded in the result
            typer.echo(f"note: --backend {choice['requested']} -> {choice['chosen']}: {choice['why']}", err=True)
        if res["error_warning"]:
            typer.echo(f"warning: {res['error_warning']['message']}", err=True)
        if as_json:
            typer.echo(json.dumps(res, indent=2))
        else:
            _print_sharpness(res)
        if strict and res["error_warning"]:
            raise typer.Exit(1)

    def _print_sharpness(res: dict) -> None:
        tr = res["trace"]
        con = _console()
        con.print(f"{res['checkpoint']}: tr H = {tr['value']:.4g} ± {tr['stderr']:.2g} "
                  f"(95% CI [{tr['ci_low']:.4g}, {tr['ci_high']:.4g}], {tr['method']}, {tr['num_matvecs']} HVPs, {tr['seconds']:.1f} s)")
        ev = res["eigen"]
        con.print(f"λ_max = {ev['values'][0]:.4g} (residual {ev['residuals'][0]:.2g}, {ev['num_matvecs']} HVPs, {ev['seconds']:.1f} s); "
                  f"{res['dim']} parameters, curvature set {res['data']['shape']}")
        if res["hvp_check"] is not None:  # a backend with a measured error (difference)
            err = res["hvp_check"].get("rel_error")
            con.print(f"HVP backend {res['backend']} in {res['compute_dtype']}: measured relative error "
                      f"{'not measured' if err is None else f'{err:.2g}'} ({res['hvp_check'].get('reference')})")
        if not all(ev["converged"]):
            con.print("[red]λ_max did not converge[/red] within the iteration limit: treat it as a lower bound on |λ_max|")

    @app.command()
    def correlate(
        results: Path = typer.Argument(..., help="SQLite store written by `losslens sweep`."),
        x: List[str] = typer.Option(["trace"], "--x", help="x series (repeatable): trace, lambda_max, kurtosis, loss, lr, ..."),
        y: List[str] = typer.Option([], "--y", help="y series (repeatable), e.g. gptq:3:g128 (its rel_loss_error) or delta_acc:gptq:3:g128 (Δacc, accuracy probe); default every quant spec."),
        control: List[str] = typer.Option([], "--control", help="Covariates for a partial correlation (repeatable): lr, loss, tokens."),
        method: List[str] = typer.Option(["pearson", "spearman", "kendall"], "--method", help="pearson | spearman | kendall (repeatable)."),
        n_boot: int = typer.Option(2000, "--n-boot", help="Bootstrap resamples for the 95% interval."),
        seed: int = typer.Option(0, "--seed"),
        include_derived: bool = typer.Option(False, "--include-derived", help="Include LAWA/derived checkpoints."),
        include_unconverged: bool = typer.Option(False, "--include-unconverged", help="Keep values whose estimator did not "
                                                 "converge (default: left out and counted in n_unconverged)."),
        allow_mixed: bool = typer.Option(False, "--allow-mixed", help="Pool rows computed with different settings or data."),
        as_json: bool = typer.Option(False, "--json", help="Print the table as JSON records."),
    ) -> None:
        """Correlate two per-checkpoint series of a sweep (bootstrap 95% CI, p-value, partial on controls)."""
        from probes.analysis import AnalysisError, summary
        from probes.analysis.inputs import check_method, check_n_boot
        from probes.sweep import Store, StoreError

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
            from probes.analysis import series_frame

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
        bad = tab[tab["r"].isna()]  # a note alone (descriptive, block capped) is information, not a failure
        if len(bad) == len(tab) and len(tab):
            typer.echo(f"error: {bad['note'].iloc[0]}", err=True)
            raise typer.Exit(1)
