"""`losslens sharpness CHECKPOINT`: Hessian trace and top eigenvalue(s) of one checkpoint
(:func:`losslens.measure.sharpness.sharpness`), printed as two lines or as one JSON object.

Registered by :mod:`losslens.cli.sweep_command` (after ``sweep``); callable from Python as
``sharpness("path/to/checkpoint", as_json=True, memory=MemoryOptions(max_memory="2GB"))``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from losslens.cli.console import wide_console
from losslens.cli.option_groups import (
    CHECKPOINT_HELP,
    CheckpointOptions,
    ComputeOptions,
    ErrorOptions,
    LoadOptions,
    MemoryOptions,
)


def sharpness(
    checkpoint: Annotated[str, typer.Argument(help=CHECKPOINT_HELP)],
    *,
    source: CheckpointOptions = CheckpointOptions(),
    num_matvecs: Annotated[int, typer.Option("--num-matvecs", help="HVP budget of the trace estimate.")] = 100,
    method: Annotated[str, typer.Option("--method", help="hutch++ | hutchinson")] = "hutch++",
    k: Annotated[int, typer.Option("--k", help="Top-k eigenvalues.")] = 1,
    params: Annotated[
        Optional[List[str]], typer.Option("--params", help="Parameter globs (repeatable; default all).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    quick: Annotated[bool, typer.Option("--quick", help="Quick (small) curvature set.")] = False,
    data: Annotated[
        Optional[Path], typer.Option("--data", help="Saved TokenSet file for the curvature set (default: built).")
    ] = None,
    max_iter: Annotated[
        int, typer.Option("--max-iter", help="Eigen solver iterations (power) or Lanczos steps.")
    ] = 100,
    tol: Annotated[
        float, typer.Option("--tol", help="Eigen solver tolerance: converged means ‖Hv − λv‖ ≤ tol·|λ|.")
    ] = 1e-3,
    eigen_method: Annotated[
        str,
        typer.Option("--eigen-method", help="lanczos (default) | power; converged means ‖Hv − λv‖ ≤ tol·|λ| for both"),
    ] = "lanczos",
    load: LoadOptions = LoadOptions(),
    memory: MemoryOptions = MemoryOptions(),
    compute: ComputeOptions = ComputeOptions(),
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    errors: ErrorOptions = ErrorOptions(),
) -> None:
    """Sharpness of one checkpoint: Hessian trace (95% CI), top eigenvalue(s), HVPs, timing, memory plan."""
    from losslens.lm.core.distributed import is_main_rank
    from losslens.measure import sharpness as one_checkpoint

    memory.apply()
    try:
        res = one_checkpoint.sharpness(
            checkpoint,
            label=source.label,
            num_matvecs=num_matvecs,
            method=method,
            k=k,
            params=params,
            seed=seed,
            quick=quick,
            device=load.device,
            data=data,
            num_threads=compute.threads,
            max_memory=memory.max_memory,
            dtype=load.dtype,
            max_iter=max_iter,
            tol=tol,
            eigen_method=eigen_method,
            allow_pickle=load.allow_pickle,
            cache_dir=source.cache_dir,
            schedule=source.schedule,
            tokens_per_step=source.tokens_per_step,
            parallel=compute.parallel,
            backend=compute.backend,
            compute_dtype=compute.compute_dtype,
            error_tolerance=errors.error_tolerance,
        )
    except one_checkpoint.SharpnessError as exc:
        typer.echo(f"error: {exc}", err=True)  # every rank: a one-line error each
        raise typer.Exit(2)
    if not is_main_rank():
        return
    choice = res["backend_choice"] or {}
    if "requested" in choice:  # a backend replaced by another: said out loud, recorded in the result
        typer.echo(f"note: --backend {choice['requested']} -> {choice['chosen']}: {choice['why']}", err=True)
    errors.warn(res["error_warning"])
    if as_json:
        typer.echo(json.dumps(res, indent=2))
    else:
        _print(res)
    errors.exit_if_strict(res["error_warning"])


def _print(res: dict) -> None:
    """The two lines of a sharpness result (and the measured product error of an inexact backend)."""
    tr = res["trace"]
    con = wide_console()
    con.print(
        f"{res['checkpoint']}: tr H = {tr['value']:.4g} ± {tr['stderr']:.2g} "
        f"(95% CI [{tr['ci_low']:.4g}, {tr['ci_high']:.4g}], {tr['method']}, {tr['num_matvecs']} HVPs, "
        f"{tr['seconds']:.1f} s)"
    )
    ev = res["eigen"]
    con.print(
        f"λ_max = {ev['values'][0]:.4g} (residual {ev['residuals'][0]:.2g}, {ev['num_matvecs']} HVPs, "
        f"{ev['seconds']:.1f} s); {res['dim']} parameters, curvature set {res['data']['shape']}"
    )
    if res["hvp_check"] is not None:  # a backend with a measured error (difference)
        err = res["hvp_check"].get("rel_error")
        con.print(
            f"HVP backend {res['backend']} in {res['compute_dtype']}: measured relative error "
            f"{'not measured' if err is None else f'{err:.2g}'} ({res['hvp_check'].get('reference')})"
        )
    if not all(ev["converged"]):
        con.print("[red]λ_max did not converge[/red] within the iteration limit: treat it as a lower bound on |λ_max|")
