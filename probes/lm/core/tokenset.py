"""Token sets: fixed evaluation / calibration / curvature data, hashed and reusable (docs/science.md §1).

A :class:`TokenSet` holds token ids of shape ``[n_batches, batch, seq]``. It is built once per
study, saved beside the results, and identified by :attr:`TokenSet.content_hash` (SHA-256 of the
shape and the int64 ids), which every result row records so that numbers are only compared on the
same data. Building token sets from text sources lives in :mod:`losslens.lm.data`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from losslens.geometry.base.errors import LosslensError


class TokenSetError(LosslensError, ValueError):
    """A token set is malformed, too small for what was asked, or unreadable."""


@dataclass(frozen=True)
class TokenSet:
    """Token ids ``tokens`` [n_batches, batch, seq] (int64) with a name and free-form metadata."""

    tokens: torch.Tensor
    name: str = "tokens"
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        t = self.tokens
        if not isinstance(t, torch.Tensor) or t.ndim != 3:
            raise TokenSetError(
                f"token set {self.name!r}: tokens must be a [n_batches, batch, seq] tensor, got "
                f"{getattr(t, 'shape', type(t))}"
            )
        if t.dtype != torch.long:
            object.__setattr__(self, "tokens", t.long())
        if min(t.shape) == 0:
            raise TokenSetError(f"token set {self.name!r} is empty (shape {tuple(t.shape)})")

    @property
    def n_batches(self) -> int:
        return self.tokens.shape[0]

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[1]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[2]

    @property
    def n_targets(self) -> int:
        """Next-token targets in the whole set: n_batches * batch * (seq - 1)."""
        return self.n_batches * self.batch_size * (self.seq_len - 1)

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.tokens.unbind(0))

    def __getitem__(self, i) -> torch.Tensor:
        return self.tokens[i]

    @property
    def content_hash(self) -> str:
        """SHA-256 hex digest of the shape and the int64 token ids (stable across runs/machines), and of
        the document framing when the set records one (``meta["framing"]``, :mod:`losslens.lm.data.framing`;
        sets without it hash as before)."""
        h = hashlib.sha256()
        h.update(json.dumps(list(self.tokens.shape)).encode())
        framing = self.meta.get("framing") if isinstance(self.meta, dict) else None
        if framing:
            h.update(json.dumps(framing, sort_keys=True).encode())
        h.update(self.tokens.contiguous().cpu().numpy().astype("<i8").tobytes())
        return h.hexdigest()

    def subset(self, n_batches: int, name: str | None = None) -> "TokenSet":
        """The first ``n_batches`` batches (raises if the set has fewer)."""
        if n_batches > self.n_batches:
            raise TokenSetError(f"token set {self.name!r} has {self.n_batches} batches, {n_batches} were asked for")
        return TokenSet(self.tokens[:n_batches], name or self.name, dict(self.meta))

    def sequences(self) -> torch.Tensor:
        """All sequences as one [n_batches * batch, seq] tensor."""
        return self.tokens.reshape(-1, self.seq_len)

    def save(self, path: str | Path) -> Path:
        """Write ``path`` (.safetensors) holding the ids, the name, the metadata and the hash."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"name": self.name, "meta": json.dumps(self.meta), "content_hash": self.content_hash}
        save_file({"tokens": self.tokens.contiguous()}, str(path), metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "TokenSet":
        """Read a token set written by :meth:`save`; verifies the stored content hash."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise TokenSetError(f"no token set file at {path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                tokens = f.get_tensor("tokens")
                md = f.metadata() or {}
        except Exception as exc:  # safetensors raises its own error types
            raise TokenSetError(f"{path} is not a readable token-set file: {exc}") from exc
        ts = cls(tokens, md.get("name", path.stem), json.loads(md.get("meta", "{}")))
        if md.get("content_hash") and md["content_hash"] != ts.content_hash:
            raise TokenSetError(f"{path}: stored hash does not match the ids; the file is corrupt")
        return ts
