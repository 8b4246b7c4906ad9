"""Documents framed as the model's own tokenizer frames them (issue #47, item 5).

A tokenizer that adds special tokens to a document (``tokenizer("text")`` against
``tokenizer("text", add_special_tokens=False)``: Llama 3's and Gemma's BOS, some BOS and EOS) was
trained on documents so framed; a window of text without its BOS is off the model's input
distribution (measured on a Gemma-family checkpoint: FP loss 7.04 nats without BOS, 4.20 with, and a
4-bit format then "improving" it by 5%). So token sets follow the tokenizer:

- :func:`document_framing` reads the framing off the tokenizer: the ids it puts before a document
  (``prefix``) and after it (``suffix``), named ``"none"``, ``"bos"``, ``"bos+eos"``, ``"eos"`` (other
  special tokens by their text);
- the token stream is the documents framed so (``prefix + ids + suffix``, one after the other; with
  framing ``"none"`` documents are separated by EOS as before, so old sets keep their hashes);
- every row starts with the prefix (:func:`framed_rows`): a window cut inside a document gets the
  prefix in front of its first ``seq − len(prefix)`` tokens, a window that starts at a framed
  document already has it. Rows therefore stay inside their own window (sets stay disjoint).

The framing is recorded in every set's ``meta["framing"]`` and in its content hash. A model whose
loss changes by more than :data:`FRAMING_NOTE_RTOL` (5% relative) between its framed rows and the same
rows without the prefix gets a :class:`FramingWarning` (:func:`framing_effect`), never a silent default.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from losslens.geometry.base.errors import LosslensWarning

__all__ = ["Framing", "FramingWarning", "FRAMING_NOTE_RTOL", "document_framing", "framed_rows", "framing_effect"]

#: The relative change of the loss between framed and unframed rows above which a note is given.
FRAMING_NOTE_RTOL = 0.05
_PROBE = "The quick brown fox jumps over the lazy dog."


class FramingWarning(LosslensWarning):
    """The model's loss depends on the document framing by more than :data:`FRAMING_NOTE_RTOL`."""


@dataclass(frozen=True)
class Framing:
    """The special-token ids a tokenizer puts before (``prefix``) and after (``suffix``) a document."""

    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    name: str = "none"

    def as_meta(self) -> dict:
        return {"name": self.name, "prefix": list(self.prefix), "suffix": list(self.suffix)}

    def frame(self, ids: list[int]) -> list[int]:
        return [*self.prefix, *ids, *self.suffix]


def _encode(tokenizer: Any, text: str, special: bool) -> list[int] | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if callable(tokenizer) and hasattr(tokenizer, "all_special_ids"):  # an HF tokenizer: its own call
        return list(tokenizer(text, add_special_tokens=special)["input_ids"])
    if backend is None and hasattr(tokenizer, "encode_batch"):
        backend = tokenizer  # a raw ``tokenizers.Tokenizer``: its post-processor
    if backend is not None:
        return list(backend.encode(text, add_special_tokens=special).ids)
    return None


def _token_name(tokenizer: Any, i: int) -> str:
    for role in ("bos", "eos"):
        if getattr(tokenizer, f"{role}_token_id", None) == i:
            return role
    convert = getattr(tokenizer, "convert_ids_to_tokens", None) or getattr(tokenizer, "id_to_token", None)
    return str(convert(i)) if convert is not None else str(i)


def document_framing(tokenizer: Any) -> Framing:
    """The framing ``tokenizer`` gives a document: the ids ``tokenizer(text)`` adds in front of and
    behind ``tokenizer(text, add_special_tokens=False)`` (read once on a probe sentence). ``"none"``
    for tokenizers that add nothing (the raw-bytes tokenizer, the demo's byte-level BPE)."""
    full, bare = _encode(tokenizer, _PROBE, True), _encode(tokenizer, _PROBE, False)
    if full is None or bare is None or full == bare or not bare:
        return Framing()
    for k in range(len(full) - len(bare) + 1):
        if full[k : k + len(bare)] == bare:
            prefix, suffix = tuple(full[:k]), tuple(full[k + len(bare) :])
            parts = [_token_name(tokenizer, i) for i in (*prefix, *suffix)]
            return Framing(prefix, suffix, "+".join(parts) or "none")
    return Framing()


def framed_rows(stream: torch.Tensor, starts: np.ndarray, seq: int, framing: Framing) -> torch.Tensor:
    """Rows ``[len(starts), seq]`` from ``stream`` [n]: the window at each start, beginning with
    ``framing.prefix`` (prefix + the first ``seq − len(prefix)`` tokens, or the window itself where
    it already begins with the prefix). Each row uses only tokens of ``stream[start : start + seq]``."""
    starts_t = torch.from_numpy(np.asarray(starts, dtype=np.int64))
    windows = stream[starts_t[:, None] + torch.arange(seq)[None, :]]
    p = len(framing.prefix)
    if p == 0:
        return windows
    prefix = torch.tensor(framing.prefix, dtype=windows.dtype)
    shifted = torch.cat([prefix.expand(len(windows), p), windows[:, : seq - p]], dim=1)
    already = (windows[:, :p] == prefix).all(dim=1, keepdim=True)
    return torch.where(already, windows, shifted)


def framing_effect(
    model: torch.nn.Module, token_set: Any, max_rows: int = 8, rtol: float = FRAMING_NOTE_RTOL, warn: bool = True
) -> dict | None:
    """The loss of ``model`` on the framed rows among the first ``max_rows`` of ``token_set`` against the
    same rows without their framing prefix (``rows[:, len(prefix):]``), over the same text targets.
    Returns ``{"framing", "framed", "unframed", "rel_change"}`` (nats; ``rel_change`` = (unframed −
    framed) / framed) or None when the set is not framed; warns :class:`FramingWarning` when
    ``|rel_change| > rtol``. Cost: two forward passes of at most ``max_rows`` rows."""
    meta = (getattr(token_set, "meta", None) or {}).get("framing") or {}
    p = len(meta.get("prefix") or ())
    if p == 0:
        return None
    rows = token_set.sequences()[:max_rows]
    framed = rows[(rows[:, :p] == torch.tensor(meta["prefix"])).all(dim=1)]
    if len(framed) == 0:
        return None
    with_prefix = _mean_loss_on_text(model, framed, p, keep_prefix=True)
    without = _mean_loss_on_text(model, framed, p, keep_prefix=False)
    rel = (without - with_prefix) / max(abs(with_prefix), 1e-12)
    out = {"framing": meta.get("name"), "framed": with_prefix, "unframed": without, "rel_change": rel}
    if warn and abs(rel) > rtol:
        warnings.warn(
            f"this model's loss depends on the document framing: {with_prefix:.4g} nats with its tokenizer's "
            f"{meta.get('name')!r} prefix, {without:.4g} without it ({100 * rel:+.1f}%, over the {100 * rtol:.0f}% "
            "note threshold). The token sets are framed as the tokenizer frames a document (recorded in their "
            "meta['framing'] and hash); losses of sets built without it are off this model's input distribution",
            FramingWarning,
            stacklevel=2,
        )
    return out


def _mean_loss_on_text(model: torch.nn.Module, rows: torch.Tensor, p: int, keep_prefix: bool) -> float:
    """Mean loss over the targets ``rows[:, p + 1:]`` (the text after its first token), with or without
    the prefix in the context: the same targets either way."""
    from losslens.lm.core.next_token_loss import _logits

    inputs = rows if keep_prefix else rows[:, p:]
    skip = p if keep_prefix else 0
    with torch.no_grad():
        logits = _logits(model, inputs.to(next(model.parameters()).device)).float()
        targets = inputs[:, 1:].to(logits.device)
        nll = torch.nn.functional.cross_entropy(
            logits[:, skip:-1].reshape(-1, logits.shape[-1]), targets[:, skip:].reshape(-1)
        )
    return float(nll)
