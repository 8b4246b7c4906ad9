"""`losslens fork` (continue a checkpoint of a `train-tiny` run, or a pretrained checkpoint, under new LR
schedules, with several data-order seeds) and `losslens compare-forks` (the forks' quantization gaps and wins
per seed pair). The work is :func:`losslens.lm.train.fork_settings.fork_runs` and
:func:`~losslens.lm.train.fork_settings.compare_fork_runs` (settings: :class:`ForkSettings`,
:class:`CompareSettings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List

import typer

from losslens.cli.option_groups import quiet_option, threads_option
from losslens.cli.option_parsing import cli, flags, long_help
from losslens.lm.checkpoints import CheckpointError
from losslens.lm.train.config import TrainError
from losslens.lm.train.fork_settings import CompareSettings, ForkSettings, compare_fork_runs, fork_runs

flags(
    ForkSettings,
    at=typer.Option("--at", help="train-tiny parent: step-000300, a step, or 'last'"),
    schedule=typer.Option(
        help=long_help(
            "LR schedule: cosine, sgdr, oscillate, parent, ...",
            "fork LR schedule: cosine | sgdr | oscillate | parent | constant | linear | wsd; a pretrained "
            "base: comma-separated for several (constant,wsd,cosine), parent excluded",
        )
    ),
    steps=typer.Option(
        help=long_help(
            "fork length in updates [the parent's remaining]",
            "fork length in updates [the parent's remaining steps; needed for a pretrained base]",
        )
    ),
    seeds=typer.Option(
        "--seeds",
        help=long_help(
            "data-order seeds, comma-separated",
            "data-order seeds, comma-separated (the parent's data seed continues its data order)",
        ),
    ),
    start_lr=typer.Option("--start-lr", help="LR at the fork [the parent's; pretrained: 1e-4]"),
    min_lr=typer.Option(
        "--min-lr",
        help=long_help(
            "final / floor LR [the parent's final LR]",
            "final / floor LR [the parent's final LR; pretrained: start LR / 10]",
        ),
    ),
    cooldown_at=typer.Option("--cooldown-at", help="wsd: cooldown start [steps - steps // 5]"),
    period=typer.Option(help="sgdr: first cycle length in updates [steps // 3]"),
    restart_lr=typer.Option("--restart-lr", help="sgdr: LR at each restart [the parent's peak LR]"),
    period_mult=typer.Option("--period-mult", help="sgdr: cycle length multiplier"),
    amplitude=typer.Option(help="oscillate: LR added during bumps [the LR at the fork]"),
    bump_steps=typer.Option("--bump-steps", help="oscillate: updates per bump"),
    cool_steps=typer.Option("--cool-steps", help="oscillate: updates per cool phase"),
    checkpoints=typer.Option(
        help=long_help(
            "fork checkpoints, evenly spaced [min(10, steps)]",
            "fork checkpoints, evenly spaced [min(10, steps); pretrained: 5]",
        )
    ),
    every=typer.Option(help="a checkpoint every N updates (not --checkpoints)"),
    save_optimizer=typer.Option("--save-optimizer", help="save AdamW state (forkable forks)"),
    restart_moments=typer.Option(
        "--restart-moments",
        help=long_help(
            "no AdamW state at the parent: zero moments",
            "allow a parent checkpoint without AdamW state: moments restart from zero (recorded in the lineage)",
        ),
    ),
    data_dir=typer.Option("--data-dir", help="token cache [PARENT/data or OUT/data]"),
    text=typer.Option(
        "--text",
        help=long_help(
            "pretrained: training text [embedded corpus]",
            "pretrained base: training text file or folder [the embedded corpus]",
        ),
    ),
    seq_len=typer.Option("--seq-len", help="pretrained: tokens per window"),
    cache_dir=typer.Option("--cache-dir", help="hf: base: hub cache [$HF_HUB_CACHE]"),
    batch_size=typer.Option("--batch-size", help="pretrained: windows per update"),
    threads=threads_option("auto; 0: torch's"),
    force=typer.Option("--force", help="overwrite different runs in the fork folders"),
    quiet=quiet_option(),
)
flags(
    CompareSettings,
    spec=typer.Option(help="quantizer spec [rtn:3:row]"),
    all_phases=typer.Option("--all-phases", help="also measure checkpoints inside bumps [default: cool phases only]"),
    pairing=typer.Option(help="seed: fork A vs fork B with the same seed; all: every seed pair"),
    by=typer.Option(help="compare the final gap or the mean gap over checkpoints"),
    quick=typer.Option("--quick", help="small evaluation set (noisier)"),
    csv=typer.Option("--csv", help="write the per-checkpoint table here"),
    threads=threads_option("auto; 0: torch's"),
    quiet=quiet_option(),
)


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
    out: Annotated[Path, typer.Option("--out", help="folder for the forks (+ forks.json)")],
    settings: ForkSettings = ForkSettings(),
) -> None:
    """Continue a checkpoint of a train-tiny trajectory, or a pretrained checkpoint, under new LR schedules,
    once per seed.

    Each fork is its own trajectory (OUT/<schedule>-at<step>-n<steps>-s<seed>/; a pretrained base:
    OUT/<schedule>-n<steps>-s<seed>/) whose trajectory.json records its lineage; its first checkpoint is
    the parent checkpoint (a pretrained base: re-saved in float32). A pretrained base is an HF checkpoint
    folder, a .gguf file or hf:ORG/NAME[@REV]; it trains with fresh AdamW state on --text (default: the
    embedded corpus) in windows of --batch-size x --seq-len tokens, resumable by rerunning the command."""
    try:
        done = fork_runs(parent, out, settings)
    except (TrainError, CheckpointError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    trajs = done.trajectories
    if done.pretrained:
        for t in trajs:
            typer.echo(
                f"{Path(t.meta['folder']).name}: {len(t)} checkpoints, steps {t.steps[0]}..{t.steps[-1]}; validation "
                f"loss {t.meta['fork']['start_val_loss']:.4f} at the base, "
                f"{t[-1].meta.get('val_loss', float('nan')):.4f} at the end"
            )
        typer.echo(
            f"wrote {len(trajs)} fork(s) of {parent} to {Path(out).resolve()} (index: forks.json); sweep one with: "
            f"losslens sweep {Path(out) / Path(trajs[0].meta['folder']).name} --quick"
        )
        return
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


def compare_forks_cmd(
    dirs: Annotated[List[Path], typer.Argument(help="fork folders, or folders of forks (the --out of losslens fork)")],
    *,
    settings: CompareSettings = CompareSettings(),
) -> None:
    """Quantization gap (ppl gap) at the forks' checkpoints and wins per seed pair."""
    try:
        df = compare_fork_runs(dirs, settings)
    except (TrainError, CheckpointError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    all_phases, by, csv = settings.all_phases, settings.by, settings.csv
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
    app.command("fork")(cli(fork_cmd))
    app.command("compare-forks")(cli(compare_forks_cmd))
