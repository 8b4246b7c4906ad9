"""`losslens fork` (continue a checkpoint of a `train-tiny` run, or a pretrained checkpoint, under new LR
schedules, with several data-order seeds) and `losslens compare-forks` (the forks' quantization gaps and wins
per seed pair)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from losslens.cli.option_parsing import long_help
from losslens.cli.train_command import parse_seeds


def fork_cmd(
    parent: Annotated[
        str,
        typer.Argument(
            help=long_help(
                "train-tiny run folder, or a pretrained checkpoint",
                "a train-tiny trajectory folder (trained with --save-optimizer), or a pretrained checkpoint: "
                "an HF checkpoint folder, a .gguf file or hf:ORG/NAME[@REV]",
            )
        ),
    ],
    *,
    at: Annotated[
        Optional[str],
        typer.Option("--at", help="train-tiny parent: step-000300, a step, or 'last'"),
    ] = None,
    schedule: Annotated[
        str,
        typer.Option(
            help=long_help(
                "LR schedule: cosine, sgdr, oscillate, parent, ...",
                "fork LR schedule: cosine | sgdr | oscillate | parent | constant | linear | wsd; a pretrained "
                "base: comma-separated for several (constant,wsd,cosine), parent excluded",
            )
        ),
    ] = "cosine",
    out: Annotated[Path, typer.Option("--out", help="folder for the forks (+ forks.json)")],
    steps: Annotated[
        Optional[int],
        typer.Option(
            help=long_help(
                "fork length in updates [the parent's remaining]",
                "fork length in updates [the parent's remaining steps; needed for a pretrained base]",
            )
        ),
    ] = None,
    seeds: Annotated[
        str,
        typer.Option(
            "--seeds",
            help=long_help(
                "data-order seeds, comma-separated",
                "data-order seeds, comma-separated (the parent's data seed continues its data order)",
            ),
        ),
    ] = "0",
    start_lr: Annotated[
        Optional[float], typer.Option("--start-lr", help="LR at the fork [the parent's; pretrained: 1e-4]")
    ] = None,
    min_lr: Annotated[
        Optional[float],
        typer.Option(
            "--min-lr",
            help=long_help(
                "final / floor LR [the parent's final LR]",
                "final / floor LR [the parent's final LR; pretrained: start LR / 10]",
            ),
        ),
    ] = None,
    cooldown_at: Annotated[
        Optional[int], typer.Option("--cooldown-at", help="wsd: cooldown start [steps - steps // 5]")
    ] = None,
    period: Annotated[Optional[int], typer.Option(help="sgdr: first cycle length in updates [steps // 3]")] = None,
    restart_lr: Annotated[
        Optional[float], typer.Option("--restart-lr", help="sgdr: LR at each restart [the parent's peak LR]")
    ] = None,
    period_mult: Annotated[float, typer.Option("--period-mult", help="sgdr: cycle length multiplier")] = 1.0,
    amplitude: Annotated[
        Optional[float], typer.Option(help="oscillate: LR added during bumps [the LR at the fork]")
    ] = None,
    bump_steps: Annotated[int, typer.Option("--bump-steps", help="oscillate: updates per bump")] = 25,
    cool_steps: Annotated[int, typer.Option("--cool-steps", help="oscillate: updates per cool phase")] = 100,
    checkpoints: Annotated[
        Optional[int],
        typer.Option(
            help=long_help(
                "fork checkpoints, evenly spaced [min(10, steps)]",
                "fork checkpoints, evenly spaced [min(10, steps); pretrained: 5]",
            )
        ),
    ] = None,
    every: Annotated[Optional[int], typer.Option(help="a checkpoint every N updates (not --checkpoints)")] = None,
    save_optimizer: Annotated[bool, typer.Option("--save-optimizer", help="save AdamW state (forkable forks)")] = False,
    restart_moments: Annotated[
        bool,
        typer.Option(
            "--restart-moments",
            help=long_help(
                "no AdamW state at the parent: zero moments",
                "allow a parent checkpoint without AdamW state: moments restart from zero (recorded in the lineage)",
            ),
        ),
    ] = False,
    data_dir: Annotated[
        Optional[Path], typer.Option("--data-dir", help="token cache [PARENT/data or OUT/data]")
    ] = None,
    text: Annotated[
        Optional[Path],
        typer.Option(
            "--text",
            help=long_help(
                "pretrained: training text [embedded corpus]",
                "pretrained base: training text file or folder [the embedded corpus]",
            ),
        ),
    ] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", help="pretrained: tokens per window")] = 128,
    cache_dir: Annotated[
        Optional[Path], typer.Option("--cache-dir", help="hf: base: hub cache [$HF_HUB_CACHE]")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="pretrained: windows per update")] = 8,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads; 0 = torch default [auto]")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite different runs in the fork folders")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress lines on stderr")] = False,
) -> None:
    """Continue a checkpoint of a train-tiny trajectory, or a pretrained checkpoint, under new LR schedules,
    once per seed.

    Each fork is its own trajectory (OUT/<schedule>-at<step>-n<steps>-s<seed>/; a pretrained base:
    OUT/<schedule>-n<steps>-s<seed>/) whose trajectory.json records its lineage; its first checkpoint is
    the parent checkpoint (a pretrained base: re-saved in float32). A pretrained base is an HF checkpoint
    folder, a .gguf file or hf:ORG/NAME[@REV]; it trains with fresh AdamW state on --text (default: the
    embedded corpus) in windows of --batch-size x --seq-len tokens, resumable by rerunning the command."""
    from losslens.lm.checkpoints import CheckpointError, Trajectory
    from losslens.lm.train.config import TrainConfig, TrainError
    from losslens.lm.train.forks import ForkSchedule, fork_trajectory, parent_checkpoint

    if is_pretrained_base(parent):
        tiny_only = {"--at": at, "--every": every, "--save-optimizer": save_optimizer or None,
                     "--restart-moments": restart_moments or None, "--data-dir": data_dir}  # fmt: skip
        given = [k for k, v in tiny_only.items() if v is not None]
        if given:
            raise typer.BadParameter(
                f"{', '.join(given)} apply to a train-tiny parent only; {parent} is a pretrained checkpoint"
            )
        if steps is None:
            raise typer.BadParameter("a pretrained checkpoint has no remaining steps: pass --steps N")
        kw = dict(min_lr=min_lr, period=period, restart_lr=restart_lr, period_mult=period_mult, amplitude=amplitude,
                  bump_steps=bump_steps, cool_steps=cool_steps, cooldown_at=cooldown_at)  # fmt: skip
        try:
            scheds = [ForkSchedule(kind=k.strip(), steps=steps, **kw) for k in schedule.split(",") if k.strip()]
        except TrainError as exc:
            raise typer.BadParameter(str(exc)) from exc
        _fork_pretrained_cmd(
            parent, scheds, out, start_lr, parse_seeds(seeds), checkpoints, text, seq_len, batch_size, threads,
            force, quiet, cache_dir,
        )  # fmt: skip
        return
    if at is None:
        raise typer.BadParameter("--at is needed for a train-tiny parent (a label, a step number or 'last')")
    if "," in schedule:
        raise typer.BadParameter("a train-tiny parent forks into one --schedule per call")
    try:
        ptraj = Trajectory.from_folder(parent)
        if steps is None:
            if "config" not in ptraj.meta:
                raise TrainError(f"{parent} is not a train-tiny trajectory")
            left = TrainConfig.from_dict(ptraj.meta["config"]).steps - int(parent_checkpoint(ptraj, at).step)
            if left < 1:
                raise TrainError(f"{at} is the parent's last step; pass --steps N for the fork length")
            steps = left
        sched = ForkSchedule(
            kind=schedule,
            steps=steps,
            start_lr=start_lr,
            min_lr=min_lr,
            period=period,
            restart_lr=restart_lr,
            period_mult=period_mult,
            amplitude=amplitude,
            bump_steps=bump_steps,
            cool_steps=cool_steps,
            cooldown_at=cooldown_at,
        )
        trajs = fork_trajectory(
            ptraj,
            at,
            sched,
            out,
            seeds=parse_seeds(seeds),
            checkpoints=checkpoints,
            every=every,
            save_optimizer=save_optimizer,
            restart_moments=restart_moments,
            progress=not quiet,
            overwrite=force,
            data_dir=data_dir,
            num_threads=threads,
        )
    except (TrainError, CheckpointError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    for t in trajs:
        f = t.meta["fork"]
        last = t[-1]
        match = {True: "same as parent", False: "DIFFERS from parent", None: "parent loss unknown"}
        typer.echo(
            f"{Path(t.meta['folder']).name}: {len(t)} checkpoints, steps {t.steps[0]}..{t.steps[-1]}; "
            f"start loss {f['start_val_loss']:.4f} ({match[f['start_loss_matches']]}), final validation "
            f"loss {last.meta.get('val_loss', float('nan')):.4f}"
        )
    typer.echo(
        f"wrote {len(trajs)} fork(s) to {Path(out).resolve()} (index: forks.json); compare with: "
        f"losslens compare-forks {out} ..."
    )


def is_pretrained_base(parent: str) -> bool:
    """Whether ``losslens fork``'s argument is a pretrained checkpoint (an ``hf:`` name, a ``.gguf`` file,
    or a folder with its own ``config.json``) rather than a train-tiny trajectory folder."""
    p = Path(parent).expanduser()
    return parent.startswith("hf:") or p.suffix.lower() == ".gguf" or (p / "config.json").is_file()


def _fork_pretrained_cmd(
    base, scheds, out, lr, seeds, checkpoints, text, seq_len, batch_size, threads, force, quiet, cache_dir
):  # fmt: skip
    """`losslens fork` of a pretrained checkpoint: one :func:`fork_pretrained` call per seed, then a line per fork."""
    from losslens.lm.checkpoints import CheckpointError
    from losslens.lm.train.checkpoint_forks import fork_pretrained
    from losslens.lm.train.config import TrainError

    trajs = []
    try:
        for seed in seeds or [0]:
            trajs += fork_pretrained(
                base, scheds, out, lr=1e-4 if lr is None else lr, text=text, seq_len=seq_len, batch_size=batch_size,
                checkpoints=5 if checkpoints is None else checkpoints, seed=seed, progress=not quiet,
                overwrite=force, num_threads=threads, cache_dir=cache_dir,
            )  # fmt: skip
    except (TrainError, CheckpointError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    for t in trajs:
        typer.echo(
            f"{Path(t.meta['folder']).name}: {len(t)} checkpoints, steps {t.steps[0]}..{t.steps[-1]}; validation "
            f"loss {t.meta['fork']['start_val_loss']:.4f} at the base, {t[-1].meta.get('val_loss', float('nan')):.4f} "
            "at the end"
        )
    typer.echo(
        f"wrote {len(trajs)} fork(s) of {base} to {Path(out).resolve()} (index: forks.json); sweep one with: "
        f"losslens sweep {Path(out) / Path(trajs[0].meta['folder']).name} --quick"
    )


def compare_forks_cmd(
    dirs: Annotated[List[Path], typer.Argument(help="fork folders, or folders of forks (the --out of losslens fork)")],
    *,
    spec: Annotated[str, typer.Option(help="quantizer spec [rtn:3:row]")] = "rtn:3:row",
    all_phases: Annotated[
        bool, typer.Option("--all-phases", help="also measure checkpoints inside bumps [default: cool phases only]")
    ] = False,
    pairing: Annotated[
        str, typer.Option(help="seed: fork A vs fork B with the same seed; all: every seed pair")
    ] = "seed",
    by: Annotated[str, typer.Option(help="compare the final gap or the mean gap over checkpoints")] = "final",
    quick: Annotated[bool, typer.Option("--quick", help="small evaluation set (noisier)")] = False,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="write the per-checkpoint table here")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads; 0 = torch default [auto]")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no per-checkpoint progress lines")] = False,
) -> None:
    """Quantization gap (ppl gap) at the forks' checkpoints and wins per seed pair."""
    from losslens.lm.checkpoints import CheckpointError
    from losslens.lm.train.config import TrainError
    from losslens.lm.train.fork_compare import compare_forks

    try:
        df = compare_forks(
            dirs,
            spec=spec,
            cool_only=not all_phases,
            quick=quick,
            pairing=pairing,
            by=by,
            progress=not quiet,
            num_threads=threads,
        )
    except (TrainError, CheckpointError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    if csv is not None:
        df.to_csv(csv, index=False)
    pct = lambda x: f"{100 * x:.3f}%"  # noqa: E731
    body = df[~df["fork_start"]]
    per = (
        body.groupby(["condition", "seed"], sort=False)
        .agg(
            checkpoints=("step", "size"),
            final_step=("step", "max"),
            final_gap=("gap", "last"),
            mean_gap=("gap", "mean"),
            final_val_loss=("val_loss", "last"),
        )
        .reset_index()
    )
    typer.echo(
        f"quantization gap ({df.attrs['spec']}, ppl gap; "
        f"{'cool phases only' if not all_phases else 'all checkpoints'}):"
    )
    typer.echo(per.to_string(index=False, formatters={"final_gap": pct, "mean_gap": pct}))
    wins, summary = df.attrs["wins"], df.attrs["summary"]
    if wins.empty:
        typer.echo("no fork pairs to compare (need two conditions with matching seeds)")
    else:
        typer.echo(f"\nwins per seed pair (lower {by} gap wins):")
        typer.echo(wins.to_string(index=False, formatters={"gap_a": pct, "gap_b": pct, "diff": pct}))
        typer.echo("\nsummary:")
        for _, r in summary.iterrows():
            typer.echo(
                f"  {r['condition_a']} vs {r['condition_b']}: {r['a_wins']}/{r['n']} wins for A, "
                f"{r['b_wins']}/{r['n']} for B, {r['ties']} ties; mean gap difference (A - B) "
                f"{100 * r['mean_diff']:+.3f} points"
            )
    if csv is not None:
        typer.echo(f"wrote {csv}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command("fork")(fork_cmd)
    app.command("compare-forks")(compare_forks_cmd)
