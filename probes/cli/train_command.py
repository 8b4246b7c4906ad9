"""`losslens train-tiny` (one run or a sweep): controlled runs of the embedded tiny GPT-NeoX on the
embedded corpus. Continuing them under other schedules (`losslens fork`, `losslens compare-forks`):
:mod:`losslens.cli.train_forks_command`. The work is
:func:`losslens.study.monitor.tiny_monitor.train_tiny_watched` (settings: :class:`TrainSettings`,
:class:`WatchSettings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from losslens.cli.option_groups import quiet_option, threads_option
from losslens.cli.option_parsing import cli, flags
from losslens.lm.train.config import TrainError
from losslens.lm.train.train_settings import TrainSettings
from losslens.study.monitor.tiny_monitor import WatchSettings, train_tiny_watched

flags(
    TrainSettings,
    schedule=typer.Option(help="LR schedule: wsd | cosine | constant | linear [wsd]"),
    peak_lr=typer.Option("--peak-lr", help="peak learning rate [3e-3]"),
    steps=typer.Option(help="optimizer updates [800; --tiny 60]"),
    checkpoints=typer.Option(help="checkpoints to write, evenly spaced [8; --tiny 3]"),
    seed=typer.Option(help="init seed (also the data-order seed unless --data-seed) [0]"),
    tiny=typer.Option("--tiny", help="tiny preset for tests/smoke runs (~60k params, seconds)"),
    weight_decay=typer.Option("--weight-decay", help="AdamW decoupled weight decay [1.0]"),
    warmup=typer.Option(help="warmup fraction of steps [0.05]"),
    decay=typer.Option(help="WSD: decay fraction of steps [0.2]"),
    min_lr_ratio=typer.Option("--min-lr-ratio", help="final LR / peak LR [0]"),
    batch_size=typer.Option("--batch-size", help="sequences per step [32]"),
    seq_len=typer.Option("--seq-len", help="tokens per sequence = context length [64]"),
    hidden_size=typer.Option("--hidden", help="hidden size [64]"),
    num_layers=typer.Option("--layers", help="transformer blocks [2]"),
    num_heads=typer.Option("--heads", help="attention heads [4]"),
    vocab_size=typer.Option("--vocab-size", help="BPE vocabulary size [512]"),
    grad_clip=typer.Option("--grad-clip", help="gradient-norm clip, 0 = off [1.0]"),
    val_batches=typer.Option("--val-batches", help="validation batches [8]"),
    data_seed=typer.Option("--data-seed", help="data-order seed [= --seed]"),
    save_optimizer=typer.Option("--save-optimizer", help="save AdamW state (resumable/forkable)"),
    resume_from=typer.Option("--resume-from", help="continue from this checkpoint folder"),
    name=typer.Option(help="run name [derived from the config]"),
    data_dir=typer.Option("--data-dir", help="tokenizer/token-stream cache to share between runs [OUT/data]"),
    threads=threads_option("auto: 1 for hidden <= 64, else torch's; 0: torch's"),
    sweep=typer.Option(
        "--sweep",
        help="sweep KEY=V1,V2,... (repeatable; keys: lr, "
        "wd, schedule, steps, hidden, ... or any TrainConfig field): trains "
        "the cartesian product into OUT/<name>/ + OUT/sweep.json",
    ),
    seeds=typer.Option(
        "--seeds", help="comma-separated seeds, e.g. 0,1 (a sweep over seeds; runs in OUT/<name>-s<seed>/)"
    ),
    force=typer.Option("--force", help="overwrite a different run in --out"),
    quiet=quiet_option(),
)
flags(
    WatchSettings,
    monitor=typer.Option(
        "--monitor",
        help="measure ΔQ (RTN INT3, INT2-g32), loss, trace and "
        "λ_max while training into OUT/monitor.sqlite (losslens.study.monitor; `losslens "
        "report` reads it); training is unchanged",
    ),
    monitor_every=typer.Option("--monitor-every", help="with --monitor: measure every N steps [50]"),
)


def _report_run(entry: dict) -> None:
    """One line per finished run of a sweep."""
    loss = entry.get("final_val_loss")
    typer.echo(
        f"  {entry['name']}: {entry['status']}"
        + (f", validation loss {loss:.4f}" if loss is not None else "")
        + (f" ({entry['error']})" if entry.get("error") else "")
    )


def train_tiny_cmd(
    *,
    out: Annotated[Path, typer.Option("--out", help="output folder (step-NNNNNN/ checkpoints + trajectory.json)")],
    settings: TrainSettings = TrainSettings(),
    watch: WatchSettings = WatchSettings(),
) -> None:
    """Train a tiny GPT-NeoX on the embedded corpus and write an HF-checkpoint trajectory.

    With --sweep / --seeds: train every combination (finished runs are skipped on reruns) and
    index them in OUT/sweep.json. Add --save-optimizer to make the runs forkable
    (`losslens fork`)."""
    try:
        done = train_tiny_watched(out, settings, watch, on_run=_report_run)
    except TrainError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if done.runs.runs is not None:
        runs, failed = done.runs.runs, done.runs.failed
        typer.echo(
            f"sweep: {len(done.runs.trajectories)} of {len(runs)} runs finished in {Path(out).resolve()} "
            f"(index: sweep.json){f'; {len(failed)} failed' if failed else ''}"
        )
        if failed:
            raise typer.Exit(1)
        return
    traj = done.runs.trajectories[0]
    last = traj[len(traj) - 1]
    meta = traj.meta
    typer.echo(
        f"wrote {len(traj)} checkpoints of {traj.name} ({meta.get('n_params', '?'):,} parameters) to "
        f"{Path(out).resolve()}"
    )
    typer.echo(
        f"  final step {last.step}: train loss {last.meta.get('train_loss', float('nan')):.4f}, "
        f"validation loss {last.meta.get('val_loss', float('nan')):.4f}; "
        f"{meta.get('seconds', 0):.1f} s, {meta.get('steps_per_second', 0):.1f} steps/s"
    )
    typer.echo(f"  load it with: Trajectory.from_folder({str(out)!r})")
    if done.summary is not None:
        sm = done.summary
        alarm = sm["alarm"]
        typer.echo(
            f"  monitor: {sm['measured']} measurements ({sm['skipped_for_time']} skipped for time, "
            f"{sm['monitor_seconds']:.1f} s) in {done.store}; "
            + (f"alarm at step {alarm['step']}" if alarm else "no alarm")
            + f"; see `losslens report {done.store}`"
        )


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command("train-tiny")(cli(train_tiny_cmd))
