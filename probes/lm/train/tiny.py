"""The embedded default trajectory: a tiny GPT-NeoX trained here, on CPU, on the embedded corpus.

A nanoGPT-style loop -- read it top to bottom:

1. **Data** (:func:`prepare_data`). The embedded corpus (:mod:`losslens.lm.data.corpus`) is split by document
   hash into *train* (~90%) and *held-out* (~10%) parts. A byte-level BPE with ``vocab_size``
   entries is trained on the train part only; both parts are tokenized into streams. The tokenizer
   and streams are cached in ``OUT/data/`` (keyed by the corpus hash, vocab size and tokenizers
   version), so reruns skip this. The validation set -- ``val_batches`` batches of
   ``[batch_size, seq_len]`` non-overlapping windows of the held-out stream -- is saved as
   ``OUT/validation.safetensors``; it never overlaps the training text.
2. **Model**: ``GPTNeoXForCausalLM`` from a ``GPTNeoXConfig`` (eager attention, untied embeddings,
   no dropout), initialised after ``torch.manual_seed(seed)``.
3. **Loop**: ``steps`` AdamW updates (betas 0.9/0.95, decoupled weight decay on matrices and
   embeddings, none on biases and LayerNorms), gradient-norm clipping, LR from :func:`lr_at`.
   Batch ``t`` is ``batch_size`` random windows of the train stream drawn with a generator seeded
   by ``(data_seed, t)`` -- so the data order depends only on the step, which makes resuming and
   forking exact.
4. **Checkpoints**: at ``checkpoints`` evenly spaced steps (the last is ``steps``),
   ``OUT/step-000100/`` gets ``config.json``, ``model.safetensors`` and the tokenizer files
   (plus ``training_state.pt`` with the AdamW state when ``save_optimizer``), and
   ``OUT/trajectory.json`` is rewritten with, per checkpoint: step, tokens seen
   (``step * batch_size * seq_len``), the LR of the last update, the mean training loss since the
   previous checkpoint, and the validation loss (:func:`losslens.lm.core.next_token_loss.evaluate` on the validation
   set).

The config and schedules (``wsd`` / ``cosine`` / ``constant`` / ``linear``) are in
:mod:`losslens.lm.train.config` (:class:`~losslens.lm.train.config.TrainConfig`,
:func:`~losslens.lm.train.config.lr_at`).
Grids of runs (``losslens train-tiny --sweep lr=1e-3,3e-3 --seeds 0,1``) are in
:mod:`losslens.lm.train.grid`; schedule forks (continue a checkpoint under cosine / SGDR / oscillating
schedules) in :mod:`losslens.lm.train.forks`, which reuses :func:`run_loop`.

Resuming: ``train_tiny(cfg, out, resume_from=ckpt_dir)`` loads a checkpoint's weights
(and AdamW state when it has ``training_state.pt``; otherwise the moments restart from zero --
documented in ``trajectory.json``) and continues at its step under ``cfg``'s schedule. Rerunning
``train_tiny`` with the same config into a finished folder returns the existing trajectory.

Measured on 2 CPU cores with 1 thread: the default (0.17M params, 800 steps of 32x64) takes
about 1–1.5 min (9 s per 100 steps); the former 1.06M preset (hidden 128, 4 layers, 600 steps of
32x128) a few minutes; ``TrainConfig.tiny()`` a few seconds.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from losslens.geometry.base.progress import ProgressArg, progress_bar
from losslens.lm.checkpoints import CheckpointLoader, CheckpointRef, Trajectory
from losslens.lm.core.next_token_loss import evaluate, lm_loss
from losslens.lm.core.threads import torch_threads
from losslens.lm.core.tokenset import TokenSet

from losslens.lm.train.config import TrainConfig, TrainError, lr_at
from losslens.lm.train.run_files import save_checkpoint, trajectory_record, write_json
from losslens.lm.train.tiny_data import get_batch, prepare_data

__all__ = ["train_tiny", "build_model", "build_optimizer", "run_loop"]


# --------------------------------------------------------------------------------------------
# model and optimizer
# --------------------------------------------------------------------------------------------


def build_model(config: TrainConfig, tokenizer: Any = None) -> nn.Module:
    """A freshly initialised ``GPTNeoXForCausalLM`` (eager attention) for ``config``; seeded by
    ``config.seed``. Context length = ``seq_len``."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    eos = getattr(tokenizer, "eos_token_id", None)
    eos = 0 if eos is None else eos
    cfg = GPTNeoXConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size or 4 * config.hidden_size,
        max_position_embeddings=config.seq_len,
        tie_word_embeddings=False,
        bos_token_id=eos,
        eos_token_id=eos,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        use_cache=False,
        attn_implementation="eager",
    )
    torch.manual_seed(config.seed)
    return GPTNeoXForCausalLM(cfg)


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on every >= 2-D parameter (matrices, embeddings), none on biases/norms."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.peak_lr, betas=(config.beta1, config.beta2), eps=1e-8)


# --------------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------------


def train_tiny(
    config: TrainConfig,
    out_dir: str | Path,
    progress: ProgressArg = True,
    resume_from: str | Path | None = None,
    overwrite: bool = False,
    data_dir: str | Path | None = None,
    num_threads: int | None = None,
    on_step=None,
) -> Trajectory:
    """Train a tiny GPT-NeoX under ``config`` and write its trajectory to ``out_dir``.

    Returns ``Trajectory.from_folder(out_dir)``. If ``out_dir`` already holds a finished run with
    the same config, returns it without training; a different run there raises :class:`TrainError`
    unless ``overwrite=True`` (which deletes its step-* folders and trajectory.json). An unfinished
    run with the same config continues from its last checkpoint if that has ``training_state.pt``
    (``save_optimizer=True``), and restarts otherwise.
    ``progress``: updates done / planned, loss and LR on stderr (``[train-tiny]``; a live bar on a
    terminal, a plain line every few seconds in a pipe; False: silent).
    ``resume_from``: a checkpoint folder (of this or another run) to continue from at its step.
    ``data_dir``: where the tokenizer / token streams are cached (default ``out_dir/data``).
    ``num_threads``: torch CPU threads during training, restored afterwards. ``None`` = auto: 1
    thread when ``hidden_size <= 64`` (such models are too small to gain from threads, and on a
    loaded machine 2 threads were measured 25x slower than 1), torch's default otherwise; 0 =
    torch's default.
    ``on_step``: called as ``on_step(model, step, lr=lr, loss=loss)`` after every update (e.g. a
    :class:`losslens.study.monitor.RobustnessMonitor`'s ``step``; it must leave the training state alone).
    Cost: ``steps`` forward+backward passes of [batch_size, seq_len] plus ``checkpoints`` x
    ``val_batches`` forward passes.
    """
    if num_threads is None:
        num_threads = 1 if config.hidden_size <= 64 else 0
    with torch_threads(num_threads):
        return _train(config, Path(out_dir), progress, resume_from, overwrite, data_dir, on_step)


def _train(
    config: TrainConfig, out: Path, progress: ProgressArg, resume_from, overwrite: bool, data_dir, on_step=None
) -> Trajectory:
    out.mkdir(parents=True, exist_ok=True)
    tj_path = out / "trajectory.json"
    if tj_path.is_file() and resume_from is None:
        old = json.loads(tj_path.read_text())
        if old.get("config") == config.to_dict() and old.get("complete") and not overwrite:
            return Trajectory.from_folder(out)
        if not overwrite and old.get("config") != config.to_dict():
            raise TrainError(
                f"{out} already holds a run with a different config ({old.get('name')}); use another "
                "output folder or overwrite=True (--force)"
            )
        done = [r for r in old.get("checkpoints", []) if (out / r["path"] / "training_state.pt").is_file()]
        if not overwrite and done:  # an unfinished run that saved its optimizer: continue it
            return _train(config, out, progress, out / done[-1]["path"], overwrite, data_dir, on_step)
        for p in out.glob("step-*"):
            if p.is_dir():
                shutil.rmtree(p)
        tj_path.unlink()

    t_start = time.perf_counter()
    tok, train, val = prepare_data(config, out, data_dir)
    tok.save_pretrained(str(out / "tokenizer"))
    model = build_model(config, tok)
    optimizer = build_optimizer(model, config)

    start, records, notes = 0, [], []
    if resume_from is not None:
        start, records, notes = _resume(Path(resume_from), model, optimizer, config, out)
    data = {
        "source": "embedded[train]",
        "validation_source": "embedded[heldout]",
        "train_tokens": len(train),
        "split": "document-level sha256 hash, 1 in 10 held out",
    }
    versions = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "transformers": __import__("transformers").__version__,
    }
    record = trajectory_record(config, model, val, data, versions, notes)
    record["checkpoints"] = records
    run_loop(
        model,
        optimizer,
        train,
        val,
        tok,
        out,
        record,
        config,
        start=start,
        checkpoint_steps=config.checkpoint_steps,
        lr_fn=lambda step: lr_at(step, config),
        progress=progress,
        t_start=t_start,
        on_step=on_step,
        label="train-tiny",
    )
    return Trajectory.from_folder(out)


def run_loop(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    train: torch.Tensor,
    val: TokenSet,
    tok: Any,
    out: Path,
    record: dict,
    config: TrainConfig,
    start: int,
    checkpoint_steps: list[int],
    lr_fn,
    progress: ProgressArg = False,
    t_start: float | None = None,
    checkpoint_extra=None,
    on_step=None,
    label: str | None = None,
) -> None:
    """The training loop shared by :func:`train_tiny` and forks (:mod:`losslens.lm.train.forks`).

    Runs updates ``start + 1 .. config.steps``; update ``step`` uses LR ``lr_fn(step)`` on batch
    :func:`get_batch` ``(train, step, config)``. At each step of ``checkpoint_steps`` (those
    ``> start``) it evaluates the validation loss, writes ``out/step-NNNNNN/`` (with AdamW state when
    ``config.save_optimizer``), appends a record (step, tokens, lr, mean train loss since the last
    checkpoint, val loss, seconds since ``t_start``, plus ``checkpoint_extra(step)`` when given) to
    ``record["checkpoints"]`` and rewrites ``out/trajectory.json``; ``record["complete"]`` turns
    true at ``config.steps``. ``on_step(model, step, lr=lr, loss=loss)``, when given, is called after
    every update (before the checkpoint of that step). ``progress``
    (:data:`~losslens.geometry.base.progress.ProgressArg`): updates done / planned with the step, loss
    and LR, on stderr under ``[label]``.
    """
    t_start = time.perf_counter() if t_start is None else t_start
    tj_path = out / "trajectory.json"
    ckpt_steps = {s for s in checkpoint_steps if s > start}
    records = record["checkpoints"]
    model.train()
    t_loop = time.perf_counter()
    losses: list[float] = []
    with progress_bar(progress, config.steps - start, what=record["name"], unit="step", label=label) as bar:
        for step in range(start + 1, config.steps + 1):
            lr = lr_fn(step)
            losses.append(_update(model, optimizer, train, config, step, lr))
            if on_step is not None:
                on_step(model, step, lr=lr, loss=losses[-1])
            bar.describe(f"step {step}, loss {losses[-1]:.3f}, lr {lr:.2e}")
            bar.update()
            if step not in ckpt_steps:
                continue
            val_loss = evaluate(model, val).loss
            model.train()
            folder = out / f"step-{step:06d}"
            save_checkpoint(folder, model, tok, optimizer if config.save_optimizer else None, step)
            records.append(
                {
                    "path": folder.name,
                    "step": step,
                    "tokens": step * config.tokens_per_step,
                    "lr": lr,
                    "train_loss": sum(losses) / len(losses),
                    "val_loss": val_loss,
                    "seconds": round(time.perf_counter() - t_start, 3),
                    **(checkpoint_extra(step) if checkpoint_extra else {}),
                }
            )
            losses = []
            record["seconds"] = round(time.perf_counter() - t_start, 3)
            record["steps_per_second"] = round((step - start) / (time.perf_counter() - t_loop), 3)
            record["complete"] = step == config.steps
            write_json(tj_path, record)


def _update(
    model: nn.Module, optimizer: torch.optim.Optimizer, train, config: TrainConfig, step: int, lr: float
) -> float:
    """One AdamW update at LR ``lr`` on batch ``step``; its training loss (:class:`TrainError` when not finite)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = lm_loss(model, get_batch(train, step, config))
    if not math.isfinite(loss.item()):
        raise TrainError(f"training diverged at step {step} (loss {float(loss)}); lower the learning rate")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return loss.item()


def _resume(
    ckpt: Path, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig, out: Path
) -> tuple[int, list, list]:
    """Load weights (+ AdamW state if saved) from ``ckpt``; return (start step, kept records, notes)."""
    ref = CheckpointRef.from_path(ckpt)
    if ref.step is None:
        raise TrainError(f"cannot tell the step of {ckpt}; name it step-<N>")
    loaded = CheckpointLoader(ref).load(ref)
    model.load_state_dict(loaded.state_dict())
    notes = [f"resumed from {ckpt} at step {ref.step}"]
    state_file = ckpt / "training_state.pt"
    if state_file.is_file():
        optimizer.load_state_dict(torch.load(state_file, map_location="cpu", weights_only=True)["optimizer"])
    else:
        notes.append("no training_state.pt: AdamW moments restarted from zero")
    records = []
    tj = ckpt.parent / "trajectory.json"
    if ckpt.parent.resolve() == out.resolve() and tj.is_file():
        records = [r for r in json.loads(tj.read_text()).get("checkpoints", []) if r["step"] <= ref.step]
    return ref.step, records, notes
