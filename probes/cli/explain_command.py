"""`losslens explain CKPT --spec rtn:4:g128 [--spec gptq:4:g128] [--blocks layer] [--within] [--json]`.

Why a quantizer hurts a checkpoint, to second order (:mod:`losslens.measure.explain`): on the curvature set,
ΔL = gᵀδ + ½δᵀHδ + remainder, ½δᵀHδ = ½·‖δ‖²·(tr H/n)·κ (tr H of the quantized matrices, with its
95% interval carried into κ), and δᵀHδ, gᵀδ, ‖δ‖² per block. Prints one table of factors per spec
and one table of blocks per spec, and writes everything as JSON (``--out``); ``--json`` prints the
JSON instead of the tables. The products' measured error (inexact backends) is recorded as ``hvp_check``;
over ``--error-tolerance`` it is flagged (``error_warning``) and printed as one ``warning:`` line on
stderr, and ``--strict`` then exits 1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from losslens.cli.option_parsing import cli, option_of
from losslens.cli.option_groups import CHECKPOINT_HELP, CheckpointOptions, ComputeOptions, ErrorOptions, MemoryOptions

DEFAULT_SPECS = ["rtn:4:g128", "gptq:4:g128"]


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
    spec: Annotated[
        Optional[List[str]],
        typer.Option("--spec", "-s", help=f"quantizer spec, repeatable (default: {' '.join(DEFAULT_SPECS)})"),
    ] = None,
    blocks: Annotated[
        str, typer.Option("--blocks", help="block partition: layer, kind, layer_kind, module, parameter")
    ] = "layer",
    within: Annotated[
        bool, typer.Option("--within", help="also δ_bᵀH_bbδ_b per block (one HVP per block and spec)")
    ] = False,
    trace_hvps: Annotated[
        int, typer.Option("--trace-hvps", min=3, help="HVPs of the tr H estimate (shared by the specs)")
    ] = 30,
    trace_method: Annotated[str, typer.Option("--trace-method", help="hutch++ or hutchinson")] = "hutch++",
    source: CheckpointOptions = CheckpointOptions(),
    out: Annotated[Path, typer.Option("--out", "-o", help="JSON file to write")] = Path("explain.json"),
    json_out: Annotated[bool, typer.Option("--json", help="print the JSON instead of the tables")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="small default token sets (smoke runs)")] = False,
    curvature_set: Annotated[
        Optional[Path], typer.Option("--curvature-set", help="curvature TokenSet file (TokenSet.save)")
    ] = None,
    calib_set: Annotated[
        Optional[Path], typer.Option("--calib-set", help="calibration TokenSet file (GPTQ / AWQ)")
    ] = None,
    modules: Annotated[
        Optional[List[str]], typer.Option("--modules", "-m", help="glob(s) of linear layers to quantize")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed of the trace estimate and the default token sets")] = 0,
    device: Annotated[
        Optional[str], typer.Option("--device", help="torch device (default: cuda when available)")
    ] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="torch threads")] = None,
    memory: MemoryOptions = MemoryOptions(),
    backend: Annotated[str, option_of(ComputeOptions, "backend")] = "reverse",
    compute_dtype: Annotated[Optional[str], option_of(ComputeOptions, "compute_dtype")] = None,
    errors: ErrorOptions = ErrorOptions(),
) -> None:
    """Explain CHECKPOINT's quantization error by factor (‖δ‖², tr H/n, κ), by block and by quantizer."""
    from losslens.geometry.base.results import EstimatorError
    from losslens.measure.explain import BlockError, ExplainError, explain_checkpoint
    from losslens.lm.quant import QuantizeError, QuantSpec

    memory.apply()
    specs = spec or DEFAULT_SPECS
    try:
        specs = [str(QuantSpec.parse(s)) for s in specs]
    except QuantizeError as e:
        raise typer.BadParameter(str(e), param_hint="--spec") from None
    try:
        result = explain_checkpoint(
            checkpoint,
            specs,
            label=source.label,
            blocks=blocks,
            within=within,
            trace_matvecs=trace_hvps,
            trace_method=trace_method,
            seed=seed,
            quick=quick,
            device=device,
            curvature_set=curvature_set,
            calibration_set=calib_set,
            modules=modules,
            num_threads=threads,
            max_memory=memory.max_memory,
            cache_dir=source.cache_dir,
            schedule=source.schedule,
            tokens_per_step=source.tokens_per_step,
            backend=backend,
            compute_dtype=compute_dtype,
            error_tolerance=errors.error_tolerance,
        )
    except (ExplainError, BlockError, QuantizeError, EstimatorError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    payload = {k: v for k, v in result.items() if k != "explanations"}
    payload["explanations"] = [e.to_dict() for e in result["explanations"]]
    text = json.dumps(payload, indent=1, default=str)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    errors.warn(result["error_warning"])
    if json_out:
        typer.echo(text)
    else:
        _print(result)
        typer.echo(f"wrote {out}")
    errors.exit_if_strict(result["error_warning"])


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(cli(explain, help=EXPLAIN_HELP))
