"""What a tiny training run writes: an HF checkpoint folder (:func:`save_checkpoint`: config, weights,
tokenizer, optionally the AdamW state) and JSON records written atomically (:func:`write_json`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["save_checkpoint", "write_json"]


def save_checkpoint(
    folder: Path,
    model: nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer | None = None,
    step: int | None = None,
) -> None:
    """Write an HF checkpoint: config.json, model.safetensors, tokenizer files (+ training_state.pt).
    A model with tied tensors (a pretrained checkpoint's shared embedding and head) is written by its
    own ``save_pretrained``, which stores a tied tensor once."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(folder))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if len({v.data_ptr() for v in model.state_dict().values()}) < len(state) and hasattr(model, "save_pretrained"):
        model.save_pretrained(str(folder))
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
