"""`losslens sharpness CHECKPOINT`: Hessian trace and top eigenvalue(s) of one checkpoint
(:func:`losslens.measure.sharpness.sharpness`), printed as two lines or as one JSON object.

Registered by :mod:`losslens.cli.sweep_command` (after ``sweep``); callable from Python as
``sharpness("path/to/checkpoint", as_json=True, memory=MemoryOptions(max_memory="2GB"))``; the
library function (what ``--json`` prints) is ``losslens.sharpness``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated

import typer

from losslens.cli.console import wide_console
from losslens.cli.option_groups import (
    CHECKPOINT_HELP,
    CheckpointOptions,
    ComputeOptions,
    ErrorOptions,
    LoadOptions,
    MemoryOptions,
    StateOptions,
    exit_if_strict,
    warn_flagged,
    quiet_option,
)
from losslens.cli.option_parsing import flags
from losslens.lm.shared_settings import SettingsError
from losslens.measure.sharpness import SharpnessSettings

flags(
    SharpnessSettings,
    num_matvecs=typer.Option("--num-matvecs", help="HVP budget of the trace estimate."),
    method=typer.Option("--method", help="hutch++ | hutchinson"),
    k=typer.Option("--k", help="Top-k eigenvalues."),
    params=typer.Option("--params", help="Parameter globs (repeatable; default all)."),
    seed=typer.Option("--seed", help="Seed of the random probe vectors."),
    quick=typer.Option("--quick", help="Quick (small) curvature set."),
    data=typer.Option("--data", help="Saved TokenSet file for the curvature set."),
    max_iter=typer.Option("--max-iter", help="Eigen solver iterations (power) / Lanczos steps."),
    tol=typer.Option("--tol", help="Eigen tolerance: converged when ‖Hv − λv‖ ≤ tol·|λ|."),
    eigen_method=typer.Option("--eigen-method", help="lanczos | power"),
    quiet=quiet_option(),
)


def sharpness(
    checkpoint: Annotated[str, typer.Argument(help=CHECKPOINT_HELP)],
    *,
    source: CheckpointOptions = CheckpointOptions(),
    settings: SharpnessSettings = SharpnessSettings(),
    load: LoadOptions = LoadOptions(),
    memory: MemoryOptions = MemoryOptions(),
    state: StateOptions = StateOptions(),
    compute: ComputeOptions = ComputeOptions(),
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    errors: ErrorOptions = ErrorOptions(),
) -> None:
    """Sharpness of one checkpoint: Hessian trace (95% CI), top eigenvalue(s), HVPs, timing, memory plan."""
    from losslens.lm.core.distributed import is_main_rank
    from losslens.measure.sharpness import SharpnessError, measure_sharpness

    try:
        res = measure_sharpness(
            checkpoint,
            settings,
            source=source,
            load=load,
            memory=memory,
            compute=compute,
            state=state,
            errors=replace(errors, strict=False),  # --strict: the output first, then exit 1
        )
    except (SharpnessError, SettingsError) as exc:  # others: the app's one line (or --debug)
        typer.echo(f"error: {exc}", err=True)  # every rank: a one-line error each
        raise typer.Exit(2)
    if not is_main_rank():
        return
    choice = res["backend_choice"] or {}
    if "requested" in choice:  # a backend replaced by another: said out loud, recorded in the result
        typer.echo(f"note: --backend {choice['requested']} -> {choice['chosen']}: {choice['why']}", err=True)
    if as_json:
        typer.echo(json.dumps(res, indent=2))
    else:
        _print(res)
    warn_flagged(res["error_warning"])  # after the result: the last line the user reads
    exit_if_strict(errors, res["error_warning"])


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
