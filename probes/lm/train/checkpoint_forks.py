"""Forks of a real checkpoint: continued training of any HF checkpoint folder (or GGUF file) under the
seeds' schedules (issue #47, item 2). Forks of a ``train-tiny`` trajectory are :mod:`losslens.lm.train.forks`.

:func:`fork_pretrained` loads the base (a folder with ``config.json`` and weights, a ``.gguf``
file dequantized by :mod:`losslens.lm.checkpoints.gguf`, or a hub revision ``hf:ORG/NAME[@REV]``) in float32,
tokenizes the training text with the checkpoint's own tokenizer, framed as that tokenizer frames a
document (:mod:`losslens.lm.data.framing`), and continues training once per schedule::

    OUT/forks.json                      # index: one entry per fork
    OUT/<schedule label>-n<steps>-s<seed>/
        trajectory.json                 # as train-tiny writes it, plus "fork": base, schedule, data
        validation.safetensors, tokenizer/
        step-000000/                    # the base, re-saved (float32) and evaluated: the fork start
        step-<k>/ ...                   # the checkpoints, their LR, train / validation loss, phase

- **Schedules**: :class:`~losslens.lm.train.fork_schedule.ForkSchedule` kinds ``constant``, ``wsd``
  (cooldown at ``cooldown_at``), ``cosine``, ``linear``, ``oscillate`` (OLI) and ``sgdr``, starting at
  ``lr`` and decaying to ``lr * min_lr_ratio`` (the base has no schedule of its own, so ``parent`` is
  refused).
- **Data**: the embedded corpus (train split; validation on its held-out split) or a user's text file
  or folder (its document-level train / held-out split, :class:`~losslens.lm.data.corpus.TextSource`).
  Update ``t`` trains on ``batch_size`` random windows of the framed stream drawn with a generator
  seeded by ``(seed, t)`` only (:func:`losslens.lm.train.tiny_data.get_batch`).
- **Resumable**: the newest checkpoint keeps the AdamW state (``training_state.pt``; older ones drop
  it, so disk stays at one optimizer state per fork). Rerunning the same call continues a killed fork
  from its last checkpoint and gives the same weights bit for bit as an uninterrupted run (same
  machine, threads and versions); a finished fork is returned as it is; a folder holding another run
  raises unless ``overwrite``.
- **Progress** (:mod:`losslens.geometry.base.progress`): a live bar on a terminal; in a pipe, a plain
  line every few seconds: updates done / planned, seconds per update, the time left, step, loss, LR.

Units: steps are AdamW updates; LRs AdamW learning rates; losses mean next-token CE in nats.
Cost per fork: ``schedule.steps`` forward + backward passes of ``batch_size × seq_len`` tokens, plus
one validation evaluation per checkpoint; memory: the float32 model, its gradients and AdamW's two
moments (16 bytes per parameter) plus activations.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from losslens.geometry.base.progress import ProgressArg
from losslens.lm.checkpoints import CheckpointError, CheckpointLoader, CheckpointRef, Trajectory
from losslens.lm.checkpoints.files import local_folder
from losslens.lm.checkpoints.gguf import dequantized
from losslens.lm.checkpoints.locate import open_checkpoint, parse_hub_name
from losslens.lm.core.next_token_loss import evaluate
from losslens.lm.core.threads import torch_threads
from losslens.lm.data.corpus import TextSource
from losslens.lm.data.framing import document_framing
from losslens.lm.data.token_sets import token_sets_from_stream, token_stream
from losslens.lm.data.tokenizers import load_tokenizer, tokenizer_fingerprint, tokenizer_name

from losslens.lm.train.config import TrainConfig, TrainError
from losslens.lm.train.fork_schedule import ForkSchedule
from losslens.lm.train.forks import fork_checkpoint_steps, write_fork_index
from losslens.lm.train.run_files import fork_start_entry, save_checkpoint, trajectory_record, write_json
from losslens.lm.train.tiny import build_optimizer, run_loop

__all__ = ["fork_pretrained", "PRETRAINED_FORKS_FORMAT"]

PRETRAINED_FORKS_FORMAT = "losslens-pretrained-forks/1"


def fork_pretrained(
    base: str | Path,
    schedules: Sequence[ForkSchedule],
    out_dir: str | Path,
    lr: float = 1e-4,
    min_lr_ratio: float = 0.1,
    text: str | Path | TextSource | None = None,
    seq_len: int = 128,
    batch_size: int = 8,
    checkpoints: int = 5,
    seed: int = 0,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    val_batches: int = 2,
    progress: ProgressArg = True,
    overwrite: bool = False,
    num_threads: int | None = None,
    on_step: Callable | None = None,
    cache_dir: str | Path | None = None,
) -> list[Trajectory]:
    """Fork the checkpoint ``base`` (an HF folder, a ``.gguf`` file or a hub revision ``hf:ORG/NAME[@REV]``
    through the local Hugging Face cache) once per schedule (see the module docstring); returns one
    :class:`Trajectory` per schedule, in order.

    ``lr``: the start LR of every schedule (AdamW; a pretrained model's peak LR is usually 1e-4 to 1e-3,
    ``lr`` is the LR it continues at); ``min_lr_ratio``: the decaying schedules end at
    ``lr * min_lr_ratio``. ``text``: None (the embedded corpus), a file or folder path, or a
    :class:`TextSource`. ``seq_len`` / ``batch_size``: one update's windows; ``checkpoints``: evenly
    spaced per fork (the last update is one); ``val_batches``: validation batches of the held-out
    text, framed as the tokenizer frames a document. ``progress``: updates done / planned, loss and LR
    on stderr (``[fork]``; a bar on a terminal, plain lines in a pipe); False = silent.
    ``on_step(model, step, lr=, loss=)`` is called after every update. ``cache_dir``: the Hugging Face
    hub cache for an ``hf:`` base (default ``$HF_HUB_CACHE``). Raises :class:`TrainError` for a
    ``parent`` schedule, a text too short, or a folder holding another run (without ``overwrite``).
    """
    if not schedules:
        raise TrainError("give at least one schedule to fork into")
    if any(s.kind == "parent" for s in schedules):
        raise TrainError("a pretrained checkpoint has no schedule to continue: pick constant, wsd, cosine, ...")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base_name, folder = _base_folder(base, cache_dir)
    tok = load_tokenizer(folder)
    framing = document_framing(tok)
    given = text if isinstance(text, TextSource) else None
    given = given or (TextSource.embedded() if text is None else TextSource.from_path(text))
    source = dataclasses.replace(given, split="train")  # the document-level split: never validated on
    held = dataclasses.replace(given, split="heldout")
    train = token_stream(tok, source, framing)
    heldout = token_stream(tok, held, framing)
    if len(train) < seq_len + 1:
        raise TrainError(f"the training text has {len(train)} tokens, fewer than one sequence of {seq_len}")
    data = {
        "source": source.describe(),
        "tokenizer": tokenizer_name(tok),
        "tokenizer_fingerprint": tokenizer_fingerprint(tok),
        "framing": framing.as_meta(),
        "train_tokens": len(train),
    }
    val = token_sets_from_stream(
        heldout,
        {"validation": (val_batches, batch_size, seq_len)},
        seed,
        dict(data, split="heldout"),
        source_name=f"the held-out text of {source.describe()}",
        framing=framing,
    )["validation"]
    base_info = {"base": base_name, "base_folder": str(Path(folder).resolve())}
    results = []
    with torch_threads(num_threads if num_threads is not None else 0):
        for sched in schedules:
            results.append(
                _fork_one(
                    folder,
                    base_info,
                    tok,
                    train,
                    val,
                    data,
                    sched,
                    out,
                    lr,
                    min_lr_ratio,
                    seq_len,
                    batch_size,
                    checkpoints,
                    seed,
                    weight_decay,
                    grad_clip,
                    progress,
                    overwrite,
                    on_step,
                )  # fmt: skip
            )
            write_fork_index(out, results, PRETRAINED_FORKS_FORMAT, origin=("base",))
    return results


def _base_folder(base: str | Path, cache_dir: str | Path | None) -> tuple[str, Path]:
    """``(name recorded as the fork's base, local checkpoint folder)`` of ``base``: a folder, a ``.gguf``
    file (its dequantized folder) or a hub revision ``hf:ORG/NAME[@REV]`` (its snapshot in the local
    Hugging Face cache, downloaded when online; the last revision of a list)."""
    if parse_hub_name(base) is not None:
        try:
            _, ref = open_checkpoint(base, cache_dir=cache_dir, alone=True)
            return str(base), local_folder(ref)
        except CheckpointError as exc:
            raise TrainError(f"cannot fork {base}: {exc}") from exc
    base_path = Path(base).expanduser()
    if not base_path.exists():
        raise TrainError(
            f"no checkpoint at {base_path}; give an HF checkpoint folder, a .gguf file or a hub name hf:ORG/NAME"
        )
    return str(base_path.resolve()), dequantized(base_path)


def _fork_one(
    folder, base_info, tok, train, val, data, schedule, out, lr, min_lr_ratio, seq_len, batch_size,
    checkpoints, seed, weight_decay, grad_clip, progress, overwrite, on_step,
) -> Trajectory:  # fmt: skip
    t_start = time.perf_counter()
    model = CheckpointLoader(CheckpointRef.from_path(folder)).load(CheckpointRef.from_path(folder))
    mcfg = model.config
    cfg = TrainConfig(
        schedule="constant",
        peak_lr=lr,
        min_lr_ratio=min_lr_ratio,
        steps=schedule.steps,
        checkpoints=1,
        seed=seed,
        weight_decay=weight_decay,
        batch_size=batch_size,
        seq_len=seq_len,
        grad_clip=grad_clip,
        val_batches=val.n_batches,
        hidden_size=int(getattr(mcfg, "hidden_size", 64)),
        num_layers=int(getattr(mcfg, "num_hidden_layers", 2)),
        num_heads=int(getattr(mcfg, "num_attention_heads", 4)),
        vocab_size=len(tok),
        save_optimizer=True,
    )
    sched = schedule.resolve(cfg, lr)
    name = f"{sched.label}-n{sched.steps}-s{seed}"
    ckpt_steps = fork_checkpoint_steps(0, sched.steps, min(checkpoints, sched.steps))
    cfg = TrainConfig.from_dict({**cfg.to_dict(), "checkpoints": len(ckpt_steps), "name": name})
    lineage = {
        **base_info,
        "schedule": sched.to_dict(),
        "label": sched.label,
        "condition": f"{sched.label}-n{sched.steps}",
        "seed": seed,
        "data_seed": seed,
        "parent": base_info["base"],
        "parent_checkpoint": "base",
        "parent_step": 0,
        "parent_lr": lr,
        "checkpoint_steps": ckpt_steps,
        "optimizer_state": "fresh AdamW at the base (a pretrained checkpoint ships no optimizer state)",
    }
    fork = out / name
    tj_path = fork / "trajectory.json"
    record = json.loads(tj_path.read_text()) if tj_path.is_file() else None
    same = record is not None and record.get("config") == cfg.to_dict() and _same(record.get("fork") or {}, lineage)
    if record is not None and same and record.get("complete") and not overwrite:
        return Trajectory.from_folder(fork)
    if record is not None and not same and not overwrite:
        raise TrainError(f"{fork} already holds a different run; use another out_dir or overwrite=True (--force)")
    optimizer = build_optimizer(model, cfg)
    start = 0
    resumable = same and not overwrite and record["checkpoints"]
    last = fork / record["checkpoints"][-1]["path"] if resumable else None
    if last is not None and (last / "training_state.pt").is_file():
        start = int(record["checkpoints"][-1]["step"])
        ref = CheckpointRef.from_path(last)
        model.load_state_dict(CheckpointLoader(ref).load(ref).state_dict())
        optimizer.load_state_dict(
            torch.load(last / "training_state.pt", map_location="cpu", weights_only=True)["optimizer"]
        )
        record["notes"].append(f"resumed at step {start} from {last.name}")
    else:
        if fork.exists():
            shutil.rmtree(fork)
        fork.mkdir(parents=True)
        val.save(fork / "validation.safetensors")
        tok.save_pretrained(str(fork / "tokenizer"))
        note = (
            f"fork of the pretrained checkpoint {lineage['base']} under {sched.label}, seed {seed}, float32 "
            f"training; {lineage['optimizer_state']}"
        )
        versions = {"torch": torch.__version__, "transformers": __import__("transformers").__version__}
        record = trajectory_record(cfg, model, val, {**data, "data_seed": seed}, versions, [note], fork=lineage)
        lineage["start_val_loss"] = evaluate(model, val).loss
        save_checkpoint(fork / "step-000000", model, tok, optimizer, 0)
        record["checkpoints"].append(
            fork_start_entry("step-000000", 0, 0, lr, None, lineage["start_val_loss"], time.perf_counter() - t_start)
        )
        write_json(tj_path, record)

    def keep_latest_state(step: int) -> dict:
        for p in fork.glob("step-*/training_state.pt"):  # the newest checkpoint alone keeps AdamW's state
            if p.parent.name != f"step-{step:06d}":
                p.unlink()
        return {"phase": sched.phase(step)}

    run_loop(
        model, optimizer, train, val, tok, fork, record, cfg, start=start, checkpoint_steps=ckpt_steps,
        lr_fn=lambda step: sched.lr(step), progress=progress, t_start=t_start,
        checkpoint_extra=keep_latest_state, on_step=on_step, label="fork",
    )  # fmt: skip
    return Trajectory.from_folder(fork)


def _same(a: dict, b: dict) -> bool:
    keys = ("base", "schedule", "seed", "checkpoint_steps", "parent_lr")
    return all(a.get(k) == b.get(k) for k in keys)
