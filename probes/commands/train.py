"""`losslens train-tiny` (one run or a sweep), `losslens fork` and `losslens compare-forks`:
controlled runs of the embedded tiny GPT-NeoX on the embedded corpus."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, List, Optional

import typer


def _seeds(text: str | None) -> list[int] | None:
    """"0,1,2" -> [0, 1, 2]; None -> None."""
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
    checkpoints: Annotated[Optional[int], typer.Option(
        help="checkpoints to write, evenly spaced [8; --tiny 3]")] = None,
    seed: Annotated[Optional[int], typer.Option(
        help="init seed (also the data-order seed unless --data-seed) [0]")] = None,
    tiny: Annotated[bool, typer.Option(
        "--tiny", help="tiny preset for tests/smoke runs (~60k params, seconds)")] = False,
    weight_decay: Annotated[Optional[float], typer.Option(
        "--weight-decay", help="AdamW decoupled weight decay [1.0]")] = None,
    warmup: Annotated[Optional[float], typer.Option(help="warmup fraction of steps [0.05]")] = None,
    decay: Annotated[Optional[float], typer.Option(help="WSD: decay fraction of steps [0.2]")] = None,
    min_lr_ratio: Annotated[Optional[float], typer.Option("--min-lr-ratio", help="final LR / peak LR [0]")] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", help="sequences per step [32]")] = None,
    seq_len: Annotated[Optional[int], typer.Option(
        "--seq-len", help="tokens per sequence = context length [64]")] = None,
    hidden: Annotated[Optional[int], typer.Option("--hidden", help="hidden size [64]")] = None,
    layers: Annotated[Optional[int], typer.Option("--layers", help="transformer blocks [2]")] = None,
    heads: Annotated[Optional[int], typer.Option("--heads", help="attention heads [4]")] = None,
    vocab_size: Annotated[Optional[int], typer.Option("--vocab-size", help="BPE vocabulary size [512]")] = None,
    grad_clip: Annotated[Optional[float], typer.Option("--grad-clip", help="gradient-norm clip, 0 = off [1.0]")] = None,
    val_batches: Annotated[Optional[int], typer.Option("--val-batches", help="validation batches [8]")] = None,
    data_seed: Annotated[Optional[int], typer.Option("--data-seed", help="data-order seed [= --seed]")] = None,
    save_optimizer: Annotated[bool, typer.Option(
        "--save-optimizer", help="save AdamW state (resumable/forkable)")] = False,
    resume_from: Annotated[Optional[Path], typer.Option(
        "--resume-from", help="continue from this checkpoint folder")] = None,
    name: Annotated[Optional[str], typer.Option(help="run name [derived from the config]")] = None,
    data_dir: Annotated[Optional[Path], typer.Option("--data-dir", help="tokenizer/token-stream cache to share "
                                                "between runs [OUT/data]")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads; 0 = torch default [auto: 1 for "
                                              "hidden <= 64, else torch default]")] = None,
    sweep: Annotated[Optional[List[str]], typer.Option("--sweep", help="sweep KEY=V1,V2,... (repeatable; keys: lr, "
                                                  "wd, schedule, steps, hidden, ... or any TrainConfig field): trains "
                                                  "the cartesian product into OUT/<name>/ + OUT/sweep.json")] = None,
    seeds: Annotated[Optional[str], typer.Option("--seeds", help="comma-separated seeds, e.g. 0,1 (a sweep over "
                                            "seeds; runs in OUT/<name>-s<seed>/)")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite a different run in --out")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
    monitor: Annotated[bool, typer.Option("--monitor", help="measure ΔQ (RTN INT3, INT2-g32), loss, trace and "
                                     "λ_max while training into OUT/monitor.sqlite (probes.monitor; `losslens "
                                     "report` reads it); training is unchanged")] = False,
    monitor_every: Annotated[int, typer.Option(
        "--monitor-every", help="with --monitor: measure every N steps [50]")] = 50,
) -> None:
    """Train a tiny GPT-NeoX on the embedded corpus and write an HF-checkpoint trajectory.

    With --sweep / --seeds: train every combination (finished runs are skipped on reruns) and
    index them in OUT/sweep.json. Add --save-optimizer to make the runs forkable
    (`losslens fork`)."""
    from probes.train.config import TrainConfig, TrainError
    from probes.train.grid import parse_sweep, train_sweep
    from probes.train.tiny import train_tiny

    overrides = dict(schedule=schedule, peak_lr=peak_lr, steps=steps, checkpoints=checkpoints, seed=seed,
                     weight_decay=weight_decay, warmup=warmup, decay=decay, min_lr_ratio=min_lr_ratio,
                     batch_size=batch_size, seq_len=seq_len, hidden_size=hidden, num_layers=layers,
                     num_heads=heads, vocab_size=vocab_size, grad_clip=grad_clip, val_batches=val_batches,
                     data_seed=data_seed, name=name)
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
                typer.echo(f"  {entry['name']}: {entry['status']}"
                           + (f", validation loss {loss:.4f}" if loss is not None else "")
                           + (f" ({entry['error']})" if entry.get("error") else ""))

            trajs = train_sweep(base, grid, out, seeds=_seeds(seeds), progress=not quiet, overwrite=force,
                                data_dir=data_dir, num_threads=threads, on_run=report)
        except TrainError as exc:
            raise typer.BadParameter(str(exc)) from exc
        import json

        runs = json.loads((Path(out) / "sweep.json").read_text())["runs"]
        failed = [r for r in runs if r["status"] == "failed"]
        typer.echo(f"sweep: {len(trajs)} of {len(runs)} runs finished in {Path(out).resolve()} "
                   f"(index: sweep.json){f'; {len(failed)} failed' if failed else ''}")
        if failed:
            raise typer.Exit(1)
        return
    mon = None
    try:
        config = replace(TrainConfig.tiny() if tiny else TrainConfig(), **overrides)
        if monitor:
            from probes.monitor.tiny import tiny_monitor

            mon = tiny_monitor(config, Path(out) / "monitor.sqlite", out, data_dir, every=monitor_every)
        traj = train_tiny(config, out, progress=not quiet, resume_from=resume_from, overwrite=force, data_dir=data_dir,
                          num_threads=threads, on_step=None if mon is None else mon.step)
    except TrainError as exc:
        raise typer.BadParameter(str(exc)) from exc
    finally:
        if mon is not None:
            mon.close()
    last = traj[len(traj) - 1]
    meta = traj.meta
    typer.echo(f"wrote {len(traj)} checkpoints of {traj.name} ({meta.get('n_params', '?'):,} parameters) to "
               f"{Path(out).resolve()}")
    typer.echo(f"  final step {last.step}: train loss {last.meta.get('train_loss', float('nan')):.4f}, "
               f"validation loss {last.meta.get('val_loss', float('nan')):.4f}; "
               f"{meta.get('seconds', 0):.1f} s, {meta.get('steps_per_second', 0):.1f} steps/s")
    typer.echo(f"  load it with: Trajectory.from_folder({str(out)!r})")
    if mon is not None:
        sm = mon.summary()
        alarm = sm["alarm"]
        typer.echo(f"  monitor: {sm['measured']} measurements ({sm['skipped_for_time']} skipped for time, "
                   f"{sm['monitor_seconds']:.1f} s) in {Path(out) / 'monitor.sqlite'}; "
                   + (f"alarm at step {alarm['step']}" if alarm else "no alarm")
                   + f"; see `losslens report {Path(out) / 'monitor.sqlite'}`")


def fork_cmd(
    parent: Annotated[Path, typer.Argument(help="a train-tiny trajectory folder (trained with --save-optimizer)")],
    *,
    at: Annotated[str, typer.Option("--at", help="parent checkpoint: label (step-000300), step number, or 'last'")],
    schedule: Annotated[str, typer.Option(help="fork LR schedule: cosine | sgdr | oscillate | parent")] = "cosine",
    out: Annotated[Path, typer.Option("--out", help="folder for the forks (one sub-folder per seed + forks.json)")],
    steps: Annotated[Optional[int], typer.Option(help="fork length in updates [the parent's remaining steps]")] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="data-order seeds, comma-separated (the parent's data seed "
                                  "continues its data order)")] = "0",
    start_lr: Annotated[Optional[float], typer.Option(
        "--start-lr", help="LR at the fork [the parent's LR there]")] = None,
    min_lr: Annotated[Optional[float], typer.Option(
        "--min-lr", help="final / floor LR [the parent's final LR]")] = None,
    period: Annotated[Optional[int], typer.Option(help="sgdr: first cycle length in updates [steps // 3]")] = None,
    restart_lr: Annotated[Optional[float], typer.Option("--restart-lr", help="sgdr: LR at each restart "
                                                   "[the parent's peak LR]")] = None,
    period_mult: Annotated[float, typer.Option("--period-mult", help="sgdr: cycle length multiplier [1]")] = 1.0,
    amplitude: Annotated[Optional[float], typer.Option(
        help="oscillate: LR added during bumps [the LR at the fork]")] = None,
    bump_steps: Annotated[int, typer.Option("--bump-steps", help="oscillate: updates per bump [25]")] = 25,
    cool_steps: Annotated[int, typer.Option("--cool-steps", help="oscillate: updates per cool phase [100]")] = 100,
    checkpoints: Annotated[Optional[int], typer.Option(help="fork checkpoints, evenly spaced [min(10, steps)]")] = None,
    every: Annotated[Optional[int], typer.Option(
        help="a fork checkpoint every N updates (instead of --checkpoints)")] = None,
    save_optimizer: Annotated[bool, typer.Option("--save-optimizer", help="save AdamW state in the fork's "
                                            "checkpoints (forkable forks)")] = False,
    restart_moments: Annotated[bool, typer.Option(
        "--restart-moments", help="allow a parent checkpoint without AdamW state: moments restart from zero (recorded "
        "in the lineage)")] = False,
    data_dir: Annotated[Optional[Path], typer.Option("--data-dir", help="tokenizer/token-stream cache "
                                                "[PARENT/data or OUT/data]")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads; 0 = torch default [auto]")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite different runs in the fork folders")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
) -> None:
    """Continue a checkpoint of a train-tiny trajectory under a new LR schedule, once per seed.

    Each fork is its own trajectory (OUT/<schedule>-at<step>-n<steps>-s<seed>/) whose
    trajectory.json records its lineage; its first checkpoint is the parent checkpoint."""
    from probes.checkpoints import CheckpointError, Trajectory
    from probes.train.config import TrainConfig, TrainError
    from probes.train.forks import ForkSchedule, fork_trajectory, parent_checkpoint

    try:
        ptraj = Trajectory.from_folder(parent)
        if steps is None:
            if "config" not in ptraj.meta:
                raise TrainError(f"{parent} is not a train-tiny trajectory")
            left = TrainConfig.from_dict(ptraj.meta["config"]).steps - int(parent_checkpoint(ptraj, at).step)
            if left < 1:
                raise TrainError(f"{at} is the parent's last step; pass --steps N for the fork length")
            steps = left
        sched = ForkSchedule(kind=schedule, steps=steps, start_lr=start_lr, min_lr=min_lr, period=period,
                             restart_lr=restart_lr, period_mult=period_mult, amplitude=amplitude,
                             bump_steps=bump_steps, cool_steps=cool_steps)
        trajs = fork_trajectory(ptraj, at, sched, out, seeds=_seeds(seeds), checkpoints=checkpoints, every=every,
                                save_optimizer=save_optimizer, restart_moments=restart_moments,
                                progress=not quiet, overwrite=force, data_dir=data_dir, num_threads=threads)
    except (TrainError, CheckpointError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    for t in trajs:
        f = t.meta["fork"]
        last = t[-1]
        match = {True: "same as parent", False: "DIFFERS from parent", None: "parent loss unknown"}
        typer.echo(f"{Path(t.meta['folder']).name}: {len(t)} checkpoints, steps {t.steps[0]}..{t.steps[-1]}; "
                   f"start loss {f['start_val_loss']:.4f} ({match[f['start_loss_matches']]}), final validation "
                   f"loss {last.meta.get('val_loss', float('nan')):.4f}")
    typer.echo(f"wrote {len(trajs)} fork(s) to {Path(out).resolve()} (index: forks.json); compare with: "
               f"losslens compare-forks {out} ...")


def compare_forks_cmd(
    dirs: Annotated[List[Path], typer.Argument(help="fork folders, or folders of forks (the --out of losslens fork)")],
    *,
    spec: Annotated[str, typer.Option(help="quantizer spec [rtn:3:row]")] = "rtn:3:row",
    all_phases: Annotated[bool, typer.Option("--all-phases", help="also measure checkpoints inside bumps "
                                        "[default: cool phases only]")] = False,
    pairing: Annotated[str, typer.Option(
        help="seed: fork A vs fork B with the same seed; all: every seed pair")] = "seed",
    by: Annotated[str, typer.Option(help="compare the final gap or the mean gap over checkpoints")] = "final",
    quick: Annotated[bool, typer.Option("--quick", help="small evaluation set (noisier)")] = False,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="write the per-checkpoint table here")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads; 0 = torch default [auto]")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no per-checkpoint progress lines")] = False,
) -> None:
    """Quantization gap (ppl gap) at the forks' checkpoints and wins per seed pair."""
    from probes.checkpoints import CheckpointError
    from probes.train.config import TrainError
    from probes.train.fork_compare import compare_forks

    try:
        df = compare_forks(dirs, spec=spec, cool_only=not all_phases, quick=quick, pairing=pairing, by=by,
                           progress=not quiet, num_threads=threads)
    except (TrainError, CheckpointError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    if csv is not None:
        df.to_csv(csv, index=False)
    pct = lambda x: f"{100 * x:.3f}%"  # noqa: E731
    body = df[~df["fork_start"]]
    per = body.groupby(["condition", "seed"], sort=False).agg(
        checkpoints=("step", "size"), final_step=("step", "max"), final_gap=("gap", "last"),
        mean_gap=("gap", "mean"), final_val_loss=("val_loss", "last")).reset_index()
    typer.echo(f"quantization gap ({df.attrs['spec']}, ppl gap; "
               f"{'cool phases only' if not all_phases else 'all checkpoints'}):")
    typer.echo(per.to_string(index=False, formatters={"final_gap": pct, "mean_gap": pct}))
    wins, summary = df.attrs["wins"], df.attrs["summary"]
    if wins.empty:
        typer.echo("no fork pairs to compare (need two conditions with matching seeds)")
    else:
        typer.echo(f"\nwins per seed pair (lower {by} gap wins):")
        typer.echo(wins.to_string(index=False, formatters={"gap_a": pct, "gap_b": pct, "diff": pct}))
        typer.echo("\nsummary:")
        for _, r in summary.iterrows():
            typer.echo(f"  {r['condition_a']} vs {r['condition_b']}: {r['a_wins']}/{r['n']} wins for A, "
                       f"{r['b_wins']}/{r['n']} for B, {r['ties']} ties; mean gap difference (A - B) "
                       f"{100 * r['mean_diff']:+.3f} points")
    if csv is not None:
        typer.echo(f"wrote {csv}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command('train-tiny')(train_tiny_cmd)
    app.command('fork')(fork_cmd)
    app.command('compare-forks')(compare_forks_cmd)
