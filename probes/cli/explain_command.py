"""`losslens explain CKPT --spec rtn:4:g128 [--spec gptq:4:g128] [--blocks layer] [--within] [--json]`.

Why a quantizer hurts a checkpoint, to second order (:mod:`losslens.measure.explain`): on the curvature set,
ΔL = gᵀδ + ½δᵀHδ + remainder, ½δᵀHδ = ½·‖δ‖²·(tr H/n)·κ (tr H of the quantized matrices, with its
95% interval carried into κ), and δᵀHδ, gᵀδ, ‖δ‖² per block. Prints one table of factors per spec
and one table of blocks per spec, and writes everything as JSON (``--out``); ``--json`` prints the
JSON instead of the tables. The products' measured error (inexact backends) is recorded as ``hvp_check``;
over ``--error-tolerance`` it is flagged (``error_warning``) and printed as one ``warning:`` line on
stderr, and ``--strict`` then exits 1. The work is
:func:`losslens.measure.checkpoint_explanation.explain_measure` (``losslens.explain`` from Python: the
JSON ``--json`` prints).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from losslens.cli.option_groups import (
    CHECKPOINT_HELP,
    CheckpointOptions,
    ComputeOptions,
    ErrorOptions,
    MemoryOptions,
    exit_if_strict,
    warn_flagged,
    quiet_option,
    threads_option,
    device_option,
)
from losslens.cli.option_parsing import cli, flags, option_of
from losslens.measure.checkpoint_explanation import DEFAULT_SPECS, ExplainSettings

flags(
    ExplainSettings,
    spec=typer.Option("--spec", "-s", help=f"quantizer spec, repeatable (default: {' '.join(DEFAULT_SPECS)})"),
    blocks=typer.Option("--blocks", help="block partition: layer, kind, layer_kind, module, parameter"),
    within=typer.Option("--within", help="also δ_bᵀH_bbδ_b per block (one HVP per block and spec)"),
    trace_hvps=typer.Option("--trace-hvps", min=3, help="HVPs of the tr H estimate (shared by the specs)"),
    trace_method=typer.Option("--trace-method", help="hutch++ or hutchinson"),
    quick=typer.Option("--quick", help="small default token sets (smoke runs)"),
    curvature_set=typer.Option("--curvature-set", help="curvature TokenSet file (TokenSet.save)"),
    calib_set=typer.Option("--calib-set", help="calibration TokenSet file (GPTQ / AWQ)"),
    modules=typer.Option("--modules", "-m", help="glob(s) of linear layers to quantize"),
    seed=typer.Option("--seed", help="seed of the trace estimate and the default token sets"),
    device=device_option("cuda when available"),
    threads=threads_option("torch's"),
    backend=option_of(ComputeOptions, "backend"),
    compute_dtype=option_of(ComputeOptions, "compute_dtype"),
    quiet=quiet_option(),
)


def _ci(v: float, lo: float, hi: float) -> str:
    return f"{v:.3g} [{lo:.3g}, {hi:.3g}]"


def _print(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    exps = result["explanations"]
    con = Console(width=max(Console().width, 130))
    t = Table(
        title=f"second-order explanation of {result['checkpoint']} (curvature set; n = {exps[0].factors.dim:,} "
        f"quantized weights)"
    )
    for c in ("spec", "ΔQ", "ΔL", "gᵀδ", "½δᵀHδ", "remainder", "‖δ‖²", "tr H/n [95% CI]", "κ [95% CI]"):
        t.add_column(c, justify="left" if c == "spec" else "right", no_wrap=c == "spec")
    for e in exps:
        f = e.factors
        t.add_row(
            e.spec,
            f"{e.rel_delta:+.3%}",
            f"{f.actual:+.3g}",
            f"{f.gTd:+.3g}",
            f"{f.quadratic:+.3g}",
            f"{f.remainder:+.2g}",
            f"{f.norm2:.3g}",
            _ci(f.trace_per_param, f.trace_per_param_ci_low, f.trace_per_param_ci_high),
            _ci(f.kappa, f.kappa_ci_low, f.kappa_ci_high),
        )
    con.print(t)
    ref = exps[0].factors
    for e in exps[1:]:
        f = e.factors
        if f.quadratic > 0 and ref.quadratic > 0:
            con.print(
                f"{e.spec} vs {exps[0].spec}: log ½δᵀHδ ratio {math.log(f.quadratic / ref.quadratic):+.3f} = "
                f"log ‖δ‖² ratio {math.log(f.norm2 / ref.norm2):+.3f} + log κ ratio "
                f"{math.log(f.kappa / ref.kappa):+.3f}"
            )
        else:
            con.print(f"{e.spec} vs {exps[0].spec}: ½δᵀHδ ≤ 0 for one of them (H is indefinite along δ): no log ratio")
    for e in exps:
        b = Table(title=f"{e.spec} by {e.partition}: parts of δᵀHδ, gᵀδ, ‖δ‖² (they sum to the totals)")
        rows = e.attribution.rows()
        cols = ["block", "size", "norm2_share", "gTd", "quadratic", "dHd_share"] + (
            ["within", "cross"] if e.attribution.within else []
        )
        for c in cols:
            b.add_column(c, justify="left" if c == "block" else "right")
        for r in rows:
            b.add_row(
                *[
                    str(r[c]) if c in ("block", "size") else (f"{r[c]:.1%}" if c.endswith("share") else f"{r[c]:+.3g}")
                    for c in cols
                ]
            )
        con.print(b)
        if e.attribution.within:
            con.print(f"cross-block terms add {e.attribution.cross:+.4g} to δᵀHδ = {e.factors.dHd:+.4g}")
    check = result.get("hvp_check")
    if check is not None:  # an inexact backend (difference): its measured error, the largest of its operators
        err = check.get("rel_error")
        con.print(
            f"HVP products in {check.get('compute_dtype')}: measured relative error "
            f"{'not measured' if err is None else f'{err:.2g}'} ({check.get('reference')})"
        )


EXPLAIN_HELP = {"max_memory": "bytes or e.g. 8GB each curvature step may allocate"}
"""Help texts of ``losslens explain`` for fields of the shared option groups."""


def explain(
    checkpoint: Annotated[str, typer.Argument(help=CHECKPOINT_HELP)],
    *,
    settings: ExplainSettings = ExplainSettings(),
    source: CheckpointOptions = CheckpointOptions(),
    out: Annotated[Path, typer.Option("--out", "-o", help="JSON file to write")] = Path("explain.json"),
    json_out: Annotated[bool, typer.Option("--json", help="print the JSON instead of the tables")] = False,
    memory: MemoryOptions = MemoryOptions(),
    errors: ErrorOptions = ErrorOptions(),
) -> None:
    """Explain CHECKPOINT's quantization error by factor (‖δ‖², tr H/n, κ), by block and by quantizer."""
    from losslens.geometry.base.results import EstimatorError
    from losslens.lm.quant import QuantizeError
    from losslens.lm.shared_settings import SettingsError
    from losslens.measure.checkpoint_explanation import ExplainSettingsError, explain_measure, explain_payload
    from losslens.measure.explain import BlockError, ExplainError

    try:
        result = explain_measure(
            checkpoint, settings, source=source, memory=memory, errors=replace(errors, strict=False)
        )
    except (ExplainError, BlockError, QuantizeError, EstimatorError, ExplainSettingsError, SettingsError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    text = json.dumps(explain_payload(result), indent=1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if json_out:
        typer.echo(text)
    else:
        _print(result)
        typer.echo(f"wrote {out}")
    warn_flagged(result["error_warning"])  # after the result: the last line the user reads
    exit_if_strict(errors, result["error_warning"])


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(cli(explain, help=EXPLAIN_HELP))
