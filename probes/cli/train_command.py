"""`losslens train-tiny` (one run or a sweep): controlled runs of the embedded tiny GPT-NeoX on the
embedded corpus. Continuing them under other schedules (`losslens fork`, `losslens compare-forks`):
:mod:`losslens.cli.train_forks_command`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, List, Optional

import typer


def parse_seeds(text: str | None) -> list[int] | None:
    """ "0,1,2" -> [0, 1, 2]; None -> None."""
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"--seeds must be comma-separated integers, got {text!r}") from None


def train_tiny_cmd(
    *,
    out: Annotated[Path, typer.Option("--out", help="output folder (step-NNNNNN/ checkpoints + trajectory.json)")],
    schedule: Annotated[Optional[str], typer.Option(help="LR schedule: wsd | cosine | constant | linear [wsd]")] = None,
    peak_lr: Annotated[Optional[float], typer.Option("--peak-lr", help="peak learning rate [3e-3]")] = None,
    steps: Annotated[Optional[int], typer.Option(help="optimizer updates [800; --tiny 60]")] = None,
    checkpoints: Annotated[
        Optional[int], typer.Option(help="checkpoints to write, evenly spaced [8; --tiny 3]")
    ] = None,
    seed: Annotated[
        Optional[int], typer.Option(help="init seed (also the data-order seed unless --data-seed) [0]")
    ] = None,
    tiny: Annotated[
        bool, typer.Option("--tiny", help="tiny preset for tests/smoke runs (~60k params, seconds)")
    ] = False,
    weight_decay: Annotated[
        Optional[float], typer.Option("--weight-decay", help="AdamW decoupled weight decay [1.0]")
    ] = None,
    warmup: Annotated[Optional[float], typer.Option(help="warmup fraction of steps [0.05]")] = None,
    decay: Annotated[Optional[float], typer.Option(help="WSD: decay fraction of steps [0.2]")] = None,
    min_lr_ratio: Annotated[Optional[float], typer.Option("--min-lr-ratio", help="final LR / peak LR [0]")] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", help="sequences per step [32]")] = None,
    seq_len: Annotated[
        Optional[int], typer.Option("--seq-len", help="tokens per sequence = context length [64]")
    ] = None,
    hidden: Annotated[Optional[int], typer.Option("--hidden", help="hidden size [64]")] = None,
    layers: Annotated[Optional[int], typer.Option("--layers", help="transformer blocks [2]")] = None,
    heads: Annotated[Optional[int], typer.Option("--heads", help="attention heads [4]")] = None,
    vocab_size: Annotated[Optional[int], typer.Option("--vocab-size", help="BPE vocabulary size [512]")] = None,
    grad_clip: Annotated[Optional[float], typer.Option("--grad-clip", help="gradient-norm clip, 0 = off [1.0]")] = None,
    val_batches: Annotated[Optional[int], typer.Option("--val-batches", help="validation batches [8]")] = None,
    data_seed: Annotated[Optional[int], typer.Option("--data-seed", help="data-order seed [= --seed]")] = None,
    save_optimizer: Annotated[
        bool, typer.Option("--save-optimizer", help="save AdamW state (resumable/forkable)")
    ] = False,
    resume_from: Annotated[
        Optional[Path], typer.Option("--resume-from", help="continue from this checkpoint folder")
    ] = None,
    name: Annotated[Optional[str], typer.Option(help="run name [derived from the config]")] = None,
    data_dir: Annotated[
        Optional[Path], typer.Option("--data-dir", help="tokenizer/token-stream cache to share between runs [OUT/data]")
    ] = None,
    threads: Annotated[
        Optional[int],
        typer.Option(help="torch CPU threads; 0 = torch default [auto: 1 for hidden <= 64, else torch default]"),
    ] = None,
    sweep: Annotated[
        Optional[List[str]],
        typer.Option(
            "--sweep",
            help="sweep KEY=V1,V2,... (repeatable; keys: lr, "
            "wd, schedule, steps, hidden, ... or any TrainConfig field): trains "
            "the cartesian product into OUT/<name>/ + OUT/sweep.json",
        ),
    ] = None,
    seeds: Annotated[
        Optional[str],
        typer.Option(
            "--seeds", help="comma-separated seeds, e.g. 0,1 (a sweep over seeds; runs in OUT/<name>-s<seed>/)"
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite a different run in --out")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress lines on stderr")] = False,
    monitor: Annotated[
        bool,
        typer.Option(
            "--monitor",
            help="measure ΔQ (RTN INT3, INT2-g32), loss, trace and "
            "λ_max while training into OUT/monitor.sqlite (losslens.study.monitor; `losslens "
            "report` reads it); training is unchanged",
        ),
    ] = False,
    monitor_every: Annotated[
        int, typer.Option("--monitor-every", help="with --monitor: measure every N steps [50]")
    ] = 50,
) -> None:
    """Train a tiny GPT-NeoX on the embedded corpus and write an HF-checkpoint trajectory.

    With --sweep / --seeds: train every combination (finished runs are skipped on reruns) and
    index them in OUT/sweep.json. Add --save-optimizer to make the runs forkable
    (`losslens fork`)."""
    from losslens.lm.train.config import TrainConfig, TrainError
    from losslens.lm.train.grid import parse_sweep, train_sweep
    from losslens.lm.train.tiny import train_tiny

    overrides = dict(
        schedule=schedule,
        peak_lr=peak_lr,
        steps=steps,
        checkpoints=checkpoints,
        seed=seed,
        weight_decay=weight_decay,
        warmup=warmup,
        decay=decay,
        min_lr_ratio=min_lr_ratio,
        batch_size=batch_size,
        seq_len=seq_len,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        vocab_size=vocab_size,
        grad_clip=grad_clip,
        val_batches=val_batches,
        data_seed=data_seed,
        name=name,
    )
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if save_optimizer:
        overrides["save_optimizer"] = True
    if monitor and (sweep or seeds is not None):
        raise typer.BadParameter("--monitor watches one run; it cannot be combined with --sweep / --seeds")
    if sweep or seeds is not None:
        if resume_from is not None:
            raise typer.BadParameter("--resume-from cannot be combined with --sweep / --seeds")
        try:
            grid = parse_sweep(sweep or [])
            base = replace(TrainConfig.tiny() if tiny else TrainConfig(), **overrides)

            def report(entry: dict) -> None:
                loss = entry.get("final_val_loss")
                typer.echo(
                    f"  {entry['name']}: {entry['status']}"
                    + (f", validation loss {loss:.4f}" if loss is not None else "")
                    + (f" ({entry['error']})" if entry.get("error") else "")
                )

            trajs = train_sweep(
                base,
                grid,
                out,
                seeds=parse_seeds(seeds),
                progress=not quiet,
                overwrite=force,
                data_dir=data_dir,
                num_threads=threads,
                on_run=report,
            )
        except TrainError as exc:
            raise typer.BadParameter(str(exc)) from exc
        import json

        runs = json.loads((Path(out) / "sweep.json").read_text())["runs"]
        failed = [r for r in runs if r["status"] == "failed"]
        typer.echo(
            f"sweep: {len(trajs)} of {len(runs)} runs finished in {Path(out).resolve()} "
            f"(index: sweep.json){f'; {len(failed)} failed' if failed else ''}"
        )
        if failed:
            raise typer.Exit(1)
        return
    mon = None
    try:
        config = replace(TrainConfig.tiny() if tiny else TrainConfig(), **overrides)
        if monitor:
            from losslens.study.monitor.tiny_monitor import tiny_monitor

            mon = tiny_monitor(config, Path(out) / "monitor.sqlite", out, data_dir, every=monitor_every)
        traj = train_tiny(
            config,
            out,
            progress=not quiet,
            resume_from=resume_from,
            overwrite=force,
            data_dir=data_dir,
            num_threads=threads,
            on_step=None if mon is None else mon.step,
        )
    except TrainError as exc:
        raise typer.BadParameter(str(exc)) from exc
    finally:
        if mon is not None:
            mon.close()
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
    if mon is not None:
        sm = mon.summary()
        alarm = sm["alarm"]
        typer.echo(
            f"  monitor: {sm['measured']} measurements ({sm['skipped_for_time']} skipped for time, "
            f"{sm['monitor_seconds']:.1f} s) in {Path(out) / 'monitor.sqlite'}; "
            + (f"alarm at step {alarm['step']}" if alarm else "no alarm")
            + f"; see `losslens report {Path(out) / 'monitor.sqlite'}`"
        )


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command("train-tiny")(train_tiny_cmd)
