"""Checkpoint files: finding a checkpoint's folder, config and weight files, and reading weights safely.

Weights are read with ``safetensors``; ``.bin`` / ``.pt`` files only with
``torch.load(weights_only=True)``; a file that needs arbitrary pickle is refused unless
``allow_pickle=True``. :func:`read_config` reads ``config.json`` (cheap: no weights).
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import torch
from torch import nn

from losslens.lm.checkpoints.errors import (
    CheckpointError,
    CorruptCheckpointError,
    MissingWeightsError,
    UnsafeCheckpointError,
)
from losslens.lm.checkpoints.hub import hub_folder
from losslens.lm.checkpoints.refs import CheckpointRef

__all__ = ["local_folder", "weight_files", "read_config", "has_tokenizer_files", "weights_bytes"]

TRAINER_FILES = {
    "optimizer.pt",
    "scheduler.pt",
    "training_args.bin",
    "rng_state.pth",
    "training_state.pt",
    "optimizer.bin",
    "scaler.pt",
}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


_IGNORABLE_BUFFER_SUFFIXES = (
    ".attention.bias",
    ".attention.masked_bias",
    ".attn.bias",
    ".attn.masked_bias",
    ".rotary_emb.inv_freq",
    ".masked_bias",
)


def is_ignorable_buffer(name: str) -> bool:
    return name.endswith(_IGNORABLE_BUFFER_SUFFIXES)


def local_folder(ref: CheckpointRef) -> Path:
    """The local folder holding ``ref``'s config.json (hub refs resolved through the HF cache)."""
    if ref.kind == "hub":  # a snapshot holding one .gguf file and no config.json: its dequantized folder
        from losslens.lm.checkpoints.gguf import gguf_checkpoint_folder, gguf_in_folder

        folder = hub_folder(ref)
        found = gguf_in_folder(folder)
        return folder if found is None else gguf_checkpoint_folder(found)
    if ref.kind == "derived":
        if not ref.sources:
            raise CheckpointError(f"derived checkpoint {ref.label!r} has no sources")
        return local_folder(ref.sources[0])
    if ref.location is None:
        raise CheckpointError(f"checkpoint {ref.label!r} has no location")
    p = Path(ref.location)
    return p if ref.kind == "hf_dir" else p.parent


def weight_files(folder: str | Path, label: str | None = None) -> list[Path]:
    """Weight files of an HF checkpoint folder, in the order ``from_pretrained`` prefers:
    model.safetensors, its sharded index, pytorch_model.bin, its index, then a single other
    .safetensors / .bin / .pt file (HF Trainer's optimizer.pt, training_args.bin ... are ignored).
    Raises :class:`MissingWeightsError` naming the folder (or a missing shard)."""
    folder = Path(folder)
    name = label or folder.name
    if not folder.is_dir():
        raise MissingWeightsError(f"checkpoint {name!r}: folder {folder} does not exist")
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if (folder / single).is_file():
            return [folder / single]
        if (folder / index).is_file():
            try:
                wm = json.loads((folder / index).read_text())["weight_map"]
            except (ValueError, KeyError) as exc:
                raise CorruptCheckpointError(
                    f"checkpoint {name!r}: shard index {folder / index} is unreadable: {exc}"
                ) from exc
            shards = [folder / s for s in sorted(set(wm.values()))]
            for s in shards:
                if not s.is_file():
                    raise MissingWeightsError(f"checkpoint {name!r}: shard {s} listed in {index} is missing")
            return shards
    others = sorted(
        p
        for p in folder.iterdir()
        if p.is_file()
        and p.suffix in WEIGHT_SUFFIXES
        and p.name not in TRAINER_FILES
        and not p.name.startswith("rng_state")
    )
    sts = [p for p in others if p.suffix == ".safetensors"]
    if len(sts) == 1:
        return sts
    if not sts and len(others) == 1:
        return others
    if len(others) > 1:
        raise MissingWeightsError(
            f"checkpoint {name!r}: {folder} holds several weight files "
            f"({', '.join(p.name for p in others)}) and no model.safetensors / index to say which to use"
        )
    raise MissingWeightsError(
        f"checkpoint {name!r}: no weight file in {folder} (expected model.safetensors, "
        "model.safetensors.index.json or pytorch_model.bin)"
    )


def ref_weight_files(ref: CheckpointRef) -> list[Path]:
    if ref.kind in ("safetensors", "torch_file"):
        p = Path(ref.location or "")
        if not p.is_file():
            raise MissingWeightsError(f"checkpoint {ref.label!r}: weight file {p} does not exist")
        return [p]
    return weight_files(local_folder(ref), ref.label)


def read_config(ref_or_path: "CheckpointRef | str | Path") -> dict:
    """The checkpoint's config.json as a dict (cheap: no weights read).

    Raises :class:`MissingWeightsError` when there is no config.json, :class:`CorruptCheckpointError`
    when it is not JSON."""
    if isinstance(ref_or_path, CheckpointRef):
        folder, label = local_folder(ref_or_path), ref_or_path.label
    else:
        p = Path(ref_or_path)
        folder, label = (p if p.is_dir() else p.parent), p.name
    path = folder / "config.json"
    if not path.is_file():
        raise MissingWeightsError(
            f"checkpoint {label!r}: no config.json in {folder}; an HF checkpoint needs one "
            "(model.config.save_pretrained(folder))"
        )
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise CorruptCheckpointError(f"checkpoint {label!r}: {path} is not valid JSON: {exc}") from exc


def load_weight_file(path: Path, allow_pickle: bool = False, label: str | None = None) -> dict[str, torch.Tensor]:
    """One weight file -> state dict of CPU tensors. safetensors, or torch.load(weights_only=True)."""
    who = f"checkpoint {label!r}: " if label else ""
    if not path.is_file():
        raise MissingWeightsError(f"{who}weight file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as exc:  # SafetensorError, OSError
            raise CorruptCheckpointError(
                f"{who}{path} is not a readable safetensors file ({exc}); re-save or re-download it"
            ) from exc
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "global" not in str(exc).lower():
            raise CorruptCheckpointError(f"{who}{path} is not a readable torch file ({_first_line(exc)})") from exc
        if not allow_pickle:
            raise UnsafeCheckpointError(
                f"{who}{path} contains pickled Python objects that torch.load(weights_only=True) refuses "
                f"({_first_line(exc)}). Loading it could run arbitrary code: convert it to safetensors, or pass "
                "allow_pickle=True (CLI: --allow-pickle) only if you trust the file."
            ) from exc
        warnings.warn(f"loading {path} with full pickle (allow_pickle=True): only do this for trusted files")
        obj = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as exc:  # RuntimeError from the zip reader, EOFError, ...
        raise CorruptCheckpointError(f"{who}{path} is not a readable torch file ({_first_line(exc)})") from exc
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if isinstance(obj, nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CorruptCheckpointError(f"{who}{path} does not hold a state dict of tensors (got {type(obj).__name__})")
    return obj


def _first_line(exc: BaseException) -> str:
    s = str(exc).strip()
    for line in s.splitlines():
        if "global" in line.lower() or "error" in line.lower():
            return line.strip()[:300]
    return s.splitlines()[0][:300] if s else type(exc).__name__


def file_shapes(files: list[Path], label: str, allow_pickle: bool = False) -> dict[str, tuple]:
    """Parameter name -> shape from weight-file headers (safetensors: header only; torch files are
    read with ``weights_only=True``, or full pickle when ``allow_pickle``)."""
    out: dict[str, tuple] = {}
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                with safe_open(str(f), framework="pt") as h:
                    for k in h.keys():
                        out[k] = tuple(h.get_slice(k).get_shape())
            except Exception as exc:
                raise CorruptCheckpointError(
                    f"checkpoint {label!r}: {f} is not a readable safetensors file ({exc})"
                ) from exc
        else:
            out.update({k: tuple(v.shape) for k, v in load_weight_file(f, allow_pickle, label).items()})
    return {k: v for k, v in out.items() if not is_ignorable_buffer(k)}


def has_tokenizer_files(folder: Path) -> bool:
    """Whether ``folder`` holds tokenizer files (as written by ``tokenizer.save_pretrained``)."""
    return any(
        (folder / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    )


def weights_bytes(ref: CheckpointRef, dtype: torch.dtype | None = None) -> int | None:
    """Bytes ``ref``'s parameters take in memory as ``dtype`` (default float32; derived: its first
    source's), from the safetensors headers (no weights read); other weight files count their size
    on disk. None for hub checkpoints (their files may not be here yet) or when the files cannot
    be read."""
    while ref.kind == "derived" and ref.sources:
        ref = ref.sources[0]
    if ref.kind == "hub":
        return None
    try:
        files = ref_weight_files(ref)
        itemsize = torch.empty((), dtype=dtype or torch.float32).element_size()
        total = 0
        for f in files:
            if f.suffix == ".safetensors":
                total += sum(int(torch.Size(s).numel()) for s in file_shapes([f], str(ref.label)).values()) * itemsize
            else:
                total += f.stat().st_size
        return total
    except (CheckpointError, OSError):
        return None
