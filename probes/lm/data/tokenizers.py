"""Tokenizers (docs/science.md §1): a checkpoint's own, a byte-level BPE trained here, or raw bytes.

- a checkpoint's own: ``transformers.AutoTokenizer.from_pretrained(folder)`` (:func:`load_tokenizer`
  also takes a :class:`~losslens.lm.checkpoints.CheckpointRef`, a ``Trajectory`` or a trajectory folder);
- :func:`train_bpe_tokenizer`: a byte-level BPE saved as a ``PreTrainedTokenizerFast`` so that
  ``AutoTokenizer`` loads it from a checkpoint folder;
- :class:`ByteTokenizer`: raw UTF-8 bytes (no training, no files).

:func:`tokenizer_fingerprint` hashes a tokenizer's full definition (recorded with every token set).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from losslens.lm.checkpoints import CheckpointRef, Trajectory, tokenizer_folder
from losslens.lm.checkpoints.files import has_tokenizer_files

from losslens.lm.data.corpus import DataError, TextSource

__all__ = [
    "ByteTokenizer",
    "train_bpe_tokenizer",
    "load_tokenizer",
    "checkpoint_tokenizer",
    "tokenizer_name",
    "tokenizer_fingerprint",
]


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255, plus EOS = 256 (``vocab_size`` 257). No training, no files."""

    name_or_path = "bytes"
    eos_token_id = 256
    vocab_size = 257

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, **_: Any) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int], **_: Any) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


def train_bpe_tokenizer(
    text: "str | Sequence[str] | TextSource",
    vocab_size: int = 1024,
    out_dir: str | Path | None = None,
    min_frequency: int = 2,
    name: str | None = None,
    model_max_length: int = 1_000_000,
):
    """Train a byte-level BPE (``tokenizers``) with ``vocab_size`` entries including the special
    token ``<|endoftext|>`` (used as BOS/EOS/UNK, like GPT-NeoX), wrapped as a
    ``transformers.PreTrainedTokenizerFast``. Saved with ``save_pretrained(out_dir)`` when
    ``out_dir`` is given, so ``AutoTokenizer.from_pretrained(out_dir)`` reloads it. Deterministic for
    the same text. Cost: ~1-3 s for the embedded corpus.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 257:
        raise DataError(f"a byte-level BPE needs vocab_size >= 257 (256 bytes + <|endoftext|>), got {vocab_size}")
    if isinstance(text, TextSource):
        docs = [t for _, t in text.documents()]
    elif isinstance(text, str):
        docs = [text]
    else:
        docs = list(text)
    if not any(d.strip() for d in docs):
        raise DataError("cannot train a tokenizer on empty text")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=False,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=model_max_length,
    )
    fast.name_or_path = name or f"bpe-{vocab_size}"
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        fast.save_pretrained(str(out))
    return fast


def tokenizer_name(tokenizer: Any) -> str:
    """A human-readable tokenizer name (``name_or_path`` for HF tokenizers, "bytes", ...)."""
    name = getattr(tokenizer, "name_or_path", None)
    return str(name) if name else type(tokenizer).__name__


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 (first 16 hex digits) of the tokenizer's full definition (vocab, merges, normaliser)."""
    if isinstance(tokenizer, ByteTokenizer):
        payload = "bytes"
    elif hasattr(tokenizer, "backend_tokenizer"):
        payload = tokenizer.backend_tokenizer.to_str()
    elif hasattr(tokenizer, "to_str"):
        payload = tokenizer.to_str()
    elif hasattr(tokenizer, "get_vocab"):
        payload = json.dumps(sorted(tokenizer.get_vocab().items()))
    else:
        payload = repr(tokenizer)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def eos_id(tokenizer: Any) -> int | None:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None and hasattr(tokenizer, "token_to_id"):
        eos = tokenizer.token_to_id("<|endoftext|>")
    return eos


def encode_documents(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if isinstance(tokenizer, ByteTokenizer):
        return [tokenizer.encode(t) for t in texts]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "encode_batch"):
        backend = tokenizer  # a raw ``tokenizers.Tokenizer``
    if backend is not None:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    if callable(tokenizer):  # slow HF tokenizer
        return list(tokenizer(texts, add_special_tokens=False)["input_ids"])
    raise DataError(
        f"don't know how to tokenize with {type(tokenizer).__name__}; pass a transformers/tokenizers "
        "tokenizer, a folder holding one, or 'bytes'"
    )


def load_tokenizer(path_or_ref: Any = "bytes"):
    """A tokenizer from a folder, a checkpoint, a trajectory, or the literal ``"bytes"``.

    - ``"bytes"`` / ``None`` -> :class:`ByteTokenizer`;
    - a tokenizer object -> itself;
    - a :class:`losslens.lm.checkpoints.CheckpointRef` or ``Trajectory`` -> the checkpoint's own tokenizer;
    - a folder -> ``AutoTokenizer.from_pretrained(folder)``; for a trajectory folder written by
      ``losslens train-tiny`` its ``tokenizer/`` subfolder or first checkpoint.

    Raises :class:`DataError` naming the folder when no tokenizer is there.
    """
    if path_or_ref is None or (isinstance(path_or_ref, str) and path_or_ref == "bytes"):
        return ByteTokenizer()
    if not isinstance(path_or_ref, (str, Path)):
        if isinstance(path_or_ref, (CheckpointRef, Trajectory)):
            folder = tokenizer_folder(path_or_ref)
            if folder is None:
                raise DataError(
                    f"{path_or_ref!r} has no tokenizer files; pass a tokenizer or 'bytes'"
                    + _unresolved_hub(path_or_ref)
                )
            return load_tokenizer(folder)
        return path_or_ref  # assume it already is a tokenizer
    folder = Path(path_or_ref).expanduser()
    if not folder.exists():
        raise DataError(f"no tokenizer at {folder}: the path does not exist")
    if folder.is_file():
        folder = folder.parent
    if (folder / "trajectory.json").is_file() or not has_tokenizer_files(folder):
        found = tokenizer_folder(folder)
        if found is None:
            raise DataError(
                f"no tokenizer in {folder}: expected tokenizer.json / tokenizer_config.json (as written by "
                "tokenizer.save_pretrained); pass 'bytes' or train one with train_bpe_tokenizer"
            )
        folder = Path(found)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # transformers raises OSError/ValueError/...
        raise DataError(f"could not load the tokenizer in {folder}: {exc}") from exc


def _unresolved_hub(obj: "CheckpointRef | Trajectory") -> str:
    """Why a hub checkpoint could not give its tokenizer (a revision missing from the cache), or ''."""
    from losslens.lm.checkpoints import CheckpointError, local_folder

    for ref in [obj] if isinstance(obj, CheckpointRef) else list(obj):
        if ref.kind == "hub":
            try:
                local_folder(ref)
            except CheckpointError as exc:
                return f" ({exc})"
    return ""


def checkpoint_tokenizer(obj: Any):
    """The tokenizer saved with a checkpoint, trajectory or folder (``AutoTokenizer`` from
    :func:`~losslens.lm.checkpoints.tokenizer_folder`), or None when it has no tokenizer files."""
    folder = tokenizer_folder(obj)
    if folder is None:
        return None
    return load_tokenizer(folder)
