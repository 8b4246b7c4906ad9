"""Token streams and the evaluation / calibration / curvature token sets (docs/science.md §1).

:func:`build_token_sets` tokenizes a source into one stream (documents separated by the
tokenizer's EOS token when it has one) and cuts **non-overlapping** windows out of it, assigned to
the requested sets by a seeded permutation, so sets built together never share a token position.
:func:`default_token_sets` draws its evaluation, calibration and curvature sets from the held-out
part of the embedded corpus, so the embedded trajectory is never evaluated on its training text.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from losslens.lm.checkpoints import CheckpointError, CheckpointRef, Trajectory, read_config
from losslens.lm.core.tokenset import TokenSet, TokenSetError

from losslens.lm.data.corpus import DataError, TextSource
from losslens.lm.data.framing import Framing, document_framing, framed_rows
from losslens.lm.data.tokenizers import encode_documents, eos_id, load_tokenizer, tokenizer_fingerprint, tokenizer_name

__all__ = [
    "token_stream",
    "plan_windows",
    "build_token_sets",
    "token_sets_from_stream",
    "default_token_sets",
    "DEFAULT_SHAPES",
    "QUICK_SHAPES",
]

DEFAULT_SHAPES: dict[str, tuple[int, int, int]] = {
    "eval": (16, 8, 128),  # 16,384 tokens
    "calibration": (8, 8, 128),  # 8,192 tokens
    "curvature": (4, 8, 128),  # 4,096 tokens
}
QUICK_SHAPES: dict[str, tuple[int, int, int]] = {
    "eval": (4, 4, 64),
    "calibration": (2, 4, 64),
    "curvature": (2, 4, 64),
}


# --------------------------------------------------------------------------------------------
# token streams and token sets
# --------------------------------------------------------------------------------------------

_STREAM_CACHE: dict[tuple, torch.Tensor] = {}


def token_stream(tokenizer: Any, source: "TextSource | str | Path", framing: Framing | None = None) -> torch.Tensor:
    """All documents of ``source`` tokenized and concatenated into one int64 tensor [n_tokens].

    Documents are encoded without special tokens; with a ``framing`` that adds tokens
    (:func:`~losslens.lm.data.framing.document_framing`) each is framed as the tokenizer frames it
    (``prefix + ids + suffix``), otherwise each is followed by the tokenizer's EOS id when it has one.
    Streams of the embedded corpus are cached per process (keyed by the tokenizer
    fingerprint). Cost: ~1 s per MB of text with a fast tokenizer.
    """
    source = _as_source(source)
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) or tokenizer is None else tokenizer
    framing = framing if framing is not None and framing.name != "none" else None
    key = (tokenizer_fingerprint(tok), source, framing) if source.kind in ("embedded", "text") else None
    if key is not None and key in _STREAM_CACHE:
        return _STREAM_CACHE[key]
    docs = source.documents()
    if not docs:
        raise DataError(f"text source {source.describe()} has no documents")
    ids = encode_documents(tok, [t for _, t in docs])
    eos = eos_id(tok)
    if framing is not None:
        parts = [np.asarray(framing.frame(d), dtype=np.int64) for d in ids]
    else:
        parts = [np.asarray(d + ([eos] if eos is not None else []), dtype=np.int64) for d in ids]
    stream = torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
    if key is not None:
        if len(_STREAM_CACHE) > 8:
            _STREAM_CACHE.clear()
        _STREAM_CACHE[key] = stream
    return stream


def _as_source(obj: "TextSource | str | Path") -> TextSource:
    if isinstance(obj, TextSource):
        return obj
    if isinstance(obj, Path):
        return TextSource.from_path(obj)
    if isinstance(obj, str):
        return TextSource.from_text(obj)
    raise DataError(f"a text source must be a TextSource, a Path or a str of text; got {type(obj).__name__}")


def _check_shapes(shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, int, int]]:
    out = {}
    if not shapes:
        raise TokenSetError("no token sets requested (shapes is empty)")
    for name, shape in shapes.items():
        shape = tuple(int(x) for x in shape)
        if len(shape) != 3 or min(shape) < 1:
            raise TokenSetError(
                f"token set {name!r}: shape must be (n_batches, batch, seq) of positive ints, got {shape}"
            )
        if shape[2] < 2:
            raise TokenSetError(f"token set {name!r}: seq must be >= 2 to have a next-token target")
        out[name] = shape
    return out


def plan_windows(
    n_tokens: int, shapes: Mapping[str, Sequence[int]], seed: int = 0, source_name: str = "the token stream"
) -> dict[str, np.ndarray]:
    """Start offsets of the non-overlapping windows of each set: ``{name: int64 array [nb*b]}``.

    The stream is cut into units of ``U = max(seq)`` tokens; a seeded permutation (numpy PCG64)
    orders the units; each set in turn (in ``shapes`` order) takes the next units it needs and cuts
    ``U // seq`` windows of its own ``seq`` out of each. Windows of different sets therefore never
    overlap, and every set samples the whole stream. Raises :class:`TokenSetError` naming the set
    that does not fit, with the tokens needed and available.
    """
    shapes = _check_shapes(shapes)
    unit = max(s for _, _, s in shapes.values())
    n_units = n_tokens // unit
    order = np.random.Generator(np.random.PCG64(seed)).permutation(n_units)
    out, used, done = {}, 0, []
    for name, (nb, b, s) in shapes.items():
        per_unit = unit // s
        need_windows = nb * b
        need_units = -(-need_windows // per_unit)
        if b * s > n_tokens:
            raise TokenSetError(
                f"token set {name!r} ({nb}x{b}x{s}): {source_name} has {n_tokens} tokens, shorter than one batch of "
                f"{b * s} tokens; use a longer text source or a smaller batch/seq"
            )
        if used + need_units > n_units:
            left = (n_units - used) * unit
            after = f" after the sets {', '.join(done)}" if done else ""
            raise TokenSetError(
                f"token set {name!r} ({nb}x{b}x{s}) needs {need_windows * s} tokens ({need_units * unit} in "
                f"{unit}-token units), but only {left} of the {n_tokens} tokens of {source_name} remain{after}; "
                "use a longer text source or fewer/smaller batches"
            )
        units = order[used : used + need_units]
        used += need_units
        starts = (units[:, None] * unit + np.arange(per_unit)[None, :] * s).reshape(-1)[:need_windows]
        out[name] = starts.astype(np.int64)
        done.append(name)
    return out


def build_token_sets(
    tokenizer: Any,
    text_or_source: "TextSource | str | Path",
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    frame: bool = True,
) -> dict[str, TokenSet]:
    """Disjoint token sets ``{name: TokenSet[n_batches, batch, seq]}`` from one text source.

    ``tokenizer``: a tokenizer object, a folder/checkpoint holding one, or "bytes".
    ``text_or_source``: a :class:`TextSource`, a ``Path`` (file or folder), or a ``str`` of text.
    ``shapes``: ``{name: (n_batches, batch, seq)}``, default :data:`DEFAULT_SHAPES`.
    Windows are non-overlapping slices of one token stream (:func:`plan_windows`). Each set's
    ``meta`` records the source, its document split, the tokenizer name and fingerprint, all shapes,
    the seed, the stream length and hash, and the window start offsets. Deterministic for
    (tokenizer, source, shapes, seed). Raises :class:`TokenSetError` when the stream is too short.
    ``frame``: documents and rows framed as the tokenizer frames a document (BOS / EOS as its
    config says: :mod:`losslens.lm.data.framing`; recorded in ``meta["framing"]`` and the content
    hash); False builds unframed sets from a framing tokenizer on purpose (recorded as well).
    """
    shapes = _check_shapes(shapes or DEFAULT_SHAPES)
    source = _as_source(text_or_source)
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) or tokenizer is None else tokenizer
    framing = document_framing(tok)
    meta = {
        "source": source.describe(),
        "split": source.split,
        "tokenizer": tokenizer_name(tok),
        "tokenizer_fingerprint": tokenizer_fingerprint(tok),
    }
    if framing.name != "none" and not frame:
        meta["framing"] = dict(Framing().as_meta(), declined=framing.name)
        framing = Framing()
    stream = token_stream(tok, source, framing)
    return token_sets_from_stream(
        stream, shapes, seed, meta, source_name=f"the token stream of {source.describe()}", framing=framing
    )


def token_sets_from_stream(
    stream: torch.Tensor,
    shapes: Mapping[str, Sequence[int]],
    seed: int = 0,
    meta: dict | None = None,
    source_name: str = "the token stream",
    framing: Framing | None = None,
) -> dict[str, TokenSet]:
    """Disjoint token sets cut from an already tokenized ``stream`` [n_tokens] (see
    :func:`plan_windows`); ``meta`` is copied into every set's metadata together with the shapes,
    seed, stream length / hash and window start offsets. With a ``framing`` that adds tokens every
    row starts with its prefix (:func:`~losslens.lm.data.framing.framed_rows`) and ``meta["framing"]``
    records it."""
    shapes = _check_shapes(shapes)
    stream = torch.as_tensor(stream, dtype=torch.long).reshape(-1)
    plan = plan_windows(len(stream), shapes, seed, source_name=source_name)
    common = dict(meta or {})
    common.update(
        {
            "shapes": {k: list(v) for k, v in shapes.items()},
            "seed": int(seed),
            "stream_tokens": int(len(stream)),
            "stream_hash": hashlib.sha256(stream.numpy().astype("<i8").tobytes()).hexdigest(),
        }
    )
    framing = framing or Framing()
    if framing.name != "none":
        common["framing"] = framing.as_meta()
    out = {}
    for name, (nb, b, s) in shapes.items():
        tokens = framed_rows(stream, plan[name], s, framing).reshape(nb, b, s)
        out[name] = TokenSet(tokens, name, dict(common, set=name, shape=[nb, b, s], window_starts=plan[name].tolist()))
    return out


def default_token_sets(
    tokenizer_or_checkpoint: Any = "bytes",
    quick: bool = False,
    source: "TextSource | str | Path | None" = None,
    seed: int = 0,
    seq_len: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    frame: bool = True,
) -> dict[str, TokenSet]:
    """The standard ``"eval"``, ``"calibration"`` and ``"curvature"`` sets for a model.

    ``tokenizer_or_checkpoint``: a tokenizer, "bytes", a checkpoint / trajectory folder, a
    :class:`~losslens.lm.checkpoints.CheckpointRef` or :class:`~losslens.lm.checkpoints.Trajectory` (its own
    tokenizer; its ``max_position_embeddings`` caps the default sequence length).
    Source: the **held-out** part of the embedded corpus unless ``source`` is given (a
    :class:`TextSource`, a ``Path``, or a spec string for :meth:`TextSource.parse`:
    ``embedded[:train|:heldout]``, ``dataset:NAME[:CONFIG][@SPLIT]`` or a path -- unlike
    :func:`build_token_sets`, where a ``str`` is raw text).
    Shapes: :data:`DEFAULT_SHAPES` (16/8/4 batches of 8x128) or, with ``quick``, :data:`QUICK_SHAPES`;
    ``seq_len`` overrides the sequence length and must not exceed the model's context (raises
    :class:`TokenSetError` if it does). ``frame``: as in :func:`build_token_sets` (rows framed as
    the model's tokenizer frames a document, BOS first where it adds one).
    """
    tok = load_tokenizer(tokenizer_or_checkpoint)
    context = _context_length(tokenizer_or_checkpoint)
    base = dict(shapes or (QUICK_SHAPES if quick else DEFAULT_SHAPES))
    if seq_len is not None:
        if context is not None and seq_len > context:
            raise TokenSetError(
                f"seq_len {seq_len} exceeds the model's context of {context} tokens "
                f"(max_position_embeddings); use seq_len <= {context}"
            )
        base = {k: (nb, b, seq_len) for k, (nb, b, _s) in base.items()}
    elif context is not None:
        over = {k: v for k, v in base.items() if v[2] > context}
        if shapes is not None and over:
            raise TokenSetError(f"token sets {sorted(over)} have seq > the model's context of {context} tokens")
        base = {k: (nb, b, min(s, context)) for k, (nb, b, s) in base.items()}
    src = (
        TextSource.embedded(split="heldout")
        if source is None
        else _as_source(TextSource.parse(source) if isinstance(source, str) else source)
    )
    return build_token_sets(tok, src, base, seed=seed, frame=frame)


def _context_length(obj: Any) -> int | None:
    """``max_position_embeddings`` of the checkpoint behind ``obj`` (None for bare tokenizers)."""
    try:
        if isinstance(obj, (str, Path)):
            p = Path(obj)
            if str(obj) == "bytes" or not p.exists():
                return None
            obj = p if (p / "config.json").is_file() else Trajectory.from_folder(p)
        if isinstance(obj, Trajectory):
            obj = obj.real[0] if obj.real else obj[0]
        if isinstance(obj, (CheckpointRef, Path)):
            cfg = read_config(obj)
            return cfg.get("max_position_embeddings") or cfg.get("n_positions")
    except CheckpointError:
        return None
    return None
