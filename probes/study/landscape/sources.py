"""Checkpoints as point sources: their tensors read a row-slice at a time, under the model's names.

:func:`checkpoint_source` turns a :class:`~losslens.lm.checkpoints.CheckpointRef` into a
:class:`~losslens.geometry.surfaces.sources.PointSource` for
:func:`losslens.geometry.surfaces.trajectory_pca.trajectory_pca`:

- safetensors checkpoints (what ``save_pretrained`` writes, single or sharded) are read lazily with
  plain positioned reads (no memory map, so no file pages stay mapped in the process): a slice
  costs its own bytes, so N checkpoints are streamed together without holding any whole;
- derived checkpoints (LAWA, soups) are the weighted mean of their sources' slices;
- other files (``.bin`` / ``.pt``, read with ``weights_only=True``) are loaded whole on first use and
  held (:attr:`CheckpointSource.held_bytes` says how much, before any read; the memory plan adds it).

Names are the model's parameter names (``model.named_parameters()``): file keys that transformers
renames at load time (GPT-NeoX's ``embed_out`` → ``lm_head``) are mapped exactly as the
:class:`~losslens.lm.checkpoints.CheckpointLoader` maps them.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Mapping, Sequence

import torch
from torch import nn

from losslens.geometry.surfaces.sources import MeanSource, PointSource, as_rows
from losslens.lm.checkpoints.errors import CheckpointError
from losslens.lm.checkpoints.files import file_shapes, load_weight_file, ref_weight_files
from losslens.lm.checkpoints.loader import _rename_legacy_keys
from losslens.lm.checkpoints.refs import CheckpointRef

__all__ = ["CheckpointSource", "checkpoint_source", "model_names"]


def model_names(model: nn.Module) -> list[str]:
    """The floating-point parameter names of ``model`` (tied parameters once), in its order."""
    return [n for n, p in model.named_parameters() if p.is_floating_point()]


class CheckpointSource:
    """One real checkpoint's weights, read a slice at a time (see the module docstring)."""

    def __init__(self, ref: CheckpointRef, model: nn.Module, allow_pickle: bool = False) -> None:
        self.ref, self.label = ref, ref.label
        files = ref_weight_files(ref)
        shapes = file_shapes(files, ref.label, allow_pickle)
        target = model.state_dict(keep_vars=True)
        renamed = _rename_legacy_keys({k: k for k in shapes}, model, target)  # model name -> file key
        self._key = {name: key for name, key in renamed.items()}
        self._shapes = {name: shapes[key] for name, key in renamed.items()}
        wanted = model_names(model)
        missing = [n for n in wanted if n not in self._key]
        if missing:
            raise CheckpointError(
                f"checkpoint {ref.label!r} has no weights for {missing[:4]} of the model "
                f"({len(missing)} in all): it is not a checkpoint of this architecture"
            )
        self._names = wanted
        self._lazy = all(f.suffix == ".safetensors" for f in files)
        self._where: dict[str, tuple[Path, int, torch.dtype]] = {}  # file key -> (file, data offset, dtype)
        self._held: dict[str, torch.Tensor] = {}
        if self._lazy:
            for f in files:
                self._where.update(_safetensors_index(f, ref.label))
            self._dtypes = {k: v[2] for k, v in self._where.items()}
        else:  # torch files: read whole on first use, then held
            self._files, self._allow_pickle = files, allow_pickle
            self._dtypes = {}

    @property
    def held_bytes(self) -> int:
        """Bytes this source will hold in memory: 0 for safetensors (read a slice at a time), the
        files' size on disk for torch files (held whole once read)."""
        return 0 if self._lazy else int(sum(f.stat().st_size for f in self._files))

    def _hold(self) -> None:
        if not self._held:
            for f in self._files:
                self._held.update(load_weight_file(f, self._allow_pickle, self.label))
            self._dtypes = {k: v.dtype for k, v in self._held.items()}

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._shapes[name])

    def dtype(self, name: str) -> torch.dtype:
        if not self._lazy:
            self._hold()
        return self._dtypes[self._key[name]]

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        key = self._key[name]
        if not self._lazy:
            self._hold()
            t = self._held[key]
            return as_rows(t)[start:stop]
        path, offset, dtype = self._where[key]
        shape = self._shapes[name]
        per_row = math.prod(shape[1:]) if len(shape) > 1 else 1
        nbytes = (stop - start) * per_row * dtype.itemsize
        with open(path, "rb") as fh:  # a plain read: no memory map keeps the file's pages mapped
            data = os.pread(fh.fileno(), nbytes, offset + start * per_row * dtype.itemsize)
        if len(data) != nbytes:
            raise CheckpointError(
                f"checkpoint {self.label!r}: {path} ends inside tensor {key!r}; the file is "
                "truncated: re-save or re-download it"
            )
        return torch.frombuffer(bytearray(data), dtype=dtype).reshape(stop - start, per_row)


def _safetensors_index(path: Path, label: str) -> dict[str, tuple[Path, int, torch.dtype]]:
    """``{key: (path, absolute byte offset of its data, dtype)}`` from a safetensors header (8-byte
    little-endian header length, then JSON; data offsets are relative to the end of the header)."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else -1
        try:
            header = json.loads(fh.read(size)) if 0 < size < (1 << 30) else None
        except ValueError:
            header = None
    if not isinstance(header, dict):
        raise CheckpointError(f"checkpoint {label!r}: {path} has no readable safetensors header; re-save it")
    out = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if info.get("dtype") not in _SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"checkpoint {label!r}: tensor {key!r} in {path} has dtype {info.get('dtype')!r}, "
                f"which losslens cannot read (known: {sorted(_SAFETENSORS_DTYPES)})"
            )
        out[key] = (path, 8 + size + int(info["data_offsets"][0]), _SAFETENSORS_DTYPES[info["dtype"]])
    return out


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def checkpoint_source(
    ref: CheckpointRef, model: nn.Module, allow_pickle: bool = False, cache: Mapping[str, PointSource] | None = None
) -> PointSource:
    """A point source for ``ref`` under ``model``'s parameter names: lazy for safetensors, the
    weighted mean of its sources for a derived checkpoint (sources shared through ``cache``)."""
    cache = {} if cache is None else cache
    key = json.dumps(ref.to_dict(), sort_keys=True, default=str)  # labels repeat across runs; locations do not
    if key in cache:
        return cache[key]
    if ref.derived:
        if not ref.sources:
            raise CheckpointError(f"derived checkpoint {ref.label!r} has no sources")
        parts: Sequence[PointSource] = [checkpoint_source(s, model, allow_pickle, cache) for s in ref.sources]
        src: PointSource = MeanSource(parts, ref.label, ref.weights)
    else:
        src = CheckpointSource(ref, model, allow_pickle)
    if isinstance(cache, dict):
        cache[key] = src
    return src
