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
``--calib-set``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from losslens.cli.option_parsing import option_of
from losslens.cli.option_groups import CHECKPOINT_HELP, CheckpointOptions

DEFAULT_SPECS = ["int8", "rtn:4:g128", "rtn:3:g128", "gptq:4:g128"]


def quantize(
    checkpoint: Annotated[str, typer.Argument(help=CHECKPOINT_HELP)],
    *,
    spec: Annotated[
        Optional[List[str]],
        typer.Option(
            "--spec",
            "-s",
            help="quantizer spec, repeatable: rtn:4:g128, rtn:3:row, int8, gptq:4:g128, gptq:3:g128:act, "
            f"bnb-nf4, ... (default: {' '.join(DEFAULT_SPECS)})",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object per spec (one per line)")] = False,
    calib_batches: Annotated[
        Optional[int], typer.Option("--calib-batches", min=1, help="use only the first N calibration batches (GPTQ)")
    ] = None,
    eval_batches: Annotated[
        Optional[int], typer.Option("--eval-batches", min=1, help="use only the first N evaluation batches")
    ] = None,
    eval_set: Annotated[
        Optional[Path], typer.Option("--eval-set", help="evaluation TokenSet file (TokenSet.save)")
    ] = None,
    calib_set: Annotated[
        Optional[Path], typer.Option("--calib-set", help="calibration TokenSet file (TokenSet.save)")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="small default token sets (smoke runs)")] = False,
    modules: Annotated[
        Optional[List[str]],
        typer.Option(
            "--modules", "-m", help="glob(s) of linear layers to quantize (default: every Linear in the blocks)"
        ),
    ] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="torch device (default: cpu)")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="progress bars on stderr")] = False,
    allow_pickle: Annotated[
        bool,
        typer.Option(
            "--allow-pickle",
            help="load a .bin/.pt checkpoint that needs full pickle (can run arbitrary code: only for files you trust)",
        ),
    ] = False,
    label: Annotated[Optional[str], option_of(CheckpointOptions, "label")] = None,
    cache_dir: Annotated[Optional[Path], option_of(CheckpointOptions, "cache_dir")] = None,
) -> None:
    """Quantization error (ΔQ L, ΔQ PPL) of CHECKPOINT under each --spec."""
    from losslens.lm.core.next_token_loss import evaluate
    from losslens.lm.core.tokenset import TokenSet, TokenSetError
    from losslens.lm.quant import QuantizeError, QuantSpec, quantization_error

    specs_text = spec or DEFAULT_SPECS
    try:
        specs = [QuantSpec.parse(s) for s in specs_text]
    except QuantizeError as e:
        raise typer.BadParameter(str(e), param_hint="--spec") from None
    from losslens.lm.checkpoints import CheckpointError, CheckpointLoader, open_checkpoint

    try:
        traj, ref = open_checkpoint(checkpoint, label, cache_dir=cache_dir, alone=True)
        model = CheckpointLoader(traj, device=device, allow_pickle=allow_pickle).load(ref)
    except (CheckpointError, OSError, ValueError) as e:
        raise typer.BadParameter(f"cannot load {checkpoint}: {e}", param_hint="CHECKPOINT") from None
    model.eval()
    try:
        sets = {}
        if eval_set is None or (calib_set is None and any(s.needs_calibration for s in specs)):
            from losslens.lm.data import default_token_sets

            sets = default_token_sets(traj, quick=quick)
        ev = TokenSet.load(eval_set) if eval_set else sets["eval"]
        cal = TokenSet.load(calib_set) if calib_set else sets.get("calibration")
    except (TokenSetError, OSError, ValueError) as e:
        raise typer.BadParameter(f"cannot build or read the token sets: {e}") from None
    try:
        if eval_batches:
            ev = ev.subset(eval_batches)
        if calib_batches and cal is not None:
            cal = cal.subset(calib_batches)
    except TokenSetError as e:
        raise typer.BadParameter(str(e)) from None

    fp = evaluate(model, ev, progress=progress)
    rows = []
    for s in specs:
        try:
            err = quantization_error(
                model, s, ev, calibration=cal if s.needs_calibration else None, modules=modules or None, fp_loss=fp
            )
        except QuantizeError as e:
            typer.echo(f"error: {s}: {e}", err=True)
            raise typer.Exit(2)
        errs = list(err.layer_errors.values())
        row = {
            "checkpoint": str(checkpoint),
            "label": ref.label,
            "step": ref.step,
            "spec": err.spec,
            "fp_loss": err.fp_loss,
            "q_loss": err.q_loss,
            "rel_loss_error": err.rel_loss_error,
            "ppl_gap": err.ppl_gap,
            "fp_ppl": err.fp_ppl,
            "q_ppl": err.q_ppl,
            "mean_rel_weight_error": sum(errs) / len(errs) if errs else math.nan,
            "kurtosis": err.kurtosis,
            "n_layers": len(errs),
            "n_tokens": err.n_tokens,
            "eval_hash": ev.content_hash,
            "calib_hash": cal.content_hash if (cal is not None and s.needs_calibration) else None,
            "calib_objective_ratio": err.calib_objective_ratio,
            "quant_seconds": err.quant_seconds,
            "seconds": err.seconds,
            "notes": list(err.notes),
        }
        rows.append(row)
        if json_out:
            typer.echo(json.dumps(row))
    if not json_out:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"quantization error of {checkpoint} (FP loss {fp.loss:.4f}, {fp.n_tokens} tokens)")
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
    app.command()(quantize)
