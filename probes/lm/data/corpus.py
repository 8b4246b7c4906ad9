"""Text sources and the embedded corpus (docs/science.md §1).

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
"heldout" | "all")`` selects a part.
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

from losslens.geometry.base.errors import LosslensError

__all__ = ["DataError", "TextSource", "embedded_corpus", "embedded_documents", "is_heldout", "HELDOUT_MODULUS"]

HELDOUT_MODULUS = 10
"""A document is held out when ``int(sha256(name)[:16], 16) % HELDOUT_MODULUS == 0`` (~10%)."""

_TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
_STDLIB_SKIP = {
    "test",
    "tests",
    "idlelib",
    "site-packages",
    "dist-packages",
    "lib2to3",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "venv",
    "__pycache__",
    "encodings",
    "config-3",
}


class DataError(LosslensError, ValueError):
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
            tmp.write_text(
                json.dumps({"sha256": hashlib.sha256(payload.encode()).hexdigest(), "docs": docs}), encoding="utf-8"
            )
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
        return cls(
            "embedded", "embedded" if docstrings else "embedded-topics", split, (("docstrings", bool(docstrings)),)
        )

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
    def from_dataset(
        cls,
        name: str,
        config: str | None = None,
        split: str = "train",
        text_field: str = "text",
        max_docs: int | None = None,
    ) -> "TextSource":
        """A ``datasets`` dataset that must already be cached locally (no download is attempted
        when ``HF_DATASETS_OFFLINE=1``). ``split`` here is the dataset's split (e.g. "validation");
        the train/held-out document split of this source is "all"."""
        return cls(
            "dataset",
            name,
            "all",
            (("config", config), ("split", split), ("text_field", text_field), ("max_docs", max_docs)),
        )

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
            rest = s[len("dataset:") :]
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
        files = sorted(
            (p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _TEXT_SUFFIXES),
            key=lambda p: p.relative_to(path).as_posix(),
        )
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


def _dataset_documents(
    name: str, config: str | None = None, split: str = "train", text_field: str = "text", max_docs: int | None = None
) -> list[tuple[str, str]]:
    try:
        import datasets  # noqa: F401  (optional dependency)
    except ImportError as exc:
        raise DataError(
            f"dataset source {name!r} needs the optional 'datasets' package: pip install datasets "
            "(or use the embedded corpus / a text file)"
        ) from exc
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # datasets raises many types (ConnectionError, FileNotFoundError, ...)
        raise DataError(
            f"could not load dataset {name!r} (config {config!r}, split {split!r}) from the local "
            f"cache: {exc}. Download it first (datasets.load_dataset while online) or set "
            "HF_DATASETS_OFFLINE=1 only after it is cached."
        ) from exc
    if text_field not in ds.column_names:
        raise DataError(f"dataset {name!r} has no column {text_field!r}; columns are {ds.column_names}")
    n = len(ds) if max_docs is None else min(len(ds), max_docs)
    return [(f"{name}[{i}]", ds[i][text_field]) for i in range(n) if ds[i][text_field]]


# --------------------------------------------------------------------------------------------
