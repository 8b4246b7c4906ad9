"""The data of a tiny training run: the tokenizer and token streams of the embedded corpus (cached),
the validation set (:func:`prepare_data`), and the batch of each update (:func:`get_batch`, seeded by
the step only, so resuming and forking see the same data order). Used by
:func:`losslens.lm.train.tiny.train_tiny` and the schedule forks (:mod:`losslens.lm.train.forks`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from losslens.lm.core.tokenset import TokenSet
from losslens.lm.data import (
    HELDOUT_MODULUS,
    TextSource,
    embedded_documents,
    token_sets_from_stream,
    token_stream,
    tokenizer_fingerprint,
    tokenizer_name,
    train_bpe_tokenizer,
)

from losslens.lm.train.config import TrainConfig, TrainError
from losslens.lm.train.run_files import write_json

__all__ = ["prepare_data", "get_batch"]


def prepare_data(
    config: TrainConfig, out_dir: str | Path, data_dir: str | Path | None = None
) -> tuple[Any, torch.Tensor, TokenSet]:
    """(tokenizer, train stream [n_train] int64, validation TokenSet [val_batches, batch, seq]).

    Cached in ``data_dir`` (default ``out_dir/data/``; runs may share one): the trained tokenizer
    and both token streams, reused when the Python build (whose stdlib *is* the corpus), vocab size,
    corpus options and tokenizers version match; ``data.json`` records the corpus SHA-256. The
    validation set is written to ``out_dir/validation.safetensors``. Cost the first time: ~3 s
    corpus + ~2 s BPE training + ~2 s tokenization (2 cores, unloaded); cached: < 1 s.
    """
    import sys
    import sysconfig

    import tokenizers
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    out = Path(out_dir)
    cache = Path(data_dir) if data_dir is not None else out / "data"
    key = {
        "format": 1,
        "python": sys.version,
        "stdlib": sysconfig.get_paths()["stdlib"],
        "vocab_size": config.vocab_size,
        "docstrings": config.docstrings,
        "heldout_modulus": HELDOUT_MODULUS,
        "tokenizers": tokenizers.__version__,
    }
    info_path = cache / "data.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    if info.get("key") == key and (cache / "streams.safetensors").is_file():
        tok = AutoTokenizer.from_pretrained(str(cache / "tokenizer"))
        streams = load_file(str(cache / "streams.safetensors"))
        train, heldout = streams["train"], streams["heldout"]
    else:
        train_docs = embedded_documents(config.docstrings, "train")
        h = hashlib.sha256()
        for name, text in train_docs:
            h.update(name.encode() + b"\0" + text.encode() + b"\0")
        train_bpe_tokenizer(
            [t for _, t in train_docs], config.vocab_size, cache / "tokenizer", name=f"losslens-bpe-{config.vocab_size}"
        )
        tok = AutoTokenizer.from_pretrained(str(cache / "tokenizer"))  # exactly what checkpoints will load
        train = token_stream(tok, TextSource.embedded("train", config.docstrings))
        heldout = token_stream(tok, TextSource.embedded("heldout", config.docstrings))
        save_file({"train": train.contiguous(), "heldout": heldout.contiguous()}, str(cache / "streams.safetensors"))
        info = {
            "key": key,
            "train_corpus_sha256": h.hexdigest(),
            "train_tokens": len(train),
            "heldout_tokens": len(heldout),
        }
        write_json(info_path, info)
    if len(train) < config.seq_len + 1:
        raise TrainError(f"the training stream has {len(train)} tokens, fewer than one sequence of {config.seq_len}")
    shapes = {"validation": (config.val_batches, config.batch_size, config.seq_len)}
    meta = {
        "source": "embedded[heldout]",
        "split": "heldout",
        "tokenizer": tokenizer_name(tok),
        "tokenizer_fingerprint": tokenizer_fingerprint(tok),
    }
    val = token_sets_from_stream(
        heldout, shapes, _data_seed(config), meta, source_name="the held-out stream of the embedded corpus"
    )["validation"]
    val.save(out / "validation.safetensors")
    return tok, train, val


def _data_seed(config: TrainConfig) -> int:
    return config.seed if config.data_seed is None else config.data_seed


def get_batch(stream: torch.Tensor, step: int, config: TrainConfig) -> torch.Tensor:
    """Batch of update ``step``: [batch_size, seq_len] random windows of ``stream``, seeded by
    (data_seed, step) only -- identical whether the run was resumed or not."""
    g = torch.Generator().manual_seed(_data_seed(config) * 1_000_003 + step)
    starts = torch.randint(0, len(stream) - config.seq_len + 1, (config.batch_size,), generator=g)
    return stream[starts[:, None] + torch.arange(config.seq_len)[None, :]]
