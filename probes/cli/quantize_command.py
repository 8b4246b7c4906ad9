"""`losslens quantize CHECKPOINT --spec ... [--spec ...] [--json]`: quantization error of one checkpoint.

CHECKPOINT: a checkpoint folder, a trajectory folder (``--label``), or a hub revision
``hf:ORG/NAME@REV`` (:func:`losslens.lm.checkpoints.open_checkpoint`).

For every spec: quantize a copy of the checkpoint, evaluate it on the evaluation set and print
FP loss, quantized loss, ΔQ L = L̂/L − 1 and ΔQ PPL = exp(L̂ − L) − 1 (docs/science.md §2) — one JSON
object per line with ``--json``, a table otherwise. AWQ rows also carry ``calib_objective_ratio``
(its calibration output error relative to RTN's, ≤ 1; ΔQ L on the evaluation set can still be
worse than RTN's: :mod:`losslens.lm.quant.awq`). Data: the checkpoint's own tokenizer and
:func:`losslens.lm.data.default_token_sets` (held-out embedded corpus; disjoint eval and calibration
sets), or token sets saved with :meth:`losslens.lm.core.tokenset.TokenSet.save` (``--eval-set``,
``--calib-set``). The work is :func:`losslens.measure.checkpoint_quantization.quantize_checkpoint`
(``losslens.quantize`` from Python: the rows ``--json`` prints).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from losslens.cli.option_groups import CHECKPOINT_HELP, CheckpointOptions, device_option, quiet_option
from losslens.cli.option_parsing import cli, flags, option_of
from losslens.measure.checkpoint_quantization import DEFAULT_SPECS, QuantizeSettings

flags(
    QuantizeSettings,
    spec=typer.Option(
        "--spec",
        "-s",
        help="quantizer spec, repeatable: rtn:4:g128, rtn:3:row, int8, gptq:4:g128, gptq:3:g128:act, "
        f"bnb-nf4, ... (default: {' '.join(DEFAULT_SPECS)})",
    ),
    calib_batches=typer.Option("--calib-batches", min=1, help="use only the first N calibration batches (GPTQ)"),
    eval_batches=typer.Option("--eval-batches", min=1, help="use only the first N evaluation batches"),
    eval_set=typer.Option("--eval-set", help="evaluation TokenSet file (TokenSet.save)"),
    calib_set=typer.Option("--calib-set", help="calibration TokenSet file (TokenSet.save)"),
    quick=typer.Option("--quick", help="small default token sets (smoke runs)"),
    modules=typer.Option(
        "--modules", "-m", help="glob(s) of linear layers to quantize (default: every Linear in the blocks)"
    ),
    device=device_option("cpu"),
    quiet=quiet_option(),
    allow_pickle=typer.Option(
        "--allow-pickle",
        help="load a .bin/.pt checkpoint that needs full pickle (can run arbitrary code: only for files you trust)",
    ),
    label=option_of(CheckpointOptions, "label"),
    cache_dir=option_of(CheckpointOptions, "cache_dir"),
)


def quantize(
    checkpoint: Annotated[str, typer.Argument(help=CHECKPOINT_HELP)],
    *,
    settings: QuantizeSettings = QuantizeSettings(),
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object per spec (one per line)")] = False,
) -> None:
    """Quantization error (ΔQ L, ΔQ PPL) of CHECKPOINT under each --spec."""
    from losslens.measure import checkpoint_quantization

    try:
        rows = checkpoint_quantization.quantize(checkpoint, settings=settings)
    except checkpoint_quantization.QuantizeCheckpointError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if json_out:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    from rich.console import Console
    from rich.table import Table

    fp = rows[0]
    table = Table(title=f"quantization error of {checkpoint} (FP loss {fp['fp_loss']:.4f}, {fp['n_tokens']} tokens)")
    for c in ("spec", "q_loss", "ΔQ L", "ΔQ PPL", "mean ‖Ŵ−W‖/‖W‖", "kurtosis", "seconds"):
        table.add_column(c, justify="left" if c == "spec" else "right", no_wrap=c == "spec")
    for r in rows:
        table.add_row(
            r["spec"],
            f"{r['q_loss']:.4f}",
            f"{r['rel_loss_error']:+.3%}",
            f"{r['ppl_gap']:+.3%}",
            f"{r['mean_rel_weight_error']:.4f}",
            f"{r['kurtosis']:.3f}",
            f"{r['quant_seconds']:.2f}",
        )
    Console().print(table)
    from losslens.lm.quant.awq import HELD_OUT_NOTE

    for r in rows:
        if r["calib_objective_ratio"] is not None:
            typer.echo(
                f"{r['spec']}: calibration output error {r['calib_objective_ratio']:.3f}× RTN's. " + HELD_OUT_NOTE
            )
    notes = [f"{r['spec']}: {n}" for r in rows for n in r["notes"]]
    for n in notes[:20]:
        typer.echo(f"note: {n}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(cli(quantize))
