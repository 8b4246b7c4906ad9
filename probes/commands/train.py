"""`losslens train-tiny`: train the embedded default trajectory (a tiny GPT-NeoX on the embedded corpus)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("train-tiny")
    def train_tiny_cmd(
        out: Path = typer.Option(..., "--out", help="output folder (step-NNNNNN/ checkpoints + trajectory.json)"),
        schedule: Optional[str] = typer.Option(None, help="LR schedule: wsd | cosine | constant | linear [wsd]"),
        peak_lr: Optional[float] = typer.Option(None, "--peak-lr", help="peak learning rate [3e-3]"),
        steps: Optional[int] = typer.Option(None, help="optimizer updates [600; --tiny 60]"),
        checkpoints: Optional[int] = typer.Option(None, help="checkpoints to write, evenly spaced [10; --tiny 3]"),
        seed: Optional[int] = typer.Option(None, help="init seed (also the data-order seed unless --data-seed) [0]"),
        tiny: bool = typer.Option(False, "--tiny", help="tiny preset for tests/smoke runs (~60k params, seconds)"),
        weight_decay: Optional[float] = typer.Option(None, "--weight-decay", help="AdamW decoupled weight decay [0.1]"),
        warmup: Optional[float] = typer.Option(None, help="warmup fraction of steps [0.05]"),
        decay: Optional[float] = typer.Option(None, help="WSD: decay fraction of steps [0.2]"),
        min_lr_ratio: Optional[float] = typer.Option(None, "--min-lr-ratio", help="final LR / peak LR [0]"),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", help="sequences per step [32]"),
        seq_len: Optional[int] = typer.Option(None, "--seq-len", help="tokens per sequence = context length [128]"),
        hidden: Optional[int] = typer.Option(None, "--hidden", help="hidden size [128]"),
        layers: Optional[int] = typer.Option(None, "--layers", help="transformer blocks [4]"),
        heads: Optional[int] = typer.Option(None, "--heads", help="attention heads [4]"),
        vocab_size: Optional[int] = typer.Option(None, "--vocab-size", help="BPE vocabulary size [1024]"),
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
        force: bool = typer.Option(False, "--force", help="overwrite a different run in --out"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
    ) -> None:
        """Train a tiny GPT-NeoX on the embedded corpus and write an HF-checkpoint trajectory."""
        from probes.train_tiny import TrainConfig, TrainError, train_tiny

        overrides = dict(schedule=schedule, peak_lr=peak_lr, steps=steps, checkpoints=checkpoints, seed=seed,
                         weight_decay=weight_decay, warmup=warmup, decay=decay, min_lr_ratio=min_lr_ratio,
                         batch_size=batch_size, seq_len=seq_len, hidden_size=hidden, num_layers=layers,
                         num_heads=heads, vocab_size=vocab_size, grad_clip=grad_clip, val_batches=val_batches,
                         data_seed=data_seed, name=name)
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if save_optimizer:
            overrides["save_optimizer"] = True
        try:
            config = replace(TrainConfig.tiny() if tiny else TrainConfig(), **overrides)
            traj = train_tiny(config, out, progress=not quiet, resume_from=resume_from, overwrite=force, data_dir=data_dir,
                              num_threads=threads)
        except TrainError as exc:
            raise typer.BadParameter(str(exc)) from exc
        last = traj[len(traj) - 1]
        meta = traj.meta
        typer.echo(f"wrote {len(traj)} checkpoints of {traj.name} ({meta.get('n_params', '?'):,} parameters) to "
                   f"{Path(out).resolve()}")
        typer.echo(f"  final step {last.step}: train loss {last.meta.get('train_loss', float('nan')):.4f}, "
                   f"validation loss {last.meta.get('val_loss', float('nan')):.4f}; "
                   f"{meta.get('seconds', 0):.1f} s, {meta.get('steps_per_second', 0):.1f} steps/s")
        typer.echo(f"  load it with: Trajectory.from_folder({str(out)!r})")
