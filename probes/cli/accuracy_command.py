"""`losslens accuracy CHECKPOINT --tasks … [--spec …] [--limit N] [--num-fewshot K] [--json]`.

Task accuracy of one checkpoint through lm-evaluation-harness (:mod:`losslens.measure.accuracy`), FP and
under each quantizer spec, on the same items: per task and for the mean over tasks, acc ± stderr
and n; for each spec Δacc = acc_q − acc_fp and the relative drop (acc_fp − acc_q)/acc_fp with
paired bootstrap 95% intervals (McNemar's p per task). The headline metric is ``acc`` (``acc_norm``
for a task without ``acc``); ``acc_norm`` is printed beside it.

``--tasks``: lm-eval task/group names, task YAML paths or folders, ``embedded`` (the offline task
shipped with losslens) or ``seed-12`` (the seeds' twelve tasks, 5-shot; MMLU counts as one task).
Offline (``HF_DATASETS_OFFLINE=1``) a task whose data is not cached is reported on one line with
how to cache it, and the other tasks still run (exit status 1 then). GPTQ/AWQ specs are calibrated on
:func:`losslens.lm.data.default_token_sets`'s calibration set. The work is
:func:`losslens.measure.accuracy.checkpoint_accuracy.checkpoint_accuracy` (``losslens.accuracy`` from
Python: the records ``--json`` prints).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from losslens.cli.option_groups import CHECKPOINT_HELP, CheckpointOptions, device_option, quiet_option
from losslens.cli.option_parsing import cli, flags, option_of
from losslens.lm.shared_settings import SettingsError
from losslens.measure.accuracy.checkpoint_accuracy import AccuracySettings

flags(
    AccuracySettings,
    tasks=typer.Option(
        "--tasks",
        "-t",
        help="task names, YAML paths/folders, 'embedded', 'seed-12' (repeatable or comma-separated)",
    ),
    spec=typer.Option("--spec", "-s", help="quantizer spec, repeatable (rtn:4:g128, gptq:4, ...)"),
    limit=typer.Option("--limit", min=1, help="a seeded random subsample of N items per task"),
    num_fewshot=typer.Option(
        "--num-fewshot", min=0, help="few-shot examples (default: the preset's or the task's own; seed-12: 5)"
    ),
    seed=typer.Option("--seed", help="seed of the subsample and of the bootstrap"),
    n_boot=typer.Option("--n-boot", min=0, help="paired bootstrap resamples for the Δacc intervals"),
    batch_size=typer.Option("--batch-size", min=1, help="sequences per forward pass"),
    device=device_option("cpu"),
    allow_pickle=typer.Option("--allow-pickle", help="load a .bin/.pt checkpoint that needs full pickle"),
    label=option_of(CheckpointOptions, "label"),
    cache_dir=option_of(CheckpointOptions, "cache_dir"),
    quiet=quiet_option(),
)


def _fmt(v, pct=False):
    if v is None:
        return "–"
    return f"{100 * v:+.2f}" if pct else f"{v:.4f}"


def accuracy(
    checkpoint: Annotated[str, typer.Argument(help=CHECKPOINT_HELP)],
    *,
    settings: AccuracySettings = AccuracySettings(),
    json_out: Annotated[
        bool, typer.Option("--json", help="print one JSON record per (variant, task) and mean")
    ] = False,
) -> None:
    """Task accuracy (lm-eval) of CHECKPOINT, FP and quantized, with paired Δacc intervals."""
    from losslens.measure.accuracy import checkpoint_accuracy

    try:
        records = checkpoint_accuracy.accuracy(checkpoint, settings=settings)
    except SettingsError as exc:
        raise typer.BadParameter(str(exc).removeprefix("--spec: "), param_hint="--spec") from None
    if json_out:
        for r in records:
            typer.echo(json.dumps(r))
    else:
        _print(records, checkpoint, settings)
    failed = [r for r in records if "error" in r]
    for r in failed:
        typer.echo(f"error: {r['variant']} {r['task']}: {r['error']}", err=True)
    if failed:
        raise typer.Exit(1)


def _print(records: list[dict], checkpoint: str, settings: AccuracySettings, console=None) -> None:
    """The records as one table, and what ``acc`` and the mean are. The full table where it fits the
    console (a pipe or a log gets 160 columns); on a narrower terminal (80 columns) a compact one: acc ± se
    and Δacc with its interval in fewer columns, ``acc_norm`` and the relative drop left to ``--json``,
    and no cell cut short (a long name wraps)."""
    from rich.measure import Measurement

    from losslens.cli.console import wide_console

    console = console or wide_console()
    title = (
        f"task accuracy of {checkpoint} (limit {settings.limit or 'all'}, seed {settings.seed}; "
        "Δ in points, paired 95% CI)"
    )
    table = _full_table(records, title)
    compact = Measurement.get(console, console.options.update(width=10_000), table).maximum > console.width
    console.print(_compact_table(records, title) if compact else table)
    note = "acc: lm-eval's acc (acc_norm where a task has no acc); mean: each task weighs the same (MMLU is one task)"
    if compact:
        note += "; p: McNemar's; acc_norm and the relative drop: --json"
    console.print(note, markup=False, highlight=False)


def _ci(r: dict) -> str:
    if r.get("delta_ci_low") is None:
        return ""
    return f"[{100 * r['delta_ci_low']:+.1f}, {100 * r['delta_ci_high']:+.1f}]"


def _p(r: dict) -> str:
    return f"{r['p_mcnemar']:.3g}" if r.get("p_mcnemar") is not None else ""


def _full_table(records: list[dict], title: str):
    from rich.table import Table

    table = Table(title=title)
    for c in ("variant", "task", "n", "acc", "± se", "acc_norm", "Δacc", "95% CI", "rel. drop", "McNemar p"):
        table.add_column(c, justify="left" if c in ("variant", "task") else "right")
    for r in records:
        if "error" in r:
            table.add_row(r["variant"], r["task"], "", "failed", "", "", "", "", "", "")
            continue
        table.add_row(
            r["variant"],
            r["task"],
            str(r["n"]),
            _fmt(r["acc"]),
            _fmt(r["acc_stderr"]),
            _fmt(r.get("acc_norm")),
            _fmt(r.get("delta_acc"), pct=True),
            _ci(r),
            _fmt(r.get("rel_drop"), pct=True),
            _p(r),
        )
    return table


def _compact_table(records: list[dict], title: str):
    """Seven columns, one space between them, no vertical rules: about 75 columns for the longest usual
    names (``gptq:4:g128``, a 17-character task); longer cells wrap, none is cut."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for c in ("variant", "task", "n", "acc ± se", "Δacc", "95% CI", "p"):
        table.add_column(c, justify="left" if c in ("variant", "task") else "right", overflow="fold")
    for r in records:
        if "error" in r:
            table.add_row(r["variant"], r["task"], "", "failed", "", "", "")
            continue
        se = f" ± {r['acc_stderr']:.3f}" if r.get("acc_stderr") is not None else ""
        table.add_row(
            r["variant"],
            r["task"],
            str(r["n"]),
            f"{r['acc']:.3f}{se}",
            _fmt(r.get("delta_acc"), pct=True),
            _ci(r),
            _p(r),
        )
    return table


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(cli(accuracy))
