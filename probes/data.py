"""Text sources, tokenizers and the evaluation / calibration / curvature token sets (SCIENCE.md §1).

Sources (:class:`TextSource`) are lists of named documents:

- ``TextSource.embedded()`` -- the **embedded corpus**: real English text that ships with every
  CPython, so nothing is downloaded: the 79-ish help topics of :mod:`pydoc_data.topics` (sorted by
  topic name) followed by the docstrings (>= 80 characters) of the pure-Python standard library,
  read with :mod:`ast` (no import), in sorted file order. About 1.8M characters (~600k tokens with a
  1024-entry BPE) on CPython 3.11. Parsing the stdlib costs ~3 s, so the docstrings are cached on
  disk per Python build (``$LOSSLENS_CACHE_DIR``, default ``~/.cache/losslens``; ``off`` disables)
  and in memory per process.
- ``TextSource.from_path(p)`` -- a text file, or a folder of ``.txt/.md/.rst`` files (sorted).
- ``TextSource.from_dataset(name, ...)`` -- a Hugging Face ``datasets`` dataset that is already
  in the local cache (``datasets`` is imported lazily and is optional).
- ``TextSource.from_text(text)`` -- a string.

**Train / held-out split.** Every document is assigned to the *held-out* part when the SHA-256 of
its name is 0 mod 10 (so about 10% of documents, spread over the whole corpus, independent of the
tokenizer and of the document order), to the *train* part otherwise. ``source.with_split("train" |
"heldout" | "all")`` selects a part. :mod:`probes.train_tiny` trains on ``split="train"`` of the
embedded corpus and validates on ``split="heldout"``; :func:`default_token_sets` draws its
evaluation, calibration and curvature sets from ``split="heldout"``, so the embedded trajectory is
never evaluated on its training text.

Tokenizers: a checkpoint's own (``transformers.AutoTokenizer.from_pretrained(folder)``), a
byte-level BPE trained here (:func:`train_bpe_tokenizer`, saved as a ``PreTrainedTokenizerFast`` so
``AutoTokenizer`` loads it from a checkpoint folder), or raw UTF-8 bytes (:class:`ByteTokenizer`).

Token sets: :func:`build_token_sets` tokenizes a source into one stream (documents separated by the
tokenizer's EOS token when it has one) and cuts **non-overlapping** windows out of it, assigned to
the requested sets by a seeded permutation, so sets built together never share a token position.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sysconfig
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch

from .tokenset import TokenSet, TokenSetError

__all__ = [
    "DataError",
    "TokenSet",
    "TokenSetError",
    "TextSource",
    "ByteTokenizer",
    "embedded_corpus",
    "embedded_documents",
    "is_heldout",
    "train_bpe_tokenizer",
    "load_tokenizer",
    "tokenizer_name",
    "tokenizer_fingerprint",
    "token_stream",
    "plan_windows",
    "build_token_sets",
    "token_sets_from_stream",
    "default_token_sets",
    "DEFAULT_SHAPES",
    "QUICK_SHAPES",
    "HELDOUT_MODULUS",
]

HELDOUT_MODULUS = 10
"""A document is held out when ``int(sha256(name)[:16], 16) % HELDOUT_MODULUS == 0`` (~10%)."""

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

_TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
_STDLIB_SKIP = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "tkinter",
                "turtledemo", "ensurepip", "venv", "__pycache__", "encodings", "config-3"}


class DataError(ValueError):
    """A text source or tokenizer could not be found or read; the message says what to do."""


# --------------------------------------------------------------------------------------------
# the embedded corpus
# --------------------------------------------------------------------------------------------

def _stdlib_docstrings(min_chars: int = 80) -> list[tuple[str, str]]:
    """(``doc:<module>.<qualname>``, docstring) for the pure-Python stdlib, in sorted file order."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for root, dirs, names in os.walk(lib):
        dirs[:] = sorted(d for d in dirs if d not in _STDLIB_SKIP and not d.startswith("config-"))
        files.extend(Path(root) / n for n in names if n.endswith(".py"))
    files.sort(key=lambda p: p.relative_to(lib).as_posix())
    docs: list[tuple[str, str]] = []
    for path in files:
        rel = path.relative_to(lib).with_suffix("").as_posix()
        module = rel.replace("/", ".").removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue

        def visit(node: ast.AST, qual: str) -> None:
            doc = ast.get_docstring(node)
            if doc and len(doc) >= min_chars:
                docs.append((f"doc:{qual}", doc))
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(child, f"{qual}.{child.name}")

        visit(tree, module)
    return docs


def _disk_cache_dir() -> Path | None:
    """``$LOSSLENS_CACHE_DIR`` (``off`` disables) or ``~/.cache/losslens``."""
    env = os.environ.get("LOSSLENS_CACHE_DIR")
    if env is not None and env.strip().lower() in ("", "off", "0", "none"):
        return None
    return Path(env).expanduser() if env else Path.home() / ".cache" / "losslens"


def _cached_stdlib_docstrings() -> list[tuple[str, str]]:
    """:func:`_stdlib_docstrings`, cached on disk per Python build (~1.4 MB JSON) because parsing
    the whole stdlib costs ~3 s per process. The cache is keyed by ``sys.version`` and the stdlib
    path; delete it or set ``LOSSLENS_CACHE_DIR=off`` to rebuild / bypass."""
    import sys

    folder = _disk_cache_dir()
    key = hashlib.sha256(json.dumps([1, sys.version, sysconfig.get_paths()["stdlib"]]).encode()).hexdigest()[:16]
    path = folder / f"stdlib-docstrings-{key}.json" if folder is not None else None
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("sha256") == hashlib.sha256(json.dumps(data["docs"]).encode()).hexdigest():
                return [tuple(d) for d in data["docs"]]
        except (OSError, ValueError, KeyError):
            pass
    docs = _stdlib_docstrings()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            payload = json.dumps(docs)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"sha256": hashlib.sha256(payload.encode()).hexdigest(), "docs": docs}),
                           encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            pass  # read-only home: just don't cache
    return docs


@lru_cache(maxsize=2)
def _embedded_documents(docstrings: bool) -> tuple[tuple[str, str], ...]:
    import pydoc_data.topics as topics

    docs = [(f"topics:{k}", topics.topics[k]) for k in sorted(topics.topics)]
    if docstrings:
        docs.extend(_cached_stdlib_docstrings())
    return tuple(docs)


def embedded_documents(docstrings: bool = True, split: str = "all") -> list[tuple[str, str]]:
    """The embedded corpus as ``(name, text)`` documents in a fixed order (see module docstring).

    ``split``: "all", "train" or "heldout" (document-level hash split). The content depends on the
    CPython version that runs it; results record its hash. Cost: ~3 s the first time per process.
    """
    return _filter_split(list(_embedded_documents(bool(docstrings))), split)


def embedded_corpus(docstrings: bool = True, split: str = "all") -> str:
    """The embedded corpus as one string (documents joined by blank lines); see :func:`embedded_documents`."""
    return "\n\n".join(text for _, text in embedded_documents(docstrings, split))


def is_heldout(name: str) -> bool:
    """Whether the document called ``name`` belongs to the held-out split (~1 in 10, by hash)."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:16], 16) % HELDOUT_MODULUS == 0


def _filter_split(docs: list[tuple[str, str]], split: str) -> list[tuple[str, str]]:
    if split == "all":
        return docs
    if split not in ("train", "heldout"):
        raise DataError(f"unknown split {split!r}; use 'all', 'train' or 'heldout'")
    want = split == "heldout"
    return [d for d in docs if is_heldout(d[0]) == want]


# --------------------------------------------------------------------------------------------
# text sources
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TextSource:
    """A named, ordered list of documents to tokenize.

    Build with :meth:`embedded`, :meth:`from_path`, :meth:`from_dataset`, :meth:`from_text`, or
    :meth:`parse` (CLI strings: ``embedded``, ``embedded:train``, ``dataset:NAME[:CONFIG][@SPLIT]``,
    or a path). ``split`` selects the train / held-out documents (see the module docstring).
    """

    kind: str  # "embedded" | "path" | "dataset" | "text"
    spec: str
    split: str = "all"
    options: tuple = ()
    text: str | None = field(default=None, repr=False, compare=False)

    # constructors ---------------------------------------------------------------------------
    @classmethod
    def embedded(cls, split: str = "all", docstrings: bool = True) -> "TextSource":
        return cls("embedded", "embedded" if docstrings else "embedded-topics", split, (("docstrings", bool(docstrings)),))

    @classmethod
    def from_path(cls, path: str | Path, split: str = "all") -> "TextSource":
        p = Path(path).expanduser()
        if not p.exists():
            raise DataError(f"text source {p} does not exist; pass a text file or a folder of .txt/.md/.rst files")
        return cls("path", str(p.resolve()), split)

    @classmethod
    def from_text(cls, text: str, name: str = "text", split: str = "all") -> "TextSource":
        h = hashlib.sha256(text.encode()).hexdigest()[:12]
        return cls("text", f"{name}:{h}", split, (), text)

    @classmethod
    def from_dataset(cls, name: str, config: str | None = None, split: str = "train", text_field: str = "text",
                     max_docs: int | None = None) -> "TextSource":
        """A ``datasets`` dataset that must already be cached locally (no download is attempted
        when ``HF_DATASETS_OFFLINE=1``). ``split`` here is the dataset's split (e.g. "validation");
        the train/held-out document split of this source is "all"."""
        return cls("dataset", name, "all", (("config", config), ("split", split), ("text_field", text_field),
                                             ("max_docs", max_docs)))

    @classmethod
    def parse(cls, spec: "str | Path | TextSource") -> "TextSource":
        """``embedded[:train|:heldout|:all]``, ``dataset:NAME[:CONFIG][@SPLIT]`` or a path."""
        if isinstance(spec, TextSource):
            return spec
        if isinstance(spec, Path):
            return cls.from_path(spec)
        s = str(spec)
        if s == "embedded" or s.startswith("embedded:"):
            return cls.embedded(split=s.split(":", 1)[1] if ":" in s else "all")
        if s.startswith("dataset:"):
            rest = s[len("dataset:"):]
            rest, _, dsplit = rest.partition("@")
            name, _, config = rest.partition(":")
            return cls.from_dataset(name, config or None, dsplit or "train")
        return cls.from_path(s)

    def with_split(self, split: str) -> "TextSource":
        if split not in ("all", "train", "heldout"):
            raise DataError(f"unknown split {split!r}; use 'all', 'train' or 'heldout'")
        return TextSource(self.kind, self.spec, split, self.options, self.text)

    # content --------------------------------------------------------------------------------
    def describe(self) -> str:
        """Short provenance string, e.g. ``embedded[heldout]`` or ``path:/data/x.txt``."""
        base = self.spec if self.kind in ("embedded", "text") else f"{self.kind}:{self.spec}"
        if self.kind == "dataset":
            opts = dict(self.options)
            base += (f":{opts['config']}" if opts.get("config") else "") + f"@{opts.get('split')}"
        return base if self.split == "all" else f"{base}[{self.split}]"

    def documents(self) -> list[tuple[str, str]]:
        """``(name, text)`` documents of the selected split, in a fixed order."""
        if self.kind == "embedded":
            return embedded_documents(dict(self.options).get("docstrings", True), self.split)
        if self.kind == "text":
            docs = _chunk_text(self.spec.split(":")[0], self.text or "")
        elif self.kind == "path":
            docs = _path_documents(Path(self.spec))
        elif self.kind == "dataset":
            docs = _dataset_documents(self.spec, **dict(self.options))
        else:
            raise DataError(f"unknown text source kind {self.kind!r}")
        return _filter_split(docs, self.split)


def _chunk_text(name: str, text: str, target: int = 2000) -> list[tuple[str, str]]:
    """Split one long text at blank lines into ~``target``-character documents ``name#i`` (so
    that a single file still has a document-level train / held-out split)."""
    paras = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    docs, cur = [], []
    size = 0
    for p in paras:
        cur.append(p)
        size += len(p)
        if size >= target:
            docs.append("\n\n".join(cur))
            cur, size = [], 0
    if cur:
        docs.append("\n\n".join(cur))
    return [(f"{name}#{i}", d) for i, d in enumerate(docs)]


def _path_documents(path: Path) -> list[tuple[str, str]]:
    if path.is_file():
        files, base = [path], path.parent
    else:
        files = sorted((p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _TEXT_SUFFIXES),
                       key=lambda p: p.relative_to(path).as_posix())
        base = path
        if not files:
            raise DataError(f"folder {path} holds no {'/'.join(_TEXT_SUFFIXES)} files")
    docs: list[tuple[str, str]] = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise DataError(f"cannot read text file {f}: {exc}") from exc
        docs.extend(_chunk_text(f.relative_to(base).as_posix(), text))
    return docs


def _dataset_documents(name: str, config: str | None = None, split: str = "train", text_field: str = "text",
                       max_docs: int | None = None) -> list[tuple[str, str]]:
    try:
        import datasets  # noqa: F401  (optional dependency)
    except ImportError as exc:
        raise DataError(f"dataset source {name!r} needs the optional 'datasets' package: pip install datasets "
                        "(or use the embedded corpus / a text file)") from exc
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # datasets raises many types (ConnectionError, FileNotFoundError, ...)
        raise DataError(f"could not load dataset {name!r} (config {config!r}, split {split!r}) from the local "
                        f"cache: {exc}. Download it first (datasets.load_dataset while online) or set "
                        "HF_DATASETS_OFFLINE=1 only after it is cached.") from exc
    if text_field not in ds.column_names:
        raise DataError(f"dataset {name!r} has no column {text_field!r}; columns are {ds.column_names}")
    n = len(ds) if max_docs is None else min(len(ds), max_docs)
    return [(f"{name}[{i}]", ds[i][text_field]) for i in range(n) if ds[i][text_field]]


# --------------------------------------------------------------------------------------------
# tokenizers
# --------------------------------------------------------------------------------------------

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


def train_bpe_tokenizer(text: "str | Sequence[str] | TextSource", vocab_size: int = 1024,
                        out_dir: str | Path | None = None, min_frequency: int = 2, name: str | None = None,
                        model_max_length: int = 1_000_000):
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
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", model_max_length=model_max_length)
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


def _eos_id(tokenizer: Any) -> int | None:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None and hasattr(tokenizer, "token_to_id"):
        eos = tokenizer.token_to_id("<|endoftext|>")
    return eos


def _encode_documents(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if isinstance(tokenizer, ByteTokenizer):
        return [tokenizer.encode(t) for t in texts]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "encode_batch"):
        backend = tokenizer  # a raw ``tokenizers.Tokenizer``
    if backend is not None:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    if callable(tokenizer):  # slow HF tokenizer
        return list(tokenizer(texts, add_special_tokens=False)["input_ids"])
    raise DataError(f"don't know how to tokenize with {type(tokenizer).__name__}; pass a transformers/tokenizers "
                    "tokenizer, a folder holding one, or 'bytes'")


def load_tokenizer(path_or_ref: Any = "bytes"):
    """A tokenizer from a folder, a checkpoint, a trajectory, or the literal ``"bytes"``.

    - ``"bytes"`` / ``None`` -> :class:`ByteTokenizer`;
    - a tokenizer object -> itself;
    - a :class:`probes.checkpoints.CheckpointRef` or ``Trajectory`` -> the checkpoint's own tokenizer;
    - a folder -> ``AutoTokenizer.from_pretrained(folder)``; for a trajectory folder written by
      ``losslens train-tiny`` its ``tokenizer/`` subfolder or first checkpoint.
    Raises :class:`DataError` naming the folder when no tokenizer is there.
    """
    if path_or_ref is None or (isinstance(path_or_ref, str) and path_or_ref == "bytes"):
        return ByteTokenizer()
    if not isinstance(path_or_ref, (str, Path)):
        from .checkpoints import CheckpointRef, Trajectory, tokenizer_folder

        if isinstance(path_or_ref, (CheckpointRef, Trajectory)):
            folder = tokenizer_folder(path_or_ref)
            if folder is None:
                raise DataError(f"{path_or_ref!r} has no tokenizer files; pass a tokenizer or 'bytes'")
            return load_tokenizer(folder)
        return path_or_ref  # assume it already is a tokenizer
    folder = Path(path_or_ref).expanduser()
    if not folder.exists():
        raise DataError(f"no tokenizer at {folder}: the path does not exist")
    if folder.is_file():
        folder = folder.parent
    if (folder / "trajectory.json").is_file() or not _has_tokenizer_files(folder):
        from .checkpoints import tokenizer_folder

        found = tokenizer_folder(folder)
        if found is None:
            raise DataError(f"no tokenizer in {folder}: expected tokenizer.json / tokenizer_config.json (as written by "
                            "tokenizer.save_pretrained); pass 'bytes' or train one with train_bpe_tokenizer")
        folder = Path(found)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # transformers raises OSError/ValueError/...
        raise DataError(f"could not load the tokenizer in {folder}: {exc}") from exc


def _has_tokenizer_files(folder: Path) -> bool:
    return any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "vocab.json",
                                                  "tokenizer.model"))


# --------------------------------------------------------------------------------------------
# token streams and token sets
# --------------------------------------------------------------------------------------------

_STREAM_CACHE: dict[tuple, torch.Tensor] = {}


def token_stream(tokenizer: Any, source: "TextSource | str | Path") -> torch.Tensor:
    """All documents of ``source`` tokenized and concatenated into one int64 tensor [n_tokens].

    Documents are encoded without special tokens and each is followed by the tokenizer's EOS id
    when it has one. Streams of the embedded corpus are cached per process (keyed by the tokenizer
    fingerprint). Cost: ~1 s per MB of text with a fast tokenizer.
    """
    source = _as_source(source)
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) or tokenizer is None else tokenizer
    key = (tokenizer_fingerprint(tok), source) if source.kind in ("embedded", "text") else None
    if key is not None and key in _STREAM_CACHE:
        return _STREAM_CACHE[key]
    docs = source.documents()
    if not docs:
        raise DataError(f"text source {source.describe()} has no documents")
    ids = _encode_documents(tok, [t for _, t in docs])
    eos = _eos_id(tok)
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
            raise TokenSetError(f"token set {name!r}: shape must be (n_batches, batch, seq) of positive ints, got {shape}")
        if shape[2] < 2:
            raise TokenSetError(f"token set {name!r}: seq must be >= 2 to have a next-token target")
        out[name] = shape
    return out


def plan_windows(n_tokens: int, shapes: Mapping[str, Sequence[int]], seed: int = 0,
                 source_name: str = "the token stream") -> dict[str, np.ndarray]:
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
                f"{b * s} tokens; use a longer text source or a smaller batch/seq")
        if used + need_units > n_units:
            left = (n_units - used) * unit
            after = f" after the sets {', '.join(done)}" if done else ""
            raise TokenSetError(
                f"token set {name!r} ({nb}x{b}x{s}) needs {need_windows * s} tokens ({need_units * unit} in "
                f"{unit}-token units), but only {left} of the {n_tokens} tokens of {source_name} remain{after}; "
                "use a longer text source or fewer/smaller batches")
        units = order[used:used + need_units]
        used += need_units
        starts = (units[:, None] * unit + np.arange(per_unit)[None, :] * s).reshape(-1)[:need_windows]
        out[name] = starts.astype(np.int64)
        done.append(name)
    return out


def build_token_sets(tokenizer: Any, text_or_source: "TextSource | str | Path",
                     shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0) -> dict[str, TokenSet]:
    """Disjoint token sets ``{name: TokenSet[n_batches, batch, seq]}`` from one text source.

    ``tokenizer``: a tokenizer object, a folder/checkpoint holding one, or "bytes".
    ``text_or_source``: a :class:`TextSource`, a ``Path`` (file or folder), or a ``str`` of text.
    ``shapes``: ``{name: (n_batches, batch, seq)}``, default :data:`DEFAULT_SHAPES`.
    Windows are non-overlapping slices of one token stream (:func:`plan_windows`). Each set's
    ``meta`` records the source, its document split, the tokenizer name and fingerprint, all shapes,
    the seed, the stream length and hash, and the window start offsets. Deterministic for
    (tokenizer, source, shapes, seed). Raises :class:`TokenSetError` when the stream is too short.
    """
    shapes = _check_shapes(shapes or DEFAULT_SHAPES)
    source = _as_source(text_or_source)
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) or tokenizer is None else tokenizer
    stream = token_stream(tok, source)
    meta = {"source": source.describe(), "split": source.split, "tokenizer": tokenizer_name(tok),
            "tokenizer_fingerprint": tokenizer_fingerprint(tok)}
    return token_sets_from_stream(stream, shapes, seed, meta, source_name=f"the token stream of {source.describe()}")


def token_sets_from_stream(stream: torch.Tensor, shapes: Mapping[str, Sequence[int]], seed: int = 0,
                           meta: dict | None = None, source_name: str = "the token stream") -> dict[str, TokenSet]:
    """Disjoint token sets cut from an already tokenized ``stream`` [n_tokens] (see
    :func:`plan_windows`); ``meta`` is copied into every set's metadata together with the shapes,
    seed, stream length / hash and window start offsets."""
    shapes = _check_shapes(shapes)
    stream = torch.as_tensor(stream, dtype=torch.long).reshape(-1)
    plan = plan_windows(len(stream), shapes, seed, source_name=source_name)
    common = dict(meta or {})
    common.update({
        "shapes": {k: list(v) for k, v in shapes.items()},
        "seed": int(seed),
        "stream_tokens": int(len(stream)),
        "stream_hash": hashlib.sha256(stream.numpy().astype("<i8").tobytes()).hexdigest(),
    })
    out = {}
    for name, (nb, b, s) in shapes.items():
        starts = torch.from_numpy(plan[name])
        idx = starts[:, None] + torch.arange(s)[None, :]
        tokens = stream[idx].reshape(nb, b, s)
        out[name] = TokenSet(tokens, name, dict(common, set=name, shape=[nb, b, s], window_starts=plan[name].tolist()))
    return out


def default_token_sets(tokenizer_or_checkpoint: Any = "bytes", quick: bool = False,
                       source: "TextSource | str | Path | None" = None, seed: int = 0,
                       seq_len: int | None = None, shapes: Mapping[str, Sequence[int]] | None = None
                       ) -> dict[str, TokenSet]:
    """The standard ``"eval"``, ``"calibration"`` and ``"curvature"`` sets for a model.

    ``tokenizer_or_checkpoint``: a tokenizer, "bytes", a checkpoint / trajectory folder, a
    :class:`~probes.checkpoints.CheckpointRef` or :class:`~probes.checkpoints.Trajectory` (its own
    tokenizer; its ``max_position_embeddings`` caps the default sequence length).
    Source: the **held-out** part of the embedded corpus unless ``source`` is given (a
    :class:`TextSource`, a ``Path``, or a spec string for :meth:`TextSource.parse`:
    ``embedded[:train|:heldout]``, ``dataset:NAME[:CONFIG][@SPLIT]`` or a path -- unlike
    :func:`build_token_sets`, where a ``str`` is raw text).
    Shapes: :data:`DEFAULT_SHAPES` (16/8/4 batches of 8x128) or, with ``quick``, :data:`QUICK_SHAPES`;
    ``seq_len`` overrides the sequence length and must not exceed the model's context (raises
    :class:`TokenSetError` if it does).
    """
    tok = load_tokenizer(tokenizer_or_checkpoint)
    context = _context_length(tokenizer_or_checkpoint)
    base = dict(shapes or (QUICK_SHAPES if quick else DEFAULT_SHAPES))
    if seq_len is not None:
        if context is not None and seq_len > context:
            raise TokenSetError(f"seq_len {seq_len} exceeds the model's context of {context} tokens "
                                f"(max_position_embeddings); use seq_len <= {context}")
        base = {k: (nb, b, seq_len) for k, (nb, b, _s) in base.items()}
    elif context is not None:
        over = {k: v for k, v in base.items() if v[2] > context}
        if shapes is not None and over:
            raise TokenSetError(f"token sets {sorted(over)} have seq > the model's context of {context} tokens")
        base = {k: (nb, b, min(s, context)) for k, (nb, b, s) in base.items()}
    src = TextSource.embedded(split="heldout") if source is None else _as_source(
        TextSource.parse(source) if isinstance(source, str) else source)
    return build_token_sets(tok, src, base, seed=seed)


def _context_length(obj: Any) -> int | None:
    """``max_position_embeddings`` of the checkpoint behind ``obj`` (None for bare tokenizers)."""
    from .checkpoints import CheckpointError, CheckpointRef, Trajectory, read_config

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
