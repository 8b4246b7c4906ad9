"""`losslens train-tiny` (one run or a sweep), `losslens fork` and `losslens compare-forks`:
controlled runs of the embedded tiny GPT-NeoX on the embedded corpus."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer


def _seeds(text: str | None) -> list[int] | None:
    """"0,1,2" -> [0, 1, 2]; None -> None."""
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"--seeds must be comma-separated integers, got {text!r}") from None


def register(app: typer.Typer) -> None:
    @app.command("train-tiny")
    def train_tiny_cmd(
        out: Path = typer.Option(..., "--out", help="output folder (step-NNNNNN/ checkpoints + trajectory.json)"),
        schedule: Optional[str] = typer.Option(None, help="LR schedule: wsd | cosine | constant | linear [wsd]"),
        peak_lr: Optional[float] = typer.Option(None, "--peak-lr", help="peak learning rate [3e-3]"),
        steps: Optional[int] = typer.Option(None, help="optimizer updates [800; --tiny 60]"),
        checkpoints: Optional[int] = typer.Option(None, help="checkpoints to write, evenly spaced [8; --tiny 3]"),
        seed: Optional[int] = typer.Option(None, help="init seed (also the data-order seed unless --data-seed) [0]"),
        tiny: bool = typer.Option(False, "--tiny", help="tiny preset for tests/smoke runs (~60k params, seconds)"),
        weight_decay: Optional[float] = typer.Option(None, "--weight-decay", help="AdamW decoupled weight decay [1.0]"),
        warmup: Optional[float] = typer.Option(None, help="warmup fraction of steps [0.05]"),
        decay: Optional[float] = typer.Option(None, help="WSD: decay fraction of steps [0.2]"),
        min_lr_ratio: Optional[float] = typer.Option(None, "--min-lr-ratio", help="final LR / peak LR [0]"),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", help="sequences per step [32]"),
        seq_len: Optional[int] = typer.Option(None, "--seq-len", help="tokens per sequence = context length [64]"),
        hidden: Optional[int] = typer.Option(None, "--hidden", help="hidden size [64]"),
        layers: Optional[int] = typer.Option(None, "--layers", help="transformer blocks [2]"),
        heads: Optional[int] = typer.Option(None, "--heads", help="attention heads [4]"),
        vocab_size: Optional[int] = typer.Option(None, "--vocab-size", help="BPE vocabulary size [512]"),
        grad_clip: Optional[float] = typer.Option(None, "--grad-clip", help="gradient-norm clip, 0 = off [1.0]"),
        val_batches: Optional[int] = typer.Option(None, "--val-batches", help="validation batches [8]"),
        data_seed: Optional[int] = typer.Option(None, "--data-seed", help="data-order seed [= --seed]"),
        save_optimizer: bool = typer.Option(False, "--save-optimizer", help="save AdamW state (resumable/forkable)"),
        resume_from: Optional[Path] = typer.Option(None, "--resume-from", help="continue from this checkpoint folder"),
        name: Optional[str] = typer.Option(None, help="run name [derived from the config]"),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="tokenizer/token-stream cache to share "
                                                "between runs [OUT/data]"),
        threads: Optional[int] = typer.Option(None, help="torch CPU threads; 0 = torch default [auto: 1 for "
                                              "hidden <= 64, else torch default]"),
        sweep: Optional[List[str]] = typer.Option(None, "--sweep", help="sweep KEY=V1,V2,... (repeatable; keys: lr, "
                                                  "wd, schedule, steps, hidden, ... or any TrainConfig field): trains "
                                                  "the cartesian product into OUT/<name>/ + OUT/sweep.json"),
        seeds: Optional[str] = typer.Option(None, "--seeds", help="comma-separated seeds, e.g. 0,1 (a sweep over "
                                            "seeds; runs in OUT/<name>-s<seed>/)"),
        force: bool = typer.Option(False, "--force", help="overwrite a different run in --out"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
        monitor: bool = typer.Option(False, "--monitor", help="measure ΔQ (RTN INT3, INT2-g32), loss, trace and "
                                     "λ_max while training into OUT/monitor.sqlite (probes.monitor; `losslens "
                                     "report` reads it); training is unchanged"),
        monitor_every: int = typer.Option(50, "--monitor-every", help="with --monitor: measure every N steps [50]"),
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

    @app.command("fork")
    def fork_cmd(
        parent: Path = typer.Argument(..., help="a train-tiny trajectory folder (trained with --save-optimizer)"),
        at: str = typer.Option(..., "--at", help="parent checkpoint: label (step-000300), step number, or 'last'"),
        schedule: str = typer.Option("cosine", help="fork LR schedule: cosine | sgdr | oscillate | parent"),
        out: Path = typer.Option(..., "--out", help="folder for the forks (one sub-folder per seed + forks.json)"),
        steps: Optional[int] = typer.Option(None, help="fork length in updates [the parent's remaining steps]"),
        seeds: str = typer.Option("0", "--seeds", help="data-order seeds, comma-separated (the parent's data seed "
                                  "continues its data order)"),
        start_lr: Optional[float] = typer.Option(None, "--start-lr", help="LR at the fork [the parent's LR there]"),
        min_lr: Optional[float] = typer.Option(None, "--min-lr", help="final / floor LR [the parent's final LR]"),
        period: Optional[int] = typer.Option(None, help="sgdr: first cycle length in updates [steps // 3]"),
        restart_lr: Optional[float] = typer.Option(None, "--restart-lr", help="sgdr: LR at each restart "
                                                   "[the parent's peak LR]"),
        period_mult: float = typer.Option(1.0, "--period-mult", help="sgdr: cycle length multiplier [1]"),
        amplitude: Optional[float] = typer.Option(None, help="oscillate: LR added during bumps [the LR at the fork]"),
        bump_steps: int = typer.Option(25, "--bump-steps", help="oscillate: updates per bump [25]"),
        cool_steps: int = typer.Option(100, "--cool-steps", help="oscillate: updates per cool phase [100]"),
        checkpoints: Optional[int] = typer.Option(None, help="fork checkpoints, evenly spaced [min(10, steps)]"),
        every: Optional[int] = typer.Option(None, help="a fork checkpoint every N updates (instead of --checkpoints)"),
        save_optimizer: bool = typer.Option(False, "--save-optimizer", help="save AdamW state in the fork's "
                                            "checkpoints (forkable forks)"),
        restart_moments: bool = typer.Option(False, "--restart-moments", help="allow a parent checkpoint without "
                                             "AdamW state: moments restart from zero (recorded in the lineage)"),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="tokenizer/token-stream cache "
                                                "[PARENT/data or OUT/data]"),
        threads: Optional[int] = typer.Option(None, help="torch CPU threads; 0 = torch default [auto]"),
        force: bool = typer.Option(False, "--force", help="overwrite different runs in the fork folders"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
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

    @app.command("compare-forks")
    def compare_forks_cmd(
        dirs: List[Path] = typer.Argument(..., help="fork folders, or folders of forks (the --out of losslens fork)"),
        spec: str = typer.Option("rtn:3:row", help="quantizer spec [rtn:3:row]"),
        all_phases: bool = typer.Option(False, "--all-phases", help="also measure checkpoints inside bumps "
                                        "[default: cool phases only]"),
        pairing: str = typer.Option("seed", help="seed: fork A vs fork B with the same seed; all: every seed pair"),
        by: str = typer.Option("final", help="compare the final gap or the mean gap over checkpoints"),
        quick: bool = typer.Option(False, "--quick", help="small evaluation set (noisier)"),
        csv: Optional[Path] = typer.Option(None, "--csv", help="write the per-checkpoint table here"),
        threads: Optional[int] = typer.Option(None, help="torch CPU threads; 0 = torch default [auto]"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no per-checkpoint progress lines"),
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
