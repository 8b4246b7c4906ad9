"""What a tiny training run writes: an HF checkpoint folder (:func:`save_checkpoint`: config, weights,
tokenizer, optionally the AdamW state), its ``trajectory.json`` record (:func:`trajectory_record`; a
fork's first checkpoint: :func:`fork_start_entry`) and JSON records written atomically (:func:`write_json`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from losslens.lm.train.config import FORMAT

__all__ = ["fork_start_entry", "save_checkpoint", "trajectory_record", "write_json"]


def save_checkpoint(
    folder: Path,
    model: nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer | None = None,
    step: int | None = None,
) -> None:
    """Write an HF checkpoint: config.json, model.safetensors, tokenizer files (+ training_state.pt).
    A model with tied tensors (a pretrained checkpoint's shared embedding and head) is written by its
    own ``save_pretrained``, which stores a tied tensor once (without its progress bar)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(folder))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if len({v.data_ptr() for v in model.state_dict().values()}) < len(state) and hasattr(model, "save_pretrained"):
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # its "Writing model shards" tqdm bar: \r-lines in a pipe (restored after)
        try:
            model.save_pretrained(str(folder))
        finally:
            if bars:
                hf_logging.enable_progress_bar()
    else:
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    if optimizer is not None:
        torch.save({"optimizer": optimizer.state_dict(), "step": step}, folder / "training_state.pt")


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` as indented JSON, atomically (a temporary file, then a rename)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def trajectory_record(
    config: Any, model: nn.Module, val: Any, data: dict, versions: dict | None, notes: list, fork: dict | None = None
) -> dict:
    """A new run's ``trajectory.json`` record (no checkpoints yet, not complete): the ``config`` (a
    :class:`~losslens.lm.train.config.TrainConfig`) and the parameters of ``model``; ``data`` plus the
    validation set ``val``'s hash and the tokens per update; ``fork``: a fork's lineage."""
    data = {**data, "validation_hash": val.content_hash, "tokens_per_step": config.tokens_per_step}
    return {
        "format": FORMAT,
        "name": config.run_name,
        "config": config.to_dict(),
        "n_params": sum(p.numel() for p in model.parameters()),
        "tokenizer": "tokenizer",
        "validation_set": "validation.safetensors",
        "data": data,
        "versions": versions,
        **({"fork": fork} if fork is not None else {}),
        "notes": list(notes),
        "checkpoints": [],
        "complete": False,
    }


def fork_start_entry(path: str, step: int, tokens: int, lr: float, train_loss, val_loss: float, seconds: float) -> dict:
    """The checkpoint entry of a fork's start (its parent checkpoint or base, re-saved and re-evaluated)."""
    return {
        "path": path,
        "step": step,
        "tokens": tokens,
        "lr": lr,
        "train_loss": train_loss,
        "val_loss": val_loss,
        "seconds": round(seconds, 3),
        "phase": "start",
        "fork_start": True,
    }
