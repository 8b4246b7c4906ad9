"""Checkpoint references: where one checkpoint's weights are, and what is known about it.

A :class:`CheckpointRef` holds a label, the training step, tokens seen and learning rate when
known, and where the weights are (``kind``: ``hf_dir``, ``safetensors``, ``torch_file``, ``hub``
or ``derived``); it never holds loaded weights. :func:`parse_step` reads the step from a checkpoint
name (``step-1000``, ``checkpoint-1000``, ``iter_0001000``, ``stage1-step1000-tokens4B`` ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from losslens.geometry.base.jsonable import jsonable

__all__ = ["CheckpointRef", "name_tokens", "parse_step"]


@dataclass(frozen=True)
class CheckpointRef:
    """A reference to one checkpoint (no weights are loaded).

    ``kind``: "hf_dir" (folder with config.json + weights), "safetensors" (a single weight file;
    config.json next to it), "torch_file" (a single .bin/.pt file; config.json next to it), "hub"
    (``location`` = repo id, ``revision``), "derived" (weighted mean of ``meta["sources"]``).
    ``tokens``: training tokens seen at this checkpoint (None when unknown). ``lr``: learning rate of
    the last optimizer update before this checkpoint (None when unknown). ``meta`` holds anything
    else read alongside (train/val loss, hub cache_dir, ...) and is excluded from equality/hash.
    """

    label: str
    step: int | None = None
    tokens: int | None = None
    lr: float | None = None
    location: str | None = None
    kind: str = "hf_dir"
    revision: str | None = None
    derived_from: tuple[str, ...] = ()
    weights: tuple[float, ...] | None = None
    meta: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def derived(self) -> bool:
        return self.kind == "derived"

    @property
    def sources(self) -> tuple["CheckpointRef", ...]:
        """The source checkpoints of a derived checkpoint (empty for real ones)."""
        return tuple(self.meta.get("sources", ()))

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        step: int | None = None,
        tokens: int | None = None,
        lr: float | None = None,
        label: str | None = None,
        **meta: Any,
    ) -> "CheckpointRef":
        """A ref for a checkpoint folder or a single weight file; ``step`` parsed from the name if not given."""
        p = Path(path).expanduser()
        name = p.name if p.is_dir() or not p.suffix else p.stem
        if step is None:
            step = parse_step(name)
        if tokens is None and "tokens_from_name" not in meta:
            tk = _parse_tokens(name)
            if tk is not None:
                meta["tokens_from_name"] = tk
        if p.suffix in (".safetensors",):
            kind = "safetensors"
        elif p.suffix in (".bin", ".pt", ".pth"):
            kind = "torch_file"
        else:
            kind = "hf_dir"
        return cls(label or name, step, tokens, lr, str(p.resolve()) if p.exists() else str(p), kind, meta=meta)

    @classmethod
    def from_hub(
        cls,
        repo_id: str,
        revision: str,
        cache_dir: str | Path | None = None,
        local_files_only: bool | None = None,
        label: str | None = None,
        step: int | None = None,
        tokens: int | None = None,
        lr: float | None = None,
    ) -> "CheckpointRef":
        meta: dict[str, Any] = {
            "cache_dir": str(cache_dir) if cache_dir else None,
            "local_files_only": local_files_only,
        }
        tk = _parse_tokens(revision)
        if tk is not None:
            meta["tokens_from_name"] = tk
        return cls(
            label or revision,
            parse_step(revision) if step is None else step,
            tokens,
            lr,
            repo_id,
            "hub",
            revision,
            meta=meta,
        )

    def replace(self, **changes: Any) -> "CheckpointRef":
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(changes)
        return CheckpointRef(**d)

    def to_dict(self) -> dict:
        """JSON-able dict (derived sources serialised recursively)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "meta"}
        d["derived_from"] = list(self.derived_from)
        d["weights"] = list(self.weights) if self.weights is not None else None
        meta = {k: v for k, v in self.meta.items() if k != "sources"}
        if self.sources:
            meta["sources"] = [s.to_dict() for s in self.sources]
        d["meta"] = jsonable(meta, repr)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CheckpointRef":
        d = dict(d)
        meta = dict(d.pop("meta", {}) or {})
        if "sources" in meta:
            meta["sources"] = tuple(cls.from_dict(s) for s in meta["sources"])
        d["derived_from"] = tuple(d.get("derived_from") or ())
        d["weights"] = tuple(d["weights"]) if d.get("weights") is not None else None
        return cls(**d, meta=meta)


_STEP_RE = re.compile(
    r"(?:^|[-_.])(?:global[-_]?step|step|checkpoint|ckpt|iter(?:ation)?)[-_]?(\d+)(?=$|[-_.])", re.IGNORECASE
)
_TOKENS_RE = re.compile(r"tokens[-_]?(\d+(?:\.\d+)?)([KMBT]?)(?=$|[-_.])", re.IGNORECASE)


def parse_step(name: str) -> int | None:
    """Training step from a checkpoint name: ``step-1000``, ``step1000``, ``step_1000``,
    ``checkpoint-1000``, ``iter_0001000``, ``global_step1000``, ``stage1-step1000-tokens4B`` -> 1000."""
    m = _STEP_RE.search(name)
    return int(m.group(1)) if m else None


def _parse_tokens(name: str) -> int | None:
    m = _TOKENS_RE.search(name)
    if not m:
        return None
    mult = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}[m.group(2).upper()]
    return int(round(float(m.group(1)) * mult))


def name_tokens(refs: list[CheckpointRef]) -> list[CheckpointRef]:
    """Tokens read from checkpoint names (``stage1-step1000-tokens4B``) where nothing better is known;
    marked ``meta["tokens_source"] = "name"`` (rounded; a schedule's tokens per step replace them)."""
    return [
        r
        if r.tokens is not None or "tokens_from_name" not in r.meta
        else r.replace(tokens=r.meta["tokens_from_name"], meta={**r.meta, "tokens_source": "name"})
        for r in refs
    ]
